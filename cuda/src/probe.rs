//! Is there a CUDA driver and a device, and which? Found once per process.
//!
//! cudarc loads libcuda at its first call and panics when it is missing or
//! lacks a symbol, so nothing here calls it before `is_culib_present()`
//! says the library is there and the driver's version is known to have the
//! entry points this build uses.

use crate::error::{CudaError, Result};
use cudarc::driver::sys;
use std::sync::OnceLock;

/// The oldest driver this build calls: CUDA 13.0's (`cuda-13000`).
pub const MIN_DRIVER_VERSION: i32 = 13000;

/// The driver found at run time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Driver {
    /// `cuDriverGetVersion`: 1000 * major + 10 * minor (13000 is 13.0).
    pub version: i32,
    /// How many devices it shows this process.
    pub devices: usize,
}

/// The driver and its devices, or why there is no usable CUDA. Probed on
/// the first call; later calls return the same answer.
pub fn driver() -> Result<Driver> {
    static FOUND: OnceLock<Result<Driver>> = OnceLock::new();
    FOUND.get_or_init(probe).clone()
}

/// Whether a device can be used: `Ok(())` or `NoDevice` with the reason.
pub fn require() -> Result<()> {
    driver().map(|_| ())
}

fn probe() -> Result<Driver> {
    if std::env::var("FERROCCL_CUDA").is_ok_and(|v| v == "0") {
        return Err(CudaError::NoDevice("FERROCCL_CUDA=0".into()));
    }
    if !driver_library_present() {
        return Err(CudaError::NoDevice(
            "the CUDA driver library (libcuda.so.1) was not found".into(),
        ));
    }
    let mut version = 0;
    // SAFETY: cuDriverGetVersion may be called before cuInit and writes
    // one int through the pointer, which points at a live local.
    let rc = unsafe { sys::cuDriverGetVersion(&mut version) };
    if rc != sys::CUresult::CUDA_SUCCESS {
        return Err(CudaError::NoDevice(format!(
            "cuDriverGetVersion failed: {rc:?}"
        )));
    }
    if version < MIN_DRIVER_VERSION {
        return Err(CudaError::NoDevice(format!(
            "the driver supports CUDA {}.{}, this build needs {}.{} or newer",
            version / 1000,
            version % 1000 / 10,
            MIN_DRIVER_VERSION / 1000,
            MIN_DRIVER_VERSION % 1000 / 10
        )));
    }
    cudarc::driver::result::init()
        .map_err(|e| CudaError::NoDevice(format!("cuInit failed: {e} (is a device visible?)")))?;
    let devices = cudarc::driver::result::device::get_count()
        .map_err(|e| CudaError::NoDevice(format!("cuDeviceGetCount failed: {e}")))?;
    if devices <= 0 {
        return Err(CudaError::NoDevice("the driver shows no device".into()));
    }
    Ok(Driver {
        version,
        devices: devices as usize,
    })
}

/// Whether libcuda opens, asked without calling into it.
#[cfg(not(feature = "dynamic-linking"))]
fn driver_library_present() -> bool {
    // SAFETY: only tries to open the library by its usual names
    // (libloading); no CUDA function is called.
    unsafe { sys::is_culib_present() }
}

/// Linked (feature `dynamic-linking`): the loader resolved libcuda before
/// the program started, or it did not start.
#[cfg(feature = "dynamic-linking")]
fn driver_library_present() -> bool {
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Without a driver (this machine, CI) the answer is `NoDevice` with a
    /// reason, and asking never panics; with one it names its version.
    /// `FERROCCL_REQUIRE_DEVICE=1` (the GPU run) makes a missing device a
    /// failure.
    #[test]
    fn probing_never_panics_and_says_why() {
        if std::env::var("FERROCCL_REQUIRE_DEVICE").is_ok_and(|v| v == "1") {
            let d = driver().expect("FERROCCL_REQUIRE_DEVICE=1 but no usable device");
            eprintln!("driver {} with {} device(s)", d.version, d.devices);
        }
        match driver() {
            Ok(d) => assert!(d.version >= MIN_DRIVER_VERSION && d.devices > 0, "{d:?}"),
            Err(CudaError::NoDevice(why)) => assert!(!why.is_empty()),
            Err(other) => panic!("expected NoDevice, got {other:?}"),
        }
        assert_eq!(driver(), driver(), "probed once");
    }
}
