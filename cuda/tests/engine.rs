//! The CUDA engine on a real GPU against the host stand-in: every (op,
//! type) kernel, on random data with NaN, signed zeros and extremes, at
//! counts with and without a tail and at offsets that break the 16-byte
//! alignment, must give the same bytes as the stand-in's scalar reduction
//! (written separately, from the same rules), and must write nothing
//! outside its output. Copies round-trip through pinned memory.
//!
//! Without a device it says why and passes, unless FERROCCL_REQUIRE_DEVICE=1
//! (the GPU run, `cuda/gpu/run.sh`), where it fails.

use ferroccl_cuda::cuda_engine::CudaEngine;
use ferroccl_cuda::device::{DevicePtr, Engine};
use ferroccl_cuda::host_engine::HostEngine;
use ferroccl_cuda::{CudaError, DataType, ReduceOp};
use std::time::Duration;

fn engine() -> Option<CudaEngine> {
    match CudaEngine::new(0) {
        Ok(e) => Some(e),
        Err(CudaError::NoDevice(why))
            if std::env::var("FERROCCL_REQUIRE_DEVICE").as_deref() != Ok("1") =>
        {
            eprintln!("skipped: {why}");
            None
        }
        Err(other) => panic!("CUDA engine: {other}"),
    }
}

/// A small deterministic generator (xorshift).
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// `count` elements of `ty` as bytes: random, with special values mixed in
/// for the floats (NaN of several payloads, both zeros, infinities).
fn data(ty: DataType, count: usize, rng: &mut Rng) -> Vec<u8> {
    let mut out = Vec::with_capacity(count * ty.size());
    for i in 0..count {
        let r = rng.next();
        let special = ty.is_float() && r.is_multiple_of(7);
        let bytes: Vec<u8> = match ty {
            DataType::F32 => {
                let v = if special {
                    [
                        f32::NAN,
                        -0.0,
                        0.0,
                        f32::INFINITY,
                        f32::from_bits(0xffc0_0001),
                    ][i % 5]
                } else {
                    ((r >> 11) as f32 / (1u64 << 53) as f32 - 0.5) * 1e3
                };
                v.to_le_bytes().to_vec()
            }
            DataType::F64 => {
                let v = if special {
                    [f64::NAN, -0.0, 0.0, f64::NEG_INFINITY][i % 4]
                } else {
                    ((r >> 11) as f64 / (1u64 << 53) as f64 - 0.5) * 1e6
                };
                v.to_le_bytes().to_vec()
            }
            // Raw halves: every bit pattern, NaN and zeros included.
            DataType::F16 | DataType::Bf16 => (r as u16).to_le_bytes().to_vec(),
            _ => r.to_le_bytes()[..ty.size()].to_vec(),
        };
        out.extend_from_slice(&bytes);
    }
    out
}

/// Run `dst = a op b` (then Avg's finish over `ranks`) through `e` with
/// every buffer placed `skew` elements into an allocation poisoned with
/// 0xA5, and return the whole output allocation.
fn reduce_via<E: Engine>(
    e: &E,
    op: ReduceOp,
    ty: DataType,
    a: &[u8],
    b: &[u8],
    skew: usize,
    ranks: usize,
) -> Vec<u8> {
    let (n, size) = (a.len(), ty.size());
    let count = n / size;
    let total = n + (skew + 8) * size;
    let off = skew * size;
    let s = e.stream().unwrap();
    let pin = e.alloc_pinned(total).unwrap();
    let dev: Vec<_> = (0..3).map(|_| e.alloc_device(total).unwrap()).collect();
    let at = |k: usize| DevicePtr::new(dev[k]).add(off);
    for (k, src) in [a, b].into_iter().enumerate() {
        e.with_pinned(pin, &mut |m| {
            m.fill(0xA5);
            m[off..off + n].copy_from_slice(src);
        })
        .unwrap();
        e.h2d(s, DevicePtr::new(dev[k]), pin, 0, total).unwrap();
        let done = e.event().unwrap();
        e.record(done, s).unwrap();
        e.host_wait(done, Duration::from_secs(30)).unwrap();
        e.free_event(done);
    }
    e.with_pinned(pin, &mut |m| m.fill(0xA5)).unwrap();
    e.h2d(s, DevicePtr::new(dev[2]), pin, 0, total).unwrap();
    e.reduce(s, op, ty, at(2), at(0), at(1), count).unwrap();
    if op == ReduceOp::Avg {
        e.avg_finish(s, ty, at(2), count, ranks).unwrap();
    }
    e.d2h(s, pin, 0, DevicePtr::new(dev[2]), total).unwrap();
    let done = e.event().unwrap();
    e.record(done, s).unwrap();
    e.host_wait(done, Duration::from_secs(30)).unwrap();
    let mut out = Vec::new();
    e.with_pinned(pin, &mut |m| out = m.to_vec()).unwrap();
    e.free_event(done);
    for d in dev {
        e.free_device(d);
    }
    e.free_pinned(pin);
    e.free_stream(s);
    out
}

