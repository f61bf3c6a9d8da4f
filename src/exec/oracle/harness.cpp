// The host run of the device executor (test code). Built after
// kernels/host_emulation.h, the executor's source and a generated table
// `dispatch.inc`; reads a job of cases (kernel_host.rs writes it), runs
// every rank's kernel with every thread of every block a host thread, over
// FIFOs laid out as the device's (one per sender, receiver and channel,
// owned by the receiver), and writes each rank's buffers and Control.
//
// It plays the host side too: a rank named dead is never launched (a
// killed process), the survivors' abort words are set once any rank has
// failed or 50 ms after a dead rank's peers started (the failure report
// the host hears), and at the case's timeout (the host's timeout). A
// kernel that does not end within 10 s after its abort word was set is a
// hang: the harness says so and exits 4.

#include <chrono>
#include <memory>
#include <thread>
#include <vector>

typedef void (*Kernel)(const unsigned char*, void*, void*, ferroccl::Conn*, ferroccl::Control*);
struct Entry {
    const char* name;
    Kernel k;
};
#include "dispatch.inc"

typedef unsigned long long u64;
typedef unsigned u32;

struct Reader {
    std::vector<unsigned char> d;
    size_t at = 0;
    void need(size_t n) {
        if (at + n > d.size()) { fprintf(stderr, "job truncated at %zu\n", at); exit(2); }
    }
    u32 u32_() { need(4); u32 v; memcpy(&v, &d[at], 4); at += 4; return v; }
    u64 u64_() { need(8); u64 v; memcpy(&v, &d[at], 8); at += 8; return v; }
    std::vector<unsigned char> bytes() {
        u64 n = u64_();
        need(n);
        std::vector<unsigned char> v(d.begin() + at, d.begin() + at + n);
        at += n;
        return v;
    }
};

struct Buf {
    unsigned char* p = nullptr;
    size_t n = 0;
    explicit Buf(size_t len) : n(len) {
        p = (unsigned char*)aligned_alloc(64, (len + 64) / 64 * 64);
        memset(p, 0, (len + 64) / 64 * 64);
    }
    ~Buf() { free(p); }
};

struct Fifo {
    std::unique_ptr<Buf> slots, meta, ll;
    alignas(64) u64 tail = 0;
    alignas(64) u64 head = 0;
    alignas(64) u64 ll_head = 0;
};

struct Writer {
    FILE* f;
    void u32_(u32 v) { fwrite(&v, 4, 1, f); }
    void u64_(u64 v) { fwrite(&v, 8, 1, f); }
    void bytes(const unsigned char* p, size_t n) { u64_(n); fwrite(p, 1, n, f); }
};

static Kernel find(const char* name) {
    for (const Entry& e : table)
        if (!strcmp(e.name, name)) return e.k;
    return nullptr;
}

