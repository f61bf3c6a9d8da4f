//! Joining a job and building a communicator: the rendezvous, the
//! transports' listeners and the first connections (a member that dies
//! during set-up is named, not waited for), the progress and watcher
//! threads, the tuner's calibration and the control pages; split; and
//! tear-down.

use super::failure::spawn_watcher;
use super::order::{IssueState, Job, Turns};
use super::{lock, Buffers, Communicator, Inner};
use crate::algo::Algorithm;
use crate::bootstrap::{self, Store};
use crate::coll::{self, CollCall, CollKind};
use crate::config::Config;
use crate::element::ReduceOp;
use crate::error::{Error, Result};
use crate::exec::{self, Connector, Io, Links, MemberWatch};
use crate::plan;
use crate::plan::tune::LinkModel;
use crate::window::Windows;
use ferroccl_transport::{AbortHandle, ListenConfig};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Instant;

/// Owns the rendezvous of the job: the store client, and on the rank that
/// hosts it the server. Shared by a communicator and every communicator split
/// from it; the last one to go says goodbye so the job does not report this
/// rank as failed.
pub(crate) struct Rendezvous {
    pub(crate) store: Arc<dyn Store>,
    pub(crate) _server: Option<bootstrap::TcpStoreServer>,
    /// Where each member of this rendezvous (by global rank) can be met
    /// again without it (`Communicator::shrink`), read when a communicator
    /// is built; `None` where that rank has no meeting point.
    pub(crate) meeting: Mutex<std::collections::HashMap<usize, Option<std::net::SocketAddr>>>,
}
impl Rendezvous {
    /// A rendezvous over `store` (and, on its host, `server`) for global
    /// rank `rank`, which publishes where this process can be met again.
    pub(crate) fn new(
        store: Arc<dyn Store>,
        server: Option<bootstrap::TcpStoreServer>,
        rank: usize,
    ) -> Result<Rendezvous> {
        let address = match bootstrap::recovery::meeting_point() {
            Ok(point) => point.address(store.local_ip()).to_string(),
            Err(e) => {
                tracing::warn!(rank, "no meeting point for shrink: {e}");
                String::new()
            }
        };
        store.set(&bootstrap::recovery::key(rank), address.as_bytes())?;
        Ok(Rendezvous {
            store,
            _server: server,
            meeting: Mutex::new(std::collections::HashMap::new()),
        })
    }

