//! Element types a collective can carry, and reduction operators.
//!
//! `Element` is sealed: the wire fingerprint and the kernels know exactly
//! these ten types. f16 and bf16 come from the `half` crate.

use half::{bf16, f16};

use crate::simd::SimdLevel;

/// Reduction operators.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReduceOp {
    /// Elementwise sum.
    Sum,
    /// Elementwise product.
    Prod,
    /// Elementwise minimum.
    Min,
    /// Elementwise maximum.
    Max,
    /// Sum divided by the number of ranks, once, at the end.
    Avg,
}

impl ReduceOp {
    /// All operators, for tests and tools.
    pub const ALL: [ReduceOp; 5] = [
        ReduceOp::Sum,
        ReduceOp::Prod,
        ReduceOp::Min,
        ReduceOp::Max,
        ReduceOp::Avg,
    ];

    /// nccl-tests name of the operator.
    pub fn name(self) -> &'static str {
        match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Prod => "prod",
            ReduceOp::Min => "min",
            ReduceOp::Max => "max",
            ReduceOp::Avg => "avg",
        }
    }

    /// Parse an nccl-tests operator name.
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL
            .into_iter()
            .find(|op| op.name().eq_ignore_ascii_case(name))
    }

    pub(crate) fn code(self) -> u8 {
        match self {
            ReduceOp::Sum => 1,
            ReduceOp::Prod => 2,
            ReduceOp::Min => 3,
            ReduceOp::Max => 4,
            ReduceOp::Avg => 5,
        }
    }

    pub(crate) fn from_code(code: u8) -> Option<Self> {
        Self::ALL.into_iter().find(|op| op.code() == code)
    }

    /// The operator applied while data moves; Avg moves as Sum and divides
    /// once at the end.
    pub(crate) fn combining(self) -> ReduceOp {
        match self {
            ReduceOp::Avg => ReduceOp::Sum,
            other => other,
        }
    }
}

impl std::fmt::Display for ReduceOp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Element type names, as nccl-tests prints them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DataType {
    /// `f32`
    F32,
    /// `f64`
    F64,
    /// `half::f16`
    F16,
    /// `half::bf16`
    Bf16,
    /// `i8`
    I8,
    /// `u8`
    U8,
    /// `i32`
    I32,
    /// `u32`
    U32,
    /// `i64`
    I64,
    /// `u64`
    U64,
}

impl DataType {
    /// All element types.
    pub const ALL: [DataType; 10] = [
        DataType::F32,
        DataType::F64,
        DataType::F16,
        DataType::Bf16,
        DataType::I8,
        DataType::U8,
        DataType::I32,
        DataType::U32,
        DataType::I64,
        DataType::U64,
    ];

    /// nccl-tests name ("float", "half", "bfloat16", "int32", ...).
    pub fn name(self) -> &'static str {
        match self {
            DataType::F32 => "float",
            DataType::F64 => "double",
            DataType::F16 => "half",
            DataType::Bf16 => "bfloat16",
            DataType::I8 => "int8",
            DataType::U8 => "uint8",
            DataType::I32 => "int32",
            DataType::U32 => "uint32",
            DataType::I64 => "int64",
            DataType::U64 => "uint64",
        }
    }

    /// Parse an nccl-tests type name (also accepts Rust names like "f32").
    pub fn from_name(name: &str) -> Option<Self> {
        let lower = name.to_ascii_lowercase();
        let alias = match lower.as_str() {
            "f32" | "float32" => "float",
            "f64" | "float64" => "double",
            "f16" | "float16" => "half",
            "bf16" => "bfloat16",
            "i8" => "int8",
            "u8" => "uint8",
            "i32" | "int" => "int32",
            "u32" => "uint32",
            "i64" => "int64",
            "u64" => "uint64",
            other => other,
        };
        Self::ALL.into_iter().find(|t| t.name() == alias)
    }

    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            DataType::I8 | DataType::U8 => 1,
            DataType::F16 | DataType::Bf16 => 2,
            DataType::F32 | DataType::I32 | DataType::U32 => 4,
            DataType::F64 | DataType::I64 | DataType::U64 => 8,
        }
    }

    pub(crate) fn code(self) -> u8 {
        match self {
            DataType::F32 => 1,
            DataType::F64 => 2,
            DataType::F16 => 3,
            DataType::Bf16 => 4,
            DataType::I8 => 5,
            DataType::U8 => 6,
            DataType::I32 => 7,
            DataType::U32 => 8,
            DataType::I64 => 9,
            DataType::U64 => 10,
        }
    }

    pub(crate) fn from_code(code: u8) -> Option<Self> {
        Self::ALL.into_iter().find(|t| t.code() == code)
    }
}

