//! The random sequence: the vocabulary of operations (`Kind`, `Call`,
//! `Action`, `Step`, `SplitPlan`) and the `Generator` that draws them from
//! the seed, alike on every rank. It runs nothing and touches no
//! communicator; the draws' order is what a seed replays, so keep it.

use crate::options::Options;
use crate::random::{mix, Rng};
use crate::reference::is_float;
use ferroccl::{DataType, ReduceOp};

/// Kinds of operation, in the order the summary lists them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Kind {
    AllReduce,
    AllReduceInPlace,
    AllReduceAsync,
    ReduceScatter,
    ReduceScatterInPlace,
    AllGather,
    AllGatherInPlace,
    Broadcast,
    Reduce,
    ReduceInPlace,
    SendRecv,
    AllToAll,
    Barrier,
}

impl Kind {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Kind::AllReduce => "all_reduce",
            Kind::AllReduceInPlace => "all_reduce_in_place",
            Kind::AllReduceAsync => "all_reduce_async",
            Kind::ReduceScatter => "reduce_scatter",
            Kind::ReduceScatterInPlace => "reduce_scatter_in_place",
            Kind::AllGather => "all_gather",
            Kind::AllGatherInPlace => "all_gather_in_place",
            Kind::Broadcast => "broadcast",
            Kind::Reduce => "reduce",
            Kind::ReduceInPlace => "reduce_in_place",
            Kind::SendRecv => "send/recv",
            Kind::AllToAll => "all_to_all",
            Kind::Barrier => "barrier",
        }
    }

    fn reduces(self) -> bool {
        matches!(
            self,
            Kind::AllReduce
                | Kind::AllReduceInPlace
                | Kind::AllReduceAsync
                | Kind::ReduceScatter
                | Kind::ReduceScatterInPlace
                | Kind::Reduce
                | Kind::ReduceInPlace
        )
    }

    /// Buffers of `count * size` elements.
    fn blocked(self) -> bool {
        matches!(
            self,
            Kind::ReduceScatter
                | Kind::ReduceScatterInPlace
                | Kind::AllGather
                | Kind::AllGatherInPlace
                | Kind::AllToAll
        )
    }
}

/// Relative weights of the kinds of a single call.
const WEIGHTS: [(Kind, usize); 12] = [
    (Kind::AllReduce, 12),
    (Kind::AllReduceInPlace, 10),
    (Kind::ReduceScatter, 7),
    (Kind::ReduceScatterInPlace, 6),
    (Kind::AllGather, 7),
    (Kind::AllGatherInPlace, 6),
    (Kind::Broadcast, 8),
    (Kind::Reduce, 7),
    (Kind::ReduceInPlace, 6),
    (Kind::SendRecv, 8),
    (Kind::AllToAll, 7),
    (Kind::Barrier, 4),
];

/// One call on one communicator, as every rank of it sees it.
#[derive(Debug, Clone)]
pub(crate) struct Call {
    pub(crate) kind: Kind,
    pub(crate) dtype: DataType,
    pub(crate) op: ReduceOp,
    /// Elements per rank (per block for blocked kinds).
    pub(crate) count: usize,
    /// Root of broadcast and reduce; the sender of send/recv.
    pub(crate) root: usize,
    /// The receiver of send/recv.
    pub(crate) peer: usize,
    /// Float inputs with fractional parts (checked within a tolerance).
    pub(crate) frac: bool,
    /// Non-root ranks of `reduce` pass an empty receive buffer.
    pub(crate) empty_recv: bool,
    /// The buffers lie in windows made for the call.
    pub(crate) windows: bool,
    /// Seeds the inputs of this call.
    pub(crate) salt: u64,
}

impl Call {
    pub(crate) fn describe(&self) -> String {
        let k = self.kind;
        let mut s = k.name().to_string();
        if k == Kind::Barrier {
            return s;
        }
        s += &format!(" {}", self.dtype);
        if k.reduces() {
            s += &format!(" {}", self.op.name());
            if self.frac {
                s += " fractional";
            }
        }
        s += &format!(
            " {} element{}{}",
            self.count,
            if self.count == 1 { "" } else { "s" },
            if k.blocked() { " per block" } else { "" }
        );
        if self.windows {
            s += " in windows";
        }
        match k {
            Kind::Broadcast | Kind::Reduce | Kind::ReduceInPlace => {
                s += &format!(" root {}", self.root);
                if k == Kind::Reduce && self.empty_recv {
                    s += " (empty recv off the root)";
                }
            }
            Kind::SendRecv => s += &format!(" from rank {} to rank {}", self.root, self.peer),
            _ => {}
        }
        s
    }
}

/// What one communicator does in one step.
#[derive(Debug, Clone)]
pub(crate) enum Action {
    Call(Call),
    /// Async allreduces issued back to back, optionally a blocking call
    /// issued after them, then the async ones waited in order.
    Batch {
        calls: Vec<Call>,
        between: Option<Call>,
    },
}

