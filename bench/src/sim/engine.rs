//! The timing simulation: every rank's schedule (the library's own, as
//! built by `ferroccl::algo`) runs on a [`Cluster`], one agent per rank
//! and channel, over FIFOs of `slots` frames, as the executors run them.
//!
//! # What a step costs
//!
//! An agent runs its steps in order. A step starts when the agent is
//! free, the frame it receives has arrived (FIFOs are in order), and,
//! when it sends, the receiver has released the slot it writes (the frame
//! `slots` before this one on that FIFO was consumed). Then:
//! - it pays `step_us`;
//! - a step that sends puts its bytes on the path's links as soon as all
//!   of them are free (first come, first served: a link carries one frame
//!   at a time, so two transfers on one link take twice as long), for
//!   `bytes / bandwidth`; a combining step cannot go faster than
//!   `reduce_gbytes_per_s`, so it ends no earlier than its start plus
//!   `bytes / reduce`. The frame arrives the path's latency after its last
//!   byte left;
//! - a step that does not send takes `bytes / reduce` if it combines,
//!   `bytes / copy` if it stores what it received or copies, else nothing;
//! - a received frame's slot is released when the step that consumed it
//!   ends.
//!
//! Steps run in the order of their start times (a heap of ready agents),
//! so links are granted first come, first served. The run ends when every
//! agent has run its steps; if agents are left waiting with nothing
//! ready, the schedules deadlock and the error says where.
//!
//! # Memory and speed
//!
//! A ring allreduce on `n` ranks has `2n - 1` steps a rank and slice, so
//! 4,096 ranks run tens of millions of steps. Schedules are stored as runs
//! of steps that differ only in their tags and in peers that move by a
//! fixed stride ([`Program`]): a ring's pass is a handful of runs. Each
//! step is still simulated on its own: no symmetry is assumed.

use super::model::Cluster;
use ferroccl::algo::{Prim, Schedule, NO_PEER};
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::hash::{BuildHasherDefault, Hasher};

/// Steps that repeat with peers moving by a fixed stride.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Run {
    prim: Prim,
    /// Peer of the first step ([`NO_PEER`] when the primitive does not
    /// send / receive).
    send_to: usize,
    recv_from: usize,
    /// Added to the peer (mod ranks) from one step of the run to the next.
    send_stride: usize,
    recv_stride: usize,
    bytes: u64,
    count: u32,
}

/// One agent's steps (a rank's, on one channel), compressed into runs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Program {
    runs: Vec<Run>,
}

impl Program {
    /// Steps in the program.
    pub fn steps(&self) -> u64 {
        self.runs.iter().map(|r| u64::from(r.count)).sum()
    }

    fn push(&mut self, ranks: usize, prim: Prim, send_to: usize, recv_from: usize, bytes: u64) {
        if let Some(run) = self.runs.last_mut() {
            if run.prim == prim && run.bytes == bytes && run.count < u32::MAX {
                // The stride that continues a run of peers to `next`, if any.
                let keeps = |first: usize, stride: usize, count: u32, next: usize| {
                    if first == NO_PEER || next == NO_PEER {
                        return (first == next).then_some(0);
                    }
                    let last = peer_at(first, stride, count - 1, ranks);
                    let s = (next + ranks - last) % ranks;
                    (count == 1 || s == stride).then_some(s)
                };
                let s = keeps(run.send_to, run.send_stride, run.count, send_to);
                let r = keeps(run.recv_from, run.recv_stride, run.count, recv_from);
                if let (Some(s), Some(r)) = (s, r) {
                    run.send_stride = s;
                    run.recv_stride = r;
                    run.count += 1;
                    return;
                }
            }
        }
        self.runs.push(Run {
            prim,
            send_to,
            recv_from,
            send_stride: 0,
            recv_stride: 0,
            bytes,
            count: 1,
        });
    }
}

fn peer_at(first: usize, stride: usize, i: u32, ranks: usize) -> usize {
    if first == NO_PEER {
        NO_PEER
    } else {
        (first + stride * i as usize) % ranks
    }
}