impl std::fmt::Display for DataType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

mod sealed {
    pub trait Sealed {}
}

/// A type collectives can carry. Sealed: implemented for f32, f64, f16,
/// bf16, i8, u8, i32, u32, i64, u64.
pub trait Element:
    sealed::Sealed + bytemuck::Pod + PartialEq + Send + Sync + std::fmt::Debug + 'static
{
    /// The runtime tag of this type.
    const DTYPE: DataType;
    /// Combine `src` into `dst` elementwise with `op` (Avg acts as Sum).
    fn reduce_into(op: ReduceOp, dst: &mut [Self], src: &[Self]);
    /// `out = a op b` elementwise (Avg acts as Sum); all three have one length.
    fn reduce_to(op: ReduceOp, out: &mut [Self], a: &[Self], b: &[Self]);
    /// Internal: every output `= ins[0] op ins[1] op ...` with streaming
    /// stores, in one pass (`reduce_to_streams`); false where this type has
    /// no such kernel (nothing written then).
    #[doc(hidden)]
    fn reduce_to_streams(op: ReduceOp, ins: &[&[Self]], outs: &mut [&mut [Self]]) -> bool {
        let _ = (op, ins, outs);
        false
    }
    /// Divide every element by `n` (the end of Avg).
    fn divide(buf: &mut [Self], n: usize);
    /// Convert to f64 (for references and checks).
    fn to_f64(self) -> f64;
    /// Convert from f64, rounding or wrapping as the type does.
    fn from_f64(v: f64) -> Self;
}

/// Elementwise combination of one pair, generic over the arithmetic of the
/// type; the kernels below are one loop each over this, so the compiler sees
/// a straight-line body it can vectorise.
trait Arith: Copy {
    fn add(self, o: Self) -> Self;
    fn mul(self, o: Self) -> Self;
    fn min(self, o: Self) -> Self;
    fn max(self, o: Self) -> Self;
}

macro_rules! float_arith {
    ($t:ty) => {
        impl Arith for $t {
            #[inline(always)]
            fn add(self, o: Self) -> Self {
                self + o
            }
            #[inline(always)]
            fn mul(self, o: Self) -> Self {
                self * o
            }
            #[inline(always)]
            fn min(self, o: Self) -> Self {
                // Not f32::min: that one is NaN-ignoring and branches; the
                // compare-select form maps to minps/maxps.
                if o < self {
                    o
                } else {
                    self
                }
            }
            #[inline(always)]
            fn max(self, o: Self) -> Self {
                if o > self {
                    o
                } else {
                    self
                }
            }
        }
    };
}

macro_rules! int_arith {
    ($t:ty) => {
        impl Arith for $t {
            #[inline(always)]
            fn add(self, o: Self) -> Self {
                self.wrapping_add(o)
            }
            #[inline(always)]
            fn mul(self, o: Self) -> Self {
                self.wrapping_mul(o)
            }
            #[inline(always)]
            fn min(self, o: Self) -> Self {
                Ord::min(self, o)
            }
            #[inline(always)]
            fn max(self, o: Self) -> Self {
                Ord::max(self, o)
            }
        }
    };
}

float_arith!(f32);
float_arith!(f64);
int_arith!(i8);
int_arith!(u8);
int_arith!(i32);
int_arith!(u32);
int_arith!(i64);
int_arith!(u64);

#[inline(always)]
fn zip_into<T: Arith>(dst: &mut [T], src: &[T], f: impl Fn(T, T) -> T) {
    for (d, s) in dst.iter_mut().zip(src) {
        *d = f(*d, *s);
    }
}

#[inline(always)]
fn zip_to<T: Arith>(out: &mut [T], a: &[T], b: &[T], f: impl Fn(T, T) -> T) {
    for ((o, x), y) in out.iter_mut().zip(a).zip(b) {
        *o = f(*x, *y);
    }
}

#[inline(always)]
fn native_reduce_into<T: Arith>(op: ReduceOp, dst: &mut [T], src: &[T]) {
    debug_assert_eq!(dst.len(), src.len());
    match op {
        ReduceOp::Sum | ReduceOp::Avg => zip_into(dst, src, T::add),
        ReduceOp::Prod => zip_into(dst, src, T::mul),
        ReduceOp::Min => zip_into(dst, src, T::min),
        ReduceOp::Max => zip_into(dst, src, T::max),
    }
}

