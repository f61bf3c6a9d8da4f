/* An allreduce of ordinary (private) buffers on N processes of this
 * machine through staging areas every process maps, with nothing of a
 * library around it: the floor of what ferroccl's staging areas
 * (src/exec/spread.rs) do on 4 to 8 ranks from 16 KiB to 8 MiB, and of
 * any allreduce of buffers the peers cannot read. f32 sum, out of place,
 * calls back to back on the same buffers (as ferroccl-perf and the MPI
 * benchmarks time them). Two ways:
 *
 *   pieces  ferroccl's: group by group of G chunks (a chunk CHUNK bytes,
 *           a staging area 8 chunks), each rank copies every chunk of the
 *           group from its input into its staging area; once every rank's
 *           chunk is there, it sums its piece (a 1/N of the chunk, in
 *           whole cache lines) out of every area in rank order into its
 *           output and back into its own area; once every rank's piece is
 *           there, it copies the others' pieces into its output. Per rank:
 *           S copied in, S read to sum, 2S/N written, (N-1)S/N copied out;
 *           two meetings a group.
 *   whole   one meeting a chunk: each rank stages its chunk, and once
 *           every rank's is there sums the whole chunk out of every area
 *           into its output. Per rank: S copied in, N x S read to sum.
 *
 * A rank stages chunk g once every rank is done reading chunk g - 8 (a
 * counter each, in a cache line of its own). Waits spin, then yield the
 * CPU (64 spins where the processes outnumber the CPUs, as ferroccl's
 * waits yield early there). Each way's time per call is the slowest
 * rank's mean, in microseconds, after every rank checked its output
 * against the exact sum (small integers). Rank r runs on CPU r mod the
 * CPUs, as ferroccl-perf and Intel MPI pin their ranks.
 *
 * build: gcc -O3 -march=native -o /tmp/spread_allreduce bench/bound/spread_allreduce.c
 * run:   [COPY=loop] /tmp/spread_allreduce N SIZE [ITERS] [G] [CHUNK]   (/tmp/spread_allreduce 4 1048576)
 */
#define _GNU_SOURCE
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MAXN 16
#define SLOTS 8

