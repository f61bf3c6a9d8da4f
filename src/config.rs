//! Settings of a communicator: explicit fields, defaults, and the FERROCCL_*
//! environment variables that override them (named as NCCL names its own).

use crate::algo::Algorithm;
use crate::bootstrap::env::LaunchInfo;
use crate::error::{Error, Result};
use std::time::Duration;

/// Default bound of every wait (FERROCCL_TIMEOUT, seconds).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(300);
/// Default bytes of slot memory per direction of a connection
/// (FERROCCL_BUFFSIZE), split into `steps` slots.
pub const DEFAULT_BUFFSIZE: usize = 4 << 20;

/// How to create a communicator.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// This process's rank, `0..size`.
    pub rank: usize,
    /// Number of ranks.
    pub size: usize,
    /// Host of the rendezvous (rank 0 hosts it).
    pub master_addr: String,
    /// Port of the rendezvous.
    pub master_port: u16,
    /// Job token: the rendezvous and every connection refuse peers without it.
    pub token: u64,
    /// Bound of every wait (FERROCCL_TIMEOUT in seconds, fractions allowed).
    pub timeout: Duration,
    /// Interval of the heartbeats between each process and the rendezvous
    /// (FERROCCL_HEARTBEAT_MS; 0 turns them off). A process that sends
    /// nothing for four intervals (stopped, frozen, cut off) is reported
    /// failed to every rank. `None`: a quarter of half the timeout, so a
    /// silent rank is named before the others time out, within 100 ms to
    /// 5 s (see [`Config::heartbeat_interval`]).
    pub heartbeat: Option<Duration>,
    /// Force one transport by name (FERROCCL_TRANSPORT): "shm", "tcp", or,
    /// for ranks that are threads of one process, "mem" or "ib-emu" (the
    /// RDMA data path over emulated verbs).
    pub transport: Option<String>,
    /// Slot bytes per direction of a connection (FERROCCL_BUFFSIZE).
    pub buffsize: usize,
    /// Slots per direction (FERROCCL_STEPS).
    pub steps: usize,
    /// Slices a ring pass keeps in flight (FERROCCL_PIPELINE_DEPTH; see
    /// `algo::ring`, "Pipelined slices"): 0 lets the library choose (one
    /// below `steps`, at most 4); 1 runs each slice's pass after the
    /// previous one. Must be below `steps`, which a deeper pass could
    /// deadlock on.
    pub pipeline_depth: usize,
    /// Sockets per peer for TCP (FERROCCL_NSOCKS_PERPEER).
    pub nsocks_per_peer: usize,
    /// Network interfaces for TCP, NCCL_SOCKET_IFNAME syntax
    /// (FERROCCL_SOCKET_IFNAME).
    pub socket_ifname: Option<String>,
    /// Force one algorithm for every collective that has it
    /// (FERROCCL_ALGO: `ring`, `tree`, `one_shot`, `two_shot`,
    /// `recursive_doubling`, `hierarchical` or `hier`, any case, so NCCL's
    /// `Ring` and `Tree` work). A collective without the forced
    /// algorithm (one-shot broadcast, say) runs its ring. `None`: the
    /// library chooses.
    pub algorithm: Option<Algorithm>,
    /// A file of user algorithms in the text format (FERROCCL_ALGO_FILE;
    /// docs/algorithms.md): one algorithm, or several for different
    /// collectives (allreduce, allgather, reduce-scatter), each checked for
    /// the communicator's rank count when it is created (an error there if
    /// one is refused), then run by every call of its collective.
    pub algorithm_file: Option<std::path::PathBuf>,
    /// A user algorithm given in code (built with
    /// `ferroccl::algo::user::UserAlgorithm::build`), checked and run like
    /// [`Config::algorithm_file`]; setting it and the file is an error.
    pub user_algorithm: Option<crate::algo::user::UserAlgorithm>,
    /// More user algorithms given in code, for other collectives than
    /// [`Config::user_algorithm`]'s (at most one per collective in all);
    /// setting them and the file is an error.
    pub user_algorithms: Vec<crate::algo::user::UserAlgorithm>,
    /// Directory of shared-memory segments (FERROCCL_SHM_DIR; default
    /// /dev/shm). Segments are unlinked as soon as both ranks mapped them.
    pub shm_dir: Option<std::path::PathBuf>,
    /// Measure at creation: the links, for the tuner, and, where every
    /// rank of one host may read the others' memory, from which block
    /// size allgathers and all-to-alls (each timed where their other
    /// routes differ) pull by cross-memory attach (FERROCCL_CALIBRATE=0
    /// to skip: `LinkModel::DEFAULT`, and 64 KiB blocks).
    pub calibrate: bool,
    /// Out-of-place calls whose output has at least this many bytes write
    /// it with streaming (non-temporal) stores, which skip reading each
    /// output line before writing it and leave the cache to the slots; 0
    /// never does (FERROCCL_NT_STORE_BYTES). In-place calls never do: their
    /// output lines were just read and are in cache. Calls straight
    /// between windows do once the inputs and outputs of all ranks
    /// together reach twice this size, an allreduce or reduce-scatter
    /// also once they reach the host's last-level cache (as sysfs gives
    /// it), and a broadcast between windows, in place too (no rank reads
    /// what it writes), once the ranks' buffers together reach a quarter
    /// of it (`plan::direct_store`, `plan::direct_reduce_store`).
    pub nt_store_bytes: usize,
    /// Where every rank is on one host and shared memory is allowed, give
    /// the communicator shared control pages at creation, so that every
    /// collective checks in there first: small ones (input of at most
    /// 4 KiB) travel inline in the check-in, one exchange in all, and
    /// calls on windows run directly (FERROCCL_CHECKIN=0: only once the
    /// first window is allocated).
    pub checkin: bool,
    /// In a small (inline) broadcast or reduce on the control pages, let
    /// the root of the broadcast and the senders of the reduce return once
    /// their input is on their page, as an MPI root does, instead of
    /// waiting for every peer to check in: they then find a mismatch with
    /// a peer's call in a later call, which names this one (see
    /// docs/reliability.md). FERROCCL_EARLY_RETURN=0: every rank's call
    /// waits for every peer and fails itself on a mismatch.
    pub early_return: bool,
    /// Let large allgathers and all-to-alls (and mid-sized broadcasts) of
    /// ordinary (non-window) buffers between ranks of one host copy each
    /// peer's data once, straight out of the peer process by cross-memory
    /// attach
    /// (`process_vm_readv`), where every rank may (FERROCCL_CMA=0 turns it
    /// off). Probed when the control pages are made; without permission the
    /// calls go through slots.
    pub cma: bool,
    /// Where `cma` is on, every rank may also write every other's memory
    /// that way (`process_vm_writev`, probed alike) and each has a CPU of
    /// its own, let ranks write into each other's outputs: a broadcast's
    /// root pushes a share of its input into the receivers while they
    /// pull the rest, and a 2-rank allreduce of 512 KiB-8 MiB runs as two
    /// halves, each rank pulling its half of the peer's input and writing
    /// the result into both outputs. FERROCCL_CMA_PUSH=0 turns it off: the
    /// ranks then only read each other (broadcasts pulled whole,
    /// allreduces through slots), so that a peer whose call fails can
    /// never write into a rank's memory after that rank has returned
    /// (docs/reliability.md, "Writes into a peer's process").
    pub cma_push: bool,
    /// Let a broadcast above the inline limit on 4 to 8 ranks of one host
    /// (on 3 from 8 MiB) run through one staging area on its root's
    /// control page that every receiver reads: the buffer copied N times
    /// on N ranks, against 2(N - 1) through the chain of pairwise slots;
    /// an allgather of blocks above the inline limit and up to 2 MiB on 4
    /// to 8 ranks through every rank's; an allreduce of 16 KiB to 8
    /// MiB on 4 to 8 ranks through every rank's, each rank reducing its
    /// piece of every chunk; and an all-to-all above the inline limit and
    /// up to 8 MiB on 4 to 8 ranks through every rank's, each chunk a
    /// slice of every block the rank sends (FERROCCL_SPREAD=0: the chain,
    /// the rings and the pairwise slots).
    pub spread: bool,
    /// Let the thread that first calls the communicator own its issue lock
    /// and take it, and end its turns, without a locked instruction until
    /// another thread calls (where the OS offers asymmetric fences: Linux
    /// `membarrier`); FERROCCL_BIASED_LOCKS=0: a mutex and a locked add
    /// for every call.
    pub biased_locks: bool,
    /// Let ranks of one host whose GPUs can reach each other move device
    /// data GPU to GPU (cuda-ipc, or device pointers within a process)
    /// rather than through host memory (FERROCCL_P2P_DISABLE=1, or NCCL's
    /// NCCL_P2P_DISABLE=1, turns it off): device collectives are then
    /// staged through host memory (docs/gpu-topology.md).
    pub p2p: bool,
    /// Let a call on device memory return before its work is done, its
    /// stream made to wait (`cuStreamWaitValue32`) on a word the progress
    /// thread raises when the call ends (FERROCCL_DEVICE_ASYNC=1; off by
    /// default). Unsafe where another thread of the process may make a
    /// synchronous driver call meanwhile: a pageable copy to the host that
    /// waits for the parked stream holds a driver lock the progress thread
    /// needs, and a stream that shares a hardware queue with the parked
    /// one waits behind it; both hung on an H200 (docs/staging.md, "Why
    /// device calls block"). Off, a device call returns once its work has
    /// ended, and later work on the stream sees the result.
    pub device_async: bool,
    /// The most channels (thread blocks, each over FIFOs of its own) the
    /// device executor cuts a call into (FERROCCL_MAX_NCHANNELS, or NCCL's
    /// NCCL_MAX_NCHANNELS; 1 to 64). `None`, the default: 32, fewer where
    /// the FIFOs (one a channel and peer, about 4 MiB each) would pass 64
    /// a rank (16 channels on 4 ranks, 8 on 8). Every rank's bound is
    /// exchanged and the smallest holds (docs/device-executor.md).
    pub max_channels: Option<usize>,
    /// The InfiniBand / RoCE settings (FERROCCL_IB_HCA, _GID_INDEX,
    /// _TIMEOUT, _RETRY_CNT, _QPS_PER_CONNECTION, each else its NCCL_IB_
    /// name; docs/ib.md), read and checked once, by the ib crate's parser:
    /// transport selection and the `ib` / `ib-emu` transports use these.
    pub ib: ferroccl_ib::IbConfig,
}

