//! Failures with ranks as threads: bad arguments, ranks that leave, abort,
//! mismatched calls, timeouts and bad configuration. Each test checks the
//! error's variant and fields (which rank, which call and its number) and
//! that it came in bounded time.

use ferroccl::testing::run_ranks_with;
use ferroccl::{Communicator, Config, Error, ReduceOp};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

/// Where rank threads wait for each other before dropping their
/// communicators. Unlike `std::sync::Barrier` it gives up after a while, so
/// a rank that panicked before arriving fails the test instead of hanging it.
struct Gate {
    arrived: Mutex<usize>,
    all_in: Condvar,
    n: usize,
}

impl Gate {
    fn new(n: usize) -> Gate {
        Gate {
            arrived: Mutex::new(0),
            all_in: Condvar::new(),
            n,
        }
    }

    fn wait(&self) {
        let mut arrived = self.arrived.lock().unwrap_or_else(|p| p.into_inner());
        *arrived += 1;
        self.all_in.notify_all();
        let _ = self
            .all_in
            .wait_timeout_while(arrived, Duration::from_secs(60), |a| *a < self.n);
    }
}

/// Run `f` on this thread; if it has not returned after `limit` (a hang,
/// which would stop the whole test binary), end the process with a
/// message naming `what` instead.
fn within<R>(limit: Duration, what: &str, f: impl FnOnce() -> R) -> R {
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    let what = what.to_string();
    let watchdog = std::thread::spawn(move || {
        if let Err(std::sync::mpsc::RecvTimeoutError::Timeout) = rx.recv_timeout(limit) {
            // Straight to stderr: the test harness's capture would swallow
            // an eprintln! from this thread when the process ends.
            let msg = format!("{what} hung for {limit:?}: ending the test process\n");
            let _ = std::io::Write::write_all(&mut std::io::stderr(), msg.as_bytes());
            std::process::exit(101);
        }
    });
    let r = f();
    drop(tx);
    let _ = watchdog.join();
    r
}

/// The default transport (TCP), the in-process one, and the RDMA data path
/// over emulated verbs.
const TRANSPORTS: [Option<&str>; 3] = [None, Some("mem"), Some("ib-emu")];

fn configure(transport: Option<&str>, timeout: Duration) -> impl Fn(&mut Config) + Sync + '_ {
    move |c: &mut Config| {
        c.transport = transport.map(str::to_string);
        c.timeout = timeout;
    }
}

/// A valid all_reduce that every rank must join; checks its result.
fn valid_all_reduce(comm: &Communicator, what: &str) {
    let n = comm.size() as i64;
    let mut v = vec![comm.rank() as i64 + 1; 33];
    comm.all_reduce_in_place(&mut v, ReduceOp::Sum)
        .unwrap_or_else(|e| panic!("rank {}: valid call after {what}: {e}", comm.rank()));
    assert!(
        v.iter().all(|&x| x == n * (n + 1) / 2),
        "after {what}: {v:?}"
    );
}

fn invalid(result: ferroccl::Result<()>, what: &str, wants: &[&str]) {
    match result {
        Err(Error::InvalidArgument(msg)) => {
            for w in wants {
                assert!(msg.contains(w), "{what}: '{msg}' does not say '{w}'");
            }
        }
        other => panic!("{what}: expected InvalidArgument, got {other:?}"),
    }
}

