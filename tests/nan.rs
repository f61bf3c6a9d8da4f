//! NaN and signed zeros in Min and Max through real communicators: a NaN
//! on any rank (the first, a middle one, the last, or all of them with
//! different NaNs) at elements in the first vector, past it, past a
//! kernel block, in the middle and last, must give the canonical NaN of
//! the type (`ReduceOp::Min`'s docs) at exactly those elements on every
//! rank that holds a result, and the IEEE minimum or maximum (-0 below +0)
//! elsewhere, bit for bit, against an f64 reference. Allreduce, reduce and
//! reduce-scatter, out of place and in place, on plain buffers and on
//! windows, small (inline at the check-in) and large (through slots or
//! directly between windows, with and without streaming stores), every
//! algorithm forced in turn and the planner's choice, on 2 and 3 ranks.

use ferroccl::testing::run_ranks_with;
use ferroccl::{Algorithm, Communicator, Config, DataType, Element, ReduceOp};
use half::{bf16, f16};
use std::time::Duration;

/// The NaN Min and Max give (documented on `ReduceOp::Min`), written out
/// from the IEEE formats: positive, quiet, no payload.
fn canonical_nan<T: Element>() -> T {
    from_bits(match T::DTYPE {
        DataType::F32 => 0x7fc0_0000,
        DataType::F64 => 0x7ff8_0000_0000_0000,
        DataType::F16 => 0x7e00,
        DataType::Bf16 => 0x7fc0,
        other => unreachable!("{other} has no NaN"),
    })
}

/// A value of `T` from its bit pattern.
fn from_bits<T: Element>(bits: u64) -> T {
    match std::mem::size_of::<T>() {
        2 => bytemuck::pod_read_unaligned(&(bits as u16).to_ne_bytes()),
        4 => bytemuck::pod_read_unaligned(&(bits as u32).to_ne_bytes()),
        8 => bytemuck::pod_read_unaligned(&bits.to_ne_bytes()),
        n => unreachable!("no float type has {n} bytes"),
    }
}

/// Non-canonical NaNs of `T`: both signs, quiet and signalling, payloads.
fn odd_nans<T: Element>() -> Vec<T> {
    let bits: &[u64] = match T::DTYPE {
        DataType::F32 => &[0xffc0_0000, 0x7f80_0001, 0x7fff_ffff, 0xffc1_2345],
        DataType::F64 => &[
            0xfff8_0000_0000_0000,
            0x7ff0_0000_0000_0001,
            0x7fff_ffff_ffff_ffff,
            0xfff8_1234_5678_9abc,
        ],
        DataType::F16 => &[0xfe00, 0x7c01, 0x7fff, 0xfe5a],
        DataType::Bf16 => &[0xffc0, 0x7f81, 0x7fff, 0xffda],
        other => unreachable!("{other} has no NaN"),
    };
    bits.iter().map(|&b| from_bits(b)).collect()
}

/// Elements that get NaNs in a call of `count` elements.
fn nan_positions(count: usize) -> Vec<usize> {
    let mut p: Vec<usize> = [0, 7, 31, 1000, 1030, count / 2, count.saturating_sub(1)]
        .into_iter()
        .filter(|&p| p < count)
        .collect();
    p.sort_unstable();
    p.dedup();
    p
}

/// Which ranks hold a NaN at each element of a call of `count` (`n`
/// ranks): the k-th NaN position goes to rank k % (n + 1), and to every
/// rank where that is n. So rank 0, the middle and the last rank all get
/// some, and some elements are NaN on every rank at once.
fn nan_ranks(count: usize, n: usize) -> Vec<Vec<usize>> {
    let mut holders = vec![Vec::new(); count];
    for (k, p) in nan_positions(count).into_iter().enumerate() {
        holders[p] = if k % (n + 1) == n {
            (0..n).collect()
        } else {
            vec![k % (n + 1)]
        };
    }
    holders
}

