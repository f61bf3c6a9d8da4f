// One launch of the device executor's kernel on the host (test code), as
// a shared library the tests load: the host stand-in engine's executor
// hook calls it (host_launch.rs). Built after kernels/host_emulation.h,
// the executor's source and a generated table `dispatch.inc`; runs the
// grid as harness.cpp does, every thread of every block a host thread,
// the threads of a block meeting at one barrier, and returns once every
// thread has ended. The host side (abort words, timeouts) is the caller's.

#include <memory>
#include <thread>
#include <vector>

typedef void (*Kernel)(const unsigned char*, void*, void*, ferroccl::Conn*, ferroccl::Control*);
struct Entry {
    const char* name;
    Kernel k;
};
#include "dispatch.inc"

static Kernel find(const char* name) {
    for (const Entry& e : table)
        if (!strcmp(e.name, name)) return e.k;
    return nullptr;
}

// 0: the kernel ran to its end (its own faults are in *ctl); 1: no kernel
// of that name here; 2: an empty grid; 3: the threads could not be made.
extern "C" int ferroccl_host_launch(const char* name, unsigned channels, unsigned threads,
                                    const unsigned char* program, void* input, void* output, void* conns,
                                    void* ctl) {
    Kernel kernel = find(name);
    if (!kernel) return 1;
    if (channels == 0 || threads == 0) return 2;
    std::vector<std::unique_ptr<std::barrier<>>> bars;
    std::vector<std::unique_ptr<HostBlock>> blocks;
    std::vector<std::thread> pool;
    // The threads start together once all are made (1), or leave without
    // running the kernel (2): a block short of a thread would never pass
    // its barrier.
    std::atomic<int> go{0};
    try {
        for (unsigned blk = 0; blk < channels; blk++) {
            bars.emplace_back(new std::barrier<>(threads));
            HostBlock* hb = new HostBlock;
            hb->bar = bars.back().get();
            blocks.emplace_back(hb);
            for (unsigned t = 0; t < threads; t++) {
                pool.emplace_back([=, &go] {
                    go.wait(0);
                    if (go.load() != 1) return;
                    threadIdx.x = t;
                    blockIdx.x = blk;
                    blockDim.x = threads;
                    gridDim.x = channels;
                    host_block = hb;
                    kernel(program, input, output, (ferroccl::Conn*)conns, (ferroccl::Control*)ctl);
                });
            }
        }
    } catch (const std::exception& e) {
        fprintf(stderr, "ferroccl_host_launch(%s): %s\n", name, e.what());
        go.store(2);
        go.notify_all();
        for (auto& t : pool) t.join();
        return 3;
    }
    go.store(1);
    go.notify_all();
    for (auto& t : pool) t.join();
    return 0;
}