#[test]
fn bad_arguments_are_refused_before_any_byte_moves() {
    for transport in TRANSPORTS {
        run_ranks_with(3, configure(transport, Duration::from_secs(30)), |comm| {
            let me = comm.rank();
            valid_all_reduce(&comm, "start");
            // Every rank makes the same bad collective calls: each is
            // refused before anything moves, and as every rank refused it
            // the communicator goes on.
            {
                let (a, mut b) = (vec![1f32; 4], vec![0f32; 5]);
                invalid(
                    comm.all_reduce(&a, &mut b, ReduceOp::Sum),
                    "all_reduce lengths",
                    &["all_reduce", "recv", "5 elements", "must have 4"],
                );
                let (a, mut b) = (vec![1f32; 10], vec![0f32; 3]);
                invalid(
                    comm.reduce_scatter(&a, &mut b, ReduceOp::Max),
                    "reduce_scatter lengths",
                    &["reduce_scatter", "send", "10 elements", "must have 9"],
                );
                let (a, mut b) = (vec![1u8; 2], vec![0u8; 5]);
                invalid(
                    comm.all_gather(&a, &mut b),
                    "all_gather lengths",
                    &["all_gather", "recv", "5 elements", "must have 6"],
                );
                let mut b = vec![0i32; 7];
                invalid(
                    comm.reduce_scatter_in_place(&mut b, ReduceOp::Sum),
                    "reduce_scatter_in_place length",
                    &[
                        "reduce_scatter_in_place",
                        "7 elements",
                        "not a multiple of the 3 ranks",
                    ],
                );
                invalid(
                    comm.all_gather_in_place(&mut b),
                    "all_gather_in_place length",
                    &[
                        "all_gather_in_place",
                        "7 elements",
                        "not a multiple of the 3 ranks",
                    ],
                );
                let (a, mut b) = (vec![1f64; 7], vec![0f64; 7]);
                invalid(
                    comm.all_to_all(&a, &mut b),
                    "all_to_all length",
                    &["all_to_all", "7 elements", "not a multiple of the 3 ranks"],
                );
                let mut b = vec![0f32; 4];
                invalid(
                    comm.broadcast(&mut b, 3),
                    "broadcast root",
                    &["broadcast root 3", "out of range", "3 ranks"],
                );
                invalid(
                    comm.reduce(&[1f32; 4], &mut b, ReduceOp::Sum, 7),
                    "reduce root",
                    &["reduce root 7", "out of range"],
                );
                assert!(
                    b.iter().all(|&x| x == 0.0),
                    "a refused call wrote to its buffer"
                );
            }
            // Point-to-point calls are refused on this rank only: only even
            // ranks make these, and the others never hear of them.
            if me % 2 == 0 {
                let mut b = vec![0f32; 4];
                invalid(
                    comm.send(&[1f32; 4], 3),
                    "send peer",
                    &["send peer 3", "out of range"],
                );
                invalid(
                    comm.recv(&mut b, 5),
                    "recv peer",
                    &["recv peer 5", "out of range"],
                );
                invalid(
                    comm.send(&[1f32; 4], me),
                    "send to self",
                    &[&format!("send peer {me}"), "this rank itself"],
                );
                invalid(
                    comm.recv(&mut b, me),
                    "recv from self",
                    &[&format!("recv peer {me}"), "this rank itself"],
                );
                assert!(
                    b.iter().all(|&x| x == 0.0),
                    "a refused call wrote to its buffer"
                );
            }
            // Every rank still agrees on the order, and any difference
            // would be a Mismatch.
            valid_all_reduce(&comm, "the bad calls");
            assert_eq!(
                comm.async_error(),
                None,
                "a bad argument ended the communicator"
            );
            let n = comm.size();
            let mut b = vec![u32::MAX; 2 * n];
            b[2 * me..2 * me + 2].copy_from_slice(&[me as u32; 2]);
            comm.all_gather_in_place(&mut b)
                .expect("valid all_gather_in_place");
            let want: Vec<u32> = (0..2 * n).map(|j| (j / 2) as u32).collect();
            assert_eq!(b, want);
        });
    }
}