#[inline(always)]
fn native_reduce_to<T: Arith>(op: ReduceOp, out: &mut [T], a: &[T], b: &[T]) {
    debug_assert!(out.len() == a.len() && a.len() == b.len());
    match op {
        ReduceOp::Sum | ReduceOp::Avg => zip_to(out, a, b, T::add),
        ReduceOp::Prod => zip_to(out, a, b, T::mul),
        ReduceOp::Min => zip_to(out, a, b, T::min),
        ReduceOp::Max => zip_to(out, a, b, T::max),
    }
}

/// The kernels compiled for wider vectors than the target's baseline, one
/// set per `SimdLevel` above it: each is the generic kernel (inlined into a
/// function built with the level's features), so every level computes the
/// same elementwise operations and gives the same bits.
#[cfg(target_arch = "x86_64")]
mod wide {
    use super::{Arith, ReduceOp};
    use half::{bf16, f16};

    macro_rules! kernels {
        (
            $features:literal,
            $into:ident,
            $to:ident,
            $bf16_into:ident,
            $bf16_to:ident,
            $bf16_simd_into:ident,
            $bf16_simd_to:ident,
            $f16_into:ident,
            $f16_to:ident,
            $f16_simd_into:ident,
            $f16_simd_to:ident,
            $streams:ident,
            $line:path
        ) => {
            #[target_feature(enable = $features)]
            pub(super) fn $streams<T: Arith + bytemuck::Pod>(
                op: ReduceOp,
                ins: &[&[T]],
                outs: &mut [&mut [T]],
            ) {
                super::stream_kernel(op, ins, outs, |d, l| $line(d, l))
            }
            #[target_feature(enable = $features)]
            pub(super) fn $into<T: Arith>(op: ReduceOp, dst: &mut [T], src: &[T]) {
                super::native_reduce_into(op, dst, src)
            }
            #[target_feature(enable = $features)]
            pub(super) fn $to<T: Arith>(op: ReduceOp, out: &mut [T], a: &[T], b: &[T]) {
                super::native_reduce_to(op, out, a, b)
            }
            half_kernels!(
                $features,
                bf16,
                $bf16_into,
                $bf16_to,
                $bf16_simd_into,
                $bf16_simd_to
            );
            half_kernels!(
                $features,
                f16,
                $f16_into,
                $f16_to,
                $f16_simd_into,
                $f16_simd_to
            );
        };
    }

    /// A half type's kernels at one level: whole steps in registers
    /// (`crate::half_simd`), the tail (less than one step) through f32
    /// blocks.
    macro_rules! half_kernels {
        ($features:literal, $h:ty, $into:ident, $to:ident, $simd_into:ident, $simd_to:ident) => {
            #[target_feature(enable = $features)]
            pub(super) fn $into(op: ReduceOp, dst: &mut [$h], src: &[$h]) {
                let done = crate::half_simd::$simd_into(op, dst, src);
                super::half_reduce_into(op, &mut dst[done..], &src[done..])
            }
            #[target_feature(enable = $features)]
            pub(super) fn $to(op: ReduceOp, out: &mut [$h], a: &[$h], b: &[$h]) {
                let done = crate::half_simd::$simd_to(op, out, a, b);
                super::half_reduce_to(op, &mut out[done..], &a[done..], &b[done..])
            }
        };
    }

    kernels!(
        "avx2,fma,f16c",
        avx2_into,
        avx2_to,
        avx2_bf16_into,
        avx2_bf16_to,
        avx2_bf16_into,
        avx2_bf16_to,
        avx2_f16_into,
        avx2_f16_to,
        avx2_f16_into,
        avx2_f16_to,
        avx2_streams,
        crate::nt::line::avx2
    );
    kernels!(
        "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,f16c",
        avx512_into,
        avx512_to,
        avx512_bf16_into,
        avx512_bf16_to,
        avx512_bf16_into,
        avx512_bf16_to,
        // f16 at the AVX-512 level takes the 8-lane F16C steps: the 16-lane
        // AVX-512 conversions were no faster here (15-19 against 21-25 GB/s
        // for a 4 KiB f16 sum in two rounds of reduce-bench).
        avx512_f16_into,
        avx512_f16_to,
        avx2_f16_into,
        avx2_f16_to,
        avx512_streams,
        crate::nt::line::avx512
    );
}

