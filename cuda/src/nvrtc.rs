//! NVRTC: finding the library and compiling the kernels to CUBIN for one
//! architecture, with ptxas's report checked (no warning, no spill).
//!
//! cudarc loads libnvrtc at its first call and panics when it is missing
//! (or lacks a symbol), so nothing here calls it before
//! `is_culib_present()` says the library opens; the calls themselves run
//! under `catch_unwind` so that a library without an entry point gives
//! [`CudaError::Compile`] too. cudarc looks for `libnvrtc.so`,
//! `libnvrtc.so.13` (this build's major version) and a few older names
//! on the loader's path (`LD_LIBRARY_PATH`), see docs/cuda.md.

use crate::error::{CudaError, Result};
use cudarc::nvrtc::{result, sys};
use std::ffi::{CStr, CString};
use std::time::{Duration, Instant};

/// Options every kernel compile uses, besides the architecture: C++17,
/// IEEE float arithmetic (no fused multiply-add, no flush of subnormals,
/// correctly rounded division), and ptxas's per-kernel report (registers,
/// stack, spills) in the log, with a warning on any spill.
pub const OPTIONS: &[&str] = &[
    "--std=c++17",
    "--fmad=false",
    "--ftz=false",
    "--prec-div=true",
    "--prec-sqrt=true",
    "--ptxas-options=-v",
    "--ptxas-options=--warn-on-spills",
];

/// A compiled module: the CUBIN for one architecture and what NVRTC said.
#[derive(Debug, Clone)]
pub struct Cubin {
    /// The architecture it was compiled for, e.g. `sm_90`.
    pub arch: String,
    /// The CUBIN image, for `cuModuleLoadData`.
    pub image: Vec<u8>,
    /// NVRTC's log, ptxas's report included.
    pub log: String,
    /// ptxas's report per kernel.
    pub kernels: Vec<KernelStats>,
    /// The NVRTC version that compiled it (major, minor).
    pub version: (i32, i32),
    /// How long the compile took.
    pub elapsed: Duration,
}

/// What ptxas reports for one kernel.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KernelStats {
    pub name: String,
    pub registers: u32,
    pub stack_bytes: u64,
    pub spill_stores: u64,
    pub spill_loads: u64,
}

/// Whether libnvrtc opens, asked without calling into it.
#[cfg(not(feature = "dynamic-linking"))]
fn nvrtc_library_present() -> bool {
    // SAFETY: only tries to open the library by its usual names
    // (libloading); no NVRTC function is called.
    unsafe { sys::is_culib_present() }
}

/// Linked (feature `dynamic-linking`): the loader resolved libnvrtc
/// before the program started, or it did not start.
#[cfg(feature = "dynamic-linking")]
fn nvrtc_library_present() -> bool {
    true
}

/// The version of the libnvrtc this process finds, or why there is none
/// (`Compile`, never a panic).
pub fn version() -> Result<(i32, i32)> {
    if !nvrtc_library_present() {
        return Err(CudaError::Compile(
            "libnvrtc was not found (looked for libnvrtc.so, libnvrtc.so.13 and older \
             names on the loader's path; set LD_LIBRARY_PATH to the folder that holds \
             libnvrtc.so.13 and libnvrtc-builtins.so.13.*)"
                .into(),
        ));
    }
    guarded(|| {
        let (mut major, mut minor) = (0, 0);
        // SAFETY: nvrtcVersion writes one int through each pointer, both
        // pointing at live locals.
        let rc = unsafe { sys::nvrtcVersion(&mut major, &mut minor) };
        rc.result()
            .map_err(|e| CudaError::Compile(format!("nvrtcVersion failed: {e}")))?;
        Ok((major, minor))
    })
}