/// A call so large against its frames that it would be cut into more
/// slices than a schedule may hold is refused on every rank before
/// anything is built or moved, with the setting to change, and the
/// communicator goes on.
#[test]
fn a_call_too_large_for_its_frames_is_refused() {
    for transport in [None, Some("mem")] {
        let timeout = Duration::from_secs(30);
        run_ranks_with(
            2,
            |c: &mut Config| {
                configure(transport, timeout)(c);
                // Slots of 64 bytes, the least the config allows.
                c.buffsize = 512;
                c.steps = 8;
            },
            |comm| {
                valid_all_reduce(&comm, "start");
                // Slices of at most 64 bytes: 2^20 of them is 64 MiB. The
                // buffers are never written, so their pages are never
                // touched.
                let limit = 64usize << 20;
                let mut big = vec![0u8; limit + 64];
                invalid(
                    comm.all_reduce_in_place(&mut big, ReduceOp::Sum),
                    "all_reduce over 64-byte slots",
                    &["all_reduce", "slices", "FERROCCL_BUFFSIZE"],
                );
                // An allgather counts every block it forwards.
                let part = vec![0u8; limit / 2 + 64];
                let mut all = vec![0u8; 2 * part.len()];
                invalid(
                    comm.all_gather(&part, &mut all),
                    "all_gather over 64-byte slots",
                    &["all_gather", "slices", "FERROCCL_BUFFSIZE"],
                );
                valid_all_reduce(&comm, "the refused calls");
            },
        );
    }
}

/// Rank 0 refuses two calls in a row; rank 1, later, refuses the first too
/// but makes the second one properly. The second refusal reached rank 1
/// while the first was still news there: it must not be lost, so that rank
/// 1 ends its call naming rank 0 (not a timeout), and rank 0 then hears
/// that rank 1 went ahead.
#[test]
fn a_refusal_heard_behind_another_is_not_lost() {
    for transport in TRANSPORTS {
        run_ranks_with(2, configure(transport, Duration::from_secs(60)), |comm| {
            let me = comm.rank();
            valid_all_reduce(&comm, "start");
            let mut bad = vec![0f32; 5];
            let refuse = |bad: &mut Vec<f32>, what| {
                invalid(
                    comm.all_reduce(&[1f32; 4], bad, ReduceOp::Sum),
                    what,
                    &["recv buffer has 5 elements", "must have 4"],
                )
            };
            if me == 1 {
                // Let both refusals of rank 0 arrive first.
                std::thread::sleep(Duration::from_millis(300));
            }
            refuse(&mut bad, "first refusal");
            assert_eq!(comm.async_error(), None, "rank {me}: both refused");
            if me == 0 {
                refuse(&mut bad, "second refusal");
                let mut v = vec![1f32; 4];
                match comm.all_reduce_in_place(&mut v, ReduceOp::Sum) {
                    Err(Error::PeerFailed {
                        rank: 1, reason, ..
                    }) => assert!(
                        reason.contains("which rank 0 refused"),
                        "rank 0: rank 1's reason '{reason}'"
                    ),
                    other => panic!("rank 0: expected PeerFailed naming rank 1, got {other:?}"),
                }
            } else {
                let mut v = vec![1f32; 4];
                match comm.all_reduce_in_place(&mut v, ReduceOp::Sum) {
                    Err(Error::PeerFailed {
                        rank: 0,
                        during,
                        reason,
                    }) => {
                        assert!(
                            during.starts_with("all_reduce #"),
                            "rank 1: during '{during}'"
                        );
                        assert!(
                            reason.contains("refused") && reason.contains("must have 4"),
                            "rank 1: reason '{reason}'"
                        );
                    }
                    other => panic!("rank 1: expected PeerFailed naming rank 0, got {other:?}"),
                }
            }
        });
    }
}

/// Whether `text` names a call with its sequence number (`name #17`).
fn has_number(text: &str) -> bool {
    text.split('#')
        .skip(1)
        .any(|after| after.starts_with(|c: char| c.is_ascii_digit()))
}

/// Expect `PeerFailed { rank }` during a call named `call` with a number.
fn assert_peer_failed(err: &Error, rank: usize, call: &str, who: usize) {
    match err {
        Error::PeerFailed {
            rank: r, during, ..
        } => {
            assert_eq!(*r, rank, "rank {who} blames rank {r}: {err}");
            assert!(
                during.starts_with(&format!("{call} #")),
                "rank {who}: during '{during}' does not name {call} with its number"
            );
        }
        other => panic!("rank {who}: expected PeerFailed naming rank {rank}, got {other:?}"),
    }
}