    /// Read the meeting points of `members` (global ranks) not read yet.
    fn learn_meeting_points(&self, members: &[usize], deadline: Instant) -> Result<()> {
        for &g in members {
            if lock(&self.meeting).contains_key(&g) {
                continue;
            }
            let value = self.store.get(&bootstrap::recovery::key(g), deadline)?;
            let addr = std::str::from_utf8(&value)
                .ok()
                .and_then(|s| s.parse().ok());
            lock(&self.meeting).insert(g, addr);
        }
        Ok(())
    }
}
impl Drop for Rendezvous {
    fn drop(&mut self) {
        self.store.goodbye();
    }
}
impl Communicator {
    /// Join a job with explicit settings: rank 0 hosts the rendezvous at
    /// `config.master_addr:master_port`, every rank connects to it.
    pub fn init(config: Config) -> Result<Communicator> {
        crate::logging::init();
        config.validate()?;
        if config.master_port == 0 {
            // Rank 0 would listen on a port of the kernel's choosing that
            // no rank can know, and every rank would wait its whole
            // timeout to reach port 0.
            return Err(Error::InvalidArgument(format!(
                "rank {}: rendezvous port 0 at {}: name the port rank 0 listens on \
                 (MASTER_PORT), one free on its host",
                config.rank, config.master_addr
            )));
        }
        let deadline = Instant::now() + config.timeout;
        let addr = crate::config::resolve(&config.master_addr, config.master_port)?;
        let server = if config.rank == 0 {
            let bind = std::net::SocketAddr::new(
                if addr.ip().is_loopback() {
                    addr.ip()
                } else {
                    std::net::Ipv4Addr::UNSPECIFIED.into()
                },
                addr.port(),
            );
            Some(bootstrap::TcpStoreServer::start(
                bind,
                config.token,
                config.size,
            )?)
        } else {
            None
        };
        let store = bootstrap::TcpStore::connect_with_heartbeat(
            addr,
            config.token,
            config.rank,
            deadline,
            config.heartbeat_interval(),
        )?;
        let rendezvous = Arc::new(Rendezvous::new(Arc::new(store), server, config.rank)?);
        let global: Vec<usize> = (0..config.size).collect();
        Self::build(config, rendezvous, global, 1)
    }
    /// Join the job described by the launcher's environment: torchrun or
    /// ferroccl-run (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT), Open MPI
    /// (OMPI_COMM_WORLD_*) or Slurm (SLURM_PROCID, ...). FERROCCL_* variables
    /// tune it (see [`Config::from_env_overrides`]).
    pub fn from_env() -> Result<Communicator> {
        let info = bootstrap::env::detect_process_env()?;
        let config = Config::from_launch(&info)?;
        if let Some(t) = config
            .transport
            .as_deref()
            .filter(|t| config.size > 1 && crate::transports::IN_PROCESS.contains(t))
        {
            // It would wait out the timeout for peers it cannot reach.
            return Err(Error::Env(format!(
                "FERROCCL_TRANSPORT={t} joins only ranks that are threads of one process; \
                 ranks started by a launcher are processes (use shm or tcp, or leave it unset)"
            )));
        }
        Self::init(config)
    }
    /// Build a communicator over an existing rendezvous (used by `init`,
    /// `split` and the in-process test harness).
    pub(crate) fn build(
        config: Config,
        rendezvous: Arc<Rendezvous>,
        global_ranks: Vec<usize>,
        comm_id: u64,
    ) -> Result<Communicator> {
        crate::logging::init();
        let (rank, size) = (config.rank, config.size);
        // Before any connection: every rank reads and checks the same
        // algorithm alike, so a refusal is the same error on every rank.
        let user = config.checked_user_algorithms()?;
        // Shared with the set-up watch thread below.
        let abort = Arc::new(AbortHandle::new());
        let transports = crate::transports::select(&config)?;
        let listen = ListenConfig {
            rank,
            size,
            token: config.token,
            comm_id,
            chunk_bytes: config.chunk_bytes(),
            steps: config.steps,
            ifname: config.socket_ifname.clone(),
            bind_addr: None,
            nsocks: config.nsocks_per_peer,
        };
        // A member that dies during set-up is named, not waited for: the
        // rendezvous waits consult `watch`, and a thread fires this
        // communicator's abort (ending transport waits) when it hears.
        let watch = Arc::new(MemberWatch::new(
            &*rendezvous.store,
            comm_id,
            rank,
            global_ranks.clone(),
        ));
        let (setup_done, setup_running) = crossbeam_channel::bounded::<()>(0);
        let setup_thread = {
            let (watch, abort) = (watch.clone(), abort.clone());
            std::thread::Builder::new()
                .name(format!("ferroccl-setup-{rank}"))
                .spawn(move || loop {
                    match setup_running.recv_timeout(std::time::Duration::from_millis(50)) {
                        Err(crossbeam_channel::RecvTimeoutError::Timeout) => {
                            if watch.failed().is_some() {
                                abort.abort();
                                return;
                            }
                        }
                        _ => return,
                    }
                })?
        };
        let closers = Arc::new(Mutex::new(Vec::new()));
        let set_up = || -> Result<Links> {
            let connector = Connector::new(
                &listen,
                rendezvous.store.clone(),
                watch.clone(),
                transports,
                crate::topo::host_info(),
                &abort.signal(),
                config.timeout,
            )?;
            let mut links = Links::new(connector, closers.clone());
            // Ring neighbours now, so that a broken network shows at
            // start-up; other peers when first needed.
            if size > 1 {
                let (next, prev) = ((rank + 1) % size, (rank + size - 1) % size);
                // The lower rank connects and the higher accepts; order the
                // two set-ups so no rank accepts while its partner also
                // accepts.
                let mut order = [next, prev];
                order.sort_unstable();
                for peer in order {
                    links.ensure(0, peer)?;
                }
            }
            Ok(links)
        };
        let links = set_up();
        drop(setup_done);
        // It returns at once now; joined, so that no thread of a set-up
        // outlives it.
        let _ = setup_thread.join();
        // Where the members can be met again should the rendezvous go
        // (shrink); read now, while it is surely there.
        let links = links.and_then(|links| {
            rendezvous.learn_meeting_points(&global_ranks, Instant::now() + config.timeout)?;
            Ok(links)
        });
        let links = links.map_err(|err| {
            watch
                .error_within("communicator set-up", exec::WAIT_SLICE)
                .unwrap_or(err)
        })?;
        let (job_tx, job_rx) = crossbeam_channel::unbounded::<Job>();
        let progress_thread = std::thread::Builder::new()
            .name(format!("ferroccl-progress-{rank}"))
            .spawn(move || {
                for job in job_rx {
                    job();
                }
            })?;
        let (stop_tx, stop_rx) = crossbeam_channel::bounded::<()>(0);
        let abort_signal = abort.signal();
        let shared = crate::transports::shared_memory(&config);
        let hosts = Arc::new(links.host_map());
        // Calls from one thread take no locked instruction to issue and
        // end their turns (src/bias.rs).
        let biased = config.biased_locks && crate::bias::asymmetric();
        let inner = Arc::new(Inner {
            rank,
            size,
            global_ranks,
            comm_id,
            chunk_bytes: config.chunk_bytes(),
            config,
            rendezvous,
            links: Mutex::new(links),
            turns: Turns {
                issued: crate::bias::BiasedLock::with_bias(IssueState::default(), biased),
                served: AtomicU64::new(0),
                waiting: AtomicUsize::new(0),
                sleep: Mutex::new(()),
                turn: Condvar::new(),
            },
            abort,
            failure: Mutex::new(None),
            failed: AtomicBool::new(false),
            mismatch_heard: Mutex::new(None),
            heard_later: Mutex::new(std::collections::VecDeque::new()),
            went_later: Mutex::new(std::collections::VecDeque::new()),
            mismatch_flag: AtomicBool::new(false),
            refused_here: Mutex::new(std::collections::VecDeque::new()),
            closers,
            progress: Mutex::new(Some(job_tx)),
            progress_thread: Mutex::new(Some(progress_thread)),
            watcher_stop: Mutex::new(Some(stop_tx)),
            watcher_thread: Mutex::new(None),
            splits: AtomicU64::new(0),
            shrinks: AtomicU64::new(0),
            children: Mutex::new(Vec::new()),
            known_failed: Mutex::new(std::collections::BTreeSet::new()),
            issued: Arc::new(AtomicU64::new(0)),
            user,
            model: Mutex::new(LinkModel::DEFAULT),
            intra_model: Mutex::new(LinkModel::DEFAULT),
            hosts,
            tuned: Mutex::new(std::collections::HashSet::new()),
            plans: super::plans::Plans::new(),
            windows: Arc::new(crate::bias::BiasedLock::with_bias(
                Windows::default(),
                biased,
            )),
            direct_calls: AtomicU64::new(0),
            routing: super::routes::Routing::new(size),
            gates: Mutex::new(Vec::new()),
            exec_paths: Mutex::new(Vec::new()),
            exec_setups: AtomicU64::new(0),
            shared,
            control: std::sync::OnceLock::new(),
            abort_signal,
        });
        if let Some(&global) = inner.global_ranks.get(rank) {
            inner.rendezvous.store.register_progress(
                comm_id,
                global,
                Arc::downgrade(&inner.issued),
            );
        }
        let watcher = spawn_watcher(&inner, stop_rx)?;
        *lock(&inner.watcher_thread) = Some(watcher);
        let comm = Communicator { inner };
        if comm.inner.config.calibrate && comm.inner.size > 1 {
            comm.calibrate()?;
        }
        // The set-up's own calls are numbered apart from the user's: the
        // user's first call is #1 whatever came before.
        if comm.inner.config.checkin {
            comm.create_control()?;
        }
        Ok(comm)
    }
    /// Split into sub-communicators: ranks passing the same `color` form one,
    /// ordered by `key` (ties by rank). A negative color takes no part and
    /// gets `None`. Every rank must call it (it is a collective).
    pub fn split(&self, color: i32, key: i32) -> Result<Option<Communicator>> {
        let mine = [i64::from(color), i64::from(key)];
        let mut all = vec![0i64; 2 * self.inner.size];
        let call = CollCall {
            internal: true,
            ..CollCall::new(CollKind::AllGather, 2, 2, all.len())
        };
        self.collective(
            &call,
            Buffers::OutOfPlace {
                send: &mine,
                recv: &mut all,
            },
        )?;
        let split_index = self.inner.splits.fetch_add(1, Ordering::SeqCst);
        if color < 0 {
            return Ok(None);
        }
        let mut members: Vec<(i64, usize)> = (0..self.inner.size)
            .filter(|&r| all[2 * r] == i64::from(color))
            .map(|r| (all[2 * r + 1], r))
            .collect();
        members.sort_unstable();
        let rank = members
            .iter()
            .position(|&(_, r)| r == self.inner.rank)
            .ok_or_else(|| {
                Error::Aborted(Some(
                    "split: this rank is missing from its own color".into(),
                ))
            })?;
        let global: Vec<usize> = members
            .iter()
            .map(|&(_, r)| self.inner.global_ranks[r])
            .collect();
        let comm_id = split_id(self.inner.comm_id, split_index, color);
        let mut config = self.inner.config.clone();
        config.rank = rank;
        config.size = members.len();
        let child = Self::build(config, self.inner.rendezvous.clone(), global, comm_id)?;
        // Kept weakly, for `abort_with_splits` only: the child lives on
        // its own.
        let mut splits = lock(&self.inner.children);
        splits.retain(|c| c.strong_count() > 0);
        splits.push(Arc::downgrade(&child.inner));
        Ok(Some(child))
    }
    /// Choose how a buffer not aligned like a shared-memory slot is copied
    /// into the slot and out of it: time a 128 KiB broadcast from rank 0
    /// (its root copies into slots, the others out of them) from such a
    /// buffer with each way, in turns, and keep `memcpy` unless the loop
    /// is clearly faster by every rank's slowest time (`agree`: an
    /// allreduce of MAX). Only where every rank is on this host and the
    /// transport is shared memory, and FERROCCL_COPY did not choose. Which
    /// copy wins depends on where the ranks run: on the AMD EPYC VM of
    /// 2026-11-30 the loop was 1.7-1.8x faster while its two CPUs shared a
    /// cache and `memcpy` 3-4.5x faster when they did not
    /// (docs/performance-log.md, "The copy into a slot").
    fn calibrate_shared_copy(
        &self,
        agree: &dyn Fn(&mut [f32], ReduceOp) -> Result<()>,
    ) -> Result<()> {
        let shm = matches!(self.inner.config.transport.as_deref(), None | Some("shm"));
        if !shm
            || self.inner.hosts.hosts() > 1
            || ferroccl_transport::shared_copy_from_env().is_some()
        {
            return Ok(());
        }
        const BYTES: usize = 128 << 10;
        let mut raw = vec![0u8; BYTES + 128];
        // 16 bytes past a 64-byte line: not aligned like a slot's payload.
        let off = (64 - raw.as_ptr() as usize % 64) % 64 + 16;
        let buf = &mut raw[off..off + BYTES];
        let call = CollCall {
            root: Some(0),
            in_place: true,
            internal: true,
            ..CollCall::new(CollKind::Broadcast, BYTES, BYTES, BYTES)
        };
        let mut best = [f64::INFINITY; 2];
        for _ in 0..3 {
            for (way, memcpy) in [(0, true), (1, false)] {
                ferroccl_transport::choose_shared_copy(memcpy);
                self.collective::<u8>(&call, Buffers::InPlace(&mut *buf))?;
                for _ in 0..4 {
                    let start = Instant::now();
                    self.collective::<u8>(&call, Buffers::InPlace(&mut *buf))?;
                    best[way] = best[way].min(start.elapsed().as_secs_f64() * 1e6);
                }
            }
        }
        let mut agreed = [best[0] as f32, best[1] as f32];
        agree(&mut agreed, ReduceOp::Max)?;
        // The loop only where it is clearly faster: in a tie memcpy, which
        // was level or ahead in every collective measured in turns with
        // the CPUs sharing a cache, and 3-4.5x ahead where they did not.
        let memcpy = agreed[1] >= 0.85 * agreed[0];
        ferroccl_transport::choose_shared_copy(memcpy);
        tracing::info!(
            rank = self.inner.rank,
            "copy into and out of a slot: {} (a 128 KiB broadcast from a buffer not aligned like the \
             slot: memcpy {:.1} us, loop {:.1} us)",
            if memcpy { "memcpy" } else { "loop" },
            agreed[0],
            agreed[1]
        );
        Ok(())
    }
    /// Measure this communicator's links and agree on the tuner's constants:
    /// the latency of a one-element ring allreduce, the bandwidth of a
    /// 1 MiB one, the local reduction speed; the slowest rank's figures win,
    /// so every rank's model (and so every choice) is the same. Runs on
    /// every rank at creation (a collective); turn off with
    /// FERROCCL_CALIBRATE=0.
    pub(super) fn calibrate(&self) -> Result<()> {
        let n = self.inner.size as f64;
        let hops = 2.0 * (n - 1.0);
        // Always the ring, whatever the model (not calibrated yet) or the
        // config would choose: it is what the figures describe.
        let ring = |buf: &mut [f32], op: ReduceOp| -> Result<()> {
            let n = buf.len();
            let call = CollCall {
                internal: true,
                ..CollCall::all_reduce_in_place(n, op)
            };
            let inner = &self.inner;
            let geometry = plan::geometry(
                CollKind::AllReduce,
                Algorithm::Ring,
                (inner.rank, inner.size),
                n,
                std::mem::size_of::<f32>(),
                inner.chunk_bytes,
            );
            let plan = coll::plan(&call, geometry, Algorithm::Ring)?;
            self.run_blocking(self.spec::<f32>(&call), &plan, Io::in_place(buf, 0, 0))
        };
        // Each figure is the best of several timed runs after a warm-up:
        // the minimum is what the links can do; the noise of a shared
        // machine only ever adds.
        let best_of = |reps: usize, buf: &mut [f32]| -> Result<f64> {
            let mut best = f64::INFINITY;
            for _ in 0..reps {
                let start = Instant::now();
                ring(buf, ReduceOp::Sum)?;
                best = best.min(start.elapsed().as_secs_f64() * 1e6);
            }
            Ok(best)
        };
        let mut one = [0f32; 1];
        best_of(4, &mut one)?;
        let alpha_us = best_of(16, &mut one)? / hops;

        let reduce_gbps = measure_reduce_gbps();
        let copy_gbps = measure_copy_gbps();
        let mut big = vec![0f32; (1 << 20) / 4];
        let bytes = (big.len() * 4) as f64;
        best_of(2, &mut big)?;
        let t_us = best_of(4, &mut big)?;
        let moving_us =
            (t_us - hops * alpha_us - (n - 1.0) / n * bytes / (reduce_gbps * 1e3)).max(t_us * 0.1);
        let beta_gbps = 2.0 * (n - 1.0) / n * bytes / moving_us / 1e3;

        // Whether this rank's host has more ranks than CPUs.
        let here = self.inner.hosts.members_of(self.inner.rank).len();
        let shared_cores = ferroccl_transport::wait::ranks_share_cpus(here);
        // Agree: the largest latency, the smallest speeds; CPUs shared if
        // on any host.
        let mut agreed = [
            alpha_us as f32,
            (1.0 / beta_gbps) as f32,
            (1.0 / reduce_gbps) as f32,
            (1.0 / copy_gbps) as f32,
            f32::from(u8::from(shared_cores)),
        ];
        ring(&mut agreed, ReduceOp::Max)?;
        self.inner.routing.set_shared_cores(agreed[4] > 0.0);
        let model = LinkModel {
            alpha_us: f64::from(agreed[0]).max(0.1),
            beta_gbps: (1.0 / f64::from(agreed[1])).clamp(0.01, 1000.0),
            reduce_gbps: (1.0 / f64::from(agreed[2])).clamp(0.01, 1000.0),
        };
        *lock(&self.inner.model) = model;
        // Inside a host a frame is copied into a slot and out again: half
        // the copy speed. Its latency is not measured apart from the
        // network's (the ring above mixes both), so it keeps the slowest
        // link's: the model then favours the hierarchical algorithm by the
        // bytes it keeps off the network, never by latency it assumes.
        let intra = LinkModel {
            beta_gbps: (0.5 / f64::from(agreed[3])).clamp(0.01, 1000.0),
            ..model
        };
        *lock(&self.inner.intra_model) = if self.inner.hosts.hosts() > 1 {
            intra
        } else {
            model
        };
        // Plans chosen under the old model (none in practice) are stale.
        self.inner.plans.clear();
        self.calibrate_shared_copy(&ring)?;
        tracing::info!(
            rank = self.inner.rank,
            "tuner: calibrated on {} ranks: alpha {:.1} us, beta {:.2} GB/s, reduce {:.1} GB/s \
             ({} kernels; the CPU has {}); this host: {} ranks, CPUs for them: {} \
             (FERROCCL_HOST_CPUS, else the online CPUs or a wider process mask){}",
            self.inner.size,
            model.alpha_us,
            model.beta_gbps,
            model.reduce_gbps,
            crate::reduce::SimdLevel::current(),
            crate::reduce::SimdLevel::detected(),
            here,
            ferroccl_transport::wait::host_cpus(),
            if agreed[4] > 0.0 {
                "; a host has more ranks than CPUs"
            } else {
                ""
            }
        );
        if self.inner.hosts.hosts() > 1 {
            tracing::info!(
                rank = self.inner.rank,
                "tuner: ranks on {} hosts (largest {} ranks); a link inside a host costed at \
                 {:.2} GB/s (half this machine's copy speed)",
                self.inner.hosts.hosts(),
                self.inner.hosts.largest(),
                lock(&self.inner.intra_model).beta_gbps
            );
        }
        Ok(())
    }
    /// The tuner's constants (measured at creation, agreed by all ranks).
    pub fn link_model(&self) -> LinkModel {
        *lock(&self.inner.model)
    }
}