/// Run `$base` or its `wide` counterpart for `$level` (capped at what the
/// CPU has).
macro_rules! at_level {
    ($level:expr, $base:ident, $avx2:ident, $avx512:ident, ($($arg:expr),*)) => {{
        #[cfg(target_arch = "x86_64")]
        match $level.min(SimdLevel::detected()) {
            // SAFETY: calling a function compiled for CPU features requires
            // that the CPU has them: the level is capped at the detected
            // one, which `is_x86_feature_detected!` found for every feature
            // the `wide` kernels of that level enable.
            SimdLevel::Avx512 => return unsafe { wide::$avx512($($arg),*) },
            // SAFETY: as above, for the AVX2 features.
            SimdLevel::Avx2 => return unsafe { wide::$avx2($($arg),*) },
            SimdLevel::Baseline => {}
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = $level;
        $base($($arg),*)
    }};
}

fn reduce_into_at<T: Arith>(level: SimdLevel, op: ReduceOp, dst: &mut [T], src: &[T]) {
    at_level!(
        level,
        native_reduce_into,
        avx2_into,
        avx512_into,
        (op, dst, src)
    )
}

fn reduce_to_at<T: Arith>(level: SimdLevel, op: ReduceOp, out: &mut [T], a: &[T], b: &[T]) {
    at_level!(level, native_reduce_to, avx2_to, avx512_to, (op, out, a, b))
}

fn bf16_reduce_into_at(level: SimdLevel, op: ReduceOp, dst: &mut [bf16], src: &[bf16]) {
    at_level!(
        level,
        half_reduce_into,
        avx2_bf16_into,
        avx512_bf16_into,
        (op, dst, src)
    )
}

fn bf16_reduce_to_at(level: SimdLevel, op: ReduceOp, out: &mut [bf16], a: &[bf16], b: &[bf16]) {
    at_level!(
        level,
        half_reduce_to,
        avx2_bf16_to,
        avx512_bf16_to,
        (op, out, a, b)
    )
}

fn f16_reduce_into_at(level: SimdLevel, op: ReduceOp, dst: &mut [f16], src: &[f16]) {
    at_level!(
        level,
        half_reduce_into,
        avx2_f16_into,
        avx512_f16_into,
        (op, dst, src)
    )
}

fn f16_reduce_to_at(level: SimdLevel, op: ReduceOp, out: &mut [f16], a: &[f16], b: &[f16]) {
    at_level!(
        level,
        half_reduce_to,
        avx2_f16_to,
        avx512_f16_to,
        (op, out, a, b)
    )
}

/// The fused kernel: every output gets `ins[0] op ins[1] op ...` (a copy
/// of `ins[0]` when it is alone), computed a cache line at a time in
/// registers and written to each output with streaming stores (`line`), so
/// the loads of the inputs and the stores of the outputs interleave in one
/// pass. Through a buffer instead (reduce a block into L1, then stream it
/// out), a 2-process 64 MiB allreduce ran at 6.6-7.4 GB/s here; fused, at
/// 9.3-11.4 (`bench/bound/direct.c`, docs/performance.md). The lines of
/// every output start at the same element (the caller checks that the
/// outputs lie alike against 64-byte boundaries); the elements before the
/// first boundary and after the last whole line use ordinary stores.
#[inline(always)]
fn stream_kernel<T: Arith + bytemuck::Pod>(
    op: ReduceOp,
    ins: &[&[T]],
    outs: &mut [&mut [T]],
    line: impl Fn(&mut [u8], &crate::nt::Line),
) {
    match op {
        ReduceOp::Sum | ReduceOp::Avg => stream_lines(ins, outs, T::add, line),
        ReduceOp::Prod => stream_lines(ins, outs, T::mul, line),
        ReduceOp::Min => stream_lines(ins, outs, T::min, line),
        ReduceOp::Max => stream_lines(ins, outs, T::max, line),
    }
}

#[inline(always)]
fn stream_lines<T: Arith + bytemuck::Pod>(
    ins: &[&[T]],
    outs: &mut [&mut [T]],
    f: impl Fn(T, T) -> T,
    line: impl Fn(&mut [u8], &crate::nt::Line),
) {
    use crate::nt::LINE;
    let per_line = LINE / std::mem::size_of::<T>();
    let n = outs[0].len();
    let head = outs[0].as_ptr().align_offset(LINE).min(n);
    let end = head + (n - head) / per_line * per_line;
    let one = |i: usize| ins[1..].iter().fold(ins[0][i], |v, x| f(v, x[i]));
    for i in (0..head).chain(end..n) {
        let v = one(i);
        for out in outs.iter_mut() {
            out[i] = v;
        }
    }
    // Four lines a step (the loop's bookkeeping, bounds and the walk over
    // the outputs, is paid once per group), then the lines left one by one.
    let grouped = head + (end - head) / (4 * per_line) * (4 * per_line);
    stream_group::<T, 4>(ins, outs, head..grouped, &f, &line);
    stream_group::<T, 1>(ins, outs, grouped..end, &f, &line);
}

/// `stream_lines` over `range` (whole lines, a multiple of `G` of them),
/// `G` lines a step, computed in a buffer of `G` lines.
#[inline(always)]
fn stream_group<T: Arith + bytemuck::Pod, const G: usize>(
    ins: &[&[T]],
    outs: &mut [&mut [T]],
    range: std::ops::Range<usize>,
    f: &impl Fn(T, T) -> T,
    line: &impl Fn(&mut [u8], &crate::nt::Line),
) {
    use crate::nt::{Line, LINE};
    let span = G * LINE / std::mem::size_of::<T>();
    let mut buf = [Line::default(); G];
    for s in range.step_by(span) {
        let l: &mut [T] = bytemuck::cast_slice_mut(&mut buf);
        l.copy_from_slice(&ins[0][s..s + span]);
        for x in &ins[1..] {
            for (o, v) in l.iter_mut().zip(&x[s..s + span]) {
                *o = f(*o, *v);
            }
        }
        for out in outs.iter_mut() {
            let dst: &mut [u8] = bytemuck::cast_slice_mut(&mut out[s..s + span]);
            for (d, b) in dst.chunks_exact_mut(LINE).zip(&buf) {
                line(d, b);
            }
        }
    }
}

/// `stream_kernel` at `level` (capped at the CPU's), then the store fence.
/// False (nothing written) where it cannot run: not x86-64, lengths that
/// differ, or outputs that lie differently against 64-byte boundaries.
fn reduce_to_streams_at<T: Arith + bytemuck::Pod>(
    level: SimdLevel,
    op: ReduceOp,
    ins: &[&[T]],
    outs: &mut [&mut [T]],
) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        let Some(n) = outs.first().map(|o| o.len()) else {
            return false;
        };
        let phase = |p: *const T| p as usize % crate::nt::LINE;
        let first = phase(outs[0].as_ptr());
        if ins.is_empty()
            || ins.iter().any(|x| x.len() != n)
            || outs
                .iter()
                .any(|o| o.len() != n || phase(o.as_ptr()) != first)
        {
            return false;
        }
        let base = |op, ins: &[&[T]], outs: &mut [&mut [T]]| {
            stream_kernel(op, ins, outs, crate::nt::line::sse2)
        };
        let run = |level: SimdLevel, op, ins, outs| {
            at_level!(level, base, avx2_streams, avx512_streams, (op, ins, outs))
        };
        run(level, op, ins, outs);
        crate::nt::line::fence();
        true
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (level, op, ins, outs);
        false
    }
}

