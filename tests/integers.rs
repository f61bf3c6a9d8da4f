//! Integer semantics through real communicators (`ReduceOp`'s docs):
//! Sum and Prod wrap on overflow (two's complement, modulo 2^bits, as
//! NCCL); Avg is the wrapped sum divided by the rank count, truncated
//! toward zero. Allreduce, reduce and reduce-scatter of i8, u8, i32, u32,
//! i64 and u64 on full-range inputs, the extremes and small negatives,
//! small (inline at the check-in) and large, every algorithm forced and
//! the planner's choice, on 2, 3 and 4 ranks, against a reference
//! computed in i128.

mod common;

use common::SplitMix;
use ferroccl::testing::run_ranks_with;
use ferroccl::{Algorithm, Communicator, Config, Element, ReduceOp};
use std::time::Duration;

/// An integer element type, seen through i128.
trait Int: Element {
    const MIN: i128;
    const MAX: i128;
    fn to_i128(self) -> i128;
    /// `v` modulo 2^bits, as the type (the two's-complement truncation
    /// of `as`).
    fn wrap(v: i128) -> Self;
}

macro_rules! int {
    ($($t:ty),*) => {$(
        impl Int for $t {
            const MIN: i128 = <$t>::MIN as i128;
            const MAX: i128 = <$t>::MAX as i128;
            fn to_i128(self) -> i128 {
                self as i128
            }
            fn wrap(v: i128) -> Self {
                v as $t
            }
        }
    )*};
}
int!(i8, u8, i32, u32, i64, u64);

/// `rank`'s input at element `i`: the extremes on every rank (sums and
/// products that overflow at once), small negatives that differ by rank
/// (an Avg that is not a whole number: truncated toward zero, not down),
/// and full-range values.
fn value<T: Int>(rank: usize, i: usize) -> T {
    match i % 8 {
        0 => T::wrap(T::MAX),
        1 => T::wrap(T::MIN),
        2 => T::wrap(-1 - rank as i128),
        3 => T::wrap(T::MAX - rank as i128),
        _ => T::wrap(SplitMix((rank * 1_000_003 + i) as u64).next() as i128),
    }
}

/// The result at element `i` over `n` ranks, computed in i128: the exact
/// sum (at most 4 * 2^64 in size, no overflow) or the product modulo
/// 2^128 (which 2^bits divides), reduced modulo 2^bits; Avg the reduced
/// sum divided by `n` toward zero.
fn reference<T: Int>(op: ReduceOp, n: usize, i: usize) -> T {
    let vals = (0..n).map(|r| value::<T>(r, i).to_i128());
    match op {
        ReduceOp::Sum => T::wrap(vals.sum()),
        ReduceOp::Prod => T::wrap(vals.fold(1i128, i128::wrapping_mul)),
        ReduceOp::Avg => {
            let sum = T::wrap(vals.sum()).to_i128();
            let q = (sum.unsigned_abs() / n as u128) as i128;
            T::wrap(if sum < 0 { -q } else { q })
        }
        other => unreachable!("{other} does not overflow"),
    }
}

fn check<T: Int>(what: &str, got: &[T], want: impl Fn(usize) -> T) {
    for (j, g) in got.iter().enumerate() {
        let w = want(j);
        assert!(
            *g == w,
            "{what}: element {j} of {} is {g:?}, expected {w:?}",
            got.len()
        );
    }
}

/// Allreduce (out of place and in place), reduce to a root and
/// reduce-scatter of every overflowing op at `count` elements (per rank
/// for reduce-scatter).
fn calls<T: Int>(comm: &Communicator, count: usize) {
    let (rank, n) = (comm.rank(), comm.size());
    for op in [ReduceOp::Sum, ReduceOp::Prod, ReduceOp::Avg] {
        let what = |name: &str| {
            format!(
                "{name} {} {op} n={n} count={count} rank={rank} algorithm {:?}",
                T::DTYPE,
                comm.config().algorithm
            )
        };
        let mine: Vec<T> = (0..count).map(|i| value(rank, i)).collect();
        let want = |j: usize| reference::<T>(op, n, j);

        let mut out = vec![T::wrap(7); count];
        comm.all_reduce(&mine, &mut out, op).unwrap();
        check(&what("all_reduce"), &out, want);
        let mut buf = mine.clone();
        comm.all_reduce_in_place(&mut buf, op).unwrap();
        check(&what("all_reduce_in_place"), &buf, want);

        let root = (count + 1) % n;
        let mut out = vec![T::wrap(7); if rank == root { count } else { 0 }];
        comm.reduce(&mine, &mut out, op, root).unwrap();
        if rank == root {
            check(&what("reduce"), &out, want);
        }

        let big: Vec<T> = (0..count * n).map(|i| value(rank, i)).collect();
        let mut out = vec![T::wrap(7); count];
        comm.reduce_scatter(&big, &mut out, op).unwrap();
        check(&what("reduce_scatter"), &out, |j| {
            reference::<T>(op, n, rank * count + j)
        });
    }
}

fn every_type(comm: &Communicator) {
    // Small: at most 4 KiB (inline at the check-in); large: through slots.
    let sizes = |elem: usize| [1000 / elem, 96 * 1024 / elem + 3];
    for count in sizes(1) {
        calls::<i8>(comm, count);
        calls::<u8>(comm, count);
    }
    for count in sizes(4) {
        calls::<i32>(comm, count);
        calls::<u32>(comm, count);
    }
    for count in sizes(8) {
        calls::<i64>(comm, count);
        calls::<u64>(comm, count);
    }
}

fn run(configure: impl Fn(&mut Config) + Sync) {
    for n in [2, 3, 4] {
        run_ranks_with(
            n,
            |c| {
                c.timeout = Duration::from_secs(30);
                configure(c);
            },
            |comm| every_type(&comm),
        );
    }
}

#[test]
fn planner_choice_wraps_and_truncates() {
    run(|_| {});
}

#[test]
fn every_algorithm_wraps_and_truncates() {
    for algorithm in Algorithm::ALL {
        run(|c| c.algorithm = Some(algorithm));
    }
}
