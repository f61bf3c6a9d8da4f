/* A broadcast of ordinary (private) buffers on N processes of this
 * machine, two ways, with nothing of a library around them: how many
 * times the buffer is copied decides the time once the processes share
 * cores.
 *
 *   chain   the root copies each chunk into a ring it shares with rank 1;
 *           rank r copies it out into its output and, unless it is the
 *           last, from there into its ring with rank r + 1: 2(N - 1)
 *           copies of the buffer (what a broadcast through pairwise slots
 *           does);
 *   spread  the root copies each chunk into one ring that every rank
 *           maps, and every other rank copies it out: N copies.
 *
 * A ring has SLOTS chunks of CHUNK bytes; a writer takes a chunk again
 * once every reader of it said it is done (a counter each, in a cache
 * line of its own). Waits spin, then yield the CPU (short spins where the
 * processes outnumber the CPUs). Calls run back to back on the same
 * buffers; each way's mean time per call on the slowest rank, in
 * microseconds, after checking every rank's output against the root's
 * input.
 *
 * build: gcc -O3 -march=native -o /tmp/spread bench/bound/spread.c
 * run:   [OFFSET=B] /tmp/spread N SIZE [ITERS] [CHUNK] [SLOTS]   (/tmp/spread 4 33554432)
 *
 * OFFSET=B (0 to 4095) puts every rank's buffer B bytes past a page, as
 * malloc hands out large blocks (16 past one), while the rings stay
 * page-aligned: on the AMD EPYC VM of 2026-12-04 OFFSET=16 took a 4-rank
 * broadcast of 2 MiB from 176-194 us to 1,668-2,696, glibc's memcpy
 * crawling on pairs aligned differently (docs/performance-log.md,
 * "Copies out of the staging areas that crawled").
 */
#define _GNU_SOURCE
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MAXN 16

struct counters {
  /* chunks written into this rank's ring, chunks read out of the ring of
   * the rank it reads from: each in a line of its own */
  _Atomic long written[MAXN][16];
  _Atomic long read[MAXN][16];
  _Atomic long gen[MAXN][16];
  double took[2][MAXN];
};

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

static int spins;

static void wait_at_least(_Atomic long *w, long v) {
  int n = 0;
  while (atomic_load_explicit(w, memory_order_acquire) < v)
    if (++n > spins) {
      sched_yield();
      n = 0;
    }
}

static void meet(struct counters *c, int n, int rank, long gen) {
  atomic_store_explicit(&c->gen[rank][0], gen, memory_order_release);
  for (int j = 0; j < n; j++) wait_at_least(&c->gen[j][0], gen);
}

