//! Compiles every reduction kernel with NVRTC for sm_80 and sm_90 and fails
//! on any error, warning or register spill; and checks that the checker
//! itself catches a broken source, a warning and a forced spill.
//!
//! Needs libnvrtc on the loader's path (docs/cuda.md). Without it each test
//! says why it skipped and passes, unless `FERROCCL_REQUIRE_NVRTC=1`, then
//! it fails (CI sets it).

use ferroccl_cuda::kernels;
use ferroccl_cuda::nvrtc::{self, Cubin};
use ferroccl_cuda::CudaError;

/// Whether NVRTC is here; if not, whether that is allowed (skip) or not
/// (panic).
fn nvrtc_here(test: &str) -> bool {
    match nvrtc::version() {
        Ok(_) => true,
        Err(e) => {
            if std::env::var("FERROCCL_REQUIRE_NVRTC").is_ok_and(|v| v == "1") {
                panic!("{test}: FERROCCL_REQUIRE_NVRTC=1 but NVRTC is unusable: {e}");
            }
            eprintln!("{test}: skipped, NVRTC is unusable: {e}");
            false
        }
    }
}

fn report(c: &Cubin) {
    eprintln!(
        "NVRTC {}.{} {}: {} bytes of CUBIN in {:.2?}",
        c.version.0,
        c.version.1,
        c.arch,
        c.image.len(),
        c.elapsed
    );
    for k in &c.kernels {
        eprintln!(
            "  {:<32} {:>3} registers, {} bytes stack, {}/{} bytes spill stores/loads",
            k.name, k.registers, k.stack_bytes, k.spill_stores, k.spill_loads
        );
    }
}

fn compiles_every_kernel_for(arch: &str) {
    if !nvrtc_here(arch) {
        return;
    }
    let c = nvrtc::compile_kernels(arch).unwrap_or_else(|e| panic!("{e}"));
    report(&c);
    assert_eq!(c.arch, arch);
    // An ELF image.
    assert_eq!(&c.image[..4], b"\x7fELF", "not a CUBIN");
    // ptxas reported on exactly the kernels of the table, none spilling.
    let mut reported: Vec<&str> = c.kernels.iter().map(|k| k.name.as_str()).collect();
    let mut want: Vec<&str> = kernels::names().iter().map(String::as_str).collect();
    reported.sort_unstable();
    want.sort_unstable();
    assert_eq!(reported, want);
    for k in &c.kernels {
        assert!(k.registers > 0, "{k:?}");
        assert_eq!((k.spill_stores, k.spill_loads), (0, 0), "{k:?}");
        // The kernel's name is in the image's symbol table.
        let found = c
            .image
            .windows(k.name.len() + 1)
            .any(|w| &w[..k.name.len()] == k.name.as_bytes() && w[k.name.len()] == 0);
        assert!(found, "{} not in the CUBIN", k.name);
    }
    assert_eq!(nvrtc::check_log(&c.log), Ok(()));
}

#[test]
fn every_kernel_compiles_for_sm_80_without_warning_or_spill() {
    compiles_every_kernel_for("sm_80");
}

#[test]
fn every_kernel_compiles_for_sm_90_without_warning_or_spill() {
    compiles_every_kernel_for("sm_90");
}

fn compile_error(src: &str, extra: &[&str]) -> String {
    match nvrtc::compile(src, "sm_90", extra) {
        Err(CudaError::Compile(log)) => log,
        Ok(c) => panic!("compiled, log:\n{}", c.log),
        Err(other) => panic!("{other:?}"),
    }
}

#[test]
fn a_broken_source_is_an_error_with_the_log() {
    if !nvrtc_here("broken source") {
        return;
    }
    // The real source with one kernel's body cut short.
    let src = kernels::source().replacen("(dst, a, b, count); }", "(dst, a, b, count); ", 1);
    let log = compile_error(&src, &[]);
    assert!(log.contains("nvrtcCompileProgram"), "{log}");
    assert!(log.contains("error"), "{log}");
}

#[test]
fn a_warning_is_an_error() {
    if !nvrtc_here("warning") {
        return;
    }
    let src = "extern \"C\" __global__ void k(float* p) { int unused = 1; p[0] = 1.0f; }";
    let log = compile_error(src, &[]);
    assert!(log.contains("warning"), "{log}");
    // And the same kernel without the warning compiles.
    let ok = nvrtc::compile(
        "extern \"C\" __global__ void k(float* p) { p[0] = 1.0f; }",
        "sm_90",
        &[],
    );
    assert!(ok.is_ok(), "{ok:?}");
}

#[test]
fn a_forced_spill_is_an_error() {
    if !nvrtc_here("spill") {
        return;
    }
    // 64 values live at once, in at most 16 registers: ptxas must spill.
    let src = r#"
extern "C" __global__ void hungry(float* p, const float* q) {
    float v[64];
#pragma unroll
    for (int i = 0; i < 64; i++) v[i] = q[i * 977 + threadIdx.x];
    float s = 0.0f;
#pragma unroll
    for (int i = 0; i < 64; i++) s += v[i] * v[63 - i] * v[(i * 7) & 63];
    p[threadIdx.x] = s;
}
"#;
    let fine = nvrtc::compile(src, "sm_90", &[]).unwrap_or_else(|e| panic!("{e}"));
    assert!(fine.kernels[0].registers > 16, "{:?}", fine.kernels);
    let log = compile_error(src, &["--maxrregcount=16"]);
    assert!(log.contains("spill"), "{log}");
}