#[test]
fn a_rank_that_leaves_is_named_and_later_calls_fail_fast() {
    for transport in TRANSPORTS {
        let timeout = Duration::from_secs(20);
        let started = Gate::new(2);
        run_ranks_with(2, configure(transport, timeout), |comm| {
            valid_all_reduce(&comm, "start");
            valid_all_reduce(&comm, "start");
            started.wait();
            if comm.rank() == 1 {
                return; // drops its communicator mid-job
            }
            let start = Instant::now();
            let mut buf = vec![1f32; 1000];
            let err = comm
                .all_reduce_in_place(&mut buf, ReduceOp::Sum)
                .expect_err("the peer is gone");
            assert!(start.elapsed() < timeout, "took {:?}", start.elapsed());
            assert_peer_failed(&err, 1, "all_reduce", 0);
            assert!(err.to_string().contains("all_reduce #3"), "{err}");
            assert_eq!(err.failed_rank(), Some(1));

            let start = Instant::now();
            let stored = comm.async_error().expect("async_error after a failure");
            assert!(start.elapsed() < Duration::from_secs(1));
            assert!(
                matches!(stored, Error::PeerFailed { rank: 1, .. }),
                "{stored:?}"
            );

            let start = Instant::now();
            let again = comm.barrier().expect_err("the communicator has ended");
            assert!(
                start.elapsed() < Duration::from_secs(1),
                "a later call took {:?}",
                start.elapsed()
            );
            assert!(
                matches!(again, Error::PeerFailed { rank: 1, .. }),
                "{again:?}"
            );
            assert!(has_number(&again.to_string()), "{again}");
        });
    }
}

#[test]
fn a_failure_reaches_ranks_that_are_not_its_neighbours() {
    for transport in TRANSPORTS {
        let timeout = Duration::from_secs(20);
        // Every survivor issues its call before rank 2 leaves (async calls
        // are issued at once), and keeps its communicator until every
        // survivor has its error, so that what rank 0 sees comes from rank
        // 2's departure alone.
        let issued = Gate::new(4);
        let survivors = Gate::new(3);
        let errors = run_ranks_with(4, configure(transport, timeout), |comm| {
            valid_all_reduce(&comm, "start");
            if comm.rank() == 2 {
                issued.wait();
                return None;
            }
            let start = Instant::now();
            let work = comm
                .all_reduce_async(vec![comm.rank() as f64; 5000], ReduceOp::Max)
                .expect("issue the call");
            issued.wait();
            let err = work.wait().expect_err("rank 2 is gone");
            let took = start.elapsed();
            survivors.wait();
            Some((err, took))
        });
        for (rank, got) in errors.into_iter().enumerate() {
            let Some((err, took)) = got else {
                assert_eq!(rank, 2);
                continue;
            };
            assert!(took < timeout, "rank {rank} took {took:?}");
            assert_peer_failed(&err, 2, "all_reduce", rank);
            assert!(err.to_string().contains("all_reduce #2"), "{err}");
        }
    }
}