int main(int argc, char **argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: %s N SIZE [ITERS] [CHUNK] [SLOTS]\n", argv[0]);
    return 2;
  }
  int n = atoi(argv[1]);
  size_t size = strtoull(argv[2], 0, 10);
  int iters = argc > 3 ? atoi(argv[3]) : 0;
  size_t chunk = argc > 4 ? strtoull(argv[4], 0, 10) : 256 << 10;
  long slots = argc > 5 ? atol(argv[5]) : 8;
  long offset = getenv("OFFSET") ? atol(getenv("OFFSET")) : 0;
  if (n < 2 || n > MAXN || size == 0 || chunk == 0 || slots < 1) return 2;
  if (offset < 0 || offset > 4095) {
    fprintf(stderr, "OFFSET must be 0 to 4095 bytes, not %ld\n", offset);
    return 2;
  }
  if (iters <= 0) iters = size >= (8 << 20) ? 20 : size >= (512 << 10) ? 200 : 2000;
  long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
  spins = n > ncpu ? 64 : 4096;
  size_t ring = chunk * slots;
  struct counters *c = mmap(0, sizeof *c, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  char *rings = mmap(0, ring * n, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (c == MAP_FAILED || rings == MAP_FAILED) return 1;
  memset(c, 0, sizeof *c);
  long chunks = (size + chunk - 1) / chunk;
  for (int rank = 0; rank < n; rank++) {
    if (fork() != 0) continue;
    char *buf = (char *)aligned_alloc(4096, (size + 4095) / 4096 * 4096 + 4096) + offset;
    for (size_t i = 0; i < size; i++) buf[i] = rank == 0 ? (char)(i * 7 + 3) : 0;
    long gen = 0;
    for (int way = 0; way < 2; way++) {
      /* way 0: chain, way 1: spread; the counters go on from the last way */
      long base = atomic_load(&c->written[rank][0]);
      long rbase = atomic_load(&c->read[rank][0]);
      (void)rbase;
      for (int it = -2; it < iters; it++) {
        if (it == 0) {
          meet(c, n, rank, ++gen);
          c->took[way][rank] = now();
        }
        for (long k = 0; k < chunks; k++) {
          size_t at = k * chunk, len = size - at < chunk ? size - at : chunk;
          if (way == 0) {
            /* chain: read from rank - 1's ring, write into this rank's */
            long seq = atomic_load_explicit(&c->read[rank][0], memory_order_relaxed);
            if (rank > 0) {
              char *from = rings + (rank - 1) * ring + (seq % slots) * chunk;
              wait_at_least(&c->written[rank - 1][0], seq + 1);
              memcpy(buf + at, from, len);
              atomic_store_explicit(&c->read[rank][0], seq + 1, memory_order_release);
            }
            if (rank < n - 1) {
              long w = atomic_load_explicit(&c->written[rank][0], memory_order_relaxed);
              if (w >= slots) wait_at_least(&c->read[rank + 1][0], w - slots + 1);
              memcpy(rings + rank * ring + (w % slots) * chunk, buf + at, len);
              atomic_store_explicit(&c->written[rank][0], w + 1, memory_order_release);
            }
          } else {
            /* spread: rank 0's ring, read by every other rank */
            if (rank == 0) {
              long w = atomic_load_explicit(&c->written[0][0], memory_order_relaxed);
              if (w >= slots)
                for (int j = 1; j < n; j++) wait_at_least(&c->read[j][0], w - slots + 1);
              memcpy(rings + (w % slots) * chunk, buf + at, len);
              atomic_store_explicit(&c->written[0][0], w + 1, memory_order_release);
            } else {
              long seq = atomic_load_explicit(&c->read[rank][0], memory_order_relaxed);
              wait_at_least(&c->written[0][0], seq + 1);
              memcpy(buf + at, rings + (seq % slots) * chunk, len);
              atomic_store_explicit(&c->read[rank][0], seq + 1, memory_order_release);
            }
          }
        }
      }
      c->took[way][rank] = now() - c->took[way][rank];
      meet(c, n, rank, ++gen);
      /* line the counters up for the next way: ring 0's writes and every
       * reader's reads start equal */
      if (way == 0) {
        meet(c, n, rank, ++gen);
        long top = 0;
        for (int j = 0; j < n; j++) {
          long a = atomic_load(&c->written[j][0]), b = atomic_load(&c->read[j][0]);
          if (a > top) top = a;
          if (b > top) top = b;
        }
        meet(c, n, rank, ++gen);
        atomic_store(&c->written[rank][0], top);
        atomic_store(&c->read[rank][0], top);
        meet(c, n, rank, ++gen);
      }
      (void)base;
    }
    for (size_t i = 0; i < size; i++)
      if (buf[i] != (char)(i * 7 + 3)) {
        fprintf(stderr, "rank %d: byte %zu wrong\n", rank, i);
        _exit(1);
      }
    _exit(0);
  }
  int bad = 0, st;
  while (wait(&st) > 0) bad |= !WIFEXITED(st) || WEXITSTATUS(st) != 0;
  if (bad) return 1;
  double worst[2] = {0, 0};
  for (int way = 0; way < 2; way++)
    for (int j = 0; j < n; j++)
      if (c->took[way][j] > worst[way]) worst[way] = c->took[way][j];
  printf("broadcast N=%d size=%zu chunk=%zu slots=%ld: chain %.2f us (2(N-1) copies), spread %.2f us (N copies)\n",
         n, size, chunk, slots, worst[0] / iters * 1e6, worst[1] / iters * 1e6);
  return 0;
}
