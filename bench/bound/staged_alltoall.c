/* An all-to-all of ordinary (private) buffers among N processes through
 * staging rings in shared memory, with nothing of a library around it:
 * the other way to move it than the pull by cross-memory attach
 * (cma_alltoall.c). Each process's input and output hold N blocks of
 * BLOCK bytes. Process i stages, chunk by chunk, the blocks its peers
 * need into a ring of its own that every process maps: chunk k holds
 * slice k of each peer's block (CHUNK / (N - 1) bytes of each, peers in
 * rank order), so that every peer takes a slice out of every chunk. For
 * chunk k a process stages its own chunk k, then copies its slice of
 * chunk k out of each peer's ring (nearest peer first) into its output,
 * then says it is done with chunk k; its own block it copies last. Two
 * copies of every byte that travels, both in user space, where the pull
 * copies it once in the kernel (pinning the peer's pages).
 *
 * A ring has SLOTS chunks of CHUNK bytes; a process stages chunk k
 * again once every peer is done with chunk k - SLOTS. Waits spin, then
 * yield the CPU. Calls run back to back on the same buffers; prints the
 * loop's time over ITERS on process 0 (as ferroccl-perf and the MPIs
 * time), after checking every output.
 *
 * build: gcc -O3 -march=native -o /tmp/staged_alltoall bench/bound/staged_alltoall.c
 * run:   /tmp/staged_alltoall N BLOCK [ITERS] [CHUNK] [SLOTS]
 *        (/tmp/staged_alltoall 4 2097152 100: a 4-rank all-to-all of 8 MiB)
 */
#define _GNU_SOURCE
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MAXN 16

struct words {
  /* chunks staged into each process's ring, chunks each process is done
   * reading out of its peers' rings, and a meeting's generation: each in
   * a cache line of its own */
  _Atomic long written[MAXN][8];
  _Atomic long read[MAXN][8];
  _Atomic long gen[MAXN][8];
};

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

/* Wait until *w reaches at least v: spin a while, then yield. */
static void wait_for(_Atomic long *w, long v) {
  for (long spins = 0; atomic_load_explicit(w, memory_order_acquire) < v; spins++) {
    if (spins > 256) sched_yield();
  }
}

int main(int argc, char **argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: %s N BLOCK [ITERS] [CHUNK] [SLOTS]\n", argv[0]);
    return 2;
  }
  int n = atoi(argv[1]);
  size_t block = strtoul(argv[2], 0, 10);
  int iters = argc > 3 ? atoi(argv[3]) : 100;
  size_t chunk = argc > 4 ? strtoul(argv[4], 0, 10) : 256 << 10;
  long slots = argc > 5 ? atol(argv[5]) : 8;
  if (n < 2 || n > MAXN || block == 0 || iters <= 0 || slots <= 0) {
    fprintf(stderr, "N must be 2 to %d; BLOCK, ITERS and SLOTS positive\n", MAXN);
    return 2;
  }
  /* Each peer's slice of a chunk, in whole cache lines. */
  size_t slice = chunk / (n - 1) / 64 * 64;
  if (slice == 0) {
    fprintf(stderr, "CHUNK must hold a cache line for each of the %d peers\n", n - 1);
    return 2;
  }
  size_t ring = slice * (n - 1) * slots;
  struct words *w = mmap(0, sizeof *w, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  char *rings = mmap(0, ring * n, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (w == MAP_FAILED || rings == MAP_FAILED) {
    perror("mmap");
    return 1;
  }
  int r = 0;
  for (int c = 1; c < n; c++) {
    if (fork() == 0) {
      r = c;
      break;
    }
  }
  size_t all = (size_t)n * block;
  char *in = aligned_alloc(4096, all), *out = aligned_alloc(4096, all);
  /* Block b of process r's input holds r * N + b + 1: block b of every
   * output must hold b * N + r + 1 (as a char). */
  for (int b = 0; b < n; b++) memset(in + b * block, r * n + b + 1, block);
  memset(out, 0, all);
  long chunks = (long)((block + slice - 1) / slice), g = 0, gen = 0;
  char *mine = rings + r * ring;
  double t0 = 0;
  for (int it = -5; it < iters; it++) {
    if (it == 0) t0 = now();
    for (long k = 0; k < chunks; k++, g++) {
      size_t from = k * slice, len = slice < block - from ? slice : block - from;
      /* Stage chunk g once every peer is done with chunk g - slots. */
      for (int p = 0; p < n; p++) {
        if (p != r) wait_for(&w->read[p][0], g - slots + 1);
      }
      char *slot = mine + (g % slots) * slice * (n - 1);
      for (int p = 0, at = 0; p < n; p++) {
        if (p == r) continue;
        memcpy(slot + at * slice, in + p * block + from, len);
        at++;
      }
      atomic_store_explicit(&w->written[r][0], g + 1, memory_order_release);
      for (int step = 1; step < n; step++) {
        int p = (r + step) % n;
        wait_for(&w->written[p][0], g + 1);
        int at = r < p ? r : r - 1;
        char *theirs = rings + p * ring + (g % slots) * slice * (n - 1);
        memcpy(out + p * block + from, theirs + at * slice, len);
      }
      atomic_store_explicit(&w->read[r][0], g + 1, memory_order_release);
    }
    memcpy(out + r * block, in + r * block, block);
    /* The end of a call: every process's output is whole. */
    gen++;
    atomic_store(&w->gen[r][0], gen);
    for (int p = 0; p < n; p++) wait_for(&w->gen[p][0], gen);
  }
  double loop = (now() - t0) / iters;
  int bad = 0;
  for (size_t i = 0; i < all; i += 4093)
    bad += out[i] != (char)((i / block) * n + r + 1);
  if (r) return bad != 0;
  int failed = 0;
  for (int c = 1; c < n; c++) {
    int status = 0;
    wait(&status);
    failed |= !WIFEXITED(status) || WEXITSTATUS(status) != 0;
  }
  printf("staged all-to-all, %d processes, block %zu (chunk %zu, %ld slots): loop %.1f us a "
         "call%s\n",
         n, block, slice * (n - 1), slots, loop * 1e6, bad || failed ? " (WRONG RESULT)" : "");
  return 0;
}