/// Over the RDMA data path (emulated verbs), rank 2's host dies while every
/// survivor waits in a collective: nothing is said on the wire (its queue
/// pairs just go to error), and every survivor, neighbour or not, ends its
/// call naming rank 2 within the timeout.
#[test]
fn a_rank_whose_rdma_host_dies_is_named_by_every_other_rank() {
    const TOKEN: u64 = 0x1b_dead_0002;
    let timeout = Duration::from_secs(20);
    let issued = Gate::new(4);
    let survivors = Gate::new(4);
    let errors = run_ranks_with(
        4,
        |c: &mut Config| {
            c.transport = Some("ib-emu".into());
            c.timeout = timeout;
            c.token = TOKEN;
            // The ranks are threads of one process, so they share control
            // pages, and an allreduce of this size would go through the
            // staging areas on them: this case is about the RDMA data path.
            c.spread = false;
        },
        |comm| {
            valid_all_reduce(&comm, "start");
            if comm.rank() == 2 {
                issued.wait();
                assert!(ferroccl_ib::emu_transport::kill_rank(TOKEN, 2) > 0);
                // Keep the communicator (and its heartbeats) until every
                // survivor has its error: the dead device alone tells them.
                survivors.wait();
                return None;
            }
            let start = Instant::now();
            let work = comm
                .all_reduce_async(vec![comm.rank() as f64; 300_000], ReduceOp::Sum)
                .expect("issue the call");
            issued.wait();
            let err = work.wait().expect_err("rank 2's host is gone");
            let took = start.elapsed();
            survivors.wait();
            Some((err, took))
        },
    );
    for (rank, got) in errors.into_iter().enumerate() {
        let Some((err, took)) = got else {
            assert_eq!(rank, 2);
            continue;
        };
        assert!(took < timeout, "rank {rank} took {took:?}");
        assert_peer_failed(&err, 2, "all_reduce", rank);
    }
}

/// A call issued after this rank heard of a failure (through the job's
/// failure reports) should still name itself; today it returns the stored
/// report with an empty `during` (see the report of this branch).
#[test]
fn a_call_after_a_failure_report_names_itself() {
    for transport in TRANSPORTS {
        let timeout = Duration::from_secs(20);
        let done = Gate::new(2);
        run_ranks_with(3, configure(transport, timeout), |comm| {
            valid_all_reduce(&comm, "start");
            match comm.rank() {
                2 => return,
                1 => {
                    // Rank 1 finds out first, waiting on rank 2 directly.
                    let err = comm.recv(&mut [0u8; 100], 2).expect_err("rank 2 is gone");
                    assert_peer_failed(&err, 2, "send/recv", 1);
                }
                _ => {
                    let start = Instant::now();
                    while comm.async_error().is_none() && start.elapsed() < timeout {
                        std::thread::sleep(Duration::from_millis(5));
                    }
                    let err = comm.barrier().expect_err("the communicator has failed");
                    assert_peer_failed(&err, 2, "barrier", 0);
                }
            }
            done.wait();
        });
    }
}

#[test]
fn abort_ends_a_blocked_call_quickly() {
    for transport in TRANSPORTS {
        let timeout = Duration::from_secs(60);
        let done = Gate::new(2);
        run_ranks_with(2, configure(transport, timeout), |comm| {
            valid_all_reduce(&comm, "start");
            if comm.rank() == 0 {
                let start = Instant::now();
                let err = std::thread::scope(|s| {
                    s.spawn(|| {
                        std::thread::sleep(Duration::from_millis(200));
                        comm.abort();
                    });
                    let mut buf = vec![1i32; 100];
                    comm.all_reduce_in_place(&mut buf, ReduceOp::Sum)
                        .expect_err("aborted")
                });
                let took = start.elapsed();
                assert!(
                    took >= Duration::from_millis(150) && took < Duration::from_secs(10),
                    "abort took {took:?}"
                );
                match &err {
                    Error::Aborted(Some(why)) => assert!(why.contains("abort()"), "{why}"),
                    other => panic!("expected Aborted, got {other:?}"),
                }
                let start = Instant::now();
                let again = comm.barrier().expect_err("aborted communicator");
                assert!(start.elapsed() < Duration::from_secs(1));
                assert!(matches!(again, Error::Aborted(_)), "{again:?}");
                assert!(matches!(comm.async_error(), Some(Error::Aborted(_))));
            }
            // Rank 1 never joins the call; it stays until rank 0 is done.
            done.wait();
        });
    }
}

/// Run one call per rank on 2 ranks and return each rank's result and time.
fn two_calls(
    transport: Option<&str>,
    timeout: Duration,
    call: impl Fn(&Communicator) -> ferroccl::Result<()> + Sync,
) -> Vec<(ferroccl::Result<()>, Duration)> {
    let done = Gate::new(2);
    run_ranks_with(2, configure(transport, timeout), |comm| {
        let start = Instant::now();
        let r = call(&comm);
        let took = start.elapsed();
        done.wait();
        (r, took)
    })
}