/// Whether `bytes` (one element of `ty`) is a NaN.
fn is_nan(ty: DataType, bytes: &[u8]) -> bool {
    let bits = bytes
        .iter()
        .rev()
        .fold(0u64, |acc, &b| acc << 8 | u64::from(b));
    let (exp, mantissa) = match ty {
        DataType::F32 => (0x7f80_0000, 0x007f_ffff),
        DataType::F64 => (0x7ff0_0000_0000_0000, 0x000f_ffff_ffff_ffff),
        DataType::F16 => (0x7c00, 0x03ff),
        DataType::Bf16 => (0x7f80, 0x007f),
        _ => return false,
    };
    bits & exp == exp && bits & mantissa != 0
}

/// The first byte where `got` differs from `want`, the output being
/// `len` bytes at `off`: bit for bit, except that a NaN matches any NaN.
/// IEEE 754 leaves the payload of a NaN that arithmetic produces open:
/// x86 passes an input's on (`0x7fc00000` stays), the GPU writes its
/// canonical NaN (`0x7fffffff`; seen on the first GPU run, an H200).
fn first_difference(
    ty: DataType,
    want: &[u8],
    got: &[u8],
    off: usize,
    len: usize,
) -> Option<usize> {
    let size = ty.size();
    (0..want.len()).find(|&i| {
        if want[i] == got[i] {
            return false;
        }
        if i < off || i >= off + len {
            return true;
        }
        let at = off + (i - off) / size * size;
        !(is_nan(ty, &want[at..at + size]) && is_nan(ty, &got[at..at + size]))
    })
}

#[test]
fn nan_matches_any_nan_and_nothing_else() {
    let q = 0x7fc0_0000u32.to_le_bytes();
    let canonical = 0x7fff_ffffu32.to_le_bytes();
    let inf = 0x7f80_0000u32.to_le_bytes();
    let one = 1.0f32.to_le_bytes();
    assert!(is_nan(DataType::F32, &q) && is_nan(DataType::F32, &canonical));
    assert!(!is_nan(DataType::F32, &inf) && !is_nan(DataType::I32, &canonical));
    assert!(is_nan(DataType::Bf16, &[0xc1, 0x7f]) && !is_nan(DataType::Bf16, &[0x80, 0x7f]));
    assert!(is_nan(DataType::F16, &[0x01, 0x7c]) && !is_nan(DataType::F16, &[0x00, 0x7c]));
    let pad = [0xa5u8; 4];
    let (w, g) = ([pad, q, pad].concat(), [pad, canonical, pad].concat());
    assert_eq!(first_difference(DataType::F32, &w, &g, 4, 4), None);
    assert_eq!(
        first_difference(
            DataType::F32,
            &[pad, q].concat(),
            &[pad, one].concat(),
            4,
            4
        ),
        Some(6)
    );
    // Outside the output every byte counts; as integers NaN bits are bits.
    assert_eq!(first_difference(DataType::F32, &w, &g, 0, 4), Some(4));
    assert_eq!(first_difference(DataType::I32, &w, &g, 4, 4), Some(4));
}