struct counters {
  /* per rank, each in a line of its own: chunks staged, chunks whose
   * piece is summed into the area, chunks done reading; the meeting */
  _Atomic long written[MAXN][16];
  _Atomic long reduced[MAXN][16];
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

static int use_loop;

/* memcpy, or (COPY=loop) a loop the compiler makes of vector loads and
 * stores: glibc's memcpy takes rep movsb for these sizes, which on some
 * CPUs crawls where the other core holds the lines */
static void copy(void *restrict dst, const void *restrict src, size_t bytes) {
  if (!use_loop) {
    memcpy(dst, src, bytes);
    return;
  }
  float *restrict d = dst;
  const float *restrict s = src;
  for (size_t i = 0; i < bytes / 4; i++) d[i] = s[i];
}

static void meet(struct counters *c, int n, int rank, long gen) {
  atomic_store_explicit(&c->gen[rank][0], gen, memory_order_release);
  for (int j = 0; j < n; j++) wait_at_least(&c->gen[j][0], gen);
}

static void wait_all(_Atomic long (*w)[16], int n, long v) {
  for (int j = 0; j < n; j++) wait_at_least(&w[j][0], v);
}

/* out[i] = sum over ranks j in order of area_j[i], i < len (floats) */
static void sum_areas(float *restrict out, float *const *src, int n, size_t len) {
  for (size_t i = 0; i < len; i++) out[i] = src[0][i];
  for (int j = 1; j < n; j++) {
    const float *restrict s = src[j];
    for (size_t i = 0; i < len; i++) out[i] += s[i];
  }
}

int main(int argc, char **argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: %s N SIZE [ITERS] [G] [CHUNK]\n", argv[0]);
    return 2;
  }
  int n = atoi(argv[1]);
  size_t size = strtoull(argv[2], 0, 10);
  int iters = argc > 3 ? atoi(argv[3]) : 0;
  long group = argc > 4 ? atol(argv[4]) : 4;
  size_t chunk = argc > 5 ? strtoull(argv[5], 0, 10) : 256 << 10;
  if (n < 2 || n > MAXN || size < 4 || size % 4 || chunk < 64 || chunk % 64 || group < 1 ||
      group > SLOTS / 2) {
    fprintf(stderr, "N 2-%d, SIZE a multiple of 4, CHUNK of 64, G 1-%d\n", MAXN, SLOTS / 2);
    return 2;
  }
  if (iters <= 0) iters = size >= (8 << 20) ? 20 : size >= (512 << 10) ? 200 : 2000;
  long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
  spins = n > ncpu ? 64 : 4096;
  use_loop = getenv("COPY") && !strcmp(getenv("COPY"), "loop");
  size_t area = chunk * SLOTS;
  struct counters *c = mmap(0, sizeof *c, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  char *areas = mmap(0, area * n, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (c == MAP_FAILED || areas == MAP_FAILED) return 1;
  memset(c, 0, sizeof *c);
  memset(areas, 0, area * n);
  size_t count = size / 4, per_chunk = chunk / 4;
  long chunks = (count + per_chunk - 1) / per_chunk;
  for (int rank = 0; rank < n; rank++) {
    if (fork() != 0) continue;
    /* pinned as ferroccl-perf and Intel MPI pin their ranks: rank r on
     * CPU r mod the CPUs */
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(rank % ncpu, &set);
    sched_setaffinity(0, sizeof set, &set);
    float *in = aligned_alloc(4096, (size + 4095) / 4096 * 4096);
    float *out = aligned_alloc(4096, (size + 4095) / 4096 * 4096);
    for (size_t i = 0; i < count; i++) in[i] = (float)((rank * 13 + i) % 61), out[i] = 0;
    long gen = 0, g0 = 0; /* chunks numbered across calls and ways */
    for (int way = 0; way < 2; way++) {
      for (int it = -2; it < iters; it++) {
        if (it == 0) {
          meet(c, n, rank, ++gen);
          c->took[way][rank] = now();
        }
        long step = way == 0 ? group : 1;
        for (long k0 = 0; k0 < chunks; k0 += step) {
          long k1 = k0 + step < chunks ? k0 + step : chunks;
          for (long k = k0; k < k1; k++) {
            long g = g0 + k;
            size_t from = k * per_chunk, len = count - from < per_chunk ? count - from : per_chunk;
            if (g >= SLOTS) wait_all(c->read, n, g - SLOTS + 1);
            copy(areas + rank * area + (g % SLOTS) * chunk, in + from, len * 4);
            atomic_store_explicit(&c->written[rank][0], g + 1, memory_order_release);
          }
          for (long k = k0; k < k1; k++) {
            long g = g0 + k;
            size_t from = k * per_chunk, len = count - from < per_chunk ? count - from : per_chunk;
            wait_all(c->written, n, g + 1);
            size_t per = way == 0 ? (len + n - 1) / n : len;
            per = (per + 15) / 16 * 16;
            size_t off = way == 0 ? rank * per : 0;
            if (off > len) off = len;
            size_t mine = per < len - off ? per : len - off;
            float *src[MAXN];
            for (int j = 0; j < n; j++)
              src[j] = (float *)(areas + j * area + (g % SLOTS) * chunk) + off;
            sum_areas(out + from + off, src, n, mine);
            if (way == 0) {
              copy(src[rank], out + from + off, mine * 4);
              atomic_store_explicit(&c->reduced[rank][0], g + 1, memory_order_release);
            } else {
              atomic_store_explicit(&c->read[rank][0], g + 1, memory_order_release);
            }
          }
          if (way == 1) continue;
          for (long k = k0; k < k1; k++) {
            long g = g0 + k;
            size_t from = k * per_chunk, len = count - from < per_chunk ? count - from : per_chunk;
            size_t per = ((len + n - 1) / n + 15) / 16 * 16;
            for (int s = 1; s < n; s++) {
              int j = (rank + s) % n;
              size_t off = j * per < len ? j * per : len;
              size_t m = per < len - off ? per : len - off;
              if (m == 0) continue;
              wait_at_least(&c->reduced[j][0], g + 1);
              copy(out + from + off,
                     (float *)(areas + j * area + (g % SLOTS) * chunk) + off, m * 4);
            }
            atomic_store_explicit(&c->read[rank][0], g + 1, memory_order_release);
          }
        }
        g0 += chunks;
      }
      c->took[way][rank] = now() - c->took[way][rank];
      meet(c, n, rank, ++gen);
      for (size_t i = 0; i < count; i++) {
        float want = 0;
        for (int j = 0; j < n; j++) want += (float)((j * 13 + i) % 61);
        if (out[i] != want) {
          fprintf(stderr, "rank %d way %d: element %zu is %g, not %g\n", rank, way, i, out[i], want);
          _exit(1);
        }
        out[i] = 0;
      }
      meet(c, n, rank, ++gen);
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
  printf("allreduce N=%d size=%zu chunk=%zu group=%ld: pieces %.2f us, whole %.2f us\n", n, size,
         chunk, group, worst[0] / iters * 1e6, worst[1] / iters * 1e6);
  return 0;
}