/// Every output `= ins[0] op ins[1] op ...` (Avg acts as Sum; a copy of
/// `ins[0]` when it is the only input), in one pass with streaming stores:
/// for large outputs that are not read soon (see `crate::nt`). False, and
/// nothing written, where the type or the buffers do not allow it (then use
/// `reduce_to_output` and `store`).
pub(crate) fn reduce_to_streams<T: Element>(
    op: ReduceOp,
    ins: &[&[T]],
    outs: &mut [&mut [T]],
) -> bool {
    T::reduce_to_streams(op.combining(), ins, outs)
}

macro_rules! native_element {
    ($t:ty, $dt:expr, float) => {
        native_element!(@impl $t, $dt, |buf: &mut [$t], n: usize| {
            let n = n as $t;
            for v in buf.iter_mut() {
                *v /= n;
            }
        });
    };
    ($t:ty, $dt:expr, int) => {
        // Integer Avg truncates toward zero, as NCCL's does. The rank count
        // may not fit the type (256 ranks of u8): divide in i128.
        native_element!(@impl $t, $dt, |buf: &mut [$t], n: usize| {
            let n = n as i128;
            for v in buf.iter_mut() {
                *v = (*v as i128 / n) as $t;
            }
        });
    };
    (@impl $t:ty, $dt:expr, $div:expr) => {
        impl sealed::Sealed for $t {}
        impl Element for $t {
            const DTYPE: DataType = $dt;
            fn reduce_into(op: ReduceOp, dst: &mut [Self], src: &[Self]) {
                reduce_into_at(SimdLevel::current(), op, dst, src)
            }
            fn reduce_to(op: ReduceOp, out: &mut [Self], a: &[Self], b: &[Self]) {
                reduce_to_at(SimdLevel::current(), op, out, a, b)
            }
            fn reduce_to_streams(
                op: ReduceOp,
                ins: &[&[Self]],
                outs: &mut [&mut [Self]],
            ) -> bool {
                reduce_to_streams_at(SimdLevel::current(), op, ins, outs)
            }
            fn divide(buf: &mut [Self], n: usize) {
                let div = $div;
                div(buf, n)
            }
            fn to_f64(self) -> f64 {
                self as f64
            }
            fn from_f64(v: f64) -> Self {
                v as $t
            }
        }
    };
}

