//! Compiles every device-executor kernel (`kernels/executor.cu`) with
//! NVRTC for sm_80 and sm_90 and fails on any error, warning or register
//! spill. Needs libnvrtc as cuda/tests/kernels.rs does: without it each
//! test says why it skipped and passes, unless `FERROCCL_REQUIRE_NVRTC=1`
//! (CI sets it).

use ferroccl_cuda::executor;
use ferroccl_cuda::nvrtc;

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

fn compiles_for(arch: &str) {
    if !nvrtc_here(arch) {
        return;
    }
    let c = nvrtc::compile(executor::source(), arch, &[]).unwrap_or_else(|e| panic!("{e}"));
    eprintln!(
        "NVRTC {}.{} {}: {} bytes of CUBIN in {:.2?}",
        c.version.0,
        c.version.1,
        c.arch,
        c.image.len(),
        c.elapsed
    );
    assert_eq!(&c.image[..4], b"\x7fELF", "not a CUBIN");
    let mut reported: Vec<&str> = c
        .kernels
        .iter()
        .map(|k| k.name.as_str())
        .filter(|n| n.starts_with("ferroccl_exec_"))
        .collect();
    let mut want: Vec<&str> = executor::names().iter().map(String::as_str).collect();
    reported.sort_unstable();
    want.sort_unstable();
    assert_eq!(reported, want);
    for k in &c.kernels {
        eprintln!(
            "  {:<34} {:>3} registers, {} bytes stack, {}/{} bytes spill stores/loads",
            k.name, k.registers, k.stack_bytes, k.spill_stores, k.spill_loads
        );
        assert_eq!((k.spill_stores, k.spill_loads), (0, 0), "{k:?}");
        // 512 threads per block: at most 128 registers each.
        assert!(k.registers <= 128, "{k:?}");
    }
    assert_eq!(nvrtc::check_log(&c.log), Ok(()));
}

#[test]
fn executor_kernels_compile_for_sm_80_without_warning_or_spill() {
    compiles_for("sm_80");
}

#[test]
fn executor_kernels_compile_for_sm_90_without_warning_or_spill() {
    compiles_for("sm_90");
}
