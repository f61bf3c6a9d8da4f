//! Data-parallel training: gradient buckets that stream into in-flight
//! collectives while backward is still producing later gradients (the
//! reducer of PyTorch's DistributedDataParallel, written for ferroccl).
//!
//! The module owns the bucket layout, the per-step bookkeeping and the comm
//! hooks; it knows nothing of transports and moves bytes only through the
//! public [`Communicator`] API. A training loop:
//!
//! ```no_run
//! use ferroccl::ddp::{broadcast_parameters, ParamSpec, Reducer, ReducerConfig};
//! let comm = ferroccl::Communicator::from_env()?;
//! let mut w = vec![0.1f32; 1000];
//! let mut b = vec![0.0f32; 10];
//! broadcast_parameters(&comm, &mut [&mut w[..], &mut b[..]])?;
//! let specs = [ParamSpec::new("w", w.len()), ParamSpec::new("b", b.len())];
//! let mut reducer = Reducer::<f32>::new(&comm, &specs, ReducerConfig::default())?;
//! for _step in 0..10 {
//!     // backward produces the last layer's gradients first
//!     let (gb, gw) = (vec![0.0f32; 10], vec![0.0f32; 1000]);
//!     reducer.mark_ready(1, &gb)?; // may start the first bucket's allreduce
//!     reducer.mark_ready(0, &gw)?;
//!     reducer.finish()?; // waits, the gradients are now averaged
//!     for (x, g) in w.iter_mut().zip(reducer.grad(0).unwrap()) {
//!         *x -= 0.01 * g;
//!     }
//!     for (x, g) in b.iter_mut().zip(reducer.grad(1).unwrap()) {
//!         *x -= 0.01 * g;
//!     }
//! }
//! # Ok::<(), ferroccl::Error>(())
//! ```
//!
//! `docs/ddp.md` is the user guide, with the mapping to PyTorch's names.

mod hook;
mod layout;
mod reducer;

pub use hook::{
    AllReduceHook, Bf16CompressHook, Bucket, CommHook, Fp16CompressHook, PendingBucket,
};
pub use reducer::Reducer;

use crate::{Communicator, Element, Result};

/// PyTorch's default bucket cap (`bucket_cap_mb=25`).
pub const DEFAULT_BUCKET_CAP_BYTES: usize = 25 << 20;
/// PyTorch's default cap of the first bucket (1 MiB): the gradients that
/// come first out of backward start moving early.
pub const DEFAULT_FIRST_BUCKET_CAP_BYTES: usize = 1 << 20;

/// One parameter as the reducer sees it: a name for error messages and the
/// number of elements of its gradient.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParamSpec {
    /// Shown in errors, e.g. `fc2.weight`.
    pub name: String,
    /// Elements of the gradient (the parameter's element count).
    pub len: usize,
}

impl ParamSpec {
    /// A parameter called `name` with `len` elements.
    pub fn new(name: impl Into<String>, len: usize) -> Self {
        ParamSpec {
            name: name.into(),
            len,
        }
    }
}

/// How the reducer buckets and reduces. Every rank must use the same
/// settings (the reducer checks at construction).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReducerConfig {
    /// Bytes a bucket holds before it closes (PyTorch `bucket_cap_mb`);
    /// a single larger parameter gets a bucket of its own.
    pub bucket_cap_bytes: usize,
    /// Cap of the first bucket, the one backward fills first.
    pub first_bucket_cap_bytes: usize,
    /// Prefix streaming: cut buckets larger than this many bytes into
    /// chunks of at least this size (on parameter boundaries), each reduced
    /// by its own collective as soon as it and every chunk before it are
    /// ready. `None` reduces each bucket as one collective, as PyTorch does.
    pub prefix_chunk_bytes: Option<usize>,
    /// Re-pack the buckets once, after the first synchronised step, in the
    /// order rank 0 saw gradients become ready.
    pub rebuild_buckets: bool,
    /// Treat parameters not marked by `finish()` as unused in this step
    /// (zero gradient) instead of failing (PyTorch
    /// `find_unused_parameters`).
    pub find_unused_parameters: bool,
    /// Allocate the buckets as windows ([`Communicator::alloc_window`]):
    /// where the ranks share a host, each bucket's allreduce then reads and
    /// writes the peers' buckets directly, each byte copied once; elsewhere
    /// the windows are private memory and nothing changes.
    pub windows: bool,
}

impl Default for ReducerConfig {
    fn default() -> Self {
        ReducerConfig {
            bucket_cap_bytes: DEFAULT_BUCKET_CAP_BYTES,
            first_bucket_cap_bytes: DEFAULT_FIRST_BUCKET_CAP_BYTES,
            prefix_chunk_bytes: None,
            rebuild_buckets: true,
            find_unused_parameters: false,
            windows: true,
        }
    }
}

/// Copy rank 0's parameters to every rank (DDP does this at construction so
/// that every replica starts from the same weights). All ranks must pass
/// parameters of the same lengths; they travel as one broadcast per 25 MiB.
pub fn broadcast_parameters<T: Element>(
    comm: &Communicator,
    params: &mut [&mut [T]],
) -> Result<()> {
    let cap = (DEFAULT_BUCKET_CAP_BYTES / std::mem::size_of::<T>()).max(1);
    let mut start = 0;
    while start < params.len() {
        let mut end = start;
        let mut len = 0;
        while end < params.len() && (end == start || len + params[end].len() <= cap) {
            len += params[end].len();
            end += 1;
        }
        let mut flat = Vec::with_capacity(len);
        for p in &params[start..end] {
            flat.extend_from_slice(p);
        }
        comm.broadcast(&mut flat, 0)?;
        let mut at = 0;
        for p in &mut params[start..end] {
            p.copy_from_slice(&flat[at..at + p.len()]);
            at += p.len();
        }
        start = end;
    }
    Ok(())
}