#[test]
fn every_kernel_matches_the_stand_in_bit_for_bit() {
    let Some(gpu) = engine() else { return };
    let host = HostEngine::new();
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let mut checked = 0;
    for ty in DataType::ALL {
        for op in ReduceOp::ALL {
            for (count, skew) in [(1, 0), (7, 1), (1000, 0), (65_537, 3), (1 << 20, 0)] {
                let a = data(ty, count, &mut rng);
                let b = data(ty, count, &mut rng);
                let want = reduce_via(&host, op, ty, &a, &b, skew, 3);
                let got = reduce_via(&gpu, op, ty, &a, &b, skew, 3);
                if let Some(i) = first_difference(ty, &want, &got, skew * ty.size(), a.len()) {
                    let (size, off) = (ty.size(), skew * ty.size());
                    let inside = i >= off && i < off + a.len();
                    let el = if inside { (i - off) / size } else { 0 };
                    let at = if inside { off + el * size } else { i };
                    let len = if inside { size } else { 1 };
                    panic!(
                        "{} {}: {count} elements, skew {skew}: byte {i} ({}) differs: GPU \
                         {:02x?}, stand-in {:02x?} (inputs {:02x?} and {:02x?})",
                        op.name(),
                        ty.short_name(),
                        if inside {
                            format!("element {el}")
                        } else {
                            "outside the output".into()
                        },
                        &got[at..at + len],
                        &want[at..at + len],
                        a.get(el * size..(el + 1) * size),
                        b.get(el * size..(el + 1) * size),
                    );
                }
                checked += 1;
            }
        }
    }
    eprintln!("{checked} cases on {} matched", gpu.arch());
}

/// The harness above, run here on the stand-in (with delays, against one
/// without): the placement, the poison around the output and the waits
/// are right, so that on a GPU only the kernels are on trial.
#[test]
fn the_harness_runs_on_the_stand_in() {
    let (calm, slow) = (
        HostEngine::new(),
        HostEngine::with_delays(Duration::from_micros(300), 7),
    );
    let a: Vec<u8> = [1.5f32, -2.0, 3.25]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    let b: Vec<u8> = [2.0f32, 0.5, -1.0]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    let out = reduce_via(&slow, ReduceOp::Sum, DataType::F32, &a, &b, 1, 3);
    assert_eq!(
        out,
        reduce_via(&calm, ReduceOp::Sum, DataType::F32, &a, &b, 1, 3)
    );
    let sums: Vec<f32> = out[4..16]
        .chunks(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    assert_eq!(sums, [3.5, -1.5, 2.25]);
    assert!(
        out[..4].iter().chain(&out[16..]).all(|&x| x == 0xA5),
        "poison overwritten"
    );
    let mut rng = Rng(5);
    for ty in DataType::ALL {
        let (a, b) = (data(ty, 33, &mut rng), data(ty, 33, &mut rng));
        assert_eq!(
            reduce_via(&slow, ReduceOp::Avg, ty, &a, &b, 3, 2),
            reduce_via(&calm, ReduceOp::Avg, ty, &a, &b, 3, 2),
            "{}",
            ty.short_name()
        );
    }
}

/// A stream held at a gate runs nothing behind it until the host raises
/// the gate to the value waited for (a lower value does not release it);
/// numbers compare cyclically, across the wrap of 32 bits.
fn gate_holds_a_stream(e: &dyn Engine) {
    let stream = e.stream().unwrap();
    let gate = e.gate().unwrap();
    let pinned = e.alloc_pinned(4).unwrap();
    let dev = DevicePtr::new(e.alloc_device(4).unwrap());
    let done = e.event().unwrap();
    let limit = Duration::from_secs(30);
    // From 0 in steps below 2^31 (a gate's numbers grow by one a call),
    // across the wrap of 32 bits.
    for value in [1u32, 1 << 30, 1 << 31, 3 << 30, u32::MAX, 2] {
        e.with_pinned(pinned, &mut |m| m.copy_from_slice(&value.to_le_bytes()))
            .unwrap();
        e.stream_wait_gate(stream, gate, value, limit).unwrap();
        e.h2d(stream, dev, pinned, 0, 4).unwrap();
        e.record(done, stream).unwrap();
        // Below the value: still held.
        e.raise_gate(gate, value.wrapping_sub(1));
        let early = e.host_wait(done, Duration::from_millis(100));
        assert!(early.is_err(), "the stream passed a gate below {value}");
        e.raise_gate(gate, value);
        e.host_wait(done, limit).unwrap();
    }
    e.free_event(done);
    e.free_device(dev.buf);
    e.free_pinned(pinned);
    e.free_stream(stream);
}

#[test]
fn gates_hold_streams_until_raised() {
    gate_holds_a_stream(&HostEngine::with_delays(Duration::from_micros(300), 3));
    if let Some(gpu) = engine() {
        gate_holds_a_stream(&gpu);
    }
}
