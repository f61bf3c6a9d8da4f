// ferroccl reduction kernels, compiled at run time by NVRTC.
//
// This file is the one source of every kernel: each op is defined once
// (the Op* structs), each element type once (the E* structs), and the
// extern "C" kernels, one per (op, type), are instantiation lines that
// cuda/src/kernels.rs appends to this text (see docs/cuda.md).
//
// No #include: NVRTC ships no headers we can rely on. Only the built-in
// device functions (__uint_as_float, __fadd_rn, ...) are used; the f16
// conversions are the hardware's (inline PTX cvt), the bf16 ones bit
// operations.
//
// Semantics, bit for bit the host library's (src/reduce/arith.rs):
// - integers: Sum and Prod wrap (computed in unsigned types: signed
//   overflow is undefined in C++), Min and Max are the plain ones;
// - f32, f64: one IEEE operation rounded to nearest even (the _rn
//   intrinsics, which are never contracted into a fused multiply-add);
// - f16, bf16: widened to f32 (exact), one f32 operation, rounded back to
//   nearest even once per op;
// - Min, Max of floats: IEEE 754-2019 minimum / maximum with one NaN: if
//   either operand is NaN the result is the type's canonical NaN (f32
//   0x7fc00000, f64 0x7ff8000000000000, f16 0x7e00, bf16 0x7fc0) in either
//   order; -0 is below +0;
// - Avg reduces as Sum; the finishing kernel divides once by the rank
//   count n: integers truncate toward zero (the wrapped sum divided),
//   floats divide (true division, not a reciprocal), halves divide in f32
//   and round once.

