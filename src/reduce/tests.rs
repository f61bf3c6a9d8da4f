//! Unit tests of the kernels: against an f64 reference, across SIMD
//! levels bit for bit, and the streaming and two-destination kernels.
//!
//! Why one file of about 860 lines: one test module of one module
//! (`reduce`), every case over the same reference and type table; split,
//! each part would repeat them.

use super::arith::Arith;
use super::half::HalfSlices;
use super::kernels::{
    bf16_reduce_into_at, bf16_reduce_to_at, f16_reduce_into_at, f16_reduce_to_at, reduce_into_at,
    reduce_to_at, reduce_to_streams_at,
};
use super::{
    reduce_into, reduce_into_both, reduce_into_both_by, reduce_to, reduce_to_both,
    reduce_to_both_by, reduce_to_output, reduce_to_streams, SimdLevel, Store,
};
use crate::element::{DataType, Element, ReduceOp};
use half::{bf16, f16};

fn reference(op: ReduceOp, a: f64, b: f64) -> f64 {
    match op {
        ReduceOp::Sum | ReduceOp::Avg => a + b,
        ReduceOp::Prod => a * b,
        ReduceOp::Min | ReduceOp::Max => ieee_min_max(op, a, b).unwrap_or(f64::NAN),
    }
}

fn check<T: Element>(values: impl Fn(usize) -> (f64, f64)) {
    for op in ReduceOp::ALL {
        // Lengths around PAIR_BLOCK too, for the two-destination kernels.
        for len in [0usize, 1, 7, 255, 256, 257, 1000, 1024, 1025, 3000] {
            let a: Vec<T> = (0..len).map(|i| T::from_f64(values(i).0)).collect();
            let b: Vec<T> = (0..len).map(|i| T::from_f64(values(i).1)).collect();
            let mut into = a.clone();
            reduce_into(op, &mut into, &b);
            let mut to = vec![T::from_f64(0.0); len];
            reduce_to(op, &mut to, &a, &b);
            for i in 0..len {
                let want = T::from_f64(reference(op, a[i].to_f64(), b[i].to_f64()));
                assert_eq!(into[i], want, "{} {op} i={i}", T::DTYPE);
                assert_eq!(to[i], want, "{} {op} i={i}", T::DTYPE);
            }
            for mode in [Store::Cached, Store::Streaming] {
                let zeros = || vec![T::from_f64(0.0); len];
                let mut out = zeros();
                reduce_to_output(mode, op, &mut out, &a, &b);
                for after in [false, true] {
                    let (mut both, mut both_copy) = (zeros(), zeros());
                    reduce_to_both_by(after, mode, op, &mut both, &mut both_copy, &a, &b);
                    let (mut into_both, mut into_copy) = (a.clone(), zeros());
                    reduce_into_both_by(after, mode, op, &mut into_both, &mut into_copy, &b);
                    for i in 0..len {
                        let want = T::from_f64(reference(op, a[i].to_f64(), b[i].to_f64()));
                        let got = [out[i], both[i], both_copy[i], into_both[i], into_copy[i]];
                        for got in got {
                            assert_eq!(
                                got,
                                want,
                                "{mode:?} kernels (slot after: {after}): {} {op} i={i}",
                                T::DTYPE
                            );
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn kernels_match_f64_reference_for_every_type_and_op() {
    // Small integers keep every product exact in every type, so the
    // f64 reference rounded to the type is the exact answer.
    let small = |i: usize| (((i * 7) % 11) as f64 - 3.0, ((i * 5) % 9) as f64 - 2.0);
    let unsigned = |i: usize| (((i * 7) % 11) as f64, ((i * 5) % 9) as f64);
    check::<f32>(small);
    check::<f64>(small);
    check::<f16>(small);
    check::<bf16>(small);
    check::<i8>(small);
    check::<i32>(small);
    check::<i64>(small);
    check::<u8>(unsigned);
    check::<u32>(unsigned);
    check::<u64>(unsigned);
}

#[test]
fn slice_conversions_match_the_scalar_ones_bit_for_bit() {
    // Edge cases plus a sweep of bit patterns: zeros, subnormals, ties,
    // the largest finite values, infinities and NaNs.
    let mut bits: Vec<u32> = vec![
        0,
        0x8000_0000,
        1,
        0x0000_8000,
        0x3f80_8000,
        0x3f81_8000,
        0x7f7f_ffff,
        0xff7f_ffff,
        0x7f80_0000,
        0xff80_0000,
        0x7fc0_0000,
        0x7f80_0001,
        0xffff_ffff,
    ];
    bits.extend((0..200_000u32).map(|i| i.wrapping_mul(0x9e37_79b9)));
    let floats: Vec<f32> = bits.iter().map(|&b| f32::from_bits(b)).collect();
    let mut b16 = vec![bf16::ZERO; floats.len()];
    <bf16 as HalfSlices>::narrow(&floats, &mut b16);
    let mut h16 = vec![f16::ZERO; floats.len()];
    <f16 as HalfSlices>::narrow(&floats, &mut h16);
    for (i, f) in floats.iter().enumerate() {
        let (want_b, want_h) = (bf16::from_f32(*f), f16::from_f32(*f));
        if f.is_nan() {
            assert!(b16[i].is_nan() && h16[i].is_nan(), "NaN {:#x}", bits[i]);
        } else {
            assert_eq!(b16[i].to_bits(), want_b.to_bits(), "bf16 of {:#x}", bits[i]);
            assert_eq!(h16[i].to_bits(), want_h.to_bits(), "f16 of {:#x}", bits[i]);
        }
    }
    let mut wide = vec![0f32; b16.len()];
    <bf16 as HalfSlices>::widen(&b16, &mut wide);
    for (w, b) in wide.iter().zip(&b16) {
        assert!(w.to_bits() == b.to_f32().to_bits() || (w.is_nan() && b.is_nan()));
    }
}

/// Every bit pattern of a half type against a permutation of every
/// pattern, and against half its own unit in the last place (sums that
/// are ties), so the widening and the rounding of each level's
/// conversions meet every exponent, subnormals, infinities and NaNs.
/// `exp_mask` keeps sign and exponent, `min_normal` is the smallest
/// normal's bits, `mantissa` the stored mantissa bits.
fn halves_agree<H: Element>(
    from_bits: fn(u16) -> H,
    to_bits: fn(H) -> u16,
    (exp_mask, min_normal, mantissa): (u16, u16, u32),
    into_at: fn(SimdLevel, ReduceOp, &mut [H], &[H]),
    to_at: fn(SimdLevel, ReduceOp, &mut [H], &[H], &[H]),
) {
    let all: Vec<H> = (0..=u16::MAX).map(from_bits).collect();
    let shuffled: Vec<H> = (0..=u16::MAX)
        .map(|i| from_bits(i.wrapping_mul(7919)))
        .collect();
    let half_ulp: Vec<H> = all
        .iter()
        .map(|x| from_bits((to_bits(*x) & exp_mask).max(min_normal)))
        .map(|x| H::from_f64(x.to_f64() / f64::from(2u32 << mantissa)))
        .collect();
    let nan = |x: H| x.to_f64().is_nan();
    for b in [&shuffled, &half_ulp, &all] {
        for op in ReduceOp::ALL {
            let mut want = vec![H::zeroed(); all.len()];
            to_at(SimdLevel::Baseline, op, &mut want, &all, b);
            // Against the f64 reference where no input is NaN; where one
            // is, min and max must give the canonical NaN.
            let min_max = matches!(op, ReduceOp::Min | ReduceOp::Max);
            for (i, w) in want.iter().enumerate() {
                if nan(all[i]) || nan(b[i]) {
                    assert!(
                        !min_max || to_bits(*w) == to_bits(canonical_nan()),
                        "{} baseline {op} {:#06x} {:#06x}",
                        H::DTYPE,
                        to_bits(all[i]),
                        to_bits(b[i])
                    );
                    continue;
                }
                let exact = reference(op, all[i].to_f64(), b[i].to_f64());
                assert!(
                    to_bits(*w) == to_bits(H::from_f64(exact)) || (nan(*w) && exact.is_nan()),
                    "{} baseline {op} {:#06x} {:#06x}",
                    H::DTYPE,
                    to_bits(all[i]),
                    to_bits(b[i])
                );
            }
            for level in SimdLevel::ALL {
                let (mut to, mut into) = (vec![H::zeroed(); all.len()], all.clone());
                to_at(level, op, &mut to, &all, b);
                into_at(level, op, &mut into, b);
                assert!(
                    same_bits_for(op, &to, &want),
                    "{} reduce_to {op} at {level}",
                    H::DTYPE
                );
                assert!(
                    same_bits_for(op, &into, &want),
                    "{} reduce_into {op} at {level}",
                    H::DTYPE
                );
            }
        }
    }
}

#[test]
fn half_kernels_agree_at_every_level_over_every_bit_pattern() {
    halves_agree(
        f16::from_bits,
        f16::to_bits,
        (0xfc00, 0x0400, 10),
        f16_reduce_into_at,
        f16_reduce_to_at,
    );
    halves_agree(
        bf16::from_bits,
        bf16::to_bits,
        (0xff80, 0x0080, 7),
        bf16_reduce_into_at,
        bf16_reduce_to_at,
    );
}

/// Bit patterns of every class for `T`: zeros, subnormals, ties,
/// extremes, infinities and NaNs where the type has them, and a sweep.
fn patterns<T: Element>(n: usize, seed: u64) -> Vec<T> {
    let size = std::mem::size_of::<T>();
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut bytes = vec![0u8; n * size];
    for b in bytes.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        b.copy_from_slice(&x.to_le_bytes()[..b.len()]);
    }
    let mut v: Vec<T> = bytemuck::pod_collect_to_vec(&bytes);
    let specials = [
        0.0,
        -0.0,
        1.0,
        -1.5,
        65504.0,
        65520.0,
        1e-7,
        3e38,
        f64::INFINITY,
    ];
    for (slot, s) in v.iter_mut().step_by(17).zip(specials.iter().cycle()) {
        *slot = T::from_f64(*s);
    }
    v
}

/// The same bits, but any NaN for a NaN: Rust leaves which NaN an
/// arithmetic operation on NaNs returns unspecified (the compiler may swap
/// the operands of an addition), so only NaN-ness is comparable. (Min and
/// Max define their NaN: `same_bits_for` compares them exactly.)
fn same_bits<T: Element>(a: &[T], b: &[T]) -> bool {
    let size = std::mem::size_of::<T>();
    let (x, y) = (
        bytemuck::cast_slice::<T, u8>(a),
        bytemuck::cast_slice::<T, u8>(b),
    );
    a.len() == b.len()
        && a.iter().zip(b).enumerate().all(|(i, (p, q))| {
            let (p64, q64) = (p.to_f64(), q.to_f64());
            (p64.is_nan() && q64.is_nan()) || x[i * size..][..size] == y[i * size..][..size]
        })
}

/// `same_bits`, but exactly the same bits for Min and Max, whose NaN is
/// defined.
fn same_bits_for<T: Element>(op: ReduceOp, a: &[T], b: &[T]) -> bool {
    match op {
        ReduceOp::Min | ReduceOp::Max => {
            bytemuck::cast_slice::<T, u8>(a) == bytemuck::cast_slice::<T, u8>(b)
        }
        _ => same_bits(a, b),
    }
}

fn levels_agree<T: Element>(
    into_at: fn(SimdLevel, ReduceOp, &mut [T], &[T]),
    to_at: fn(SimdLevel, ReduceOp, &mut [T], &[T], &[T]),
) {
    for op in ReduceOp::ALL {
        for len in [0usize, 1, 3, 15, 16, 17, 63, 64, 65, 1023, 1024, 1025, 5000] {
            let (a, b) = (patterns::<T>(len, 1), patterns::<T>(len, 2));
            let (mut base_into, mut base_to) = (a.clone(), vec![T::zeroed(); len]);
            into_at(SimdLevel::Baseline, op, &mut base_into, &b);
            to_at(SimdLevel::Baseline, op, &mut base_to, &a, &b);
            assert!(
                same_bits_for(op, &base_into, &base_to),
                "{} {op} into vs to",
                T::DTYPE
            );
            for level in SimdLevel::ALL {
                let (mut into, mut to) = (a.clone(), vec![T::zeroed(); len]);
                into_at(level, op, &mut into, &b);
                to_at(level, op, &mut to, &a, &b);
                let what = format!("{} {op} len {len} at {level}", T::DTYPE);
                assert!(same_bits_for(op, &into, &base_into), "reduce_into {what}");
                assert!(same_bits_for(op, &to, &base_into), "reduce_to {what}");
            }
        }
    }
}

#[test]
fn every_simd_level_gives_the_baselines_bits() {
    // Levels above what this CPU has run the baseline (capped), so on
    // any machine this compares every kernel it can run.
    levels_agree::<f32>(reduce_into_at, reduce_to_at);
    levels_agree::<f64>(reduce_into_at, reduce_to_at);
    levels_agree::<i8>(reduce_into_at, reduce_to_at);
    levels_agree::<u8>(reduce_into_at, reduce_to_at);
    levels_agree::<i32>(reduce_into_at, reduce_to_at);
    levels_agree::<u32>(reduce_into_at, reduce_to_at);
    levels_agree::<i64>(reduce_into_at, reduce_to_at);
    levels_agree::<u64>(reduce_into_at, reduce_to_at);
    levels_agree::<f16>(f16_reduce_into_at, f16_reduce_to_at);
    levels_agree::<bf16>(bf16_reduce_into_at, bf16_reduce_to_at);
}

fn streams_match_the_block_kernels<T: Element + Arith>() {
    for level in SimdLevel::ALL {
        for op in ReduceOp::ALL {
            for inputs in 1..=4usize {
                for len in [0usize, 1, 15, 16, 17, 63, 64, 65, 1000] {
                    for shift in [0usize, 1, 3] {
                        let ins: Vec<Vec<T>> = (0..inputs)
                            .map(|i| patterns::<T>(len, 7 + i as u64))
                            .collect();
                        let mut want = ins[0].clone();
                        for x in &ins[1..] {
                            reduce_into_at(SimdLevel::Baseline, op.combining(), &mut want, x);
                        }
                        // Three outputs, each `shift` elements into a
                        // buffer with guard elements around it.
                        let guard = T::from_f64(-7.0);
                        let mut bufs: Vec<Vec<T>> = (0..3).map(|_| vec![guard; len + 80]).collect();
                        let ok = {
                            let refs: Vec<&[T]> = ins.iter().map(|x| &x[..]).collect();
                            let mut outs: Vec<&mut [T]> = bufs
                                .iter_mut()
                                .map(|b| {
                                    let at = b.as_ptr().align_offset(64) + shift;
                                    &mut b[at..at + len]
                                })
                                .collect();
                            reduce_to_streams_at(level, op.combining(), &refs, &mut outs)
                        };
                        let what =
                            format!("{} {op} {inputs} inputs len {len} at {level}", T::DTYPE);
                        assert_eq!(ok, cfg!(target_arch = "x86_64"), "{what}");
                        if !ok {
                            continue;
                        }
                        for b in &bufs {
                            let at = b.as_ptr().align_offset(64) + shift;
                            assert!(same_bits_for(op, &b[at..at + len], &want), "{what}");
                            assert!(
                                b[..at].iter().chain(&b[at + len..]).all(|v| *v == guard),
                                "{what}: wrote outside the output"
                            );
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn fused_streaming_kernels_match_the_block_kernels() {
    streams_match_the_block_kernels::<f32>();
    streams_match_the_block_kernels::<f64>();
    streams_match_the_block_kernels::<i8>();
    streams_match_the_block_kernels::<u8>();
    streams_match_the_block_kernels::<i32>();
    streams_match_the_block_kernels::<u64>();
}

#[test]
fn fused_streaming_declines_what_it_cannot_do() {
    let ins = [vec![1f32; 100], vec![2f32; 100]];
    let refs: Vec<&[f32]> = ins.iter().map(|x| &x[..]).collect();
    let mut a = vec![0f32; 200];
    let mut b = vec![0f32; 200];
    let (pa, pb) = (a.as_ptr().align_offset(64), b.as_ptr().align_offset(64));
    // Outputs that lie differently against cache lines.
    let mut outs: Vec<&mut [f32]> = vec![&mut a[pa..pa + 100], &mut b[pb + 1..pb + 101]];
    assert!(!reduce_to_streams(ReduceOp::Sum, &refs, &mut outs));
    // Lengths that differ, and no input at all.
    let mut outs: Vec<&mut [f32]> = vec![&mut a[pa..pa + 99]];
    assert!(!reduce_to_streams(ReduceOp::Sum, &refs, &mut outs));
    let mut outs: Vec<&mut [f32]> = vec![&mut a[pa..pa + 100]];
    assert!(!reduce_to_streams::<f32>(ReduceOp::Sum, &[], &mut outs));
    assert!(a.iter().chain(&b).all(|&v| v == 0.0), "nothing written");
    // Half types have no fused kernel.
    let h = [vec![bf16::ONE; 4]];
    let hr: Vec<&[bf16]> = h.iter().map(|x| &x[..]).collect();
    let mut ho = [bf16::ZERO; 4];
    assert!(!reduce_to_streams(ReduceOp::Sum, &hr, &mut [&mut ho[..]]));
}

#[test]
fn integer_sum_wraps_instead_of_panicking() {
    let mut a = [u8::MAX, 200];
    reduce_into(ReduceOp::Sum, &mut a, &[1, 100]);
    assert_eq!(a, [0, 44]);
}

#[test]
fn integer_avg_survives_rank_counts_beyond_the_type() {
    let mut a = [200u8, 255];
    u8::divide(&mut a, 256);
    assert_eq!(a, [0, 0]);
    let mut b = [-100i8, 127];
    i8::divide(&mut b, 128);
    assert_eq!(b, [0, 0]);
    let mut c = [-128i8];
    i8::divide(&mut c, 1);
    assert_eq!(c, [-128]);
}

#[test]
fn avg_divides_once() {
    let mut a = [7i32, -7, 9];
    i32::divide(&mut a, 2);
    assert_eq!(a, [3, -3, 4]);
    let mut h = [f16::from_f32(3.0)];
    f16::divide(&mut h, 4);
    assert_eq!(h[0].to_f32(), 0.75);
}

// ---- NaN, signed zeros and integer wrapping: the documented semantics ----

/// `v`'s bytes, for comparing bit patterns of any element type.
fn bits_of<T: Element>(v: &[T]) -> Vec<u8> {
    bytemuck::cast_slice::<T, u8>(v).to_vec()
}

/// Assert `got` has `want`'s bits, naming the first element that differs.
#[track_caller]
fn assert_bits<T: Element>(got: &[T], want: &[T], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    let size = std::mem::size_of::<T>();
    let (g, w) = (bits_of(got), bits_of(want));
    if let Some(i) = (0..got.len()).find(|i| g[i * size..][..size] != w[i * size..][..size]) {
        panic!(
            "{what}: element {i} of {} is {:?} ({:02x?}), expected {:?} ({:02x?})",
            got.len(),
            got[i],
            &g[i * size..][..size],
            want[i],
            &w[i * size..][..size]
        );
    }
}

/// A value of `T` from its bit pattern (the low `size_of::<T>()` bytes).
fn from_bits<T: Element>(bits: u64) -> T {
    match std::mem::size_of::<T>() {
        2 => bytemuck::pod_read_unaligned(&(bits as u16).to_ne_bytes()),
        4 => bytemuck::pod_read_unaligned(&(bits as u32).to_ne_bytes()),
        8 => bytemuck::pod_read_unaligned(&bits.to_ne_bytes()),
        n => unreachable!("no float type has {n} bytes"),
    }
}

/// The one NaN Min and Max give wherever an operand is NaN (the rule in
/// `arith`): positive, quiet, no payload. Written out here from the IEEE
/// formats, not taken from the kernels.
fn canonical_nan<T: Element>() -> T {
    from_bits(match T::DTYPE {
        DataType::F32 => 0x7fc0_0000,
        DataType::F64 => 0x7ff8_0000_0000_0000,
        DataType::F16 => 0x7e00,
        DataType::Bf16 => 0x7fc0,
        other => unreachable!("{other} has no NaN"),
    })
}

/// NaNs of `T` of both signs, quiet and signalling, with payloads.
fn nans<T: Element>() -> Vec<T> {
    let bits: &[u64] = match T::DTYPE {
        DataType::F32 => &[
            0xffc0_0000,
            0x7f80_0001,
            0x7fff_ffff,
            0xffc1_2345,
            0x7fc0_0000,
        ],
        DataType::F64 => &[
            0xfff8_0000_0000_0000,
            0x7ff0_0000_0000_0001,
            0x7fff_ffff_ffff_ffff,
            0xfff8_1234_5678_9abc,
            0x7ff8_0000_0000_0000,
        ],
        DataType::F16 => &[0xfe00, 0x7c01, 0x7fff, 0xfe5a, 0x7e00],
        DataType::Bf16 => &[0xffc0, 0x7f81, 0x7fff, 0xffda, 0x7fc0],
        other => unreachable!("{other} has no NaN"),
    };
    bits.iter().map(|&b| from_bits(b)).collect()
}

/// IEEE 754-2019 minimum and maximum on f64 (None where an operand is
/// NaN): -0 is below +0.
fn ieee_min_max(op: ReduceOp, a: f64, b: f64) -> Option<f64> {
    if a.is_nan() || b.is_nan() {
        return None;
    }
    let a_first = a < b || (a == b && a.is_sign_negative());
    Some(match op {
        ReduceOp::Min if a_first => a,
        ReduceOp::Min => b,
        ReduceOp::Max if a_first => b,
        ReduceOp::Max => a,
        other => unreachable!("{other} is not min or max"),
    })
}

/// What `a op b` must be, bit for bit: the canonical NaN where either is
/// NaN, else the exact minimum or maximum (exact in the type, so
/// `from_f64` only changes the representation).
fn min_max_want<T: Element>(op: ReduceOp, a: &[T], b: &[T]) -> Vec<T> {
    a.iter()
        .zip(b)
        .map(|(x, y)| {
            ieee_min_max(op, x.to_f64(), y.to_f64()).map_or_else(canonical_nan, T::from_f64)
        })
        .collect()
}

/// Values exact in every float type, both zeros and both infinities
/// among them; `seed` varies which is where, so that two seeds pair every
/// value with every other one somewhere in 4099 elements (-0 with +0
/// included).
fn min_max_values<T: Element>(len: usize, seed: usize) -> Vec<T> {
    (0..len)
        .map(|i| match (i + seed * (i / 23) + seed) % 23 {
            0 => -0.0,
            1 => 0.0,
            2 => f64::INFINITY,
            3 => f64::NEG_INFINITY,
            k => k as f64 - 12.5,
        })
        .map(T::from_f64)
        .collect()
}

/// Element positions for NaNs: the first, inside the first vector, past
/// a whole number of 16-lane steps, past HALF_BLOCK, the middle and the
/// last (in the remainder of every vector loop for the odd lengths).
fn nan_positions(len: usize) -> Vec<usize> {
    let mut p: Vec<usize> = [0, 7, 31, 1000, 1030, len / 2, len.saturating_sub(1)]
        .into_iter()
        .filter(|&p| p < len)
        .collect();
    p.sort_unstable();
    p.dedup();
    p
}

/// Lengths that end inside the first vector, after whole vectors, and a
/// few elements past every loop's main part (4099: past the 64-element
/// unrolled f32 loop, the 16- and 8-lane half steps and HALF_BLOCK).
const NAN_LENGTHS: [usize; 6] = [1, 8, 33, 1001, 1031, 4099];

/// Operand pairs with NaNs at `nan_positions`: in `a` only, in `b` only,
/// and in both (different NaNs); the payloads cycle through `nans`.
fn nan_operand_pairs<T: Element>(len: usize) -> Vec<(Vec<T>, Vec<T>)> {
    let nans = nans::<T>();
    let with_nans = |mut v: Vec<T>, shift: usize| {
        for (k, &p) in nan_positions(len).iter().enumerate() {
            v[p] = nans[(k + shift) % nans.len()];
        }
        v
    };
    let (a, b) = (min_max_values::<T>(len, 1), min_max_values::<T>(len, 2));
    vec![
        (with_nans(a.clone(), 0), b.clone()),
        (a.clone(), with_nans(b.clone(), 1)),
        (with_nans(a, 2), with_nans(b, 3)),
    ]
}

/// Min and Max of `T` with NaNs at every `nan_positions` in either
/// operand, both operand orders, at every level this CPU runs (those
/// above it run capped, as the dispatch does): the canonical NaN exactly
/// where an operand is NaN, the IEEE minimum or maximum elsewhere, the
/// same bits whichever operand comes first.
fn nan_min_max_at_every_level<T: Element>(
    into_at: fn(SimdLevel, ReduceOp, &mut [T], &[T]),
    to_at: fn(SimdLevel, ReduceOp, &mut [T], &[T], &[T]),
) {
    for op in [ReduceOp::Min, ReduceOp::Max] {
        for len in NAN_LENGTHS {
            for (case, (a, b)) in nan_operand_pairs::<T>(len).into_iter().enumerate() {
                let want = min_max_want(op, &a, &b);
                for level in SimdLevel::ALL {
                    for (x, y, order) in [(&a, &b, "a op b"), (&b, &a, "b op a")] {
                        let what = format!(
                            "{} {op} len {len} case {case} at {level}, {order}",
                            T::DTYPE
                        );
                        let mut into = x.clone();
                        into_at(level, op, &mut into, y);
                        assert_bits(&into, &want, &format!("reduce_into {what}"));
                        let mut to = vec![T::zeroed(); len];
                        to_at(level, op, &mut to, x, y);
                        assert_bits(&to, &want, &format!("reduce_to {what}"));
                    }
                }
            }
        }
    }
}

#[test]
fn min_max_give_the_canonical_nan_at_every_level_in_either_order() {
    nan_min_max_at_every_level::<f32>(reduce_into_at, reduce_to_at);
    nan_min_max_at_every_level::<f64>(reduce_into_at, reduce_to_at);
    nan_min_max_at_every_level::<f16>(f16_reduce_into_at, f16_reduce_to_at);
    nan_min_max_at_every_level::<bf16>(bf16_reduce_into_at, bf16_reduce_to_at);
}

/// The public entry points and every store mode of the executor's
/// kernels (at the level in use), with NaNs in either operand.
fn nan_min_max_through_every_entry_point<T: Element>() {
    for op in [ReduceOp::Min, ReduceOp::Max] {
        for len in NAN_LENGTHS {
            for (case, (a, b)) in nan_operand_pairs::<T>(len).into_iter().enumerate() {
                let want = min_max_want(op, &a, &b);
                let zeros = || vec![T::zeroed(); len];
                for (x, y, order) in [(&a, &b, "a op b"), (&b, &a, "b op a")] {
                    let what =
                        |k: &str| format!("{k}: {} {op} len {len} case {case}, {order}", T::DTYPE);
                    let mut into = x.clone();
                    reduce_into(op, &mut into, y);
                    assert_bits(&into, &want, &what("reduce_into"));
                    let mut to = zeros();
                    reduce_to(op, &mut to, x, y);
                    assert_bits(&to, &want, &what("reduce_to"));
                    for mode in [Store::Cached, Store::Streaming] {
                        let mut out = zeros();
                        reduce_to_output(mode, op, &mut out, x, y);
                        assert_bits(&out, &want, &what(&format!("{mode:?} to_output")));
                        let (mut both, mut copy) = (zeros(), zeros());
                        reduce_to_both(mode, op, &mut both, &mut copy, x, y);
                        assert_bits(&both, &want, &what(&format!("{mode:?} to_both")));
                        assert_bits(&copy, &want, &what(&format!("{mode:?} to_both copy")));
                        let (mut dst, mut copy) = (x.clone(), zeros());
                        reduce_into_both(mode, op, &mut dst, &mut copy, y);
                        assert_bits(&dst, &want, &what(&format!("{mode:?} into_both")));
                        assert_bits(&copy, &want, &what(&format!("{mode:?} into_both copy")));
                    }
                }
            }
        }
    }
}

#[test]
fn min_max_give_the_canonical_nan_through_every_entry_point_and_store_mode() {
    nan_min_max_through_every_entry_point::<f32>();
    nan_min_max_through_every_entry_point::<f64>();
    nan_min_max_through_every_entry_point::<f16>();
    nan_min_max_through_every_entry_point::<bf16>();
}

/// The fused streaming kernel with 2 to 4 inputs, NaNs in each input in
/// turn (and in all), every rotation of the inputs, at every level: the
/// canonical NaN where any input is NaN, the IEEE extreme elsewhere, the
/// same bits for every order of the inputs.
fn nan_min_max_streams<T: Element + Arith>() {
    for level in SimdLevel::ALL {
        for op in [ReduceOp::Min, ReduceOp::Max] {
            for inputs in 2..=4usize {
                for len in [1usize, 17, 64, 1001, 4099] {
                    // `holder`: which input holds the NaNs (`inputs`: all).
                    for holder in 0..=inputs {
                        let nans = nans::<T>();
                        let ins: Vec<Vec<T>> = (0..inputs)
                            .map(|k| {
                                let mut v = min_max_values::<T>(len, k + 1);
                                if holder == k || holder == inputs {
                                    for (j, &p) in nan_positions(len).iter().enumerate() {
                                        v[p] = nans[(j + k) % nans.len()];
                                    }
                                }
                                v
                            })
                            .collect();
                        let want = ins[1..]
                            .iter()
                            .fold(ins[0].clone(), |acc, x| min_max_want(op, &acc, x));
                        for rotation in 0..inputs {
                            for shift in [0usize, 3] {
                                let refs: Vec<&[T]> = (0..inputs)
                                    .map(|k| &ins[(k + rotation) % inputs][..])
                                    .collect();
                                let mut bufs: Vec<Vec<T>> =
                                    (0..2).map(|_| vec![T::zeroed(); len + 80]).collect();
                                let ok = {
                                    let mut outs: Vec<&mut [T]> = bufs
                                        .iter_mut()
                                        .map(|b| {
                                            let at = b.as_ptr().align_offset(64) + shift;
                                            &mut b[at..at + len]
                                        })
                                        .collect();
                                    reduce_to_streams_at(level, op, &refs, &mut outs)
                                };
                                assert_eq!(ok, cfg!(target_arch = "x86_64"));
                                if !ok {
                                    continue;
                                }
                                for b in &bufs {
                                    let at = b.as_ptr().align_offset(64) + shift;
                                    let what = format!(
                                        "{} {op} {inputs} inputs, NaNs in {holder}, rotation \
                                         {rotation}, len {len} shift {shift} at {level}",
                                        T::DTYPE
                                    );
                                    assert_bits(&b[at..at + len], &want, &what);
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn fused_streaming_min_max_give_the_canonical_nan_for_every_input_order() {
    nan_min_max_streams::<f32>();
    nan_min_max_streams::<f64>();
}

#[test]
fn min_of_signed_zeros_is_minus_zero_and_max_plus_zero_in_either_order() {
    fn zeros<T: Element>(
        into_at: fn(SimdLevel, ReduceOp, &mut [T], &[T]),
        to_at: fn(SimdLevel, ReduceOp, &mut [T], &[T], &[T]),
    ) {
        // Long enough for the vector loops and their remainders.
        let (plus, minus) = (T::from_f64(0.0), T::from_f64(-0.0));
        let a: Vec<T> = (0..1031)
            .map(|i| if i % 3 == 0 { minus } else { plus })
            .collect();
        let b: Vec<T> = (0..1031)
            .map(|i| if i % 2 == 0 { minus } else { plus })
            .collect();
        for level in SimdLevel::ALL {
            for op in [ReduceOp::Min, ReduceOp::Max] {
                let want = min_max_want(op, &a, &b);
                for (x, y) in [(&a, &b), (&b, &a)] {
                    let mut into = x.clone();
                    into_at(level, op, &mut into, y);
                    let mut to = vec![T::zeroed(); x.len()];
                    to_at(level, op, &mut to, x, y);
                    assert_bits(&into, &want, &format!("{} {op} into at {level}", T::DTYPE));
                    assert_bits(&to, &want, &format!("{} {op} to at {level}", T::DTYPE));
                }
            }
        }
    }
    zeros::<f32>(reduce_into_at, reduce_to_at);
    zeros::<f64>(reduce_into_at, reduce_to_at);
    zeros::<f16>(f16_reduce_into_at, f16_reduce_to_at);
    zeros::<bf16>(bf16_reduce_into_at, bf16_reduce_to_at);
}

/// An integer element type seen through i128, for references computed
/// without the kernels' wrapping operations.
trait WideInt: Element + Arith {
    fn to_i128(self) -> i128;
    /// `v` modulo 2^bits, as the type (`as` truncates, two's complement).
    fn wrap(v: i128) -> Self;
}

macro_rules! wide_int {
    ($($t:ty),*) => {$(
        impl WideInt for $t {
            fn to_i128(self) -> i128 {
                self as i128
            }
            fn wrap(v: i128) -> Self {
                v as $t
            }
        }
    )*};
}
wide_int!(i8, u8, i32, u32, i64, u64);

/// Sum and Prod of full-range integers (`patterns`: random bits, so most
/// sums and products overflow) at every level and through the fused
/// streaming kernel: the exact result in i128 reduced modulo 2^bits
/// (products modulo 2^128 first, which 2^bits divides).
fn integers_wrap<T: WideInt>() {
    for op in [ReduceOp::Sum, ReduceOp::Prod] {
        let exact = |x: i128, y: i128| match op {
            ReduceOp::Sum => x + y,
            _ => x.wrapping_mul(y),
        };
        for len in [1usize, 17, 64, 65, 1025, 4099] {
            let ins: Vec<Vec<T>> = (0..3).map(|k| patterns::<T>(len, 40 + k)).collect();
            let pair: Vec<T> = (0..len)
                .map(|i| T::wrap(exact(ins[0][i].to_i128(), ins[1][i].to_i128())))
                .collect();
            let triple: Vec<T> = (0..len)
                .map(|i| T::wrap(exact(pair[i].to_i128(), ins[2][i].to_i128())))
                .collect();
            for level in SimdLevel::ALL {
                let what = format!("{} {op} len {len} at {level}", T::DTYPE);
                let mut into = ins[0].clone();
                reduce_into_at(level, op, &mut into, &ins[1]);
                assert_bits(&into, &pair, &format!("reduce_into {what}"));
                let mut to = vec![T::zeroed(); len];
                reduce_to_at(level, op, &mut to, &ins[0], &ins[1]);
                assert_bits(&to, &pair, &format!("reduce_to {what}"));
                let refs: Vec<&[T]> = ins.iter().map(|x| &x[..]).collect();
                let mut buf = vec![T::zeroed(); len + 64];
                let at = buf.as_ptr().align_offset(64);
                if reduce_to_streams_at(level, op, &refs, &mut [&mut buf[at..at + len]]) {
                    assert_bits(&buf[at..at + len], &triple, &format!("streams {what}"));
                }
            }
        }
    }
}

#[test]
fn integer_sum_and_prod_wrap_at_every_level() {
    integers_wrap::<i8>();
    integers_wrap::<u8>();
    integers_wrap::<i32>();
    integers_wrap::<u32>();
    integers_wrap::<i64>();
    integers_wrap::<u64>();
}

/// The end of integer Avg: the (wrapped) sum divided by the rank count,
/// truncated toward zero (not rounded down: -3 / 2 is -1), for rank
/// counts that do not fit the type too.
fn integer_divide_truncates<T: WideInt>() {
    let v = patterns::<T>(3000, 50);
    for n in [1usize, 2, 3, 7, 128, 255, 256, 1000] {
        let mut got = v.clone();
        T::divide(&mut got, n);
        let want: Vec<T> = v
            .iter()
            .map(|x| {
                let (x, n) = (x.to_i128(), n as i128);
                let q = x.abs() / n;
                T::wrap(if x < 0 { -q } else { q })
            })
            .collect();
        assert_bits(&got, &want, &format!("{} divide by {n}", T::DTYPE));
    }
}

#[test]
fn integer_avg_truncates_toward_zero() {
    integer_divide_truncates::<i8>();
    integer_divide_truncates::<u8>();
    integer_divide_truncates::<i32>();
    integer_divide_truncates::<u32>();
    integer_divide_truncates::<i64>();
    integer_divide_truncates::<u64>();
}