/// A communicator id for a split that every member computes alike and that
/// differs from its parent's and its siblings'.
fn split_id(parent: u64, index: u64, color: i32) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for v in [parent, index, color as u32 as u64, 0x0053_504c_4954] {
        for b in v.to_le_bytes() {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    h | 2
}
impl Drop for Inner {
    fn drop(&mut self) {
        // A peer waiting at a check-in learns that this rank is gone (after
        // a failure it learns that from the job's failure report instead).
        if let Some(control) = self.control.get() {
            if !self.has_failed() {
                exec::leave(control, self.rank);
            }
        }
        lock(&self.watcher_stop).take();
        // The watcher holds the communicator only weakly, so it is not
        // working on it now unless this drop runs on it (its upgrade was
        // the last reference); else it returns at the stop.
        if let Some(handle) = lock(&self.watcher_thread).take() {
            if handle.thread().id() != std::thread::current().id() {
                let _ = handle.join();
            }
        }
        lock(&self.progress).take();
        if let Some(handle) = lock(&self.progress_thread).take() {
            if handle.thread().id() != std::thread::current().id() {
                let _ = handle.join();
            }
        }
        // Every device call's job has raised its gate; this covers any
        // that did not run.
        self.raise_gates();
        // Dropping the halves flushes frames still queued for peers (bounded
        // by the transport) and says goodbye; `close()` would cut them off.
        // The closers are for failure and abort only.
        lock(&self.links).clear();
        // The closers hold the last references to the connections: let
        // them go before the abort fires, so a connection still owed to a
        // peer (shm frames the peer has not mapped yet) can wait for it.
        lock(&self.closers).clear();
        self.abort.abort();
        // This member is done with the communicator's rendezvous keys; the
        // last member's release removes them (docs/reliability.md,
        // "What a communicator holds"). After a failure a member may never
        // release, so the keys stay, and the rendezvous may be gone: no
        // round trip to it then.
        if !self.has_failed() {
            self.rendezvous
                .store
                .release(&exec::key_scope(self.comm_id), self.size);
        }
    }
}

/// Speed of a plain copy on this machine, GB/s, on a 256 KiB block (in
/// cache, as slices are): what a shared-memory link inside a host is
/// costed from (a frame is copied into a slot and out again). The caller
/// agrees it with the other ranks.
fn measure_copy_gbps() -> f64 {
    let n = 256 << 10;
    let src = vec![1u8; n];
    let mut dst = vec![0u8; n];
    dst.copy_from_slice(&src);
    let start = std::time::Instant::now();
    const REPS: u32 = 8;
    for _ in 0..REPS {
        std::hint::black_box(&mut dst).copy_from_slice(std::hint::black_box(&src));
    }
    let secs = start.elapsed().as_secs_f64().max(1e-9);
    n as f64 * f64::from(REPS) / secs / 1e9
}

/// Speed of the f32 sum kernel on this machine, GB/s of output, on a
/// 256 KiB block (in cache, as slices are). The one measurement here: the
/// caller agrees it with the other ranks.
fn measure_reduce_gbps() -> f64 {
    let n = (256 << 10) / 4;
    let src = vec![1.0f32; n];
    let mut dst = vec![0.0f32; n];
    crate::reduce::reduce_into(crate::ReduceOp::Sum, &mut dst, &src);
    let start = std::time::Instant::now();
    const REPS: u32 = 8;
    for _ in 0..REPS {
        crate::reduce::reduce_into(crate::ReduceOp::Sum, std::hint::black_box(&mut dst), &src);
    }
    let secs = start.elapsed().as_secs_f64().max(1e-9);
    (n * 4) as f64 * f64::from(REPS) / secs / 1e9
}

#[cfg(test)]
mod tests {
    //! The release of a communicator's rendezvous keys against the order
    //! in which its members come and go.
    use super::*;
    use crate::bootstrap::{FailureFeed, FailureReport, MemoryStore, Progress};
    use std::sync::Weak;
    use std::time::Duration;

    /// A store whose reads of host identities wait until `open` is set:
    /// the rank that uses it is held in its set-up, after it published its
    /// own keys and before it read the others'.
    struct LateStore {
        store: Arc<MemoryStore>,
        open: Arc<(Mutex<bool>, Condvar)>,
    }

    impl Store for LateStore {
        fn set(&self, key: &str, value: &[u8]) -> Result<()> {
            self.store.set(key, value)
        }
        fn get(&self, key: &str, deadline: Instant) -> Result<Vec<u8>> {
            if key.contains("/host/") {
                let (open, turned) = &*self.open;
                let mut is_open = lock(open);
                while !*is_open {
                    let left = deadline.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        return Err(Error::Bootstrap("the gate never opened".into()));
                    }
                    is_open = turned.wait_timeout(is_open, left).unwrap().0;
                }
            }
            self.store.get(key, deadline)
        }
        fn report(&self, report: FailureReport) {
            self.store.report(report)
        }
        fn failures(&self) -> FailureFeed {
            self.store.failures()
        }
        fn goodbye(&self) {}
        fn release(&self, scope: &str, parties: usize) {
            self.store.release(scope, parties)
        }
        fn register_progress(&self, comm_id: u64, rank: usize, issued: Weak<AtomicU64>) {
            self.store.register_progress(comm_id, rank, issued)
        }
        fn ask_progress(&self, comm_id: u64, members: &[usize], deadline: Instant) -> Progress {
            self.store.ask_progress(comm_id, members, deadline)
        }
    }

    /// Members 0 and 1 of a 4-rank communicator finish their set-up and
    /// drop it while member 2 has not yet read the others' host identities
    /// (member 3 waits for member 2's connection): member 2 still finds
    /// every key, both late members finish their set-up, and the keys go
    /// only when the last member drops the communicator.
    #[test]
    fn a_late_member_finds_the_keys_of_members_that_left() {
        let store = MemoryStore::new();
        let open = Arc::new((Mutex::new(false), Condvar::new()));
        let (left_tx, left_rx) = crossbeam_channel::unbounded::<usize>();
        let n = 4;
        let config = |rank: usize| {
            let mut c = Config::new(rank, n, "127.0.0.1", 0, 0x1a7e).expect("config");
            // TCP: its listener's own thread takes a handshake, so members
            // 0 and 1 connect to member 2 while it is held.
            c.transport = Some("tcp".into());
            c.calibrate = false;
            // The control pages are made together (a collective): off, so
            // that set-up is connections alone.
            c.checkin = false;
            c.timeout = Duration::from_secs(30);
            c
        };
        std::thread::scope(|s| {
            let late: Vec<_> = (2..n)
                .map(|rank| {
                    let store: Arc<dyn Store> = if rank == 2 {
                        Arc::new(LateStore {
                            store: store.clone(),
                            open: open.clone(),
                        })
                    } else {
                        store.clone()
                    };
                    let config = config(rank);
                    s.spawn(move || {
                        let rendezvous = Arc::new(Rendezvous::new(store, None, rank)?);
                        Communicator::build(config, rendezvous, (0..n).collect(), 7)
                            .map(|comm| (comm.rank(), comm.size()))
                    })
                })
                .collect();
            for rank in 0..2 {
                let (store, config, left) = (store.clone(), config(rank), left_tx.clone());
                s.spawn(move || {
                    let rendezvous =
                        Arc::new(Rendezvous::new(store, None, rank).expect("a rendezvous"));
                    let comm = Communicator::build(config, rendezvous, (0..n).collect(), 7)
                        .expect("an early member's set-up");
                    drop(comm);
                    left.send(rank).unwrap();
                });
            }
            for _ in 0..2 {
                left_rx
                    .recv_timeout(Duration::from_secs(60))
                    .expect("members 0 and 1 finish and leave");
            }
            // Two of four released: every key is there (a host identity and
            // a TCP address of each member), beside the job-wide meeting
            // point of each process (shrink), which no communicator owns.
            assert_eq!(store.key_count(), 2 * n + n);
            *lock(&open.0) = true;
            open.1.notify_all();
            for (i, h) in late.into_iter().enumerate() {
                let got = h.join().unwrap().expect("a late member's set-up");
                assert_eq!(got, (2 + i, n));
            }
        });
        // Every member dropped the communicator: nothing of it is left,
        // only each process's meeting point.
        assert_eq!(store.key_count(), n);
    }
}