/// The agents of `ranks` ranks, rank-major: agent `rank * channels + c`
/// runs the steps of rank `rank` on channel `c`.
#[derive(Debug, Clone)]
pub struct Job {
    /// Ranks in the job.
    pub ranks: usize,
    /// Channels per rank.
    pub channels: usize,
    /// One program per agent.
    pub programs: Vec<Program>,
    /// Most runs of steps the job may hold (a run takes about 56 bytes):
    /// [`Job::add`] refuses a schedule past it rather than exhaust memory.
    pub max_runs: usize,
    runs: usize,
}

/// [`Job::max_runs`] unless set: about 1.7 GB of runs.
pub const DEFAULT_MAX_RUNS: usize = 30_000_000;

impl Job {
    /// An empty job of `ranks` ranks on `channels` channels.
    pub fn new(ranks: usize, channels: usize) -> Job {
        Job {
            ranks,
            channels,
            programs: vec![Program::default(); ranks * channels],
            max_runs: DEFAULT_MAX_RUNS,
            runs: 0,
        }
    }

    /// Add rank `rank`'s schedule, whose elements are `elem` bytes. Steps
    /// on channel `c` go to that rank's agent `c`; a step on a channel past
    /// the job's is an error, and so is a job past [`Job::max_runs`].
    pub fn add(&mut self, rank: usize, schedule: &Schedule, elem: usize) -> Result<(), String> {
        for step in &schedule.steps {
            if step.channel >= self.channels {
                return Err(format!(
                    "rank {rank}: a step on channel {} of {}",
                    step.channel, self.channels
                ));
            }
            let p = &mut self.programs[rank * self.channels + step.channel];
            let before = p.runs.len();
            let send_to = if step.prim.sends() {
                step.send_to
            } else {
                NO_PEER
            };
            let recv_from = if step.prim.receives() {
                step.recv_from
            } else {
                NO_PEER
            };
            p.push(
                self.ranks,
                step.prim,
                send_to,
                recv_from,
                (step.len * elem) as u64,
            );
            self.runs += p.runs.len() - before;
            if self.runs > self.max_runs {
                return Err(format!(
                    "the schedules need more than {} runs of steps (about {} MB; rank {rank} of {}): \
                     fewer ranks or bytes, or a larger --max-runs",
                    self.max_runs,
                    (self.max_runs * std::mem::size_of::<Run>()) >> 20,
                    self.ranks
                ));
            }
        }
        Ok(())
    }

    /// Steps of all agents.
    pub fn steps(&self) -> u64 {
        self.programs.iter().map(Program::steps).sum()
    }
}

/// What a simulation gives.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Outcome {
    /// When the last agent finished, microseconds from the start (every
    /// agent starts at 0).
    pub time_us: f64,
    /// Steps simulated.
    pub steps: u64,
}

/// A multiply-and-rotate hasher for the FIFO table (keys are small
/// integers; the standard hasher's DoS resistance costs time here).
#[derive(Default)]
struct FastHash(u64);