namespace ferroccl {

typedef unsigned char u8;
typedef signed char i8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef int i32;
typedef unsigned long long u64;
typedef long long i64;

// ---------------------------------------------------------------- floats

__device__ __forceinline__ float f32_min(float a, float b) {
    if (a != a || b != b) return __uint_as_float(0x7fc00000u);
    if (a < b) return a;
    if (b < a) return b;
    // Equal: the same bits, or -0 and +0, whose OR is -0.
    return __uint_as_float(__float_as_uint(a) | __float_as_uint(b));
}

__device__ __forceinline__ float f32_max(float a, float b) {
    if (a != a || b != b) return __uint_as_float(0x7fc00000u);
    if (a > b) return a;
    if (b > a) return b;
    // Equal: the same bits, or -0 and +0, whose AND is +0.
    return __uint_as_float(__float_as_uint(a) & __float_as_uint(b));
}

__device__ __forceinline__ double f64_min(double a, double b) {
    if (a != a || b != b) return __longlong_as_double(0x7ff8000000000000ll);
    if (a < b) return a;
    if (b < a) return b;
    return __longlong_as_double(__double_as_longlong(a) | __double_as_longlong(b));
}

__device__ __forceinline__ double f64_max(double a, double b) {
    if (a != a || b != b) return __longlong_as_double(0x7ff8000000000000ll);
    if (a > b) return a;
    if (b > a) return b;
    return __longlong_as_double(__double_as_longlong(a) & __double_as_longlong(b));
}

// ----------------------------------------------------- half conversions

// f16 <-> f32 by the hardware's conversions, one F2F instruction each
// way (inline PTX: no header needed). Written out with bit operations
// they took some 40 integer instructions an element, and the f16 kernels
// ran at half the copy's rate on an H200 (docs/hardware.md, 2026-12-04)
// while bf16, whose conversions are a shift and a rounding add, ran at it.
// The host build (kernels/host_emulation.h) has the C++ compiler's own
// _Float16 conversions in their place, and the tests check both against
// a reference written from the rules.
#ifndef FERROCCL_HOST_EMULATION
// Exact for every finite value and Inf, subnormals included.
__device__ __forceinline__ float cvt_f32_f16(u16 h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}
// Rounded to nearest even: overflow to Inf, f16 subnormals kept.
__device__ __forceinline__ u16 cvt_rn_f16_f32(float f) {
    u16 h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}
#endif

// f16 -> f32, exact. A NaN gives a NaN, whose payload no result depends
// on: f32_min/f32_max give the canonical one, and a Sum or Prod with a
// NaN may give any NaN.
__device__ __forceinline__ float f16_to_f32(u16 h) { return cvt_f32_f16(h); }

// f32 -> f16, rounded to nearest even; a NaN stays a quiet NaN with the
// top of its payload (the canonical f32 NaN gives 0x7e00), which the
// conversion instruction does not promise: NaNs take the bit path.
__device__ __forceinline__ u16 f32_to_f16(float f) {
    u32 x = __float_as_uint(f);
    u32 ax = x & 0x7fffffffu;
    if (ax > 0x7f800000u) return (u16)(((x >> 16) & 0x8000u) | 0x7e00u | ((ax >> 13) & 0x3ffu));
    return cvt_rn_f16_f32(f);
}

// bf16 -> f32, exact: a bf16 is the top half of an f32.
__device__ __forceinline__ float bf16_to_f32(u16 h) {
    return __uint_as_float((u32)h << 16);
}

// f32 -> bf16, rounded to nearest even; a NaN stays a quiet NaN (the
// canonical f32 NaN gives 0x7fc0).
__device__ __forceinline__ u16 f32_to_bf16(float f) {
    u32 x = __float_as_uint(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (u16)((x >> 16) | 0x40u);
    return (u16)((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

// ---------------------------------------------------------- element types
//
// Each type: its storage T, and add, mul, min, max of two elements and
// div of one by the rank count. These are the only per-type definitions.

struct EF32 {
    typedef float T;
    static __device__ __forceinline__ T add(T a, T b) { return __fadd_rn(a, b); }
    static __device__ __forceinline__ T mul(T a, T b) { return __fmul_rn(a, b); }
    static __device__ __forceinline__ T min(T a, T b) { return f32_min(a, b); }
    static __device__ __forceinline__ T max(T a, T b) { return f32_max(a, b); }
    static __device__ __forceinline__ T div(T a, u64 n) { return __fdiv_rn(a, __ull2float_rn(n)); }
};

struct EF64 {
    typedef double T;
    static __device__ __forceinline__ T add(T a, T b) { return __dadd_rn(a, b); }
    static __device__ __forceinline__ T mul(T a, T b) { return __dmul_rn(a, b); }
    static __device__ __forceinline__ T min(T a, T b) { return f64_min(a, b); }
    static __device__ __forceinline__ T max(T a, T b) { return f64_max(a, b); }
    static __device__ __forceinline__ T div(T a, u64 n) { return __ddiv_rn(a, __ull2double_rn(n)); }
};

// f16 and bf16: through f32, rounded once per op. Min and Max give
// operands, -0 or the canonical NaN, all exact in the half type.
template <float (*W)(u16), u16 (*N)(float)>
struct EHalf {
    typedef u16 T;
    static __device__ __forceinline__ T add(T a, T b) { return N(__fadd_rn(W(a), W(b))); }
    static __device__ __forceinline__ T mul(T a, T b) { return N(__fmul_rn(W(a), W(b))); }
    static __device__ __forceinline__ T min(T a, T b) { return N(f32_min(W(a), W(b))); }
    static __device__ __forceinline__ T max(T a, T b) { return N(f32_max(W(a), W(b))); }
    static __device__ __forceinline__ T div(T a, u64 n) { return N(__fdiv_rn(W(a), __ull2float_rn(n))); }
};
typedef EHalf<f16_to_f32, f32_to_f16> EF16;
typedef EHalf<bf16_to_f32, f32_to_bf16> EBF16;

// Integers: S the element, U an unsigned type at least as wide (and at
// least 32 bits, so that u8 * u8 is not promoted to a signed int) in which
// Sum and Prod wrap; W the type in which Avg divides (signed for signed S,
// truncating toward zero as C++ division does).
template <class S, class U, class W>
struct EInt {
    typedef S T;
    static __device__ __forceinline__ T add(T a, T b) { return (T)((U)a + (U)b); }
    static __device__ __forceinline__ T mul(T a, T b) { return (T)((U)a * (U)b); }
    static __device__ __forceinline__ T min(T a, T b) { return b < a ? b : a; }
    static __device__ __forceinline__ T max(T a, T b) { return a < b ? b : a; }
    static __device__ __forceinline__ T div(T a, u64 n) { return (T)((W)a / (W)n); }
};
typedef EInt<i8, u32, i64> EI8;
typedef EInt<u8, u32, u64> EU8;
typedef EInt<i32, u32, i64> EI32;
typedef EInt<u32, u32, u64> EU32;
typedef EInt<i64, u64, i64> EI64;
typedef EInt<u64, u64, u64> EU64;

// -------------------------------------------------------------------- ops
//
// One definition of each op, for every type. Avg reduces with OpSum.

struct OpSum {
    template <class E> static __device__ __forceinline__ typename E::T apply(typename E::T a, typename E::T b) { return E::add(a, b); }
};
struct OpProd {
    template <class E> static __device__ __forceinline__ typename E::T apply(typename E::T a, typename E::T b) { return E::mul(a, b); }
};
struct OpMin {
    template <class E> static __device__ __forceinline__ typename E::T apply(typename E::T a, typename E::T b) { return E::min(a, b); }
};
struct OpMax {
    template <class E> static __device__ __forceinline__ typename E::T apply(typename E::T a, typename E::T b) { return E::max(a, b); }
};

// ------------------------------------------------------------ the loops

// 16 bytes of elements: one vector load or store where aligned.
template <class T>
struct alignas(16) Vec16 {
    T v[16 / sizeof(T)];
};

// f(x, y) over count elements of dst, a and b (dst may be a; for the
// unary form y is x and b is not read). Grid-stride loops, so any grid
// covers any count. Where the three pointers have the same offset within
// 16 bytes (all aligned, in the usual case), the few elements before the
// first 16-byte boundary go one at a time, then whole 16-byte vectors,
// then the remainder one at a time; otherwise every element one at a time.
template <class T, bool BINARY, class F>
__device__ __forceinline__ void elementwise(T* dst, const T* a, const T* b, u64 count, F f) {
    const u64 tid = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    const u64 stride = (u64)gridDim.x * blockDim.x;
    const u64 per = 16 / sizeof(T);
    const u64 off = (u64)dst & 15u;
    bool vec = ((u64)a & 15u) == off && off % sizeof(T) == 0;
    if (BINARY) vec = vec && ((u64)b & 15u) == off;
    u64 head = 0, body = 0;
    if (vec) {
        head = ((16u - off) & 15u) / sizeof(T);
        if (head > count) head = count;
        body = (count - head) / per;
    } else {
        head = count;
    }
    for (u64 i = tid; i < head; i += stride) {
        T x = a[i];
        dst[i] = f(x, BINARY ? b[i] : x);
    }
    if (body != 0) {
        Vec16<T>* vd = (Vec16<T>*)(dst + head);
        const Vec16<T>* va = (const Vec16<T>*)(a + head);
        const Vec16<T>* vb = (const Vec16<T>*)(b + head);
        for (u64 i = tid; i < body; i += stride) {
            Vec16<T> x = va[i];
            Vec16<T> y = BINARY ? vb[i] : x;
            Vec16<T> r;
#pragma unroll
            for (u64 k = 0; k < per; k++) r.v[k] = f(x.v[k], y.v[k]);
            vd[i] = r;
        }
    }
    for (u64 i = head + body * per + tid; i < count; i += stride) {
        T x = a[i];
        dst[i] = f(x, BINARY ? b[i] : x);
    }
}

template <class E, class O>
struct Combine {
    __device__ __forceinline__ typename E::T operator()(typename E::T a, typename E::T b) const {
        return O::template apply<E>(a, b);
    }
};

template <class E>
struct Divide {
    u64 n;
    __device__ __forceinline__ typename E::T operator()(typename E::T a, typename E::T) const {
        return E::div(a, n);
    }
};

// dst[i] = op(a[i], b[i]) for i < count; dst may be a.
template <class E, class O>
__device__ __forceinline__ void reduce(typename E::T* dst, const typename E::T* a, const typename E::T* b, u64 count) {
    elementwise<typename E::T, true>(dst, a, b, count, Combine<E, O>());
}

// buf[i] = buf[i] / n for i < count: the end of Avg, once.
template <class E>
__device__ __forceinline__ void avg_finish(typename E::T* buf, u64 count, u64 n) {
    Divide<E> d;
    d.n = n;
    elementwise<typename E::T, false>(buf, buf, buf, count, d);
}

} // namespace ferroccl

// The extern "C" kernels follow, generated by cuda/src/kernels.rs.