native_element!(f32, DataType::F32, float);
native_element!(f64, DataType::F64, float);
native_element!(i8, DataType::I8, int);
native_element!(u8, DataType::U8, int);
native_element!(i32, DataType::I32, int);
native_element!(u32, DataType::U32, int);
native_element!(i64, DataType::I64, int);
native_element!(u64, DataType::U64, int);

/// Half-precision types reduce through f32: each block is widened to f32,
/// combined with the f32 kernel and rounded once, in blocks that stay in L1.
/// The conversions are slice-at-a-time so that they vectorise: f16 through
/// `half`'s slice conversions (F16C when the CPU has it, detected at run
/// time), bf16 through the bit manipulations below.
const HALF_BLOCK: usize = 1024;

/// Slice conversions between a half type and f32.
trait HalfSlices: Sized {
    fn widen(src: &[Self], dst: &mut [f32]);
    fn narrow(src: &[f32], dst: &mut [Self]);
}

impl HalfSlices for f16 {
    #[inline(always)]
    fn widen(src: &[Self], dst: &mut [f32]) {
        use half::slice::HalfFloatSliceExt;
        src.convert_to_f32_slice(dst);
    }
    #[inline(always)]
    fn narrow(src: &[f32], dst: &mut [Self]) {
        use half::slice::HalfFloatSliceExt;
        dst.convert_from_f32_slice(src);
    }
}

impl HalfSlices for bf16 {
    #[inline(always)]
    fn widen(src: &[Self], dst: &mut [f32]) {
        // A bf16 is the top half of an f32: widening is exact.
        for (o, v) in dst.iter_mut().zip(src) {
            *o = f32::from_bits(u32::from(v.to_bits()) << 16);
        }
    }
    #[inline(always)]
    fn narrow(src: &[f32], dst: &mut [Self]) {
        for (o, v) in dst.iter_mut().zip(src) {
            *o = bf16::from_bits(f32_to_bf16_bits(*v));
        }
    }
}

/// Round an f32 to the nearest bf16 (ties to even), keeping NaNs NaN; the
/// select form (no early return) lets the loop above vectorise.
#[inline(always)]
fn f32_to_bf16_bits(v: f32) -> u16 {
    let x = v.to_bits();
    let rounded = x.wrapping_add(0x7fff + ((x >> 16) & 1)) >> 16;
    let quiet_nan = (x >> 16) | 0x0040;
    // Select on u32 and narrow once (see `f32_to_f16_bits`).
    (if (x & 0x7fff_ffff) > 0x7f80_0000 {
        quiet_nan
    } else {
        rounded
    }) as u16
}

/// `dst = dst op src` for a half type, through f32 blocks.
#[inline(always)]
fn half_reduce_into<H: HalfSlices + Copy>(op: ReduceOp, dst: &mut [H], src: &[H]) {
    let mut a = [0f32; HALF_BLOCK];
    let mut b = [0f32; HALF_BLOCK];
    for (d, s) in dst.chunks_mut(HALF_BLOCK).zip(src.chunks(HALF_BLOCK)) {
        let n = d.len();
        H::widen(d, &mut a[..n]);
        H::widen(s, &mut b[..n]);
        native_reduce_into(op, &mut a[..n], &b[..n]);
        H::narrow(&a[..n], d);
    }
}

/// `out = x op y` for a half type, through f32 blocks.
#[inline(always)]
fn half_reduce_to<H: HalfSlices + Copy>(op: ReduceOp, out: &mut [H], x: &[H], y: &[H]) {
    let mut a = [0f32; HALF_BLOCK];
    let mut b = [0f32; HALF_BLOCK];
    for ((o, x), y) in out
        .chunks_mut(HALF_BLOCK)
        .zip(x.chunks(HALF_BLOCK))
        .zip(y.chunks(HALF_BLOCK))
    {
        let n = o.len();
        H::widen(x, &mut a[..n]);
        H::widen(y, &mut b[..n]);
        native_reduce_into(op, &mut a[..n], &b[..n]);
        H::narrow(&a[..n], o);
    }
}