/// Default of `Config::nt_store_bytes`. On the 2-core build machine a
/// 2-rank allreduce out of place gained 10-25% from streaming stores at
/// 64 and 256 MiB and lost about 10% at 16 MiB (docs/performance-history.md,
/// "Streaming stores", 2026-11-21).
pub const DEFAULT_NT_STORE_BYTES: usize = 32 << 20;

/// Default sockets per peer. Measured on loopback with 2 cores
/// (docs/performance-history.md, "Knob experiments"): more sockets add
/// threads that compete with the reduction for the same cores.
pub const DEFAULT_NSOCKS_PERPEER: usize = 1;

/// A random number from the process's hash seed and the clock: tokens of
/// test jobs and names of sockets, which need to be unlikely to collide,
/// not secret.
pub(crate) fn random_u64() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0),
    );
    h.finish()
}

impl Config {
    /// A config with defaults, then FERROCCL_* overrides from the process
    /// environment.
    pub fn new(
        rank: usize,
        size: usize,
        master_addr: impl Into<String>,
        master_port: u16,
        token: u64,
    ) -> Result<Config> {
        let mut config = Config {
            rank,
            size,
            master_addr: master_addr.into(),
            master_port,
            token,
            timeout: DEFAULT_TIMEOUT,
            heartbeat: None,
            transport: None,
            buffsize: DEFAULT_BUFFSIZE,
            steps: ferroccl_transport::DEFAULT_STEPS,
            pipeline_depth: 0,
            nsocks_per_peer: DEFAULT_NSOCKS_PERPEER,
            socket_ifname: None,
            algorithm: None,
            algorithm_file: None,
            user_algorithm: None,
            user_algorithms: Vec::new(),
            calibrate: true,
            shm_dir: None,
            nt_store_bytes: DEFAULT_NT_STORE_BYTES,
            checkin: true,
            early_return: true,
            cma: true,
            cma_push: true,
            spread: true,
            biased_locks: true,
            p2p: true,
            device_async: false,
            max_channels: None,
            ib: ferroccl_ib::IbConfig::default(),
        };
        config.from_env_overrides(&|k| std::env::var(k).ok())?;
        Ok(config)
    }

