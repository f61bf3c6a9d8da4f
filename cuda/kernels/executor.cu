// ferroccl device executor: runs a rank's encoded program (the image of
// src/algo/encode.rs, docs/device-executor.md) on the GPU, one thread
// block per channel, moving frames through FIFOs in device memory that the
// receiver owns and the sender writes (docs/cuda-ipc.md), with no host
// involvement between launch and the end.
//
// This text follows kernels/reduce.cu (element types and ops) in the
// source NVRTC compiles; cuda/src/executor.rs appends one extern "C"
// kernel per (protocol, op, type). The same text is also built by the
// host's C++ compiler under kernels/host_emulation.h, every thread of
// every block of every rank a host thread, and must then give the host
// executor's results bit for bit (src/exec/oracle/kernel_host.rs): the
// only lines that differ between the two builds are the few memory
// primitives in the FERROCCL_HOST_EMULATION switch below.
//
// Two protocols, chosen per call by the tuner (both ends agree, as the
// choice is a function of the call):
// - BULK: a frame is stored in a slot of `slot_bytes`, its length and tag
//   in the slot's meta word; then a system-scope fence; then the tail
//   counter (in the receiver's memory) is raised. The receiver waits for
//   the tail, reads, and raises the head counter in the sender's memory
//   to free the slot.
// - LL (low latency): a frame is a header line and payload lines of 16
//   bytes, each two 8-byte words of 4 data bytes and a 4-byte flag; a
//   reader polls the very line it wants until both of its flags carry the
//   frame's number, so no tail counter and no fence. The head counter
//   still frees slots. Flags are the frame number + 1 (32 bits): a slot's
//   stale lines carry older numbers, and once every `ll_clean` frames the
//   receiver rewrites each slot it has just read with that frame's spent
//   flag before freeing it, so no line is ever 2^32 frames old and a flag
//   cannot come round again. Cleaning adds no frames: a FIFO holds as many
//   frames of the schedule as ever.
//
// Every spin loop reads the abort word (mapped host memory) every
// `spin_check` turns: the host sets it on abort(), on its timeout and when
// it hears that a peer failed; a block that finds an error sets it too,
// so the other blocks of the rank stop. The first error is recorded in
// Control with where it happened; the launcher turns it into the named
// error of the host path.