macro_rules! half_element {
    ($t:ty, $dt:expr, $into_at:ident, $to_at:ident) => {
        impl sealed::Sealed for $t {}
        impl Element for $t {
            const DTYPE: DataType = $dt;
            fn reduce_into(op: ReduceOp, dst: &mut [Self], src: &[Self]) {
                $into_at(SimdLevel::current(), op, dst, src)
            }
            fn reduce_to(op: ReduceOp, out: &mut [Self], x: &[Self], y: &[Self]) {
                $to_at(SimdLevel::current(), op, out, x, y)
            }
            fn divide(buf: &mut [Self], n: usize) {
                let n = n as f32;
                let mut a = [0f32; HALF_BLOCK];
                for d in buf.chunks_mut(HALF_BLOCK) {
                    let len = d.len();
                    <$t as HalfSlices>::widen(d, &mut a[..len]);
                    for v in &mut a[..len] {
                        *v /= n;
                    }
                    <$t as HalfSlices>::narrow(&a[..len], d);
                }
            }
            fn to_f64(self) -> f64 {
                self.to_f64()
            }
            fn from_f64(v: f64) -> Self {
                <$t>::from_f64(v)
            }
        }
    };
}

half_element!(f16, DataType::F16, f16_reduce_into_at, f16_reduce_to_at);
half_element!(bf16, DataType::Bf16, bf16_reduce_into_at, bf16_reduce_to_at);

/// Reduce `src` into `dst` elementwise for a runtime-chosen op (Avg acts as
/// Sum); the single entry point the executor uses.
#[inline]
pub fn reduce_into<T: Element>(op: ReduceOp, dst: &mut [T], src: &[T]) {
    T::reduce_into(op.combining(), dst, src)
}

/// `out = a op b` elementwise (Avg acts as Sum).
#[inline]
pub fn reduce_to<T: Element>(op: ReduceOp, out: &mut [T], a: &[T], b: &[T]) {
    T::reduce_to(op.combining(), out, a, b)
}

/// Elements per block of the two-destination kernels: small enough that a
/// block just written is still in L1 when it is copied to the second
/// destination.
const PAIR_BLOCK: usize = 1024;

/// How a kernel writes the collective's output (see `crate::nt`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Store {
    /// Ordinary stores: the output stays in cache.
    Cached,
    /// Streaming stores: for a large output that will not be read soon.
    Streaming,
}

/// `dst = src` in the given store mode.
pub(crate) fn store<T: Element>(mode: Store, dst: &mut [T], src: &[T]) {
    match mode {
        Store::Cached => dst.copy_from_slice(src),
        Store::Streaming => {
            crate::nt::copy_nt(bytemuck::cast_slice_mut(dst), bytemuck::cast_slice(src))
        }
    }
}

/// `out = a op b` (Avg acts as Sum), writing `out` in the given mode.
pub(crate) fn reduce_to_output<T: Element>(
    mode: Store,
    op: ReduceOp,
    out: &mut [T],
    a: &[T],
    b: &[T],
) {
    if mode == Store::Cached {
        return reduce_to(op, out, a, b);
    }
    let mut tmp = [<T as bytemuck::Zeroable>::zeroed(); PAIR_BLOCK];
    let blocks = out
        .chunks_mut(PAIR_BLOCK)
        .zip(a.chunks(PAIR_BLOCK).zip(b.chunks(PAIR_BLOCK)));
    for (out, (a, b)) in blocks {
        let tmp = &mut tmp[..out.len()];
        reduce_to(op, tmp, a, b);
        store(mode, out, tmp);
    }
}

/// `out = a op b` and `copy = out`, block by block, so each input byte is
/// read once (Avg acts as Sum). Used where a reduced chunk goes both to the
/// output and into a send slot (`copy`, always written through the cache:
/// the peer reads it next).
pub(crate) fn reduce_to_both<T: Element>(
    mode: Store,
    op: ReduceOp,
    out: &mut [T],
    copy: &mut [T],
    a: &[T],
    b: &[T],
) {
    debug_assert!(out.len() == copy.len() && out.len() == a.len() && out.len() == b.len());
    let blocks = out
        .chunks_mut(PAIR_BLOCK)
        .zip(copy.chunks_mut(PAIR_BLOCK))
        .zip(a.chunks(PAIR_BLOCK).zip(b.chunks(PAIR_BLOCK)));
    for ((out, copy), (a, b)) in blocks {
        reduce_to(op, copy, a, b);
        store(mode, out, copy);
    }
}