    /// Build from what a launcher set (see `bootstrap::env`). Without
    /// FERROCCL_TOKEN the token is derived from the rendezvous address, so
    /// that every rank of a torchrun/mpirun job agrees on it.
    pub fn from_launch(info: &LaunchInfo) -> Result<Config> {
        let token = info
            .token
            .unwrap_or_else(|| derive_token(&info.master_addr, info.master_port, info.size));
        Config::new(
            info.rank,
            info.size,
            info.master_addr.clone(),
            info.master_port,
            token,
        )
    }

    /// Apply FERROCCL_TIMEOUT, FERROCCL_HEARTBEAT_MS, FERROCCL_TRANSPORT,
    /// FERROCCL_BUFFSIZE, FERROCCL_STEPS, FERROCCL_PIPELINE_DEPTH,
    /// FERROCCL_NSOCKS_PERPEER,
    /// FERROCCL_SOCKET_IFNAME, FERROCCL_SHM_DIR, FERROCCL_CALIBRATE,
    /// FERROCCL_CHECKIN, FERROCCL_CMA, FERROCCL_CMA_PUSH, FERROCCL_DEVICE_ASYNC, FERROCCL_NT_STORE_BYTES,
    /// FERROCCL_COPY_PAGES and FERROCCL_HOST_CPUS (checked only),
    /// FERROCCL_IB_* (each else its NCCL_IB_ name),
    /// FERROCCL_P2P_DISABLE (else NCCL_P2P_DISABLE), FERROCCL_MAX_NCHANNELS
    /// (else NCCL_MAX_NCHANNELS), FERROCCL_SIMD and
    /// FERROCCL_PROTO (else NCCL_PROTO) (checked only), FERROCCL_ALGO and
    /// FERROCCL_ALGO_FILE (read and checked at creation) read through `get`; a value that does not
    /// parse is an error naming it.
    pub fn from_env_overrides(&mut self, get: &dyn Fn(&str) -> Option<String>) -> Result<()> {
        fn parse<T: std::str::FromStr>(name: &str, value: &str) -> Result<T> {
            value
                .trim()
                .parse()
                .map_err(|_| Error::Env(format!("{name}='{value}' is not a valid number")))
        }
        fn parse_flag(name: &str, value: &str) -> Result<bool> {
            ferroccl_transport::flag_value(value)
                .ok_or_else(|| Error::Env(format!("{name}='{value}' must be 0 or 1")))
        }
        if let Some(v) = get("FERROCCL_TIMEOUT") {
            let secs: f64 = parse("FERROCCL_TIMEOUT", &v)?;
            if !(secs > 0.0 && secs.is_finite()) {
                return Err(Error::Env(format!(
                    "FERROCCL_TIMEOUT='{v}' must be a positive number of seconds"
                )));
            }
            self.timeout = Duration::from_secs_f64(secs);
        }
        if let Some(v) = get("FERROCCL_HEARTBEAT_MS") {
            let ms: u64 = parse("FERROCCL_HEARTBEAT_MS", &v)?;
            if ms > 3_600_000 {
                return Err(Error::Env(format!(
                    "FERROCCL_HEARTBEAT_MS='{v}' must be at most 3600000 (one hour); 0 turns \
                     heartbeats off"
                )));
            }
            self.heartbeat = Some(Duration::from_millis(ms));
        }
        if let Some(v) = get("FERROCCL_TRANSPORT") {
            self.transport = Some(v.trim().to_ascii_lowercase()).filter(|s| !s.is_empty());
        }
        if let Some(v) = get("FERROCCL_BUFFSIZE") {
            self.buffsize = parse("FERROCCL_BUFFSIZE", &v)?;
        }
        if let Some(v) = get("FERROCCL_STEPS") {
            self.steps = parse("FERROCCL_STEPS", &v)?;
        }
        if let Some(v) = get("FERROCCL_PIPELINE_DEPTH") {
            self.pipeline_depth = parse("FERROCCL_PIPELINE_DEPTH", &v)?;
        }
        if let Some(v) = get("FERROCCL_NSOCKS_PERPEER") {
            self.nsocks_per_peer = parse("FERROCCL_NSOCKS_PERPEER", &v)?;
        }
        // Every FERROCCL_IB_* (and NCCL_IB_*) setting is read and checked
        // by the ib crate, the one owner of their syntax and ranges, so a
        // bad one is refused here, before any connection; the ones not set
        // keep what the config had.
        self.ib = ferroccl_ib::IbConfig::from_lookup_over(self.ib.clone(), get)
            .map_err(|e| Error::Env(e.to_string()))?;
        if let Some(v) = get("FERROCCL_SOCKET_IFNAME") {
            self.socket_ifname = Some(v).filter(|s| !s.trim().is_empty());
        }
        if let Some(v) = get("FERROCCL_NT_STORE_BYTES") {
            self.nt_store_bytes = parse("FERROCCL_NT_STORE_BYTES", &v)?;
        }
        if let Some(v) = get("FERROCCL_SHM_DIR") {
            self.shm_dir = Some(std::path::PathBuf::from(v)).filter(|p| !p.as_os_str().is_empty());
        }
        if let Some(v) = get("FERROCCL_CALIBRATE") {
            self.calibrate = parse_flag("FERROCCL_CALIBRATE", &v)?;
        }
        if let Some(v) = get("FERROCCL_CHECKIN") {
            self.checkin = parse_flag("FERROCCL_CHECKIN", &v)?;
        }
        if let Some(v) = get("FERROCCL_EARLY_RETURN") {
            self.early_return = parse_flag("FERROCCL_EARLY_RETURN", &v)?;
        }
        if let Some(v) = get("FERROCCL_CMA") {
            self.cma = parse_flag("FERROCCL_CMA", &v)?;
        }
        if let Some(v) = get("FERROCCL_CMA_PUSH") {
            self.cma_push = parse_flag("FERROCCL_CMA_PUSH", &v)?;
        }
        if let Some(v) = get("FERROCCL_SPREAD") {
            self.spread = parse_flag("FERROCCL_SPREAD", &v)?;
        }
        if let Some(v) = get("FERROCCL_BIASED_LOCKS") {
            self.biased_locks = parse_flag("FERROCCL_BIASED_LOCKS", &v)?;
        }
        if let Some(v) = get("FERROCCL_DEVICE_ASYNC") {
            self.device_async = parse_flag("FERROCCL_DEVICE_ASYNC", &v)?;
        }
        // FERROCCL_COPY_PAGES is the transport core's, read once per
        // process (`ferroccl_transport::pages_enabled`, which takes any
        // value but 0, false, off and no as on); checked here so that a
        // misspelt value fails at creation.
        if let Some(v) = get("FERROCCL_COPY_PAGES") {
            parse_flag("FERROCCL_COPY_PAGES", &v)?;
        }
        // FERROCCL_HOST_CPUS is the transport core's too
        // (`ferroccl_transport::wait::host_cpus`, read once per process).
        if let Some(v) = get(ferroccl_transport::wait::HOST_CPUS_VAR) {
            if ferroccl_transport::wait::parse_host_cpus(&v).is_none() {
                return Err(Error::Env(format!(
                    "FERROCCL_HOST_CPUS='{v}' must be a positive number of CPUs (those this \
                     host's ranks may run on between them)"
                )));
            }
        }
        if let Some(disabled) = crate::plan::gpu_path::p2p_disabled_from_env(get)? {
            self.p2p = !disabled;
        }
        if let Some(c) = crate::plan::device::max_channels_from_env(get)? {
            self.max_channels = Some(c);
        }
        // FERROCCL_PROTO (else NCCL_PROTO) narrows the device executor's
        // protocols; checked here so that a bad value fails at creation.
        crate::plan::device::allowed_from_env(get)?;
        // The kernels read FERROCCL_SIMD themselves (once per process, for
        // every communicator); here a value they would not know is an error.
        if let Some(v) = get("FERROCCL_SIMD") {
            if !v.trim().is_empty() && crate::reduce::SimdLevel::from_name(&v).is_none() {
                let names: Vec<_> = crate::reduce::SimdLevel::ALL
                    .iter()
                    .map(|l| l.name())
                    .collect();
                return Err(Error::Env(format!(
                    "FERROCCL_SIMD='{v}' names no kernel level (one of: {})",
                    names.join(", ")
                )));
            }
        }
        if let Some(v) = get("FERROCCL_ALGO_FILE") {
            self.algorithm_file =
                Some(std::path::PathBuf::from(v)).filter(|p| !p.as_os_str().is_empty());
        }
        if let Some(v) = get("FERROCCL_ALGO") {
            self.algorithm = if v.trim().is_empty() {
                None
            } else {
                let names: Vec<_> = Algorithm::ALL.iter().map(|a| a.name()).collect();
                Some(Algorithm::from_name(v.trim()).ok_or_else(|| {
                    Error::Env(format!(
                        "FERROCCL_ALGO='{v}' names no algorithm (one of: {})",
                        names.join(", ")
                    ))
                })?)
            };
        }
        Ok(())
    }