/// Finite and infinite values exact in every float type, both zeros
/// among them, different on every rank.
fn finite(rank: usize, i: usize) -> f64 {
    match (i * 7 + rank * 5 + (i / 19) * (rank + 1)) % 19 {
        0 => -0.0,
        1 => 0.0,
        2 => f64::INFINITY,
        3 => f64::NEG_INFINITY,
        k => k as f64 - 9.5,
    }
}

/// `rank`'s input: `finite`, with a NaN (a different one per rank) where
/// `nan_ranks` says.
fn input<T: Element>(rank: usize, n: usize, count: usize) -> Vec<T> {
    let nans = odd_nans::<T>();
    let holders = nan_ranks(count, n);
    (0..count)
        .map(|i| {
            if holders[i].contains(&rank) {
                nans[(i + rank) % nans.len()]
            } else {
                T::from_f64(finite(rank, i))
            }
        })
        .collect()
}

/// The result of a call of `count` elements, from the f64 values: the
/// canonical NaN where any rank's element is NaN, else the IEEE minimum or
/// maximum (-0 below +0).
fn want<T: Element>(op: ReduceOp, n: usize, count: usize) -> Vec<T> {
    let below = |a: f64, b: f64| a < b || (a == b && a.is_sign_negative() && b.is_sign_positive());
    let pick = |acc: f64, v: f64| match op {
        ReduceOp::Min if below(v, acc) => v,
        ReduceOp::Max if below(acc, v) => v,
        _ => acc,
    };
    nan_ranks(count, n)
        .iter()
        .enumerate()
        .map(|(i, holders)| {
            if holders.is_empty() {
                let extreme = (0..n).map(|r| finite(r, i)).reduce(pick);
                T::from_f64(extreme.expect("at least one rank"))
            } else {
                canonical_nan()
            }
        })
        .collect()
}

/// Assert `got[j]` has the bits of `want(j)`, naming the first that
/// does not.
fn check<T: Element>(what: &str, got: &[T], want: &[T]) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    for (j, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            bytemuck::bytes_of(g) == bytemuck::bytes_of(w),
            "{what}: element {j} of {} is {g:?} ({:02x?}), expected {w:?} ({:02x?})",
            got.len(),
            bytemuck::bytes_of(g),
            bytemuck::bytes_of(w)
        );
    }
}

/// Where a call's buffers live.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Memory {
    Plain,
    Window,
}