#[test]
fn mismatched_calls_are_described_not_hung() {
    let timeout = Duration::from_secs(10);
    for transport in TRANSPORTS {
        // Counts differ: both ranks send first, so both see the other's frame.
        let res = two_calls(transport, timeout, |c| {
            let n = if c.rank() == 0 { 10 } else { 12 };
            let mut b = vec![1f32; n];
            c.all_reduce_in_place(&mut b, ReduceOp::Sum)
        });
        check_mismatch(
            &res,
            "all_reduce #1 (float, sum, 10 elements)",
            "all_reduce #1 (float, sum, 12 elements)",
            timeout,
        );

        // Element types differ.
        let res = two_calls(transport, timeout, |c| {
            if c.rank() == 0 {
                c.all_reduce_in_place(&mut [1f32; 8], ReduceOp::Sum)
            } else {
                c.all_reduce_in_place(&mut [1i32; 8], ReduceOp::Sum)
            }
        });
        check_mismatch(
            &res,
            "all_reduce #1 (float, sum, 8 elements)",
            "all_reduce #1 (int32, sum, 8 elements)",
            timeout,
        );

        // Collectives differ: rank 0 broadcasts as root, rank 1 all-reduces.
        let res = two_calls(transport, timeout, |c| {
            let mut b = [1f32; 8];
            if c.rank() == 0 {
                c.broadcast(&mut b, 0)
            } else {
                c.all_reduce_in_place(&mut b, ReduceOp::Sum)
            }
        });
        check_mismatch(
            &res,
            "broadcast #1 (float, 8 elements, root 0)",
            "all_reduce #1 (float, sum, 8 elements)",
            timeout,
        );
    }
}

/// At least one rank reports a Mismatch naming both calls (`call0` made by
/// rank 0, `call1` by rank 1); the other ends with a Mismatch, an error
/// naming its peer, or success (a root that only sends); none hangs.
fn check_mismatch(
    res: &[(ferroccl::Result<()>, Duration)],
    call0: &str,
    call1: &str,
    timeout: Duration,
) {
    let calls = [call0, call1];
    let mut mismatches = 0;
    for (rank, (r, took)) in res.iter().enumerate() {
        let peer = 1 - rank;
        assert!(
            *took < timeout + Duration::from_secs(10),
            "rank {rank} took {took:?}"
        );
        match r {
            Err(Error::Mismatch {
                peer: p,
                local,
                remote,
            }) => {
                mismatches += 1;
                assert_eq!(*p, peer);
                assert_eq!(local, calls[rank], "rank {rank}'s own call");
                assert_eq!(remote, calls[peer], "rank {rank}'s view of rank {peer}");
                let msg = r.as_ref().unwrap_err().to_string();
                assert!(msg.contains(call0) && msg.contains(call1), "{msg}");
            }
            Err(e) => assert_eq!(e.failed_rank(), Some(peer), "rank {rank}: {e}"),
            Ok(()) => {}
        }
    }
    assert!(mismatches >= 1, "nobody saw the mismatch: {res:?}");
}

#[test]
fn a_late_rank_times_out_with_its_name() {
    let timeout = Duration::from_secs(1);
    for transport in TRANSPORTS {
        let done = Gate::new(2);
        let res = run_ranks_with(2, configure(transport, timeout), |comm| {
            valid_all_reduce(&comm, "start");
            if comm.rank() == 1 {
                std::thread::sleep(timeout * 3);
                done.wait();
                return None;
            }
            let start = Instant::now();
            let mut b = vec![2u64; 64];
            let r = comm.all_reduce_in_place(&mut b, ReduceOp::Prod);
            let took = start.elapsed();
            done.wait();
            Some((r, took))
        });
        let (r, took) = res[0].clone().expect("rank 0's result");
        assert!(
            took >= timeout && took < timeout + Duration::from_secs(10),
            "rank 0 gave up after {took:?}"
        );
        match r {
            Err(Error::Timeout {
                peer: 1,
                ref during,
                waited_ms,
                ..
            }) => {
                assert!(during.starts_with("all_reduce #2"), "{during}");
                assert!(waited_ms >= 900, "waited {waited_ms} ms");
            }
            Err(Error::PeerFailed {
                rank: 1,
                ref during,
                ..
            }) => {
                assert!(during.starts_with("all_reduce #2"), "{during}")
            }
            other => panic!("expected a timeout naming rank 1, got {other:?}"),
        }
    }
}