    /// The user algorithms this communicator runs, checked for its rank
    /// count: from [`Config::user_algorithm`] and
    /// [`Config::user_algorithms`], or read from
    /// [`Config::algorithm_file`], each with where it came from for the
    /// log. A file that cannot be read or parsed, two algorithms for one
    /// collective, a rank count one does not claim, or a refusal of the
    /// checker is an error naming the file and the line, rank and step.
    pub(crate) fn checked_user_algorithms(&self) -> Result<crate::algo::user::Installed> {
        use crate::algo::user::{Checked, Installed};
        let in_code = self.user_algorithm.iter().chain(&self.user_algorithms);
        let (algos, source): (Vec<crate::algo::user::UserAlgorithm>, String) =
            match &self.algorithm_file {
                None => (in_code.cloned().collect(), "Config::user_algorithm".into()),
                Some(path) if in_code.count() > 0 => {
                    return Err(Error::InvalidArgument(format!(
                        "both Config::user_algorithm(s) and an algorithm file ({}) are set: set \
                         one",
                        path.display()
                    )))
                }
                Some(path) => {
                    let source = format!("FERROCCL_ALGO_FILE={}", path.display());
                    let text = std::fs::read_to_string(path).map_err(|e| {
                        Error::InvalidArgument(format!("{source}: cannot read it: {e}"))
                    })?;
                    let algos = crate::algo::text::parse_all(&text)
                        .map_err(|e| Error::InvalidArgument(format!("{source}: {e}")))?;
                    (algos.into_iter().map(|(a, _)| a).collect(), source)
                }
            };
        let mut installed = Installed::default();
        for algo in &algos {
            if let Some(other) = installed.get(algo.collective) {
                return Err(Error::InvalidArgument(format!(
                    "{source}: two user algorithms for {}: '{}' and '{}' (give one per \
                     collective)",
                    algo.collective,
                    other.name(),
                    algo.name
                )));
            }
            let checked = Checked::new(algo, self.size, source.clone()).map_err(|e| {
                Error::InvalidArgument(format!("{source}: '{}' refused: {e}", algo.name))
            })?;
            installed.add(checked);
        }
        Ok(installed)
    }

