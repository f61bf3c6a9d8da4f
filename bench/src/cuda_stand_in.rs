//! A stand-in for `ferroccl::cuda`, the library's public device API, which
//! is being written on main while `ferroccl-perf --device cuda` is: the
//! same names and signatures, so that perf builds and its no-device path
//! runs before the real one lands. Its collectives only say that they are
//! a stand-in. It goes when `ferroccl::cuda` lands (perf then imports
//! that instead; nothing else changes).

use ferroccl::{Communicator, Element, ReduceOp};
use std::sync::Arc;

pub use cudarc;
use cudarc::driver::{CudaStream, DevicePtr, DevicePtrMut};

/// Why there is no usable device (`ferroccl::Error::NoDevice` in the real
/// API).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Error {
    /// No usable CUDA, and why.
    NoDevice(String),
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Error::NoDevice(reason) => write!(f, "no CUDA device: {reason}"),
        }
    }
}

impl std::error::Error for Error {}

/// The number of CUDA devices, or why there is none; never panics.
pub fn device_available() -> Result<usize, Error> {
    ferroccl_cuda::probe::driver()
        .map(|d| d.devices)
        .map_err(|e| match e {
            ferroccl_cuda::CudaError::NoDevice(reason) => Error::NoDevice(reason),
            other => Error::NoDevice(other.to_string()),
        })
}

/// `Communicator::on_stream` of the real API.
pub trait OnStreamExt {
    /// Device calls enqueued on `stream`.
    fn on_stream<'a>(&'a self, stream: &'a Arc<CudaStream>) -> OnStream<'a>;
}

impl OnStreamExt for Communicator {
    fn on_stream<'a>(&'a self, stream: &'a Arc<CudaStream>) -> OnStream<'a> {
        OnStream {
            _comm: self,
            _stream: stream,
        }
    }
}

/// Device calls of a communicator on one stream.
pub struct OnStream<'a> {
    _comm: &'a Communicator,
    _stream: &'a Arc<CudaStream>,
}

/// A device call a host thread can wait for.
#[derive(Debug)]
pub struct DeviceWork;

fn stand_in<W>() -> ferroccl::Result<W> {
    Err(ferroccl::Error::InvalidArgument(
        "ferroccl-perf was built against a stand-in of ferroccl::cuda: \
         device collectives are not in this build"
            .into(),
    ))
}

#[allow(missing_docs)]
impl OnStream<'_> {
    pub fn all_reduce<T: Element>(
        &self,
        _send: &impl DevicePtr<T>,
        _recv: &mut impl DevicePtrMut<T>,
        _op: ReduceOp,
    ) -> ferroccl::Result<DeviceWork> {
        stand_in()
    }
    pub fn all_reduce_in_place<T: Element>(
        &self,
        _buf: &mut impl DevicePtrMut<T>,
        _op: ReduceOp,
    ) -> ferroccl::Result<DeviceWork> {
        stand_in()
    }
    pub fn reduce_scatter<T: Element>(
        &self,
        _send: &impl DevicePtr<T>,
        _recv: &mut impl DevicePtrMut<T>,
        _op: ReduceOp,
    ) -> ferroccl::Result<DeviceWork> {
        stand_in()
    }
    pub fn reduce_scatter_in_place<T: Element>(
        &self,
        _buf: &mut impl DevicePtrMut<T>,
        _op: ReduceOp,
    ) -> ferroccl::Result<DeviceWork> {
        stand_in()
    }
    pub fn all_gather<T: Element>(
        &self,
        _send: &impl DevicePtr<T>,
        _recv: &mut impl DevicePtrMut<T>,
    ) -> ferroccl::Result<DeviceWork> {
        stand_in()
    }
    pub fn all_gather_in_place<T: Element>(
        &self,
        _buf: &mut impl DevicePtrMut<T>,
    ) -> ferroccl::Result<DeviceWork> {
        stand_in()
    }
    pub fn broadcast<T: Element>(
        &self,
        _buf: &mut impl DevicePtrMut<T>,
        _root: usize,
    ) -> ferroccl::Result<DeviceWork> {
        stand_in()
    }
    pub fn reduce<T: Element>(
        &self,
        _send: &impl DevicePtr<T>,
        _recv: &mut impl DevicePtrMut<T>,
        _op: ReduceOp,
        _root: usize,
    ) -> ferroccl::Result<DeviceWork> {
        stand_in()
    }
    pub fn reduce_in_place<T: Element>(
        &self,
        _buf: &mut impl DevicePtrMut<T>,
        _op: ReduceOp,
        _root: usize,
    ) -> ferroccl::Result<DeviceWork> {
        stand_in()
    }
}
