//! `plan::confirms` checked on every schedule: with the confirmation it
//! asks for, every rank of every collective, algorithm, rank count, count
//! and root ends knowing that every other rank ran its call (so a mismatch
//! anywhere fails the call on every rank); without it, a broadcast or
//! reduce leaves some rank not knowing (so the confirmation is needed).

use super::{confirmation, plan, CollCall, CollKind, Geometry};
use crate::algo::{sim, Algorithm, Schedule};
use crate::element::ReduceOp;

/// Every rank's schedule of `call` on `n` ranks over links of `slots`
/// slots (ring passes as deep as a communicator runs them there), with or
/// without the confirmation the planner appends where the ranks share no
/// control pages.
fn schedules(
    call: &CollCall,
    n: usize,
    (slice, slots): (usize, usize),
    algo: Algorithm,
    confirm: bool,
) -> Vec<Schedule> {
    (0..n)
        .map(|rank| {
            let g = Geometry {
                rank,
                size: n,
                slice,
                depth: crate::algo::ring::pipeline_depth(slots),
            };
            let mut s = plan(call, g, algo).expect("a valid call").schedule;
            if confirm && crate::plan::confirms(call.kind, call.count, n) {
                s.steps.extend(confirmation(call, g, algo).steps);
            }
            s
        })
        .collect()
}

fn calls(n: usize, c: usize) -> Vec<CollCall> {
    let reducing = |kind, send, recv| CollCall {
        op: Some(ReduceOp::Sum),
        ..CollCall::new(kind, c, send, recv)
    };
    let mut out = vec![
        reducing(CollKind::AllReduce, c, c),
        reducing(CollKind::ReduceScatter, c * n, c),
        CollCall::new(CollKind::AllGather, c, c, c * n),
        CollCall::new(CollKind::AllToAll, c * n, c * n, c * n),
        CollCall::new(CollKind::Barrier, 0, 0, 0),
    ];
    for root in 0..n {
        out.push(CollCall {
            root: Some(root),
            in_place: true,
            ..CollCall::new(CollKind::Broadcast, c, c, c)
        });
        out.push(CollCall {
            root: Some(root),
            ..reducing(CollKind::Reduce, c, c)
        });
    }
    out
}

#[test]
fn with_its_confirmation_every_rank_of_every_call_knows_every_other_ran_it() {
    for n in 1..=7 {
        for c in [0, 1, 5, 13] {
            for call in calls(n, c) {
                for algo in Algorithm::ALL {
                    for (slice, cap) in [(2, 2), (4, 8), (1, 3), (1000, 2)] {
                        let all = schedules(&call, n, (slice, cap), algo, true);
                        let informed = sim::knowledge(&all, cap)
                            .unwrap_or_else(|e| panic!("{:?} n={n} c={c} {algo}: {e}", call.kind));
                        let blind: Vec<usize> = (0..n).filter(|&r| !informed[r]).collect();
                        assert!(
                            blind.is_empty(),
                            "{:?} root {:?} n={n} count={c} {algo} slice={slice}: ranks {blind:?} \
                             would not learn of a mismatch",
                            call.kind,
                            call.root
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn without_it_a_broadcast_or_reduce_leaves_a_rank_blind() {
    for n in 2..=7 {
        for call in calls(n, 5) {
            if !matches!(call.kind, CollKind::Broadcast | CollKind::Reduce) {
                continue;
            }
            for algo in [Algorithm::Ring, Algorithm::Tree] {
                let all = schedules(&call, n, (2, 2), algo, false);
                let informed = sim::knowledge(&all, 2).unwrap();
                assert!(
                    informed.iter().any(|&i| !i),
                    "{:?} root {:?} n={n} {algo}: every rank informed without confirmation",
                    call.kind,
                    call.root
                );
            }
        }
    }
}
