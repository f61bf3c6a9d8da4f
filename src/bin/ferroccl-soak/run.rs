//! Running the sequence on one rank: each step on the world or on this
//! rank's communicator of the current split, async batches waited in
//! order, splits checked against their plan, and the tally the summary
//! prints. The checks of single calls are check.rs's.

use crate::check::{Checked, Soak};
use crate::options::Options;
use crate::sequence::{Action, Call, Generator, Kind, SplitPlan, Step};
use crate::tool::say;
use ferroccl::{Communicator, DataType};
use half::{bf16, f16};
use std::collections::BTreeMap;

/// `$obj.$method::<T>($args)` for the element type `$dt` names.
macro_rules! by_type {
    ($dt:expr, $obj:ident . $method:ident, $($arg:expr),*) => {
        match $dt {
            DataType::F32 => $obj.$method::<f32>($($arg),*),
            DataType::F64 => $obj.$method::<f64>($($arg),*),
            DataType::F16 => $obj.$method::<f16>($($arg),*),
            DataType::Bf16 => $obj.$method::<bf16>($($arg),*),
            DataType::I8 => $obj.$method::<i8>($($arg),*),
            DataType::U8 => $obj.$method::<u8>($($arg),*),
            DataType::I32 => $obj.$method::<i32>($($arg),*),
            DataType::U32 => $obj.$method::<u32>($($arg),*),
            DataType::I64 => $obj.$method::<i64>($($arg),*),
            DataType::U64 => $obj.$method::<u64>($($arg),*),
        }
    };
}

/// Count an action in the summary.
fn count_action(tally: &mut BTreeMap<String, usize>, a: &Action) {
    let mut one = |c: &Call| {
        *tally.entry(c.kind.name().into()).or_default() += 1;
        if c.windows {
            *tally.entry("in windows".into()).or_default() += 1;
        }
    };
    match a {
        Action::Call(c) => one(c),
        Action::Batch { calls, between } => {
            if let Some(b) = between {
                one(b);
            }
            *tally.entry("async batch".into()).or_default() += 1;
            *tally.entry(Kind::AllReduceAsync.name().into()).or_default() += calls.len();
        }
    }
}

impl Soak {
    fn action(&self, comm: &Communicator, a: &Action) -> Checked {
        let before = comm.direct_window_calls();
        let result = self.action_on(comm, a);
        let direct = comm.direct_window_calls() - before;
        if direct > 0 {
            self.direct.set(self.direct.get() + direct);
        }
        result
    }

    fn action_on(&self, comm: &Communicator, a: &Action) -> Checked {
        match a {
            Action::Call(c) => by_type!(c.dtype, self.call, comm, c),
            Action::Batch { calls, between } => {
                let mut pending = Vec::new();
                for (j, c) in calls.iter().enumerate() {
                    let what = format!("async call {} of {}", j + 1, calls.len());
                    let wait = by_type!(c.dtype, self.issue, comm, c)
                        .map_err(|e| format!("{what}: issue: {e}"))?;
                    pending.push((what, wait));
                }
                if let Some(b) = between {
                    by_type!(b.dtype, self.call, comm, b)
                        .map_err(|e| format!("blocking call between: {e}"))?;
                }
                for (what, wait) in pending {
                    wait().map_err(|e| format!("{what}: {e}"))?;
                }
                Ok(())
            }
        }
    }

    /// Run `ops` steps on `world`; on failure return (step, description,
    /// what went wrong).
    pub(crate) fn run(
        &self,
        world: &Communicator,
        opts: &Options,
        tally: &mut BTreeMap<String, usize>,
    ) -> Result<(), (usize, String, String)> {
        let (rank, size) = (world.rank(), world.size());
        let mut generator = Generator::new(self.seed, size, opts);
        // This rank's communicator of the current split, with its color.
        let mut sub: Option<(i32, Communicator)> = None;
        for i in 0..opts.ops {
            let step = generator.next_step();
            let (desc, result) = match &step {
                Step::World(a) => {
                    count_action(tally, a);
                    let desc = a.describe();
                    self.announce(rank, i, &desc);
                    let r = self.action(world, a);
                    (desc, r)
                }
                Step::Split(plan) => {
                    *tally.entry("split".into()).or_default() += 1;
                    let desc = format!(
                        "split #{}: colors {:?} keys {:?}",
                        plan.index, plan.colors, plan.keys
                    );
                    self.announce(rank, i, &desc);
                    let r = self.split(world, plan).map(|c| {
                        sub = c;
                    });
                    (desc, r)
                }
                Step::Cycle { plan, actions } => {
                    *tally.entry("create/drop cycle".into()).or_default() += 1;
                    let mut desc = format!(
                        "create/drop cycle (split #{}: colors {:?} keys {:?})",
                        plan.index, plan.colors, plan.keys
                    );
                    self.announce(rank, i, &desc);
                    for (_, a) in actions {
                        count_action(tally, a);
                    }
                    let mut r = self.split(world, plan);
                    if let Ok(Some((mine, comm))) = &r {
                        for (color, a) in actions {
                            if color == mine {
                                desc += &format!(
                                    ", color {color}, rank {} of {}: {}",
                                    comm.rank(),
                                    comm.size(),
                                    a.describe()
                                );
                                if let Err(e) = self.action(comm, a) {
                                    r = Err(e);
                                    break;
                                }
                            }
                        }
                    }
                    // The communicator is dropped here, at once.
                    (desc, r.map(drop))
                }
                Step::Sub { actions, last } => {
                    let mut desc = String::from("no part in this step of the split");
                    let mut r = Ok(());
                    for (color, a) in actions {
                        count_action(tally, a);
                        if let Some((mine, comm)) = &sub {
                            if mine == color {
                                desc = format!(
                                    "in split color {color}, rank {} of {}: {}",
                                    comm.rank(),
                                    comm.size(),
                                    a.describe()
                                );
                                self.announce(rank, i, &desc);
                                r = self.action(comm, a);
                            }
                        }
                    }
                    if *last {
                        sub = None;
                    }
                    (desc, r)
                }
            };
            result.map_err(|e| (i, desc, e))?;
        }
        Ok(())
    }

    /// Split `world` as `plan` says; check this rank's place in the result.
    fn split(
        &self,
        world: &Communicator,
        plan: &SplitPlan,
    ) -> Result<Option<(i32, Communicator)>, String> {
        let rank = world.rank();
        let (color, key) = (plan.colors[rank], plan.keys[rank]);
        let got = world.split(color, key).map_err(|e| e.to_string())?;
        if color < 0 {
            return match got {
                None => Ok(None),
                Some(c) => Err(format!(
                    "color {color} should give no communicator, got rank {} of {}",
                    c.rank(),
                    c.size()
                )),
            };
        }
        let comm = got.ok_or_else(|| format!("color {color} gave no communicator"))?;
        let members = plan.members(color);
        let want = members.iter().position(|&r| r == rank);
        if comm.size() != members.len() || Some(comm.rank()) != want {
            return Err(format!(
                "got rank {} of {}, expected rank {want:?} of {} (members by key: {members:?})",
                comm.rank(),
                comm.size(),
                members.len()
            ));
        }
        Ok(Some((color, comm)))
    }

    fn announce(&self, rank: usize, i: usize, desc: &str) {
        if self.verbose {
            say(&format!("rank {rank}: op #{i}: {desc}"));
        }
    }
}