/// `dst = dst op src` and `copy = dst`, block by block.
pub(crate) fn reduce_into_both<T: Element>(
    mode: Store,
    op: ReduceOp,
    dst: &mut [T],
    copy: &mut [T],
    src: &[T],
) {
    debug_assert!(dst.len() == copy.len() && dst.len() == src.len());
    let blocks = dst
        .chunks_mut(PAIR_BLOCK)
        .zip(copy.chunks_mut(PAIR_BLOCK))
        .zip(src.chunks(PAIR_BLOCK));
    for ((dst, copy), src) in blocks {
        reduce_to(op, copy, dst, src);
        store(mode, dst, copy);
    }
}

/// `out = src` (in the given mode) and `copy = src`, reading `src` once
/// per block.
pub(crate) fn copy_to_both<T: Element>(mode: Store, out: &mut [T], copy: &mut [T], src: &[T]) {
    debug_assert!(out.len() == copy.len() && out.len() == src.len());
    let blocks = out
        .chunks_mut(PAIR_BLOCK)
        .zip(copy.chunks_mut(PAIR_BLOCK))
        .zip(src.chunks(PAIR_BLOCK));
    for ((out, copy), src) in blocks {
        copy.copy_from_slice(src);
        store(mode, out, copy);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reference(op: ReduceOp, a: f64, b: f64) -> f64 {
        match op {
            ReduceOp::Sum | ReduceOp::Avg => a + b,
            ReduceOp::Prod => a * b,
            ReduceOp::Min => a.min(b),
            ReduceOp::Max => a.max(b),
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
                    let (mut both, mut both_copy) = (zeros(), zeros());
                    reduce_to_both(mode, op, &mut both, &mut both_copy, &a, &b);
                    let (mut into_both, mut into_copy) = (a.clone(), zeros());
                    reduce_into_both(mode, op, &mut into_both, &mut into_copy, &b);
                    let (mut copy_a, mut copy_b) = (zeros(), zeros());
                    copy_to_both(mode, &mut copy_a, &mut copy_b, &a);
                    for i in 0..len {
                        let want = T::from_f64(reference(op, a[i].to_f64(), b[i].to_f64()));
                        let got = [out[i], both[i], both_copy[i], into_both[i], into_copy[i]];
                        for got in got {
                            assert_eq!(got, want, "{mode:?} kernels: {} {op} i={i}", T::DTYPE);
                        }
                        assert_eq!((copy_a[i], copy_b[i]), (a[i], a[i]), "copy_to_both i={i}");
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
                // Against the f64 reference where no input is NaN (min and
                // max of a NaN are the kernels' compare-select, not IEEE's).
                for (i, w) in want.iter().enumerate() {
                    if nan(all[i]) || nan(b[i]) {
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
                        same_bits(&to, &want),
                        "{} reduce_to {op} at {level}",
                        H::DTYPE
                    );
                    assert!(
                        same_bits(&into, &want),
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
    /// operation on NaNs returns unspecified (the compiler may swap the
    /// operands of an addition), so only NaN-ness is comparable.
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
                    same_bits(&base_into, &base_to),
                    "{} {op} into vs to",
                    T::DTYPE
                );
                for level in SimdLevel::ALL {
                    let (mut into, mut to) = (a.clone(), vec![T::zeroed(); len]);
                    into_at(level, op, &mut into, &b);
                    to_at(level, op, &mut to, &a, &b);
                    let what = format!("{} {op} len {len} at {level}", T::DTYPE);
                    assert!(same_bits(&into, &base_into), "reduce_into {what}");
                    assert!(same_bits(&to, &base_into), "reduce_to {what}");
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
                            let mut bufs: Vec<Vec<T>> =
                                (0..3).map(|_| vec![guard; len + 80]).collect();
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
                                assert!(same_bits(&b[at..at + len], &want), "{what}");
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

    #[test]
    fn names_round_trip() {
        for t in DataType::ALL {
            assert_eq!(DataType::from_name(t.name()), Some(t));
            assert_eq!(DataType::from_code(t.code()), Some(t));
        }
        for op in ReduceOp::ALL {
            assert_eq!(ReduceOp::from_name(op.name()), Some(op));
            assert_eq!(ReduceOp::from_code(op.code()), Some(op));
        }
    }
}