impl Action {
    pub(crate) fn describe(&self) -> String {
        match self {
            Action::Call(c) => c.describe(),
            Action::Batch { calls, between } => {
                let list: Vec<String> = calls.iter().map(Call::describe).collect();
                let mut s = format!("async batch of {}: [{}]", calls.len(), list.join("; "));
                if let Some(b) = between {
                    s += &format!(", then blocking {} before the waits", b.describe());
                }
                s
            }
        }
    }
}

/// A split: every parent rank's color and key.
#[derive(Debug, Clone)]
pub(crate) struct SplitPlan {
    pub(crate) index: usize,
    pub(crate) colors: Vec<i32>,
    pub(crate) keys: Vec<i32>,
}

impl SplitPlan {
    /// The parent ranks of `color`, ordered as the sub-communicator ranks
    /// them: by key, ties by parent rank.
    pub(crate) fn members(&self, color: i32) -> Vec<usize> {
        let mut m: Vec<(i32, usize)> = (0..self.colors.len())
            .filter(|&r| self.colors[r] == color)
            .map(|r| (self.keys[r], r))
            .collect();
        m.sort_unstable();
        m.into_iter().map(|(_, r)| r).collect()
    }

    /// The colors in use, ascending.
    fn groups(&self) -> Vec<i32> {
        let mut c: Vec<i32> = self.colors.iter().copied().filter(|&c| c >= 0).collect();
        c.sort_unstable();
        c.dedup();
        c
    }
}

/// One step of the sequence.
#[derive(Debug, Clone)]
pub(crate) enum Step {
    /// Every rank of the job.
    World(Action),
    /// Every rank calls split; the members of each color get a communicator.
    Split(SplitPlan),
    /// Each sub-communicator of the current split does its action (by
    /// color); `last` ends the split (the sub-communicators are dropped).
    Sub {
        actions: Vec<(i32, Action)>,
        last: bool,
    },
    /// A communicator that comes and goes: every rank calls split, the
    /// members of each color do one action on theirs and drop it at once
    /// (as `new_group`, a pipeline stage's group or a recovery would).
    Cycle {
        plan: SplitPlan,
        actions: Vec<(i32, Action)>,
    },
}

/// Draws the sequence; every rank runs one, in step.
pub(crate) struct Generator {
    rng: Rng,
    size: usize,
    max_count: usize,
    splits: bool,
    windows: bool,
    /// The current split and the sub-steps it has left.
    split: Option<(SplitPlan, usize)>,
    splits_made: usize,
}

impl Generator {
    pub(crate) fn new(seed: u64, size: usize, opts: &Options) -> Self {
        Generator {
            rng: Rng(mix(seed ^ 0x50a4_50a4)),
            size,
            max_count: opts.max_count,
            splits: opts.splits,
            windows: opts.windows,
            split: None,
            splits_made: 0,
        }
    }

    pub(crate) fn next_step(&mut self) -> Step {
        if let Some((plan, left)) = self.split.take() {
            if self.rng.chance(20) {
                // The parent stays usable while its children live.
                let action = self.action(self.size);
                self.split = Some((plan, left));
                return Step::World(action);
            }
            let actions = plan
                .groups()
                .into_iter()
                .map(|c| (c, self.action(plan.members(c).len())))
                .collect();
            let last = left <= 1;
            if !last {
                self.split = Some((plan, left - 1));
            }
            return Step::Sub { actions, last };
        }
        if self.splits && self.rng.chance(8) {
            let plan = self.split_plan();
            let actions = plan
                .groups()
                .into_iter()
                .map(|c| (c, self.action(plan.members(c).len())))
                .collect();
            return Step::Cycle { plan, actions };
        }
        if self.splits && self.rng.chance(6) {
            let plan = self.split_plan();
            self.split = Some((plan.clone(), 1 + self.rng.below(6)));
            return Step::Split(plan);
        }
        Step::World(self.action(self.size))
    }

    /// Random colors (some negative: left out) and keys for every rank.
    fn split_plan(&mut self) -> SplitPlan {
        let n = self.size;
        let ncolors = 1 + self.rng.below(n.min(3));
        let colors = (0..n)
            .map(|_| {
                if self.rng.chance(15) {
                    -1 - self.rng.below(2) as i32
                } else {
                    self.rng.below(ncolors) as i32
                }
            })
            .collect();
        let keys = (0..n).map(|_| self.rng.below(5) as i32 - 2).collect();
        let plan = SplitPlan {
            index: self.splits_made,
            colors,
            keys,
        };
        self.splits_made += 1;
        plan
    }