/// Compiles every kernel of [`crate::kernels::source`] for `arch` (e.g.
/// `sm_80`, `sm_90`) with [`OPTIONS`]; see [`compile`].
///
/// This is what the device loader calls, once per device (architecture)
/// and process, caching the module it loads from the result: a compile
/// takes on the order of a second.
pub fn compile_kernels(arch: &str) -> Result<Cubin> {
    compile(crate::kernels::source(), arch, &[])
}

/// Compiles `source` to CUBIN (SASS) for `arch` with [`OPTIONS`] and
/// `extra` options. Fails with [`CudaError::Compile`], carrying the log,
/// when libnvrtc is missing, on any compile error, on any warning in the
/// log (NVRTC's or ptxas's), and on any register spill ptxas reports.
pub fn compile(source: &str, arch: &str, extra: &[&str]) -> Result<Cubin> {
    check_arch(arch)?;
    let version = version()?;
    let src = CString::new(source)
        .map_err(|_| CudaError::InvalidArgument("kernel source contains a NUL byte".into()))?;
    let mut options: Vec<String> = vec![format!("--gpu-architecture={arch}")];
    options.extend(OPTIONS.iter().map(|s| s.to_string()));
    options.extend(extra.iter().map(|s| s.to_string()));
    let start = Instant::now();
    let (image, log) = guarded(|| run_nvrtc(&src, &options))?;
    let elapsed = start.elapsed();
    let log = log.map_err(|(what, log)| {
        CudaError::Compile(format!(
            "{what} for {arch} (options {options:?}):\n{}",
            log.trim_end()
        ))
    })?;
    check_log(&log).map_err(|why| {
        CudaError::Compile(format!(
            "{why} in the compile for {arch} (options {options:?}):\n{}",
            log.trim_end()
        ))
    })?;
    Ok(Cubin {
        arch: arch.to_string(),
        image,
        kernels: ptxas_stats(&log),
        log,
        version,
        elapsed,
    })
}

/// `sm_` and a number, optionally one letter (`sm_90a`).
fn check_arch(arch: &str) -> Result<()> {
    let ok = arch.strip_prefix("sm_").is_some_and(|rest| {
        let digits = rest.trim_end_matches(|c: char| c.is_ascii_lowercase());
        !digits.is_empty()
            && digits.chars().all(|c| c.is_ascii_digit())
            && rest.len() - digits.len() <= 1
    });
    if ok {
        Ok(())
    } else {
        Err(CudaError::InvalidArgument(format!(
            "architecture {arch:?}: expected sm_ and a number, e.g. sm_90"
        )))
    }
}

/// Runs `f`, turning a panic (cudarc's, on a missing symbol) into an error.
fn guarded<T>(f: impl FnOnce() -> Result<T>) -> Result<T> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_or_else(|p| {
        let why = p
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| p.downcast_ref::<&str>().copied())
            .unwrap_or("a panic");
        Err(CudaError::Compile(format!("libnvrtc: {why}")))
    })
}

type Outcome = std::result::Result<String, (String, String)>;

/// Create, compile, read the log and the CUBIN, destroy. The outer error is
/// a failure around the compile; the inner one a failed compile (what
/// failed, the log).
fn run_nvrtc(src: &CStr, options: &[String]) -> Result<(Vec<u8>, Outcome)> {
    let prog = result::create_program(src, Some(c"ferroccl_kernels.cu"))
        .map_err(|e| CudaError::Compile(format!("nvrtcCreateProgram failed: {e}")))?;
    // SAFETY: `prog` was just created and is destroyed once, below, after
    // its last use; the option strings outlive the call.
    let compiled = unsafe { result::compile_program(prog, options) };
    // SAFETY: as above; the log is read whether or not the compile worked.
    let log = unsafe { result::get_program_log(prog) }
        .map(|raw| c_chars_to_string(&raw))
        .unwrap_or_default();
    let out = match compiled {
        Err(e) => Ok((Vec::new(), Err((format!("nvrtcCompileProgram: {e}"), log)))),
        // SAFETY: `prog` compiled; see `get_cubin`.
        Ok(()) => unsafe { get_cubin(prog) }.map(|image| (image, Ok(log))),
    };
    // SAFETY: `prog` came from create_program and is not used after this.
    let destroyed = unsafe { result::destroy_program(prog) };
    let out = out?;
    destroyed.map_err(|e| CudaError::Compile(format!("nvrtcDestroyProgram failed: {e}")))?;
    Ok(out)
}