    /// Bytes per slot.
    pub fn chunk_bytes(&self) -> usize {
        // Keep slots a multiple of 8 bytes so every element type tiles them.
        (self.buffsize / self.steps.max(1)) & !7
    }

    /// The heartbeat interval in force: the one set, or one eighth of the
    /// timeout within 100 ms to 5 s, so that four missed heartbeats fit in
    /// half the timeout. `None`: heartbeats are off.
    pub fn heartbeat_interval(&self) -> Option<Duration> {
        match self.heartbeat {
            Some(h) if h.is_zero() => None,
            Some(h) => Some(h.max(Duration::from_millis(10))),
            None => {
                Some((self.timeout / 8).clamp(Duration::from_millis(100), Duration::from_secs(5)))
            }
        }
    }

    pub(crate) fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(Error::InvalidArgument(m));
        if self.size == 0 {
            return bad("size must be at least 1".into());
        }
        if self.rank >= self.size {
            return bad(format!(
                "rank {} is out of range for size {}",
                self.rank, self.size
            ));
        }
        if self.steps < 2 {
            return bad(format!(
                "steps = {} but a connection needs at least 2 slots per direction",
                self.steps
            ));
        }
        if self.pipeline_depth >= self.steps {
            return bad(format!(
                "pipeline_depth = {} (FERROCCL_PIPELINE_DEPTH) must be below steps = {} \
                 (FERROCCL_STEPS): a ring pass that deep can wait on itself; 0 lets the \
                 library choose",
                self.pipeline_depth, self.steps
            ));
        }
        if self.chunk_bytes() < 64 {
            return bad(format!(
                "buffsize = {} gives slots of {} bytes; at least 64 are needed",
                self.buffsize,
                self.chunk_bytes()
            ));
        }
        if self.chunk_bytes() > u32::MAX as usize {
            return bad(format!(
                "buffsize = {} gives slots over 4 GiB",
                self.buffsize
            ));
        }
        if !(1..=64).contains(&self.nsocks_per_peer) {
            return bad(format!(
                "nsocks_per_peer = {} must be in 1..=64",
                self.nsocks_per_peer
            ));
        }
        Ok(())
    }
}

