//! What can go wrong in the CUDA glue.

/// An error of the CUDA glue. The library maps `NoDevice` to its own
/// `Error::NoDevice`, with the reason.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CudaError {
    /// No usable CUDA: no driver library, no device, or a driver too old
    /// for what this build calls. The host path is unaffected.
    #[error("no CUDA device: {0}")]
    NoDevice(String),
    /// A driver call failed (the call and the driver's own words).
    #[error("CUDA driver: {call} failed: {reason}")]
    Driver {
        /// The driver entry point, e.g. `cuMemAlloc`.
        call: &'static str,
        /// The driver's name and description of the error.
        reason: String,
    },
    /// NVRTC is missing, or a kernel did not compile (with NVRTC's log).
    #[error("NVRTC: {0}")]
    Compile(String),
    /// The device's work did not finish within a wait's bound (a host wait
    /// on an event: the GPU is stuck, or the work it waits for never came).
    #[error("timed out after {waited_ms} ms waiting for {what}")]
    Timeout {
        /// What was waited for.
        what: String,
        /// How long.
        waited_ms: u64,
    },
    /// A bad argument, found before anything was enqueued.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
}

/// A result of the CUDA glue.
pub type Result<T> = std::result::Result<T, CudaError>;