/// The CUBIN of a compiled program.
///
/// # Safety
///
/// `prog` must be a live program that compiled successfully.
unsafe fn get_cubin(prog: sys::nvrtcProgram) -> Result<Vec<u8>> {
    let mut size = 0usize;
    // SAFETY: `prog` is live (the caller's promise); writes one usize.
    unsafe { sys::nvrtcGetCUBINSize(prog, &mut size) }
        .result()
        .map_err(|e| {
            CudaError::Compile(format!(
                "nvrtcGetCUBINSize failed: {e} (was -arch a real sm_?)"
            ))
        })?;
    if size == 0 {
        return Err(CudaError::Compile("NVRTC produced an empty CUBIN".into()));
    }
    let mut image = vec![0u8; size];
    // SAFETY: `image` holds the `size` bytes nvrtcGetCUBINSize asked for.
    unsafe { sys::nvrtcGetCUBIN(prog, image.as_mut_ptr().cast()) }
        .result()
        .map_err(|e| CudaError::Compile(format!("nvrtcGetCUBIN failed: {e}")))?;
    Ok(image)
}

fn c_chars_to_string(raw: &[std::ffi::c_char]) -> String {
    let bytes: Vec<u8> = raw
        .iter()
        .map(|&c| c as u8)
        .take_while(|&b| b != 0)
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// Whether a compile log is clean: `Err` with the reason on any warning
/// (NVRTC's `warning #...` or ptxas's `ptxas warning`) or any non-zero
/// `bytes spill stores` / `bytes spill loads`.
pub fn check_log(log: &str) -> std::result::Result<(), String> {
    for line in log.lines() {
        if line.to_ascii_lowercase().contains("warning") {
            return Err(format!("a warning ({})", line.trim()));
        }
    }
    for k in ptxas_stats(log) {
        if k.spill_stores != 0 || k.spill_loads != 0 {
            return Err(format!(
                "a register spill in {} ({} bytes spill stores, {} bytes spill loads)",
                k.name, k.spill_stores, k.spill_loads
            ));
        }
    }
    // Spill counts outside a kernel's report count too.
    for line in log.lines() {
        for what in ["bytes spill stores", "bytes spill loads"] {
            if let Some(n) = number_before(line, what) {
                if n != 0 {
                    return Err(format!("a register spill ({})", line.trim()));
                }
            }
        }
    }
    Ok(())
}

/// ptxas's `-v` report, per kernel, in the order of the log:
///
/// ```text
/// ptxas info    : Function properties for ferroccl_reduce_sum_f32
///     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
/// ptxas info    : Used 16 registers, used 0 barriers, 384 bytes cmem[0]
/// ```
pub fn ptxas_stats(log: &str) -> Vec<KernelStats> {
    let mut out: Vec<KernelStats> = Vec::new();
    let mut current: Option<usize> = None;
    for line in log.lines() {
        let find = |out: &mut Vec<KernelStats>, name: &str| -> usize {
            match out.iter().position(|k| k.name == name) {
                Some(i) => i,
                None => {
                    out.push(KernelStats {
                        name: name.to_string(),
                        ..Default::default()
                    });
                    out.len() - 1
                }
            }
        };
        if let Some(rest) = line.split("Function properties for ").nth(1) {
            current = Some(find(&mut out, rest.trim()));
        } else if let Some(rest) = line.split("Compiling entry function '").nth(1) {
            let name = rest.split('\'').next().unwrap_or("");
            current = Some(find(&mut out, name));
        } else if let Some(i) = current {
            let k = &mut out[i];
            if let Some(n) = number_before(line, "bytes stack frame") {
                k.stack_bytes = n;
            }
            if let Some(n) = number_before(line, "bytes spill stores") {
                k.spill_stores = n;
            }
            if let Some(n) = number_before(line, "bytes spill loads") {
                k.spill_loads = n;
            }
            if let Some(n) = number_before(line, "registers") {
                if line.contains("Used ") {
                    k.registers = n as u32;
                }
            }
        }
    }
    out
}

/// The number just before `what` in `line` (`12 bytes spill stores`).
fn number_before(line: &str, what: &str) -> Option<u64> {
    let at = line.find(what)?;
    line[..at].split_whitespace().last()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    const CLEAN: &str = "\
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'ferroccl_reduce_sum_f32' for 'sm_90'
ptxas info    : Function properties for ferroccl_reduce_sum_f32
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 18 registers, used 0 barriers, 380 bytes cmem[0]
ptxas info    : Compiling entry function 'ferroccl_avg_finish_f64' for 'sm_90'
ptxas info    : Function properties for ferroccl_avg_finish_f64
    8 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 30 registers, used 0 barriers, 372 bytes cmem[0]
";

    #[test]
    fn the_checker_reads_ptxas_reports() {
        assert_eq!(check_log(CLEAN), Ok(()));
        let s = ptxas_stats(CLEAN);
        assert_eq!(
            s,
            vec![
                KernelStats {
                    name: "ferroccl_reduce_sum_f32".into(),
                    registers: 18,
                    stack_bytes: 0,
                    spill_stores: 0,
                    spill_loads: 0
                },
                KernelStats {
                    name: "ferroccl_avg_finish_f64".into(),
                    registers: 30,
                    stack_bytes: 8,
                    spill_stores: 0,
                    spill_loads: 0
                }
            ]
        );
    }

    #[test]
    fn the_checker_refuses_spills_and_warnings() {
        let spill = CLEAN.replace(
            "8 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads",
            "8 bytes stack frame, 4 bytes spill stores, 4 bytes spill loads",
        );
        let e = check_log(&spill).unwrap_err();
        assert!(
            e.contains("spill") && e.contains("ferroccl_avg_finish_f64"),
            "{e}"
        );
        let loads_only = CLEAN.replace(
            "0 bytes spill loads\nptxas info    : Used 30",
            "12 bytes spill loads\nptxas info    : Used 30",
        );
        assert!(check_log(&loads_only)
            .unwrap_err()
            .contains("12 bytes spill loads"));
        let warned = format!("{CLEAN}ferroccl_kernels.cu(3): warning #177-D: variable \"x\" was declared but never referenced\n");
        assert!(check_log(&warned).unwrap_err().contains("#177-D"));
        let ptxas_warned =
            format!("ptxas warning : Registers are spilled to local memory\n{CLEAN}");
        assert!(check_log(&ptxas_warned).unwrap_err().contains("warning"));
    }

    #[test]
    fn architectures_are_checked_before_nvrtc() {
        for bad in [
            "",
            "sm_",
            "90",
            "compute_90",
            "sm_9x0",
            "sm_90ab",
            "sm_90 -G",
        ] {
            assert!(
                matches!(compile("", bad, &[]), Err(CudaError::InvalidArgument(_))),
                "{bad:?}"
            );
        }
        for good in ["sm_80", "sm_90", "sm_90a", "sm_100"] {
            assert_eq!(check_arch(good), Ok(()), "{good}");
        }
    }

    /// Without libnvrtc the answer is `Compile` saying so, never a panic.
    #[test]
    fn a_missing_library_is_an_error() {
        match version() {
            Ok((major, _)) => assert!(major >= 11),
            Err(CudaError::Compile(why)) => assert!(why.contains("libnvrtc"), "{why}"),
            Err(other) => panic!("{other:?}"),
        }
    }
}