#[test]
fn bad_configuration_is_refused() {
    let config = Config::new(3, 2, "127.0.0.1", 1, 7).expect("config");
    match Communicator::init(config) {
        Err(Error::InvalidArgument(msg)) => {
            assert!(msg.contains("rank 3 is out of range for size 2"), "{msg}")
        }
        other => panic!("expected InvalidArgument, got {other:?}"),
    }
    // Port 0 is refused at once on every rank (it used to wait the whole
    // timeout for a rendezvous nobody could reach).
    for rank in [0, 1] {
        let mut config = Config::new(rank, 2, "127.0.0.1", 0, 7).expect("config");
        // Short, so that a regression ends in a rendezvous error, fast.
        config.timeout = Duration::from_secs(2);
        match Communicator::init(config) {
            Err(Error::InvalidArgument(msg)) => {
                assert!(
                    msg.contains(&format!("rank {rank}: rendezvous port 0")),
                    "{msg}"
                )
            }
            other => panic!("rank {rank}, port 0: expected InvalidArgument, got {other:?}"),
        }
    }
    let mut config = Config::new(0, 2, "127.0.0.1", 1, 7).expect("config");
    for bad in ["soon", "-3", "0", "NaN"] {
        let before = config.timeout;
        match config.from_env_overrides(&|k| (k == "FERROCCL_TIMEOUT").then(|| bad.to_string())) {
            Err(Error::Env(msg)) => {
                assert!(msg.contains(&format!("FERROCCL_TIMEOUT='{bad}'")), "{msg}")
            }
            other => panic!("FERROCCL_TIMEOUT={bad}: expected Error::Env, got {other:?}"),
        }
        assert_eq!(config.timeout, before, "a refused value changed the config");
    }
    config
        .from_env_overrides(&|k| (k == "FERROCCL_TIMEOUT").then(|| "0.25".to_string()))
        .expect("a valid timeout");
    assert_eq!(config.timeout, Duration::from_millis(250));
}

/// Every rank ends a mismatched call with `Error::Mismatch` that names both
/// calls, also the ranks whose neighbours called what they called (with a
/// ring on four ranks only ranks 3 and 0 see the odd frame themselves; the
/// others learn it from the job's mismatch report).
#[test]
fn a_mismatch_reaches_every_rank_as_a_mismatch() {
    let timeout = Duration::from_secs(10);
    let odd = "all_reduce #1 (float, sum, 12 elements)";
    let even = "all_reduce #1 (float, sum, 10 elements)";
    for transport in TRANSPORTS {
        let (ready, done) = (Gate::new(4), Gate::new(4));
        let res = run_ranks_with(
            4,
            |c| {
                configure(transport, timeout)(c);
                c.algorithm = Some(ferroccl::Algorithm::Ring);
            },
            |comm| {
                // Every rank has finished creating its communicator (the
                // calibration's collectives): a mismatch found while a
                // neighbour still finishes the call before fails that call.
                ready.wait();
                let n = if comm.rank() == 3 { 12 } else { 10 };
                let mut b = vec![1f32; n];
                let start = Instant::now();
                let r = comm.all_reduce_in_place(&mut b, ReduceOp::Sum);
                let took = start.elapsed();
                // The next call is refused with the mismatch too, at once.
                // (A rank that only heard of the mismatch used to deadlock
                // here: refusing the call read the recent calls under the
                // lock the call was issued under.)
                let next = within(
                    timeout * 2,
                    &format!("rank {}'s next call", comm.rank()),
                    || comm.barrier(),
                );
                done.wait();
                (r, took, next)
            },
        );
        for (rank, (r, took, next)) in res.iter().enumerate() {
            assert!(*took < timeout, "rank {rank} took {took:?}");
            match next {
                Err(Error::Mismatch { local, remote, .. }) => assert!(
                    [local, remote].iter().any(|d| d.starts_with(odd)),
                    "rank {rank}'s next call names the wrong mismatch: {local} / {remote}"
                ),
                other => panic!("rank {rank}: its next call gave {other:?}, not the mismatch"),
            }
            let (own, other) = if rank == 3 { (odd, even) } else { (even, odd) };
            match r {
                Err(Error::Mismatch {
                    peer,
                    local,
                    remote,
                }) => {
                    assert_eq!(local, own, "rank {rank}'s own call");
                    assert!(remote.starts_with(other), "rank {rank}: remote '{remote}'");
                    if rank == 3 {
                        assert!(*peer < 3, "rank 3 names peer {peer}");
                    } else {
                        assert_eq!(*peer, 3, "rank {rank} names peer {peer}");
                    }
                }
                other => panic!("rank {rank} ({transport:?}): expected a Mismatch, got {other:?}"),
            }
        }
    }
}