/// Allreduce, reduce and reduce-scatter of `op` at `count` elements (per
/// rank for reduce-scatter), out of place and in place, in `memory`;
/// returns this rank's allreduce result, as bits, for the comparison
/// across ranks.
fn calls<T: Element>(comm: &Communicator, op: ReduceOp, count: usize, memory: Memory) -> Vec<u8> {
    let (rank, n) = (comm.rank(), comm.size());
    let what = |name: &str| {
        format!(
            "{name} {} {op} n={n} count={count} rank={rank} {memory:?} algorithm {:?} \
             checkin {} nt_store_bytes {}",
            T::DTYPE,
            comm.config().algorithm,
            comm.config().checkin,
            comm.config().nt_store_bytes
        )
    };
    let mine: Vec<T> = input(rank, n, count);
    let big: Vec<T> = input(rank, n, count * n);
    let want_all = &want::<T>(op, n, count)[..];
    let want_block = &want::<T>(op, n, count * n)[rank * count..(rank + 1) * count];
    let root = (count + op as usize) % n;
    let poison = T::from_f64(-99.0);

    // Buffers: two of `count * n + 8` elements, plain or windows.
    let len = count * n + 8;
    let (mut wa, mut wb);
    let (mut pa, mut pb);
    let (a, b): (&mut [T], &mut [T]) = match memory {
        Memory::Window => {
            wa = comm.alloc_window::<T>(len).unwrap();
            wb = comm.alloc_window::<T>(len).unwrap();
            (&mut wa[..], &mut wb[..])
        }
        Memory::Plain => {
            pa = vec![T::zeroed(); len];
            pb = vec![T::zeroed(); len];
            (&mut pa[..], &mut pb[..])
        }
    };

    // Allreduce: out of place (the input at an offset per rank), in place.
    let at = rank % 3;
    a[at..at + count].copy_from_slice(&mine);
    b[..count].fill(poison);
    comm.all_reduce(&a[at..at + count], &mut b[..count], op)
        .unwrap();
    check(&what("all_reduce"), &b[..count], want_all);
    let result = bytemuck::cast_slice::<T, u8>(&b[..count]).to_vec();
    a[..count].copy_from_slice(&mine);
    comm.all_reduce_in_place(&mut a[..count], op).unwrap();
    check(&what("all_reduce_in_place"), &a[..count], want_all);

    // Reduce to `root`.
    a[..count].copy_from_slice(&mine);
    b[..count].fill(poison);
    let out = if rank == root { count } else { 0 };
    comm.reduce(&a[..count], &mut b[..out], op, root).unwrap();
    a[..count].copy_from_slice(&mine);
    comm.reduce_in_place(&mut a[..count], op, root).unwrap();
    if rank == root {
        check(&what("reduce"), &b[..count], want_all);
        check(&what("reduce_in_place"), &a[..count], want_all);
    } else {
        assert!(
            bytemuck::cast_slice::<T, u8>(&a[..count]) == bytemuck::cast_slice::<T, u8>(&mine),
            "{}: a non-root buffer changed",
            what("reduce_in_place")
        );
    }

    // Reduce-scatter: out of place into the other buffer, and in place.
    a[..count * n].copy_from_slice(&big);
    b[..count].fill(poison);
    comm.reduce_scatter(&a[..count * n], &mut b[..count], op)
        .unwrap();
    check(&what("reduce_scatter"), &b[..count], want_block);
    a[..count * n].copy_from_slice(&big);
    comm.reduce_scatter_in_place(&mut a[..count * n], op)
        .unwrap();
    check(
        &what("reduce_scatter_in_place"),
        &a[rank * count..(rank + 1) * count],
        want_block,
    );
    result
}

/// Every type, op, size and memory on one communicator; returns the
/// allreduce results, for the comparison across ranks.
fn every_case(comm: &Communicator) -> Vec<Vec<u8>> {
    let n = comm.size();
    // Small: every call's input at most 4 KiB (inline at the check-in,
    // reduce-scatter's whole input too); large: a few hundred KiB.
    let sizes = |elem: usize| [(4096 / elem - 3) / n, 300 * 1024 / elem + 1];
    let mut results = Vec::new();
    for memory in [Memory::Plain, Memory::Window] {
        for op in [ReduceOp::Min, ReduceOp::Max] {
            for count in sizes(4) {
                results.push(calls::<f32>(comm, op, count, memory));
            }
            for count in sizes(8) {
                results.push(calls::<f64>(comm, op, count, memory));
            }
            for count in sizes(2) {
                results.push(calls::<f16>(comm, op, count, memory));
                results.push(calls::<bf16>(comm, op, count, memory));
            }
        }
    }
    results
}

fn run(n: usize, configure: impl Fn(&mut Config) + Sync) {
    let results = run_ranks_with(
        n,
        |c| {
            c.timeout = Duration::from_secs(30);
            configure(c);
        },
        |comm| every_case(&comm),
    );
    for (rank, r) in results.iter().enumerate() {
        assert!(
            *r == results[0],
            "rank {rank} of {n}: allreduce bits differ from rank 0's"
        );
    }
}

#[test]
fn planner_choice() {
    for n in [2, 3] {
        run(n, |_| {});
    }
}

#[test]
fn planner_choice_without_the_check_in() {
    for n in [2, 3] {
        run(n, |c| c.checkin = false);
    }
}

#[test]
fn planner_choice_with_streaming_stores() {
    // Every output written with streaming stores: the fused kernels
    // between windows.
    for n in [2, 3] {
        run(n, |c| c.nt_store_bytes = 1);
    }
}

#[test]
fn every_algorithm_forced() {
    for algorithm in Algorithm::ALL {
        for n in [2, 3] {
            run(n, |c| c.algorithm = Some(algorithm));
        }
    }
}
