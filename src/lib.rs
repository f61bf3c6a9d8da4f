//! ferroccl: collective communication for Rust.
//!
//! Allreduce, reduce-scatter, allgather, broadcast, reduce, send/recv,
//! all-to-all and barrier between the processes of a job, over pluggable
//! transports. See `docs/architecture.md` for the layers.
//!
//! ```no_run
//! use ferroccl::{Communicator, ReduceOp};
//! let comm = Communicator::from_env()?;          // torchrun / mpirun / srun / ferroccl-run
//! let send = vec![comm.rank() as f32; 1024];
//! let mut recv = vec![0f32; 1024];
//! comm.all_reduce(&send, &mut recv, ReduceOp::Sum)?;
//! # Ok::<(), ferroccl::Error>(())
//! ```
#![warn(missing_docs, unreachable_pub)]

pub mod algo;
mod bias;
pub mod bootstrap;
mod call;
#[cfg(feature = "candle")]
pub mod candle;
mod coll;
mod comm;
mod config;
pub mod cuda;
pub mod ddp;
mod element;
mod error;
mod exec;
mod fingerprint;
pub mod fsdp;
mod logging;
mod plan;
pub mod reduce;
pub mod testing;
mod topo;
mod transports;
mod window;

/// What the planner decides for a call, for tools that build the very
/// schedules a call runs (`ferroccl-sim`): the slice sizes schedules are
/// cut with, the channels the device executor splits them over, and the
/// tuner's allreduce choice. Pure functions, no I/O.
pub mod planner {
    pub use crate::plan::device::bulk_channels;
    pub use crate::plan::tune::{
        choose_all_reduce, choose_all_reduce_on, choose_reduce_scatter_on, HostLinks, Layout,
    };
    pub use crate::plan::{all_reduce_slice, block_slice};
}

pub use comm::{Communicator, DeviceWork, Work};

pub use algo::Algorithm;
pub use config::{
    Config, DEFAULT_BUFFSIZE, DEFAULT_NSOCKS_PERPEER, DEFAULT_NT_STORE_BYTES, DEFAULT_TIMEOUT,
};
pub use element::{DataType, Element, ReduceOp};
pub use error::{Error, Result};
pub use plan::tune::LinkModel;
pub use transports::TRANSPORT_NAMES;
pub use window::Window;