    /// An action for a communicator of `n` ranks.
    fn action(&mut self, n: usize) -> Action {
        if self.rng.chance(8) {
            let calls = (0..1 + self.rng.below(4))
                .map(|_| self.call(Kind::AllReduceAsync, n))
                .collect();
            let between = if self.rng.chance(30) {
                let kind = self
                    .rng
                    .pick(&[Kind::AllReduce, Kind::Barrier, Kind::Broadcast]);
                Some(self.call(kind, n))
            } else {
                None
            };
            return Action::Batch { calls, between };
        }
        let total: usize = WEIGHTS.iter().map(|w| w.1).sum();
        let mut x = self.rng.below(total);
        let mut kind = Kind::Barrier;
        for (k, w) in WEIGHTS {
            if x < w {
                kind = k;
                break;
            }
            x -= w;
        }
        if kind == Kind::SendRecv && n < 2 {
            kind = Kind::AllReduce;
        }
        Action::Call(self.call(kind, n))
    }

    fn call(&mut self, kind: Kind, n: usize) -> Call {
        let dtype = self.rng.pick(&DataType::ALL);
        let op = self.rng.pick(&ReduceOp::ALL);
        let limit = if kind.blocked() {
            self.max_count / n
        } else {
            self.max_count
        };
        let count = if kind == Kind::Barrier {
            0
        } else {
            self.count(n, limit)
        };
        let root = self.rng.below(n);
        let peer = if n > 1 {
            (root + 1 + self.rng.below(n - 1)) % n
        } else {
            root
        };
        let frac = is_float(dtype) && op != ReduceOp::Prod && self.rng.chance(30);
        Call {
            kind,
            dtype,
            op,
            count,
            root,
            peer,
            frac,
            empty_recv: self.rng.chance(50),
            // Not send/recv, whose ranks hold different buffers (windows
            // are made by every rank together).
            windows: self.windows
                && !matches!(kind, Kind::SendRecv | Kind::Barrier)
                && self.rng.chance(25),
            salt: self.rng.next(),
        }
    }

    /// A count skewed towards the edges: 0, 1, the rank count give or take
    /// one, small odd numbers, powers of two give or take one; sometimes
    /// anything up to `limit`.
    fn count(&mut self, n: usize, limit: usize) -> usize {
        let r = &mut self.rng;
        let c = match r.below(100) {
            0..=9 => 0,
            10..=19 => 1,
            20..=29 => n + r.below(3) - 1,
            30..=54 => 2 + r.below(63),
            55..=66 => (1usize << (4 + r.below(14))) + r.below(3) - 1,
            67..=87 => 65 + r.below(4032),
            _ => r.below(limit + 1),
        };
        let c = if c > 1 && r.chance(50) { c | 1 } else { c };
        c.min(limit)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::options::parse_options;
    use crate::reference::{int_input, int_range, reference};

    #[test]
    fn sequences_depend_on_the_seed_only() {
        let steps = |seed| {
            let opts = parse_options(&["--max-count=1000".to_string()])
                .unwrap()
                .unwrap();
            let mut g = Generator::new(seed, 4, &opts);
            (0..300)
                .map(|_| format!("{:?}", g.next_step()))
                .collect::<Vec<_>>()
        };
        assert_eq!(steps(5), steps(5));
        assert_ne!(steps(5), steps(6));
    }

    #[test]
    fn create_drop_cycles_give_one_action_to_each_color() {
        let cycles = |args: &[&str]| {
            let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
            let opts = parse_options(&args).unwrap().unwrap();
            let mut g = Generator::new(3, 4, &opts);
            let mut made = 0;
            for _ in 0..500 {
                if let Step::Cycle { plan, actions } = g.next_step() {
                    made += 1;
                    let colors: Vec<i32> = actions.iter().map(|(c, _)| *c).collect();
                    assert_eq!(colors, plan.groups());
                    assert!(plan
                        .colors
                        .iter()
                        .all(|&c| c >= 0 || colors.iter().all(|&g| g != c)));
                }
            }
            made
        };
        assert!(cycles(&[]) > 10);
        assert_eq!(cycles(&["--no-splits"]), 0);
    }

    #[test]
    fn integer_references_stay_in_range() {
        let opts = parse_options(&["--max-count=50".to_string(), "--no-splits".to_string()])
            .unwrap()
            .unwrap();
        let mut g = Generator::new(1, 5, &opts);
        for _ in 0..2000 {
            let n = 1 + g.rng.below(8);
            let c = g.call(Kind::AllReduce, n);
            if c.frac {
                continue;
            }
            let (lo, hi) = int_range(c.dtype);
            for i in 0..c.count {
                let (want, _) = reference(&c, n, i);
                assert!(want >= lo as f64 && want <= hi as f64, "{c:?} {i}: {want}");
                for r in 0..n {
                    let v = int_input(&c, n, r, i) as f64;
                    assert!(v >= lo as f64 && v <= hi as f64, "{c:?}");
                }
            }
        }
    }
}
