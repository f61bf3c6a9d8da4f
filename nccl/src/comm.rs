//! What an `ncclComm_t` points at, and making one.
//!
//! A handle is never freed: `ncclCommDestroy` and `ncclCommAbort` drop its
//! communicator and mark it gone, so that a call still running on another
//! thread (PyTorch's watchdog aborts while the main thread waits) keeps
//! valid memory, and a later use of the handle is refused by name instead
//! of reading freed memory. What stays behind is a few words per
//! communicator.

use crate::abi::{CommConfig, PreMul};
use crate::status::Failure;
use crate::uid::Meeting;
use ferroccl::{Communicator, Config, DeviceWork};
use std::ffi::c_int;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

const LIVE: u64 = 0x6665_7272_6f63_636c;
const GONE: u64 = 0x676f_6e65_676f_6e65;

/// The state of a communicator the handle stands for.
pub enum State {
    /// Initialisation (or a split) deferred to `ncclGroupEnd`.
    Pending,
    /// Usable.
    Ready(Arc<Core>),
    /// Initialisation failed; every call reports this.
    Failed(Failure),
    /// Destroyed or aborted.
    Gone(&'static str),
}

/// A live communicator and what the ABI keeps beside it.
pub struct Core {
    /// The library's communicator.
    pub comm: Communicator,
    /// PreMulSum operators, by `op - ncclNumOps`; `None` once destroyed.
    pub ops: Mutex<Vec<Option<PreMul>>>,
    /// The last device call enqueued (`ncclCommFinalize` waits for it).
    pub pending: Mutex<Option<DeviceWork>>,
    /// The config's settings.
    pub config: CommConfig,
}

/// What an `ncclComm_t` points at.
pub struct Handle {
    magic: AtomicU64,
    /// Rank in the communicator and ranks in it: known at creation for
    /// an init, at `ncclGroupEnd` for a split deferred there.
    place: OnceLock<(usize, usize)>,
    /// `ncclCommCuDevice`.
    pub device: c_int,
    state: Mutex<State>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Handle {
    /// A handle for rank `rank` of `size` in state `state`, leaked into
    /// the pointer C holds.
    pub fn new_raw(rank: usize, size: usize, device: c_int, state: State) -> *mut Handle {
        Box::into_raw(Box::new(Handle {
            magic: AtomicU64::new(LIVE),
            place: OnceLock::from((rank, size)),
            device,
            state: Mutex::new(state),
        }))
    }

    /// A handle for a split deferred to `ncclGroupEnd`: pending, its
    /// rank and size not known yet ([`Handle::set_split`] sets them).
    pub fn new_split_raw(device: c_int) -> *mut Handle {
        Box::into_raw(Box::new(Handle {
            magic: AtomicU64::new(LIVE),
            place: OnceLock::new(),
            device,
            state: Mutex::new(State::Pending),
        }))
    }

    /// Rank and size, or why they are not known yet.
    pub fn place(&self) -> Result<(usize, usize), Failure> {
        self.place.get().copied().ok_or_else(|| {
            Failure::invalid_usage(
                "the communicator is not made yet: its ncclCommSplit is in a group that has \
                 not ended (call ncclGroupEnd first)",
            )
        })
    }

    /// The outcome of a deferred split: the communicator made.
    pub fn set_split(&self, core: Arc<Core>) {
        let _ = self.place.set((core.comm.rank(), core.comm.size()));
        self.set_state(State::Ready(core));
    }

    /// Whether the handle waits for `ncclGroupEnd`.
    pub fn pending(&self) -> bool {
        matches!(*lock(&self.state), State::Pending)
    }

    /// The handle behind a C `ncclComm_t`.
    ///
    /// # Safety
    /// `ptr` is NULL or was returned by this library as an `ncclComm_t`
    /// (handles are never freed, so any such pointer stays readable).
    pub unsafe fn from_c<'a>(ptr: *mut Handle) -> Result<&'a Handle, Failure> {
        if ptr.is_null() {
            return Err(Failure::invalid_argument("comm is NULL"));
        }
        // SAFETY: as the caller vouches; handles are never freed.
        let h = unsafe { &*ptr };
        match h.magic.load(Ordering::Acquire) {
            LIVE => Ok(h),
            GONE => Err(Failure::invalid_usage(
                "comm was destroyed or aborted already",
            )),
            _ => Err(Failure::invalid_argument(
                "comm is not a communicator made by this library",
            )),
        }
    }

    /// The live communicator, or why there is none.
    pub fn core(&self) -> Result<Arc<Core>, Failure> {
        match &*lock(&self.state) {
            State::Ready(core) => Ok(core.clone()),
            State::Pending => Err(Failure::invalid_usage(
                "the communicator is not initialised yet: its ncclCommInitRank or \
                 ncclCommSplit is in a group that has not ended (call ncclGroupEnd first)",
            )),
            State::Failed(f) => Err(f.clone()),
            State::Gone(why) => Err(Failure::invalid_usage(format!("comm was {why}"))),
        }
    }

    /// Set the outcome of a deferred initialisation.
    pub fn set_state(&self, state: State) {
        *lock(&self.state) = state;
    }

    /// `ncclCommGetAsyncError`: never blocks.
    pub fn async_error(&self) -> Result<c_int, Failure> {
        use crate::abi::result;
        Ok(match &*lock(&self.state) {
            State::Ready(core) => core
                .comm
                .async_error()
                .map_or(result::SUCCESS, |e| crate::status::code_of(&e)),
            State::Pending => result::IN_PROGRESS,
            State::Failed(f) => f.code,
            State::Gone(why) => return Err(Failure::invalid_usage(format!("comm was {why}"))),
        })
    }

    /// Drop the communicator (after `abort()` where `abort`); the handle
    /// stays, marked gone.
    pub fn retire(&self, abort: bool) -> Result<(), Failure> {
        let old = std::mem::replace(
            &mut *lock(&self.state),
            State::Gone(if abort { "aborted" } else { "destroyed" }),
        );
        self.magic.store(GONE, Ordering::Release);
        if let State::Ready(core) = old {
            if abort {
                core.comm.abort();
                // Dropping the communicator of the rank that hosts the
                // rendezvous waits (bounded) for the other ranks to leave
                // it: an abort returns at once and leaves that to a
                // thread. (Where no thread can start, the core is dropped
                // here with the closure.) A call still running on the
                // communicator holds it until that call ends.
                let _ = std::thread::Builder::new()
                    .name("ferroccl-nccl-abort".into())
                    .spawn(move || drop(core));
            } else {
                // The last call still running on it (if any) drops it.
                drop(core);
            }
        }
        Ok(())
    }
}

impl Core {
    /// A core around a new communicator.
    pub fn new(comm: Communicator, config: CommConfig) -> Arc<Core> {
        Arc::new(Core {
            comm,
            ops: Mutex::new(Vec::new()),
            pending: Mutex::new(None),
            config,
        })
    }