/// Resolve `host:port` to a socket address, preferring IPv4.
pub(crate) fn resolve(host: &str, port: u16) -> Result<std::net::SocketAddr> {
    use std::net::ToSocketAddrs;
    let addrs: Vec<_> = (host, port)
        .to_socket_addrs()
        .map_err(|e| Error::Bootstrap(format!("cannot resolve rendezvous host '{host}': {e}")))?
        .collect();
    addrs
        .iter()
        .find(|a| a.is_ipv4())
        .or(addrs.first())
        .copied()
        .ok_or_else(|| Error::Bootstrap(format!("rendezvous host '{host}' resolves to no address")))
}

/// A token every rank of one job derives alike when the launcher set none.
pub(crate) fn derive_token(addr: &str, port: u16, size: usize) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in addr
        .bytes()
        .chain(port.to_le_bytes())
        .chain((size as u64).to_le_bytes())
    {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn with(vars: &[(&str, &str)]) -> Result<Config> {
        let map: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let mut c = Config::new(0, 2, "127.0.0.1", 1, 7)?;
        c.from_env_overrides(&|k| map.get(k).cloned())?;
        Ok(c)
    }

    #[test]
    fn algorithm_file_is_read_from_the_environment_and_checked_at_creation() {
        let c = with(&[("FERROCCL_ALGO_FILE", "/nowhere/x.algo")]).unwrap();
        assert_eq!(
            c.algorithm_file.as_deref(),
            Some(std::path::Path::new("/nowhere/x.algo"))
        );
        let err = c.checked_user_algorithms().unwrap_err().to_string();
        assert!(
            err.contains("FERROCCL_ALGO_FILE=/nowhere/x.algo") && err.contains("cannot read"),
            "{err}"
        );
        assert_eq!(
            with(&[("FERROCCL_ALGO_FILE", "")]).unwrap().algorithm_file,
            None
        );
        assert!(with(&[])
            .unwrap()
            .checked_user_algorithms()
            .unwrap()
            .is_empty());
        // Both ways at once is ambiguous.
        let mut both = with(&[("FERROCCL_ALGO_FILE", "/nowhere/x.algo")]).unwrap();
        both.user_algorithm = Some(crate::algo::user::examples::halving_doubling(2));
        let err = both.checked_user_algorithms().unwrap_err().to_string();
        assert!(err.contains("set one"), "{err}");
        both.algorithm_file = None;
        let installed = both.checked_user_algorithms().unwrap();
        let checked = installed
            .get(crate::algo::user::Collective::AllReduce)
            .unwrap();
        assert_eq!(checked.name(), "halving_doubling");
        assert!(installed
            .get(crate::algo::user::Collective::AllGather)
            .is_none());
    }

    /// Several algorithms in code: one per collective, each checked;
    /// two for one collective are refused naming both.
    #[test]
    fn several_user_algorithms_one_per_collective() {
        use crate::algo::user::examples::{
            halving_doubling, pairwise_reduce_scatter, recursive_doubling_allgather,
        };
        use crate::algo::user::Collective;
        let mut c = with(&[]).unwrap();
        c.user_algorithm = Some(halving_doubling(2));
        c.user_algorithms = vec![recursive_doubling_allgather(2), pairwise_reduce_scatter(2)];
        let installed = c.checked_user_algorithms().unwrap();
        for (collective, name) in [
            (Collective::AllReduce, "halving_doubling"),
            (Collective::AllGather, "recursive_doubling_allgather"),
            (Collective::ReduceScatter, "pairwise_reduce_scatter"),
        ] {
            assert_eq!(installed.get(collective).unwrap().name(), name);
        }
        c.user_algorithms.push(pairwise_reduce_scatter(4));
        let err = c.checked_user_algorithms().unwrap_err().to_string();
        assert!(
            err.contains("two user algorithms for reduce_scatter"),
            "{err}"
        );
    }

    #[test]
    fn env_overrides_apply_and_bad_values_name_the_variable() {
        let c = with(&[
            ("FERROCCL_TIMEOUT", "2.5"),
            ("FERROCCL_NSOCKS_PERPEER", "3"),
            ("FERROCCL_TRANSPORT", "TCP"),
        ])
        .unwrap();
        assert_eq!(c.timeout, Duration::from_millis(2500));
        assert_eq!(c.nsocks_per_peer, 3);
        assert_eq!(c.transport.as_deref(), Some("tcp"));
        let err = with(&[("FERROCCL_BUFFSIZE", "lots")])
            .unwrap_err()
            .to_string();
        assert!(err.contains("FERROCCL_BUFFSIZE"), "{err}");
        let err = with(&[("FERROCCL_TIMEOUT", "-1")]).unwrap_err().to_string();
        assert!(err.contains("FERROCCL_TIMEOUT"), "{err}");
        assert!(with(&[]).unwrap().cma);
        assert!(!with(&[("FERROCCL_CMA", "0")]).unwrap().cma);
        let err = with(&[("FERROCCL_CMA", "maybe")]).unwrap_err().to_string();
        assert!(err.contains("FERROCCL_CMA"), "{err}");
        assert!(with(&[]).unwrap().cma_push);
        assert!(!with(&[("FERROCCL_CMA_PUSH", "0")]).unwrap().cma_push);
        let err = with(&[("FERROCCL_CMA_PUSH", "no way")])
            .unwrap_err()
            .to_string();
        assert!(err.contains("FERROCCL_CMA_PUSH"), "{err}");
        assert!(with(&[]).unwrap().spread);
        assert!(!with(&[("FERROCCL_SPREAD", "0")]).unwrap().spread);
        assert!(
            !with(&[("FERROCCL_BIASED_LOCKS", "0")])
                .unwrap()
                .biased_locks
        );
        assert!(
            with(&[("FERROCCL_BIASED_LOCKS", "1")])
                .unwrap()
                .biased_locks
        );
        let err = with(&[("FERROCCL_BIASED_LOCKS", "yes please")])
            .unwrap_err()
            .to_string();
        assert!(err.contains("FERROCCL_BIASED_LOCKS"), "{err}");
        let err = with(&[("FERROCCL_SPREAD", "2")]).unwrap_err().to_string();
        assert!(err.contains("FERROCCL_SPREAD"), "{err}");
        assert!(with(&[("FERROCCL_COPY_PAGES", "1")]).is_ok());
        let err = with(&[("FERROCCL_COPY_PAGES", "2")])
            .unwrap_err()
            .to_string();
        assert!(err.contains("FERROCCL_COPY_PAGES"), "{err}");
        assert!(with(&[("FERROCCL_HOST_CPUS", "3")]).is_ok());
        for bad in ["0", "-2", "two"] {
            let err = with(&[("FERROCCL_HOST_CPUS", bad)])
                .unwrap_err()
                .to_string();
            assert!(err.contains("FERROCCL_HOST_CPUS"), "{err}");
        }
        assert!(!with(&[]).unwrap().device_async);
        assert!(
            with(&[("FERROCCL_DEVICE_ASYNC", "1")])
                .unwrap()
                .device_async
        );
        let err = with(&[("FERROCCL_DEVICE_ASYNC", "maybe")])
            .unwrap_err()
            .to_string();
        assert!(err.contains("FERROCCL_DEVICE_ASYNC"), "{err}");
    }

    #[test]
    fn ib_settings_are_read_with_their_nccl_names_and_checked() {
        assert_eq!(with(&[]).unwrap().ib.qps_per_connection, 1);
        let c = with(&[("FERROCCL_IB_QPS_PER_CONNECTION", "4")]).unwrap();
        assert_eq!(c.ib.qps_per_connection, 4);
        let c = with(&[("NCCL_IB_QPS_PER_CONNECTION", "3")]).unwrap();
        assert_eq!(c.ib.qps_per_connection, 3);
        for (var, bad) in [
            ("FERROCCL_IB_QPS_PER_CONNECTION", "0"),
            ("FERROCCL_IB_QPS_PER_CONNECTION", "17"),
            ("NCCL_IB_QPS_PER_CONNECTION", "many"),
            ("FERROCCL_IB_TIMEOUT", "40"),
            ("FERROCCL_IB_HCA", "mlx5_0:x"),
        ] {
            match with(&[(var, bad)]) {
                Err(Error::Env(msg)) => assert!(msg.contains(var), "{var}={bad}: {msg}"),
                other => panic!("{var}={bad}: {other:?}"),
            }
        }
    }

    #[test]
    fn heartbeats_follow_the_timeout_unless_set() {
        let c = with(&[("FERROCCL_TIMEOUT", "3")]).unwrap();
        assert_eq!(c.heartbeat_interval(), Some(Duration::from_millis(375)));
        let c = with(&[("FERROCCL_TIMEOUT", "0.2")]).unwrap();
        assert_eq!(c.heartbeat_interval(), Some(Duration::from_millis(100)));
        let c = with(&[]).unwrap();
        assert_eq!(c.heartbeat_interval(), Some(Duration::from_secs(5)));
        let c = with(&[("FERROCCL_HEARTBEAT_MS", "250")]).unwrap();
        assert_eq!(c.heartbeat_interval(), Some(Duration::from_millis(250)));
        let c = with(&[("FERROCCL_HEARTBEAT_MS", "0")]).unwrap();
        assert_eq!(c.heartbeat_interval(), None);
        for bad in ["-1", "fast", "3600001"] {
            let err = with(&[("FERROCCL_HEARTBEAT_MS", bad)])
                .unwrap_err()
                .to_string();
            assert!(err.contains("FERROCCL_HEARTBEAT_MS"), "{bad}: {err}");
        }
    }

    #[test]
    fn algorithm_names_parse_in_any_case() {
        assert_eq!(with(&[]).unwrap().algorithm, None);
        for (v, want) in [
            ("Ring", Algorithm::Ring),
            ("TREE", Algorithm::Tree),
            ("one_shot", Algorithm::OneShot),
            ("OneShot", Algorithm::OneShot),
            ("two-shot", Algorithm::TwoShot),
            ("recursive_doubling", Algorithm::RecursiveDoubling),
            ("RecursiveDoubling", Algorithm::RecursiveDoubling),
            (" tree ", Algorithm::Tree),
            ("hier", Algorithm::Hierarchical),
            ("Hierarchical", Algorithm::Hierarchical),
        ] {
            assert_eq!(
                with(&[("FERROCCL_ALGO", v)]).unwrap().algorithm,
                Some(want),
                "{v}"
            );
        }
        assert_eq!(with(&[("FERROCCL_ALGO", "")]).unwrap().algorithm, None);
        let err = with(&[("FERROCCL_ALGO", "CollNet")])
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("FERROCCL_ALGO") && err.contains("tree"),
            "{err}"
        );
        for a in Algorithm::ALL {
            assert_eq!(Algorithm::from_name(a.name()), Some(a));
        }
    }

    #[test]
    fn simd_levels_are_checked_by_name() {
        for v in ["baseline", "AVX2", " avx512 ", ""] {
            assert!(with(&[("FERROCCL_SIMD", v)]).is_ok(), "{v}");
        }
        let err = with(&[("FERROCCL_SIMD", "sse4")]).unwrap_err().to_string();
        assert!(
            err.contains("FERROCCL_SIMD='sse4'") && err.contains("avx2"),
            "{err}"
        );
    }

    #[test]
    fn validation_rejects_nonsense() {
        let mut c = with(&[]).unwrap();
        c.rank = 2;
        assert!(c.validate().is_err());
        let mut c = with(&[]).unwrap();
        c.steps = 1;
        assert!(c.validate().is_err());
        assert!(with(&[]).unwrap().validate().is_ok());
        // A ring pass as deep as the slots could deadlock (algo::sim's
        // a_ring_deeper_than_its_slots_deadlocks).
        let mut c = with(&[("FERROCCL_STEPS", "4"), ("FERROCCL_PIPELINE_DEPTH", "4")]).unwrap();
        let err = c.validate().unwrap_err().to_string();
        assert!(
            err.contains("FERROCCL_PIPELINE_DEPTH") && err.contains("steps = 4"),
            "{err}"
        );
        c.pipeline_depth = 3;
        assert!(c.validate().is_ok());
        assert!(with(&[("FERROCCL_PIPELINE_DEPTH", "two")]).is_err());
    }
}