impl Hasher for FastHash {
    fn finish(&self) -> u64 {
        // splitmix64's finaliser: the table indexes by the low bits, which
        // a bare product leaves zero for keys whose low bits are zero.
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }
    fn write_u64(&mut self, x: u64) {
        self.0 = (self.0.rotate_left(5) ^ x).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
}

type FastMap<K, V> = HashMap<K, V, BuildHasherDefault<FastHash>>;

/// A connection's FIFO on one channel: frames `consumed..sent` are in
/// flight; slot `k % slots` holds frame `k`'s arrival time and bytes, and
/// once consumed its release time.
struct Fifo {
    sent: u64,
    consumed: u64,
    /// An agent waiting for a frame (the receiver) or a slot (the sender).
    waiting_receiver: usize,
    waiting_sender: usize,
}

#[derive(Clone, Copy)]
struct Agent {
    run: usize,
    in_run: u32,
    free_at: f64,
}

/// Run `job` on `cluster`. Deadlock (agents left that cannot move) and a
/// frame whose length differs from the step receiving it are errors.
pub fn simulate(cluster: &Cluster, job: &Job) -> Result<Outcome, String> {
    let n = job.ranks;
    let ch = job.channels;
    let slots = cluster.slots;
    let agents = job.programs.len();
    let mut state: Vec<Agent> = vec![
        Agent {
            run: 0,
            in_run: 0,
            free_at: 0.0,
        };
        agents
    ];
    let mut link_free = vec![0.0f64; cluster.link_count(n)];
    let mut fifo_of: FastMap<u64, u32> = FastMap::default();
    let mut fifos: Vec<Fifo> = Vec::new();
    // Per FIFO and slot: arrival time, bytes, release time.
    let mut arrival: Vec<f64> = Vec::new();
    let mut frame_bytes: Vec<u64> = Vec::new();
    let mut release: Vec<f64> = Vec::new();
    let reduce_rate = cluster.reduce_gbytes_per_s * 1e3;
    let copy_rate = cluster.copy_gbytes_per_s * 1e3;
    let mut heap: BinaryHeap<Reverse<(u64, usize)>> = BinaryHeap::new();
    let mut steps = 0u64;

    let fifo_id = |fifo_of: &mut FastMap<u64, u32>,
                   fifos: &mut Vec<Fifo>,
                   arrival: &mut Vec<f64>,
                   frame_bytes: &mut Vec<u64>,
                   release: &mut Vec<f64>,
                   from: usize,
                   to: usize,
                   c: usize|
     -> usize {
        let key = ((from as u64) << 40) | ((to as u64) << 16) | c as u64;
        *fifo_of.entry(key).or_insert_with(|| {
            fifos.push(Fifo {
                sent: 0,
                consumed: 0,
                waiting_receiver: usize::MAX,
                waiting_sender: usize::MAX,
            });
            arrival.extend(std::iter::repeat_n(0.0, slots));
            frame_bytes.extend(std::iter::repeat_n(0, slots));
            release.extend(std::iter::repeat_n(0.0, slots));
            (fifos.len() - 1) as u32
        }) as usize
    };

    // The current step of agent `a`: (prim, send_to, recv_from, bytes).
    let current = |job: &Job, st: &Agent, a: usize| -> Option<(Prim, usize, usize, u64)> {
        let run = job.programs[a].runs.get(st.run)?;
        Some((
            run.prim,
            peer_at(run.send_to, run.send_stride, st.in_run, n),
            peer_at(run.recv_from, run.recv_stride, st.in_run, n),
            run.bytes,
        ))
    };

    // FIFOs of runs whose peer does not move, found once.
    let mut cached: Vec<Vec<[u32; 2]>> = Vec::with_capacity(agents);
    for (a, p) in job.programs.iter().enumerate() {
        let (rank, c) = (a / ch, a % ch);
        let ids = p
            .runs
            .iter()
            .map(|run| {
                let mut id = [u32::MAX; 2];
                if run.send_to != NO_PEER && (run.send_stride == 0 || run.count == 1) {
                    id[0] = fifo_id(
                        &mut fifo_of,
                        &mut fifos,
                        &mut arrival,
                        &mut frame_bytes,
                        &mut release,
                        rank,
                        run.send_to,
                        c,
                    ) as u32;
                }
                if run.recv_from != NO_PEER && (run.recv_stride == 0 || run.count == 1) {
                    id[1] = fifo_id(
                        &mut fifo_of,
                        &mut fifos,
                        &mut arrival,
                        &mut frame_bytes,
                        &mut release,
                        run.recv_from,
                        rank,
                        c,
                    ) as u32;
                }
                id
            })
            .collect();
        cached.push(ids);
    }

    macro_rules! fifo {
        ($from:expr, $to:expr, $c:expr) => {
            fifo_id(
                &mut fifo_of,
                &mut fifos,
                &mut arrival,
                &mut frame_bytes,
                &mut release,
                $from,
                $to,
                $c,
            )
        };
    }

    // The FIFO agent `a` sends on (`0`) or receives from (`1`) at its
    // current step.
    macro_rules! fifo_at {
        ($a:expr, $st:expr, $which:expr, $from:expr, $to:expr, $c:expr) => {{
            let id = cached[$a][$st.run][$which];
            if id != u32::MAX {
                id as usize
            } else {
                fifo!($from, $to, $c)
            }
        }};
    }

    // Puts agent `a` on the heap if its current step can start, else
    // notes it on the FIFO it waits for.
    macro_rules! try_ready {
        ($a:expr) => {{
            let a: usize = $a;
            let st = state[a];
            if let Some((prim, send_to, recv_from, _)) = current(job, &st, a) {
                let (rank, c) = (a / ch, a % ch);
                let mut t = st.free_at;
                let mut ready = true;
                if prim.receives() {
                    let f = fifo_at!(a, st, 1, recv_from, rank, c);
                    let q = &mut fifos[f];
                    if q.sent > q.consumed {
                        t = t.max(arrival[f * slots + (q.consumed % slots as u64) as usize]);
                    } else {
                        q.waiting_receiver = a;
                        ready = false;
                    }
                }
                if ready && prim.sends() {
                    let f = fifo_at!(a, st, 0, rank, send_to, c);
                    let q = &mut fifos[f];
                    if q.sent >= slots as u64 {
                        if q.consumed > q.sent - slots as u64 {
                            t = t.max(release[f * slots + (q.sent % slots as u64) as usize]);
                        } else {
                            q.waiting_sender = a;
                            ready = false;
                        }
                    }
                }
                if ready {
                    heap.push(Reverse((t.to_bits(), a)));
                }
            }
        }};
    }

    for a in 0..agents {
        try_ready!(a);
    }
    let mut end = 0.0f64;
    while let Some(Reverse((bits, a))) = heap.pop() {
        let t = f64::from_bits(bits);
        let st = state[a];
        let Some((prim, send_to, recv_from, bytes)) = current(job, &st, a) else {
            continue;
        };
        let (rank, c) = (a / ch, a % ch);
        let start = t + cluster.step_us;
        let b = bytes as f64;
        let mut done = if prim.reduces() || prim == Prim::Reduce {
            start + b / reduce_rate
        } else if prim.writes_output() {
            start + b / copy_rate
        } else {
            start
        };
        let mut woke = [usize::MAX; 2];
        let f_in = if prim.receives() {
            fifo_at!(a, st, 1, recv_from, rank, c)
        } else {
            0
        };
        if prim.receives() {
            let f = f_in;
            let slot = f * slots + (fifos[f].consumed % slots as u64) as usize;
            if frame_bytes[slot] != bytes {
                return Err(format!(
                    "rank {rank} channel {c}: a frame of {} bytes from rank {recv_from} meets a step of {bytes}",
                    frame_bytes[slot]
                ));
            }
        }
        if prim.sends() {
            let path = cluster.path(n, rank, send_to);
            let mut tx = start;
            for &l in path.links.iter().filter(|&&l| l != usize::MAX) {
                tx = tx.max(link_free[l]);
            }
            let tx_end = tx + b / path.bytes_per_us;
            for &l in path.links.iter().filter(|&&l| l != usize::MAX) {
                link_free[l] = tx_end;
            }
            // A combining step streams its result out no faster than it
            // combines; a copy-and-send, no faster than it copies.
            let sent_at = tx_end.max(done);
            done = sent_at;
            let f = fifo_at!(a, st, 0, rank, send_to, c);
            let q = &mut fifos[f];
            let slot = f * slots + (q.sent % slots as u64) as usize;
            arrival[slot] = sent_at + path.latency_us;
            frame_bytes[slot] = bytes;
            q.sent += 1;
            if q.waiting_receiver != usize::MAX {
                woke[0] = q.waiting_receiver;
                q.waiting_receiver = usize::MAX;
            }
        }
        if prim.receives() {
            let f = f_in;
            let q = &mut fifos[f];
            release[f * slots + (q.consumed % slots as u64) as usize] = done;
            q.consumed += 1;
            if q.waiting_sender != usize::MAX {
                woke[1] = q.waiting_sender;
                q.waiting_sender = usize::MAX;
            }
        }
        end = end.max(done);
        steps += 1;
        let s = &mut state[a];
        s.free_at = done;
        s.in_run += 1;
        if s.in_run == job.programs[a].runs[s.run].count {
            s.run += 1;
            s.in_run = 0;
        }
        try_ready!(a);
        for w in woke {
            if w != usize::MAX {
                try_ready!(w);
            }
        }
    }
    let stuck: Vec<String> = (0..agents)
        .filter(|&a| state[a].run < job.programs[a].runs.len())
        .take(8)
        .map(|a| {
            let st = state[a];
            let (prim, to, from, bytes) = current(job, &st, a).expect("a stuck agent has a step");
            let peer = |p: usize| {
                if p == NO_PEER {
                    "-".to_string()
                } else {
                    p.to_string()
                }
            };
            format!(
                "rank {} channel {} at {prim:?} (to {}, from {}, {bytes} B)",
                a / ch,
                a % ch,
                peer(to),
                peer(from)
            )
        })
        .collect();
    if !stuck.is_empty() {
        return Err(format!("deadlock: {}", stuck.join("; ")));
    }
    let left: u64 = fifos.iter().map(|q| q.sent - q.consumed).sum();
    if left > 0 {
        return Err(format!("{left} frames never received"));
    }
    Ok(Outcome {
        time_us: end,
        steps,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferroccl::algo::ring::RingParams;
    use ferroccl::algo::{channels, direct, ring, tree};

    /// The runs of a program, expanded back into (prim, to, from, bytes).
    fn expand(p: &Program, ranks: usize) -> Vec<(Prim, usize, usize, u64)> {
        p.runs
            .iter()
            .flat_map(|r| {
                (0..r.count).map(move |i| {
                    (
                        r.prim,
                        peer_at(r.send_to, r.send_stride, i, ranks),
                        peer_at(r.recv_from, r.recv_stride, i, ranks),
                        r.bytes,
                    )
                })
            })
            .collect()
    }

    /// Folding steps into runs loses nothing: every agent's runs expand to
    /// exactly its channel's steps of the schedule, in order.
    #[test]
    fn runs_expand_to_the_schedule() {
        type Build = fn(RingParams, usize) -> Schedule;
        let builders: [(&str, Build); 5] = [
            ("ring", ring::all_reduce),
            ("tree", tree::all_reduce),
            ("one_shot", direct::one_shot),
            ("two_shot", direct::two_shot),
            ("recursive_doubling", direct::recursive_doubling),
        ];
        for (name, build) in builders {
            for n in [1usize, 2, 3, 5, 8, 13] {
                for (count, slice) in [(1usize, 1usize), (37, 4), (1000, 64)] {
                    for ch in [1usize, 3] {
                        let mut job = Job::new(n, ch);
                        let mut want = vec![Vec::new(); n * ch];
                        for rank in 0..n {
                            // Pipelined passes (depth 3) on 3 channels.
                            let p = RingParams {
                                rank,
                                size: n,
                                slice,
                                depth: ch,
                            };
                            let s = channels::split(&build(p, count), ch);
                            job.add(rank, &s, 4).unwrap();
                            for step in &s.steps {
                                let to = if step.prim.sends() {
                                    step.send_to
                                } else {
                                    NO_PEER
                                };
                                let from = if step.prim.receives() {
                                    step.recv_from
                                } else {
                                    NO_PEER
                                };
                                want[rank * ch + step.channel].push((
                                    step.prim,
                                    to,
                                    from,
                                    (step.len * 4) as u64,
                                ));
                            }
                        }
                        for (a, w) in want.iter().enumerate() {
                            assert_eq!(
                                &expand(&job.programs[a], n),
                                w,
                                "{name} n={n} count={count} slice={slice} channels={ch} agent {a}"
                            );
                        }
                    }
                }
            }
        }
    }
}