namespace ferroccl {

// ------------------------------------------------------------ the format

struct ProgramHeader {
    u8 magic[4];
    u16 version, header_bytes;
    u32 rank, ranks;
    u8 dtype, elem_bytes, layout, op;
    u16 channels, record_bytes;
    u64 input_base, output_base, input_extent, output_extent;
    u64 finish_offset, finish_len;
    u32 finish_divisor, reserved0;
    u64 total_bytes, reserved1;
};

struct ChannelEntry {
    u64 records;
    u32 count, reserved;
};

struct Instr {
    u8 opcode, local, flags, channel;
    u16 send_peer, recv_peer;
    u32 send_tag, recv_tag;
    u64 input, output, len;
};

enum : u8 { F_RECV = 1, F_SEND = 2, F_REDUCE = 4, F_WRITE = 8, F_LOCAL = 16 };
enum : u8 {
    P_SEND = 1,
    P_RECV = 2,
    P_RECV_REDUCE_SEND = 3,
    P_RECV_REDUCE_COPY_SEND = 4,
    P_RECV_COPY_SEND = 5,
    P_RECV_REDUCE_COPY = 6,
    P_COPY_SEND = 7,
    P_COPY = 8,
    P_REDUCE = 9
};

// ----------------------------------------------------- connections, control

// One peer on one channel, seen from this rank: the FIFO toward the peer
// (in the peer's memory, mapped here) and the FIFO from it (ours). The
// launcher fills one per (channel, peer) at `conns[channel * ranks + peer]`
// (zeros where there is no connection); only this rank's block of that
// channel touches it while a kernel runs, and the counts persist from
// call to call. Mirrored by `ferroccl_cuda::executor::Conn`.
struct Conn {
    u8* send_slots;     // bulk: slots * slot_bytes, the peer's
    u64* send_meta;     // bulk: a word per slot, len | tag << 32, the peer's
    u64* send_tail;     // bulk: frames published, the peer's word
    u64* send_head;     // bulk: frames the peer has freed, our word
    u64* send_ll;       // LL: ll_slots * ll_lines lines, the peer's
    u64* send_ll_head;  // LL: frames the peer has freed, our word
    u8* recv_slots;     // bulk: ours
    u64* recv_meta;     // bulk: ours
    u64* recv_tail;     // bulk: ours, the peer raises it
    u64* recv_head;     // bulk: the peer's send_head, we raise it
    u64* recv_ll;       // LL: ours
    u64* recv_ll_head;  // LL: the peer's send_ll_head, we raise it
    u64 sent, received, ll_sent, ll_received;
    u64 ll_clean;       // LL: period of the cleaning, in frames (nonzero)
    u32 slots, slot_bytes, ll_slots, ll_lines;
};

enum : u32 {
    E_NONE = 0,
    E_ABORTED = 1,    // the abort word was set
    E_TAG = 2,        // a frame carried another tag (want, got)
    E_LENGTH = 3,     // a frame carried another length (want, got)
    E_TOO_BIG = 4,    // a frame larger than a slot (capacity, len)
    E_NO_CONN = 5,    // no connection to the peer on the channel
    E_PROGRAM = 6     // the image does not fit this kernel (want, got)
};

// Per launch: the abort word and where the first error happened.
// Mirrored by `ferroccl_cuda::executor::Control`.
struct Control {
    u32* abort;          // mapped host word; nonzero: stop
    u32 spin_check;      // spins between reads of the abort word
    u32 done;            // blocks that have ended; the last resets it
    u32 error;           // the first error's code
    u32 channel, record, peer;
    u64 want, got;
};

// ---------------------------------------------------- memory primitives

#ifndef FERROCCL_HOST_EMULATION
__device__ __forceinline__ u64 ld_acquire(const u64* p) {
    u64 v;
    asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}
__device__ __forceinline__ void st_release(u64* p, u64 v) {
    asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
__device__ __forceinline__ u32 ld_abort(const u32* p) {
    u32 v;
    asm volatile("ld.relaxed.sys.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}
__device__ __forceinline__ void st_abort(u32* p, u32 v) {
    asm volatile("st.relaxed.sys.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ u32 ld_shared_flag(const u32* p) { return *(const volatile u32*)p; }
__device__ __forceinline__ void st_shared_flag(u32* p, u32 v) { *(volatile u32*)p = v; }
__device__ __forceinline__ u32 ld_u32(const u32* p) { return *(const volatile u32*)p; }
__device__ __forceinline__ void fence_system() { __threadfence_system(); }
__device__ __forceinline__ void fence_device() { __threadfence(); }
__device__ __forceinline__ void spin_pause() {}
// A 16-byte line: data0, flag, data1, flag in one vector store.
__device__ __forceinline__ void ll_store(u64* line, u32 d0, u32 d1, u32 flag) {
    asm volatile("st.volatile.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(line), "r"(d0), "r"(flag),
                 "r"(d1), "r"(flag)
                 : "memory");
}
__device__ __forceinline__ void ll_load(const u64* line, u32& d0, u32& f0, u32& d1, u32& f1) {
    asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(d0), "=r"(f0), "=r"(d1), "=r"(f1)
                 : "l"(line)
                 : "memory");
}
#define FERROCCL_BLOCK_SHARED(T, name) __shared__ T name
#endif

// ---------------------------------------------------------------- errors

struct BlockState {
    u32 stop;   // nonzero: every thread of the block leaves
    u32 last;   // this block ended last: it applies the finish
};

// Records the first error of the launch and raises the abort word, so
// that every other block stops too.
__device__ __forceinline__ void fail(Control* ctl, BlockState* sh, u32 code, u32 channel, u32 record, u32 peer, u64 want,
                                  u64 got) {
    if (atomicCAS(&ctl->error, 0u, code) == 0u) {
        ctl->channel = channel;
        ctl->record = record;
        ctl->peer = peer;
        ctl->want = want;
        ctl->got = got;
        fence_system();
    }
    st_abort(ctl->abort, 2u);
    st_shared_flag(&sh->stop, 1u);
}

// Whether the block goes on, the same answer in every thread: call it
// after a barrier that follows every write of `stop` that must count.
// The second barrier keeps any thread from setting `stop` again (in the
// next wait) before every thread has read it; without it, threads could
// part ways at different barriers (the host run found that hang).
__device__ __forceinline__ bool block_goes_on(BlockState* sh) {
    const bool go = ld_shared_flag(&sh->stop) == 0u;
    __syncthreads();
    return go;
}

// Waits until *p >= want. False (and the error recorded) when the abort
// word is set first.
__device__ __forceinline__ bool wait_at_least(const u64* p, u64 want, Control* ctl, BlockState* sh, u32 channel,
                                              u32 record, u32 peer) {
    u32 spins = 0;
    while (ld_acquire(p) < want) {
        if (++spins >= ctl->spin_check) {
            spins = 0;
            if (ld_abort(ctl->abort) != 0u || ld_shared_flag(&sh->stop) != 0u) {
                fail(ctl, sh, E_ABORTED, channel, record, peer, want, 0);
                return false;
            }
        }
        spin_pause();
    }
    return true;
}

// ----------------------------------------------------------- one pass

// N elements at once: a 16-byte vector (N = 16 / sizeof(T)) or one.
template <class T, int N>
struct Frag {
    T v[N];
};

template <class T, int N>
__device__ __forceinline__ Frag<T, N> load(const T* p) {
    return *(const Frag<T, N>*)p;
}
template <class T, int N>
__device__ __forceinline__ void store(T* p, const Frag<T, N>& x) {
    *(Frag<T, N>*)p = x;
}
template <class E, class O, int N>
__device__ __forceinline__ Frag<typename E::T, N> combine(const Frag<typename E::T, N>& a,
                                                         const Frag<typename E::T, N>& b) {
    Frag<typename E::T, N> r;
#pragma unroll
    for (int k = 0; k < N; k++) r.v[k] = O::template apply<E>(a.v[k], b.v[k]);
    return r;
}

// What one record reads and writes, as pointers to its first element.
template <class T>
struct Operands {
    const T* frame;   // F: the received frame (RECV)
    const T* local;   // L: the local operand (LOCAL)
    T* out;           // O: the output (WRITE)
    const T* in;      // the input at the record's offset (REDUCE's operand)
    T* send;          // S: the slot sent (SEND)
    u8 opcode;
    bool aliased;     // combine into O: O = O op F
    bool copy;        // the copy primitives store L into O (local is the input)
};

// Units a thread loads before it stores any of them: a block's bytes in
// flight. With one (a load, then its store), a block of 512 threads kept
// 8 KiB in flight and moved about 10 GB/s on an H200 (docs/hardware.md,
// run 9), far below what one SM can copy. The launcher may set it
// (FERROCCL_EXEC_UNROLL, 1 to 4) to measure others; 8 spills registers
// (NVRTC 13.0, sm_90), which the compile refuses.
#ifndef FERROCCL_EXEC_UNROLL
#define FERROCCL_EXEC_UNROLL 4
#endif

// The operands one unit of a record reads, by its primitive: `x` and,
// for the reducing ones, `y` (in the order `put` combines them).
template <class E, int N>
__device__ __forceinline__ void fetch(const Operands<typename E::T>& a, u64 i,
                                      Frag<typename E::T, N>& x, Frag<typename E::T, N>& y) {
    typedef typename E::T T;
    switch (a.opcode) {
    case P_SEND:
    case P_COPY_SEND:
        x = load<T, N>(a.local + i);
        break;
    case P_COPY:
        if (a.copy) x = load<T, N>(a.local + i);
        break;
    case P_RECV:
    case P_RECV_COPY_SEND:
        x = load<T, N>(a.frame + i);
        break;
    case P_RECV_REDUCE_SEND:
        x = load<T, N>(a.frame + i);
        y = load<T, N>(a.local + i);
        break;
    case P_RECV_REDUCE_COPY_SEND:
    case P_RECV_REDUCE_COPY:
        if (a.aliased) {
            x = load<T, N>(a.out + i);
            y = load<T, N>(a.frame + i);
        } else {
            x = load<T, N>(a.frame + i);
            y = load<T, N>(a.local + i);
        }
        break;
    case P_REDUCE:
        x = load<T, N>(a.out + i);
        y = load<T, N>(a.in + i);
        break;
    default:
        break;
    }
}

// What one unit of a record writes, from what `fetch` read.
template <class E, class O, int N>
__device__ __forceinline__ void put(const Operands<typename E::T>& a, u64 i,
                                    const Frag<typename E::T, N>& x,
                                    const Frag<typename E::T, N>& y) {
    typedef typename E::T T;
    switch (a.opcode) {
    case P_SEND:
        store<T, N>(a.send + i, x);
        break;
    case P_RECV:
        store<T, N>(a.out + i, x);
        break;
    case P_RECV_REDUCE_SEND:
        store<T, N>(a.send + i, combine<E, O, N>(x, y));
        break;
    case P_RECV_REDUCE_COPY_SEND:
    case P_RECV_REDUCE_COPY: {
        const Frag<T, N> v = combine<E, O, N>(x, y);
        store<T, N>(a.out + i, v);
        if (a.opcode == P_RECV_REDUCE_COPY_SEND) store<T, N>(a.send + i, v);
        break;
    }
    case P_RECV_COPY_SEND:
        store<T, N>(a.out + i, x);
        store<T, N>(a.send + i, x);
        break;
    case P_COPY_SEND:
        if (a.copy) store<T, N>(a.out + i, x);
        store<T, N>(a.send + i, x);
        break;
    case P_COPY:
        if (a.copy) store<T, N>(a.out + i, x);
        break;
    case P_REDUCE:
        store<T, N>(a.out + i, combine<E, O, N>(x, y));
        break;
    default:
        break;
    }
}

// Elements [from, from + units * N) of one record, the block's threads
// taking units in turn: every primitive in one pass over the bytes. A
// thread reads FERROCCL_EXEC_UNROLL units (a block's width apart) before
// it writes them (one for byte types); a unit's reads and
// writes are at its own elements only, so this order gives what one unit
// at a time gives.
template <class E, class O, int N>
__device__ __forceinline__ void pass(const Operands<typename E::T>& a, u64 from, u64 units) {
    typedef Frag<typename E::T, N> V;
    // Byte types hold 16 elements a unit, each in a register of its own
    // as it is combined: one unit at a time (more spill registers).
    const int U = sizeof(typename E::T) == 1 ? 1 : FERROCCL_EXEC_UNROLL;
    const u64 s = blockDim.x;
    u64 u = threadIdx.x;
    for (; u + (U - 1) * s < units; u += U * s) {
        V x[U], y[U];
#pragma unroll
        for (int k = 0; k < U; k++) fetch<E, N>(a, from + (u + k * s) * N, x[k], y[k]);
#pragma unroll
        for (int k = 0; k < U; k++) put<E, O, N>(a, from + (u + k * s) * N, x[k], y[k]);
    }
    for (; u < units; u += s) {
        V x, y;
        fetch<E, N>(a, from + u * N, x, y);
        put<E, O, N>(a, from + u * N, x, y);
    }
}

__device__ __forceinline__ bool aligned16(const void* p) { return ((u64)p & 15u) == 0; }

// The whole record: 16-byte vectors where every buffer it touches is
// 16-byte aligned at the record's offsets (the slots always are), then
// the remainder one element at a time.
template <class E, class O>
__device__ __forceinline__ void pass_all(const Operands<typename E::T>& a, u64 len) {
    typedef typename E::T T;
    const int per = 16 / sizeof(T);
    bool vec = (a.local == 0 || aligned16(a.local)) && (a.out == 0 || aligned16(a.out)) &&
               (a.in == 0 || aligned16(a.in)) && (a.frame == 0 || aligned16(a.frame)) &&
               (a.send == 0 || aligned16(a.send));
    u64 units = vec ? len / per : 0;
    if (units != 0) pass<E, O, 16 / sizeof(T)>(a, 0, units);
    const u64 done = units * per;
    if (done < len) pass<E, O, 1>(a, done, len - done);
}

// ------------------------------------------------------------ bulk step

// One record by the bulk protocol; false when the block stops.
template <class E, class O>
__device__ __forceinline__ bool bulk_step(const Instr& r, Operands<typename E::T> a, Conn* sc, Conn* rc,
                                          Control* ctl, BlockState* sh, u32 channel, u32 index) {
    typedef typename E::T T;
    const u64 bytes = r.len * sizeof(T);
    if (threadIdx.x == 0) {
        if (rc != 0) {
            const u64 rs = rc->received;
            if (wait_at_least(rc->recv_tail, rs + 1, ctl, sh, channel, index, r.recv_peer)) {
                const u64 meta = ((const volatile u64*)rc->recv_meta)[rs % rc->slots];
                if ((meta >> 32) != r.recv_tag)
                    fail(ctl, sh, E_TAG, channel, index, r.recv_peer, r.recv_tag, meta >> 32);
                else if ((meta & 0xffffffffull) != r.len)
                    fail(ctl, sh, E_LENGTH, channel, index, r.recv_peer, r.len, meta & 0xffffffffull);
            }
        }
        if (sc != 0 && ld_shared_flag(&sh->stop) == 0u) {
            const u64 ss = sc->sent;
            if (bytes > sc->slot_bytes)
                fail(ctl, sh, E_TOO_BIG, channel, index, r.send_peer, sc->slot_bytes, bytes);
            else
                wait_at_least(sc->send_head, ss + 1 > sc->slots ? ss + 1 - sc->slots : 0, ctl, sh, channel,
                              index, r.send_peer);
        }
    }
    __syncthreads();
    // Only thread 0 sets `stop`, and only before the barrier above and
    // after the one below: one read is the same in every thread.
    if (ld_shared_flag(&sh->stop) != 0u) return false;
    if (rc != 0) a.frame = (const T*)(rc->recv_slots + (rc->received % rc->slots) * (u64)rc->slot_bytes);
    if (sc != 0) a.send = (T*)(sc->send_slots + (sc->sent % sc->slots) * (u64)sc->slot_bytes);
    pass_all<E, O>(a, r.len);
    __syncthreads();
    if (threadIdx.x == 0) {
        if (sc != 0) {
            const u64 ss = sc->sent;
            ((volatile u64*)sc->send_meta)[ss % sc->slots] = r.len | ((u64)r.send_tag << 32);
            fence_system();
            st_release(sc->send_tail, ss + 1);
            sc->sent = ss + 1;
        }
        if (rc != 0) {
            const u64 rs = rc->received;
            st_release(rc->recv_head, rs + 1);
            rc->received = rs + 1;
        }
    }
    return true;
}

// -------------------------------------------------------------- LL step

__device__ __forceinline__ u32 ll_flag(u64 frame) { return (u32)(frame + 1); }

// Lines of 16 bytes a slot holds; line 0 of a frame is its header.
__device__ __forceinline__ u64* ll_line(u64* base, const Conn* c, u64 frame, u64 line) {
    return base + 2 * ((frame % c->ll_slots) * (u64)c->ll_lines + line);
}

// Polls a line until both flags are `flag`. False when stopped.
__device__ __forceinline__ bool ll_wait(const u64* line, u32 flag, u32& d0, u32& d1, Control* ctl, BlockState* sh,
                                        u32 channel, u32 record, u32 peer) {
    u32 spins = 0;
    for (;;) {
        u32 f0, f1;
        ll_load(line, d0, f0, d1, f1);
        if (f0 == flag && f1 == flag) return true;
        if (++spins >= ctl->spin_check) {
            spins = 0;
            if (ld_abort(ctl->abort) != 0u || ld_shared_flag(&sh->stop) != 0u) {
                fail(ctl, sh, E_ABORTED, channel, record, peer, flag, 0);
                return false;
            }
        }
        spin_pause();
    }
}

// An element's bits in a u64 and back: the payload of an LL line is
// handled in registers, lane by lane, with shifts.
template <int S> struct UnsignedOf;
template <> struct UnsignedOf<1> { typedef u8 T; };
template <> struct UnsignedOf<2> { typedef u16 T; };
template <> struct UnsignedOf<4> { typedef u32 T; };
template <> struct UnsignedOf<8> { typedef u64 T; };
template <class T>
struct Bits {
    typedef typename UnsignedOf<sizeof(T)>::T U;
    static __device__ __forceinline__ u64 to(T v) { return (u64)(U)v; }
    static __device__ __forceinline__ T from(u64 b) { return (T)(U)b; }
};
template <>
struct Bits<float> {
    static __device__ __forceinline__ u64 to(float v) { return (u64)__float_as_uint(v); }
    static __device__ __forceinline__ float from(u64 b) { return __uint_as_float((u32)b); }
};
template <>
struct Bits<double> {
    static __device__ __forceinline__ u64 to(double v) { return (u64)__double_as_longlong(v); }
    static __device__ __forceinline__ double from(u64 b) { return __longlong_as_double((i64)b); }
};

// One record by the LL protocol; false when the block stops.
template <class E, class O>
__device__ __forceinline__ bool ll_step(const Instr& r, Operands<typename E::T> a, Conn* sc, Conn* rc, Control* ctl,
                                        BlockState* sh, u32 channel, u32 index) {
    typedef typename E::T T;
    const u64 per = 8 / sizeof(T);
    const u64 lines = (r.len + per - 1) / per;
    if (threadIdx.x == 0 && sc != 0) {
        const u64 ss = sc->ll_sent;
        if (lines + 1 > sc->ll_lines)
            fail(ctl, sh, E_TOO_BIG, channel, index, r.send_peer, (sc->ll_lines - 1) * 8, r.len * sizeof(T));
        else
            wait_at_least(sc->send_ll_head, ss + 1 > sc->ll_slots ? ss + 1 - sc->ll_slots : 0, ctl, sh, channel,
                          index, r.send_peer);
    }
    __syncthreads();
    // Any thread may set `stop` in the pass below: decide first.
    if (!block_goes_on(sh)) return false;
    const u64 rs = rc != 0 ? rc->ll_received : 0;
    const u64 ss = sc != 0 ? sc->ll_sent : 0;
    const u32 rflag = ll_flag(rs), sflag = ll_flag(ss);
    if (threadIdx.x == 0) {
        if (rc != 0) {
            u32 len, tag;
            if (ll_wait(ll_line(rc->recv_ll, rc, rs, 0), rflag, len, tag, ctl, sh, channel, index, r.recv_peer)) {
                if (tag != r.recv_tag)
                    fail(ctl, sh, E_TAG, channel, index, r.recv_peer, r.recv_tag, tag);
                else if (len != r.len)
                    fail(ctl, sh, E_LENGTH, channel, index, r.recv_peer, r.len, len);
            }
        }
        if (sc != 0) ll_store(ll_line(sc->send_ll, sc, ss, 0), (u32)r.len, r.send_tag, sflag);
    }
    const int bits = 8 * (int)sizeof(T);
    const u64 mask = bits == 64 ? ~0ull : (1ull << bits) - 1;
    for (u64 j = threadIdx.x; j < lines; j += blockDim.x) {
        u32 d0 = 0, d1 = 0;
        if (rc != 0) {
            if (!ll_wait(ll_line(rc->recv_ll, rc, rs, j + 1), rflag, d0, d1, ctl, sh, channel, index, r.recv_peer))
                break;
        }
        const u64 fw = (u64)d0 | (u64)d1 << 32;
        u64 rw = 0;
        const u64 first = j * per;
        // Static lanes, so the payload stays in registers.
#pragma unroll
        for (int k = 0; k < (int)(8 / sizeof(T)); k++) {
            const u64 i = first + k;
            if (i >= r.len) break;
            const T f = Bits<T>::from(fw >> (k * bits));
            T v = T();
            switch (a.opcode) {
            case P_SEND:
                v = a.local[i];
                break;
            case P_RECV:
                a.out[i] = f;
                break;
            case P_RECV_REDUCE_SEND:
                v = O::template apply<E>(f, a.local[i]);
                break;
            case P_RECV_REDUCE_COPY_SEND:
            case P_RECV_REDUCE_COPY:
                v = a.aliased ? O::template apply<E>(a.out[i], f) : O::template apply<E>(f, a.local[i]);
                a.out[i] = v;
                break;
            case P_RECV_COPY_SEND:
                v = f;
                a.out[i] = v;
                break;
            case P_COPY_SEND:
                v = a.local[i];
                if (a.copy) a.out[i] = v;
                break;
            case P_COPY:
                if (a.copy) a.out[i] = a.local[i];
                break;
            case P_REDUCE:
                a.out[i] = O::template apply<E>(a.out[i], a.in[i]);
                break;
            default:
                break;
            }
            rw |= (Bits<T>::to(v) & mask) << (k * bits);
        }
        if (sc != 0) ll_store(ll_line(sc->send_ll, sc, ss, j + 1), (u32)rw, (u32)(rw >> 32), sflag);
    }
    __syncthreads();
    if (!block_goes_on(sh)) return false;
    // Cleaning: for `ll_slots` frames in every `ll_clean`, the receiver
    // rewrites the whole slot it has just read, before freeing it, with
    // that frame's (spent) flag. Every line of every slot is so rewritten
    // once per period, so no line keeps a flag for 2^32 frames, when the
    // 32-bit frame number would come round to it.
    const bool clean = rc != 0 && rs % rc->ll_clean < rc->ll_slots;
    if (clean) {
        for (u64 l = threadIdx.x; l < rc->ll_lines; l += blockDim.x)
            ll_store(ll_line(rc->recv_ll, rc, rs, l), 0u, 0u, rflag);
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        if (sc != 0) sc->ll_sent = ss + 1;
        if (rc != 0) {
            if (clean) fence_system();
            st_release(rc->recv_ll_head, rs + 1);
            rc->ll_received = rs + 1;
        }
    }
    return true;
}

// ------------------------------------------------------------ the kernel

enum : int { BULK = 0, LL = 1 };

template <class E, class O, int PROTO>
__device__ __forceinline__ void execute(const u8* image, typename E::T* input, typename E::T* output, Conn* conns,
                                        Control* ctl) {
    typedef typename E::T T;
    FERROCCL_BLOCK_SHARED(BlockState, sh);
    const ProgramHeader* h = (const ProgramHeader*)image;
    const u32 channel = blockIdx.x;
    if (threadIdx.x == 0) {
        st_shared_flag(&sh.stop, 0u);
        sh.last = 0;
        if (h->magic[0] != 'F' || h->magic[1] != 'C' || h->magic[2] != 'L' || h->magic[3] != 'P' ||
            h->version != 1)
            fail(ctl, &sh, E_PROGRAM, channel, 0, 0, 1, h->version);
        else if (h->elem_bytes != sizeof(T))
            fail(ctl, &sh, E_PROGRAM, channel, 0, 0, sizeof(T), h->elem_bytes);
        else if (h->channels != gridDim.x)
            fail(ctl, &sh, E_PROGRAM, channel, 0, 0, h->channels, gridDim.x);
    }
    __syncthreads();
    if (block_goes_on(&sh)) {
        const ChannelEntry* ch = (const ChannelEntry*)(image + sizeof(ProgramHeader)) + channel;
        const Instr* records = (const Instr*)(image + ch->records);
        const u32 ranks = h->ranks;
        T* in = input + (h->layout == 1 ? h->input_base : 0);
        T* out = output + (h->layout == 1 ? h->output_base : 0);
        for (u32 i = 0; i < ch->count; i++) {
            const Instr r = records[i];
            Conn* sc = 0;
            Conn* rc = 0;
            if (r.flags & F_SEND) sc = conns + (u64)channel * ranks + r.send_peer;
            if (r.flags & F_RECV) rc = conns + (u64)channel * ranks + r.recv_peer;
            const bool send_missing =
                sc != 0 && (PROTO == BULK ? sc->send_slots == 0 : sc->send_ll == 0);
            const bool recv_missing =
                rc != 0 && (PROTO == BULK ? rc->recv_slots == 0 : rc->recv_ll == 0);
            if (send_missing || recv_missing) {
                if (threadIdx.x == 0)
                    fail(ctl, &sh, E_NO_CONN, channel, i, send_missing ? r.send_peer : r.recv_peer, 0, 0);
                break;
            }
            Operands<T> a;
            a.frame = 0;
            a.send = 0;
            a.opcode = r.opcode;
            a.local = (r.flags & F_LOCAL) ? (r.local == 1 ? out + r.output : in + r.input) : 0;
            a.out = (r.flags & F_WRITE) ? out + r.output : 0;
            a.in = r.opcode == P_REDUCE ? in + r.input : 0;
            a.aliased = r.local == 1 || (h->layout == 1 && h->input_base + r.input == h->output_base + r.output);
            a.copy = r.local == 0;
            const bool go = PROTO == BULK ? bulk_step<E, O>(r, a, sc, rc, ctl, &sh, channel, i)
                                          : ll_step<E, O>(r, a, sc, rc, ctl, &sh, channel, i);
            if (!go) break;
        }
    }
    // The last block to end divides Avg's result, once every channel has
    // written its part.
    __syncthreads();
    if (threadIdx.x == 0) {
        fence_device();
        sh.last = atomicAdd(&ctl->done, 1u) == gridDim.x - 1 ? 1u : 0u;
    }
    __syncthreads();
    if (sh.last != 0u) {
        fence_device();
        if (h->finish_divisor != 0 && ld_u32(&ctl->error) == 0u) {
            T* out = output + (h->layout == 1 ? h->output_base : 0) + h->finish_offset;
            for (u64 i = threadIdx.x; i < h->finish_len; i += blockDim.x) out[i] = E::div(out[i], h->finish_divisor);
        }
        __syncthreads();
        if (threadIdx.x == 0) ctl->done = 0;
    }
}

} // namespace ferroccl

// The extern "C" kernels follow, generated by cuda/src/executor.rs.