/// A rank that stays away in its own code (not dead: its heartbeats and
/// the answers of its watch thread go on) is named by every other rank,
/// not each rank's neighbour: on a timeout the ranks ask how far every
/// member has come and blame the one that never issued the call.
#[test]
fn a_rank_busy_outside_the_library_is_named_by_every_other_rank() {
    let timeout = Duration::from_secs(1);
    for transport in TRANSPORTS {
        let done = Gate::new(4);
        let res = run_ranks_with(
            4,
            |c| {
                configure(transport, timeout)(c);
                c.algorithm = Some(ferroccl::Algorithm::Ring);
            },
            |comm| {
                valid_all_reduce(&comm, "start");
                if comm.rank() == 1 {
                    std::thread::sleep(timeout * 4);
                    done.wait();
                    return None;
                }
                let start = Instant::now();
                let mut b = vec![1u32; 1000];
                let r = comm.all_reduce_in_place(&mut b, ReduceOp::Sum);
                let took = start.elapsed();
                let stored = comm.async_error();
                done.wait();
                Some((r, took, stored))
            },
        );
        for (rank, got) in res.into_iter().enumerate() {
            let Some((r, took, stored)) = got else {
                assert_eq!(rank, 1);
                continue;
            };
            assert!(
                took >= timeout && took < timeout + Duration::from_secs(10),
                "rank {rank} gave up after {took:?}"
            );
            let err = r.expect_err("rank 1 never joined");
            assert_peer_failed(&err, 1, "all_reduce", rank);
            assert!(err.to_string().contains("all_reduce #2"), "{err}");
            assert!(
                matches!(stored, Some(Error::PeerFailed { rank: 1, .. })),
                "rank {rank}: async_error {stored:?}"
            );
        }
    }
}

/// A rank that never joins the job is named when the others give up at
/// set-up: a timeout naming rank 1 and the set-up, not a store key.
#[test]
fn a_rank_that_never_joins_is_named_at_set_up() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let mut config = Config::new(0, 2, "127.0.0.1", port, 11).expect("config");
    config.timeout = Duration::from_secs(2);
    let start = Instant::now();
    let err = Communicator::init(config).expect_err("rank 1 never joined");
    let took = start.elapsed();
    match &err {
        Error::Timeout {
            peer: 1,
            during,
            what,
            waited_ms,
        } => {
            assert!(during.contains("set-up"), "{err}");
            assert!(what.contains("never joined"), "{err}");
            assert!(*waited_ms >= 1000, "{err}");
        }
        other => panic!("expected a timeout naming rank 1, got {other:?}: {other}"),
    }
    assert!(took < Duration::from_secs(30), "took {took:?}");
}
