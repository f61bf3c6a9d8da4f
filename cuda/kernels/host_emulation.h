// The few lines that let the host's C++ compiler build the kernels' own
// source (kernels/reduce.cu, kernels/executor.cu) for tests that run it
// on the CPU: the CUDA qualifiers become nothing, each built-in arithmetic
// function one IEEE operation (no contraction on x86-64/aarch64 at the
// default flags), and each thread of a block is a host thread with its
// indices in thread-local variables. A block's threads meet at
// __syncthreads() on a std::barrier and share one BlockState. The memory
// primitives of the executor are C++ atomics with the orders the PTX
// versions have (acquire loads, release stores, sequentially consistent
// fences); an LL line is two 8-byte atomic words, each carrying its own
// flag, which is all the device's 16-byte store promises too.
//
// Needs C++20 (<barrier>). Test code only: nothing here is in a library.

#include <atomic>
#include <barrier>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sched.h>

#define __device__
#define __global__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define FERROCCL_HOST_EMULATION 1

struct Dim3 {
    unsigned x;
};
static thread_local Dim3 threadIdx, blockIdx, blockDim, gridDim;

static inline unsigned __float_as_uint(float f) { unsigned u; memcpy(&u, &f, 4); return u; }
static inline float __uint_as_float(unsigned u) { float f; memcpy(&f, &u, 4); return f; }
static inline long long __double_as_longlong(double d) { long long u; memcpy(&u, &d, 8); return u; }
static inline double __longlong_as_double(long long u) { double d; memcpy(&d, &u, 8); return d; }
static inline float __fadd_rn(float a, float b) { return a + b; }
static inline float __fmul_rn(float a, float b) { return a * b; }
static inline float __fdiv_rn(float a, float b) { return a / b; }
static inline double __dadd_rn(double a, double b) { return a + b; }
static inline double __dmul_rn(double a, double b) { return a * b; }
static inline double __ddiv_rn(double a, double b) { return a / b; }
static inline float __uint2float_rn(unsigned u) { return (float)u; }
static inline float __ull2float_rn(unsigned long long u) { return (float)u; }
static inline double __ull2double_rn(unsigned long long u) { return (double)u; }
// The f16 conversions the device does with cvt.f32.f16 / cvt.rn.f16.f32:
// here the compiler's IEEE half type (exact widening, rounding to nearest
// even), not a copy of any code in the kernels.
static inline float cvt_f32_f16(unsigned short h) { _Float16 x; memcpy(&x, &h, 2); return (float)x; }
static inline unsigned short cvt_rn_f16_f32(float f) { _Float16 x = (_Float16)f; unsigned short h; memcpy(&h, &x, 2); return h; }

// A block: its barrier and its shared state.
struct HostBlock {
    std::barrier<>* bar;
    alignas(64) unsigned char shared[64];
};
static thread_local HostBlock* host_block;

static inline void __syncthreads() { host_block->bar->arrive_and_wait(); }
#define FERROCCL_BLOCK_SHARED(T, name)                                        \
    static_assert(sizeof(T) <= sizeof(host_block->shared), "shared state"); \
    T& name = *reinterpret_cast<T*>(host_block->shared)

static inline unsigned atomicCAS(unsigned* p, unsigned expected, unsigned desired) {
    __atomic_compare_exchange_n(p, &expected, desired, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
    return expected;
}
static inline unsigned atomicAdd(unsigned* p, unsigned v) { return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST); }

static inline unsigned long long ld_acquire(const unsigned long long* p) {
    return __atomic_load_n(p, __ATOMIC_ACQUIRE);
}
static inline void st_release(unsigned long long* p, unsigned long long v) {
    __atomic_store_n(p, v, __ATOMIC_RELEASE);
}
static inline unsigned ld_abort(const unsigned* p) { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }
static inline void st_abort(unsigned* p, unsigned v) { __atomic_store_n(p, v, __ATOMIC_RELEASE); }
static inline unsigned ld_shared_flag(const unsigned* p) { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }
static inline void st_shared_flag(unsigned* p, unsigned v) { __atomic_store_n(p, v, __ATOMIC_RELEASE); }
static inline unsigned ld_u32(const unsigned* p) { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }
static inline void fence_system() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
static inline void fence_device() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
static inline void spin_pause() { sched_yield(); }
static inline void ll_store(unsigned long long* line, unsigned d0, unsigned d1, unsigned flag) {
    __atomic_store_n(&line[0], (unsigned long long)d0 | (unsigned long long)flag << 32, __ATOMIC_RELAXED);
    __atomic_store_n(&line[1], (unsigned long long)d1 | (unsigned long long)flag << 32, __ATOMIC_RELAXED);
}
static inline void ll_load(const unsigned long long* line, unsigned& d0, unsigned& f0, unsigned& d1, unsigned& f1) {
    unsigned long long a = __atomic_load_n(&line[0], __ATOMIC_RELAXED);
    unsigned long long b = __atomic_load_n(&line[1], __ATOMIC_RELAXED);
    d0 = (unsigned)a;
    f0 = (unsigned)(a >> 32);
    d1 = (unsigned)b;
    f1 = (unsigned)(b >> 32);
}