static void run_case(Reader& in, Writer& out) {
    const u32 n = in.u32_(), threads = in.u32_(), repeats = in.u32_();
    const u32 slots = in.u32_(), slot_bytes = in.u32_(), ll_slots = in.u32_(), ll_lines = in.u32_();
    const u64 ll_clean = in.u64_(), start = in.u64_();
    const u32 dead = in.u32_(), timeout_ms = in.u32_();
    std::vector<unsigned char> name_bytes = in.bytes();
    std::string name(name_bytes.begin(), name_bytes.end());
    Kernel kernel = find(name.c_str());
    if (!kernel) { fprintf(stderr, "no kernel %s\n", name.c_str()); exit(2); }
    std::vector<std::vector<unsigned char>> image(n), a0(n), b0(n);
    std::vector<std::unique_ptr<Buf>> img(n), a(n), b(n);
    std::vector<u32> channels(n);
    u32 C = 1;
    for (u32 r = 0; r < n; r++) {
        image[r] = in.bytes();
        a0[r] = in.bytes();
        b0[r] = in.bytes();
        img[r].reset(new Buf(image[r].size()));
        memcpy(img[r]->p, image[r].data(), image[r].size());
        a[r].reset(new Buf(a0[r].size()));
        b[r].reset(new Buf(b0[r].size()));
        unsigned short ch;
        memcpy(&ch, &image[r][20], 2);
        channels[r] = ch;
        if (ch > C) C = ch;
    }
    // FIFO (s -> r, c) at (s * n + r) * C + c.
    std::vector<std::unique_ptr<Fifo>> fifo((size_t)n * n * C);
    // Every count starts at `start` (near 2^32, the LL flags then pass
    // through 0), the LL lines as the last frame before it left them.
    for (auto& f : fifo) {
        f.reset(new Fifo);
        f->slots.reset(new Buf((size_t)slots * slot_bytes));
        f->meta.reset(new Buf((size_t)slots * 8));
        f->ll.reset(new Buf((size_t)ll_slots * ll_lines * 16));
        f->tail = f->head = f->ll_head = start;
        u64* w = (u64*)f->ll->p;
        for (size_t i = 0; i < (size_t)ll_slots * ll_lines * 2; i++) w[i] = (u64)(u32)start << 32;
    }
    std::vector<std::vector<ferroccl::Conn>> conns(n, std::vector<ferroccl::Conn>((size_t)C * n));
    for (u32 r = 0; r < n; r++)
        for (u32 c = 0; c < C; c++)
            for (u32 p = 0; p < n; p++) {
                ferroccl::Conn& k = conns[r][(size_t)c * n + p];
                memset(&k, 0, sizeof k);
                Fifo* to = fifo[((size_t)r * n + p) * C + c].get();
                Fifo* from = fifo[((size_t)p * n + r) * C + c].get();
                k.send_slots = to->slots->p;
                k.send_meta = (u64*)to->meta->p;
                k.send_tail = &to->tail;
                k.send_head = &to->head;
                k.send_ll = (u64*)to->ll->p;
                k.send_ll_head = &to->ll_head;
                k.recv_slots = from->slots->p;
                k.recv_meta = (u64*)from->meta->p;
                k.recv_tail = &from->tail;
                k.recv_head = &from->head;
                k.recv_ll = (u64*)from->ll->p;
                k.recv_ll_head = &from->ll_head;
                k.ll_clean = ll_clean;
                k.sent = k.received = k.ll_sent = k.ll_received = start;
                k.slots = slots;
                k.slot_bytes = slot_bytes;
                k.ll_slots = ll_slots;
                k.ll_lines = ll_lines;
            }
    std::vector<ferroccl::Control> ctl(n);
    std::vector<u32> abort_word(n);
    std::vector<u32> timed_out(n);
    std::vector<std::vector<unsigned char>> first_a(n), first_b(n);
    for (u32 rep = 0; rep < repeats; rep++) {
        for (u32 r = 0; r < n; r++) {
            memcpy(a[r]->p, a0[r].data(), a0[r].size());
            memcpy(b[r]->p, b0[r].data(), b0[r].size());
            memset(&ctl[r], 0, sizeof ctl[r]);
            abort_word[r] = 0;
            ctl[r].abort = &abort_word[r];
            ctl[r].spin_check = 16;
        }
        std::vector<std::unique_ptr<std::barrier<>>> bars;
        std::vector<std::unique_ptr<HostBlock>> blocks;
        std::vector<std::thread> pool;
        std::atomic<u32> finished{0};
        u32 started = 0;
        for (u32 r = 0; r < n; r++) {
            if (r == dead) continue;
            const unsigned char* layout = &image[r][18];
            void* vin = a[r]->p;
            void* vout = *layout == 1 ? a[r]->p : b[r]->p;
            const u32 grid = channels[r];
            for (u32 blk = 0; blk < grid; blk++) {
                bars.emplace_back(new std::barrier<>(threads));
                HostBlock* hb = new HostBlock;
                hb->bar = bars.back().get();
                blocks.emplace_back(hb);
                for (u32 t = 0; t < threads; t++) {
                    started++;
                    pool.emplace_back([t, blk, r, grid, threads, hb, vin, vout, kernel, &conns, &ctl, &img, &finished] {
                        threadIdx.x = t;
                        blockIdx.x = blk;
                        blockDim.x = threads;
                        gridDim.x = grid;
                        host_block = hb;
                        kernel(img[r]->p, vin, vout, conns[r].data(), &ctl[r]);
                        finished.fetch_add(1);
                    });
                }
            }
        }
        auto t0 = std::chrono::steady_clock::now();
        bool raised = false;
        std::chrono::steady_clock::time_point raised_at;
        while (finished.load() < started) {
            std::this_thread::sleep_for(std::chrono::microseconds(500));
            auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0).count();
            bool failed = false;
            for (u32 r = 0; r < n; r++) failed = failed || __atomic_load_n(&ctl[r].error, __ATOMIC_ACQUIRE) != 0;
            bool report = failed || (dead < n && ms >= 50);
            bool timeout = ms >= (long long)timeout_ms;
            if ((report || timeout) && !raised) {
                for (u32 r = 0; r < n; r++) {
                    if (timeout && __atomic_load_n(&ctl[r].error, __ATOMIC_ACQUIRE) == 0) timed_out[r] = 1;
                    __atomic_store_n(&abort_word[r], 1u, __ATOMIC_RELEASE);
                }
                raised = true;
                raised_at = std::chrono::steady_clock::now();
            }
            if (raised && std::chrono::steady_clock::now() - raised_at > std::chrono::seconds(10)) {
                fprintf(stderr, "HANG: %u of %u threads still running 10 s after the abort word was set (%s)\n",
                        started - finished.load(), started, name.c_str());
                fflush(stderr);
                _exit(4);
            }
        }
        for (auto& t : pool) t.join();
        for (u32 r = 0; r < n; r++) {
            std::vector<unsigned char> ga(a[r]->p, a[r]->p + a0[r].size()), gb(b[r]->p, b[r]->p + b0[r].size());
            if (rep == 0) {
                first_a[r] = ga;
                first_b[r] = gb;
            } else if (ctl[r].error == 0 && (ga != first_a[r] || gb != first_b[r])) {
                fprintf(stderr, "%s: rank %u: repeat %u differs from the first run\n", name.c_str(), r, rep);
                exit(5);
            }
        }
    }
    for (u32 r = 0; r < n; r++) {
        out.u32_(ctl[r].error);
        out.u32_(ctl[r].channel);
        out.u32_(ctl[r].record);
        out.u32_(ctl[r].peer);
        out.u64_(ctl[r].want);
        out.u64_(ctl[r].got);
        out.u32_(timed_out[r]);
        out.u32_(r == dead ? 1 : 0);
        out.bytes(a[r]->p, a0[r].size());
        out.bytes(b[r]->p, b0[r].size());
    }
}