    /// The PreMulSum operator `op` (at least `ncclNumOps`).
    pub fn premul(&self, op: c_int) -> Result<PreMul, Failure> {
        let index = (op - crate::abi::NUM_OPS) as usize;
        lock(&self.ops)
            .get(index)
            .copied()
            .flatten()
            .ok_or_else(|| {
                Failure::invalid_argument(format!(
                    "op {op} is not an operator created on this communicator (or was destroyed)"
                ))
            })
    }

    /// Record a new PreMulSum operator; its `ncclRedOp_t`.
    pub fn add_premul(&self, p: PreMul) -> Result<c_int, Failure> {
        let mut ops = lock(&self.ops);
        let index = match ops.iter().position(Option::is_none) {
            Some(i) => i,
            None => {
                ops.push(None);
                ops.len() - 1
            }
        };
        let value = c_int::try_from(index)
            .ok()
            .and_then(|i| i.checked_add(crate::abi::NUM_OPS))
            .ok_or_else(|| Failure::invalid_usage("too many PreMulSum operators"))?;
        ops[index] = Some(p);
        Ok(value)
    }

    /// Forget operator `op`.
    pub fn remove_premul(&self, op: c_int) -> Result<(), Failure> {
        self.premul(op)?;
        lock(&self.ops)[(op - crate::abi::NUM_OPS) as usize] = None;
        Ok(())
    }

    /// Wait for the last device call (`ncclCommFinalize`).
    pub fn flush(&self) -> Result<(), Failure> {
        let work = lock(&self.pending).take();
        match work {
            Some(w) => w.wait().map_err(Failure::from),
            None => Ok(()),
        }
    }
}

/// Check `nranks` and `rank` as NCCL's init takes them.
pub fn check_rank(nranks: c_int, rank: c_int) -> Result<(usize, usize), Failure> {
    if nranks < 1 {
        return Err(Failure::invalid_argument(format!(
            "nranks {nranks} must be at least 1"
        )));
    }
    if rank < 0 || rank >= nranks {
        return Err(Failure::invalid_argument(format!(
            "rank {rank} is out of range for nranks {nranks}"
        )));
    }
    Ok((rank as usize, nranks as usize))
}

/// Join the job `meeting` describes as `rank` of `size`.
pub fn init(
    meeting: &Meeting,
    rank: usize,
    size: usize,
    config: CommConfig,
) -> Result<Arc<Core>, Failure> {
    let cfg = Config::new(
        rank,
        size,
        meeting.addr.ip().to_string(),
        meeting.addr.port(),
        meeting.token,
    )?;
    let comm = Communicator::init(cfg).map_err(|e| {
        let mut f = Failure::from(e);
        if let Some(name) = &config.name {
            f.message = format!("communicator '{name}': {}", f.message);
        }
        f
    })?;
    Ok(Core::new(comm, config))
}

/// The CUDA device current on this thread, as NCCL records it at
/// initialisation; -1 where there is no usable CUDA driver (a host-only
/// communicator).
pub fn current_device() -> c_int {
    if ferroccl::cuda::device_count().map_or(true, |n| n == 0) {
        return -1;
    }
    use ferroccl::cuda::cudarc::driver::sys;
    let mut dev: sys::CUdevice = 0;
    // SAFETY: the driver library is loaded and new enough (the probe
    // above); the call writes one int. Without a current context it fails
    // and device 0 is reported (the CUDA runtime's default).
    let rc = unsafe { sys::cuCtxGetDevice(&mut dev) };
    if rc == sys::CUresult::CUDA_SUCCESS {
        dev
    } else {
        0
    }
}
