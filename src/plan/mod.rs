//! The one place that decides the path of a call, for host and device
//! memory alike: which algorithm it runs, how its slices are cut, and
//! which way its bytes go, with the reason each decision gives at
//! FERROCCL_DEBUG=INFO (`plan: ...` lines, once per collective and size
//! class).
//!
//! - [`host`] (re-exported here): calls in host memory: the algorithm
//!   (by [`tune`]'s model over the measured host links), slices, the
//!   route (slots, inline, check-in, windows, cross-memory attach),
//!   confirmations, store modes.
//! - [`device`]: calls in device memory: the executor or staging, the
//!   FIFO sizes, the executor's protocol, chunk and channels, and the
//!   links a device call's algorithm is chosen over (its own link model:
//!   the host half's rule over those links), and the INFO line.
//! - [`tune`]: the alpha-beta cost model the algorithm choice reads.
//! - [`gpu_path`]: the GPU path per pair of ranks (same process, cuda-ipc,
//!   staged), which `device` asks for every pair.
//!
//! Every decision is a pure function of described facts that every rank
//! holds alike; the executing code (`comm`, `exec`) gathers the facts and
//! carries the decision out. No I/O, no clock, no `unsafe`.

pub(crate) mod device;
pub(crate) mod gpu_path;
pub(crate) mod host;
pub(crate) mod tune;

// The call's vocabulary: `Memory` stays nameable as `plan::Memory`.
pub(crate) use crate::call::Memory;
pub(crate) use host::{
    after_check_in, algorithm, algorithm_why, always_inline, cma_allreduce_default,
    cma_allreduce_probes, cma_allreduce_range, cma_alltoall_probes, cma_broadcast_default,
    cma_probes, cma_range, confirms, device_unsupported, direct_capable, direct_reduce_store,
    direct_store, doubling_probe, doubling_until, explain, explain_user, geometry,
    inline_after_check_in, inline_page_bytes, leaves_early, limit_without_windows, reads_inline,
    route, slot_store, staged_pull_range, takes_spread, Direct, Facts, Route, CMA_GATHER_DEFAULT,
    CMA_MIN_BYTES, DOUBLING_PROBE_BYTES, INLINE_MAX_BYTES, NO_CMA, RING_WIN,
    WIDE_ALLTOALL_INLINE_AREA,
};
pub use host::{all_reduce_slice, block_slice};