// args: job.bin result.bin; also prints the C layout of the shared structs.
int main(int argc, char** argv) {
    if (argc == 2 && !strcmp(argv[1], "layout")) {
        printf("%zu %zu %zu %zu %zu %zu %zu %zu %zu\n", sizeof(ferroccl::Conn), offsetof(ferroccl::Conn, recv_slots),
               offsetof(ferroccl::Conn, sent), offsetof(ferroccl::Conn, ll_clean), offsetof(ferroccl::Conn, slots),
               offsetof(ferroccl::Conn, ll_lines), sizeof(ferroccl::Control), offsetof(ferroccl::Control, error),
               offsetof(ferroccl::Control, want));
        return 0;
    }
    if (argc != 3) { fprintf(stderr, "usage: harness job result | harness layout\n"); return 2; }
    Reader in;
    FILE* f = fopen(argv[1], "rb");
    if (!f) { fprintf(stderr, "cannot read %s\n", argv[1]); return 2; }
    unsigned char chunk[65536];
    size_t got;
    while ((got = fread(chunk, 1, sizeof chunk, f)) > 0) in.d.insert(in.d.end(), chunk, chunk + got);
    fclose(f);
    if (in.u32_() != 0x4a4c4346u) { fprintf(stderr, "not a job\n"); return 2; }
    const u32 cases = in.u32_();
    Writer out{fopen(argv[2], "wb")};
    if (!out.f) { fprintf(stderr, "cannot write %s\n", argv[2]); return 2; }
    for (u32 i = 0; i < cases; i++) run_case(in, out);
    fclose(out.f);
    return 0;
}
