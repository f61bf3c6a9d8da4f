/* An all-to-all of *plain* (malloc'd) buffers among NPROC processes
 * (default 2, at most 16) by cross-memory attach, with only the
 * unavoidable work: each process's input and output hold NPROC x BLOCK
 * bytes; process r copies block r of its input into block r of its
 * output, and pulls block r of every peer p's input into block p of its
 * output with process_vm_readv (CHUNK bytes per call), nearest peer
 * first (r+1, r+2, ...); a meeting before (the peers' inputs are ready)
 * and after (the peers are done reading this input). ferroccl's
 * `exec::pull` moves a large all-to-all this way, plus its check-in.
 * Prints the mean and the median of ITERS calls in microseconds, each
 * call timed alone by process 0 between its meetings, and the loop's
 * time over ITERS ("loop"), which is how ferroccl-perf and the MPIs
 * time calls back to back (bench/peers/mpi_coll.c): where processes
 * outnumber CPUs, the time process 0 waits at the first meeting for a
 * peer that is off its CPU counts only in the loop's. Compare the loop's
 * with the NPROC x NPROC x BLOCK rows of `bench/peers.sh alltoall NPROC`,
 * whose size is a rank's whole input.
 *
 * The ways of ordering the copies (WAY=):
 *   own-first   (default) the own block, then the pulls (ferroccl's order);
 *   pull-first  the pulls, then the own block;
 *   interleave  CHUNK of the own block, then CHUNK of each peer's, in turn;
 *   nt          as own-first, the own block with streaming stores
 *               (x86-64 with SSE2; elsewhere memcpy);
 *   bounce      the own block with streaming stores, and each pull of
 *               CHUNK bytes into a buffer of this process (staying in
 *               its cache), then from there into the output with
 *               streaming stores: two copies of each byte, but no
 *               output line read from memory before it is written.
 *
 * FRESH=1: between calls (untimed) each process reads its whole output
 * and rewrites its input, as a training step would (see cma.c).
 *
 * Needs ptrace permission on the peer (same user; Yama ptrace_scope 0, or
 * root; a container's seccomp profile may forbid the call).
 *
 * build: gcc -O3 -march=native -o /tmp/cma_alltoall bench/bound/cma_alltoall.c
 * run:   [NPROC=n] [WAY=...] [FRESH=1] /tmp/cma_alltoall BLOCK [CHUNK] [ITERS]
 *        (e.g. WAY=interleave /tmp/cma_alltoall 4194304 262144 200,
 *        NPROC=4 /tmp/cma_alltoall 2097152 2097152 100)
 */
#define _GNU_SOURCE
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#if defined(__x86_64__)
#include <emmintrin.h>
#endif

#define MAXPROC 16

struct shared {
  _Atomic long flags[MAXPROC * 8];
  char *in[MAXPROC];
  pid_t pid[MAXPROC];
};

static int nproc = 2;

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

static void barrier(struct shared *s, int r, long *gen) {
  ++*gen;
  atomic_store(&s->flags[r * 8], *gen);
  /* Spin a while, then give the CPU away: with more processes than
   * CPUs a spinning waiter would hold the CPU its peer needs. */
  for (int p = 0; p < nproc; p++) {
    for (long spins = 0; atomic_load(&s->flags[p * 8]) < *gen; spins++) {
      if (spins > 4096) sched_yield();
    }
  }
}

/* memcpy with streaming stores where the target has them (dst and src
 * 16-byte aligned, n a multiple of 64, as malloc'd blocks of powers of
 * two are). */
static void copy_nt(char *dst, const char *src, size_t n) {
#if defined(__x86_64__)
  if (((size_t)dst | (size_t)src | n) % 64 == 0) {
    for (size_t i = 0; i < n; i += 64) {
      __m128i a = _mm_load_si128((const __m128i *)(src + i));
      __m128i b = _mm_load_si128((const __m128i *)(src + i + 16));
      __m128i c = _mm_load_si128((const __m128i *)(src + i + 32));
      __m128i d = _mm_load_si128((const __m128i *)(src + i + 48));
      _mm_stream_si128((__m128i *)(dst + i), a);
      _mm_stream_si128((__m128i *)(dst + i + 16), b);
      _mm_stream_si128((__m128i *)(dst + i + 32), c);
      _mm_stream_si128((__m128i *)(dst + i + 48), d);
    }
    _mm_sfence();
    return;
  }
#endif
  memcpy(dst, src, n);
}

static int pull(struct shared *s, int p, char *dst, size_t from, size_t n) {
  struct iovec local = {dst, n}, remote = {s->in[p] + from, n};
  if (process_vm_readv(s->pid[p], &local, 1, &remote, 1, 0) != (ssize_t)n) {
    perror("process_vm_readv");
    return 1;
  }
  return 0;
}

static int cmp(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: [NPROC=n] %s BLOCK [CHUNK] [ITERS]\n", argv[0]);
    return 2;
  }
  size_t block = strtoul(argv[1], 0, 10);
  size_t chunk = argc > 2 ? strtoul(argv[2], 0, 10) : block;
  int iters = argc > 3 ? atoi(argv[3]) : 100;
  const char *way = getenv("WAY") ? getenv("WAY") : "own-first";
  nproc = getenv("NPROC") ? atoi(getenv("NPROC")) : 2;
  if (block == 0 || chunk == 0 || iters <= 0) {
    fprintf(stderr, "BLOCK, CHUNK and ITERS must be positive\n");
    return 2;
  }
  if (nproc < 2 || nproc > MAXPROC) {
    fprintf(stderr, "NPROC must be 2 to %d, not %d\n", MAXPROC, nproc);
    return 2;
  }
  if (strcmp(way, "own-first") && strcmp(way, "pull-first") && strcmp(way, "interleave") &&
      strcmp(way, "nt") && strcmp(way, "bounce")) {
    fprintf(stderr, "WAY must be own-first, pull-first, interleave, nt or bounce, not %s\n",
            way);
    return 2;
  }
  struct shared *s = mmap(0, sizeof(struct shared), PROT_READ | PROT_WRITE,
                          MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  int r = 0;
  for (int c = 1; c < nproc; c++) {
    if (fork() == 0) {
      r = c;
      break;
    }
  }
  size_t all = (size_t)nproc * block;
  char *in = aligned_alloc(4096, all), *out = aligned_alloc(4096, all);
  double *t = calloc(iters, sizeof *t);
  char *bounce = aligned_alloc(4096, (chunk + 4095) / 4096 * 4096);
  /* Block b of rank r's input holds r * NPROC + b + 1: block b of every
   * output must hold b * NPROC + r + 1 (as a char). */
  for (int b = 0; b < nproc; b++) memset(in + b * block, r * nproc + b + 1, block);
  memset(out, 0, all);
  s->in[r] = in, s->pid[r] = getpid();
  long gen = 0;
  barrier(s, r, &gen);
  int fresh = getenv("FRESH") && atoi(getenv("FRESH"));
  volatile char sink = 0;
  char *own_to = out + r * block, *own_from = in + r * block;
  double loop0 = 0;
  for (int it = -5; it < iters; it++) {
    if (it == 0) loop0 = now();
    if (fresh) {
      char acc = 0;
      for (size_t i = 0; i < all; i += 64) acc ^= out[i];
      for (int b = 0; b < nproc; b++) memset(in + b * block, r * nproc + b + 1, block);
      sink ^= acc;
    }
    barrier(s, r, &gen);
    double t0 = now();
    if (!strcmp(way, "interleave")) {
      for (size_t o = 0; o < block; o += chunk) {
        size_t n = chunk < block - o ? chunk : block - o;
        memcpy(own_to + o, own_from + o, n);
        for (int step = 1; step < nproc; step++) {
          int p = (r + step) % nproc;
          if (pull(s, p, out + p * block + o, r * block + o, n)) return 1;
        }
      }
    } else if (!strcmp(way, "bounce")) {
      copy_nt(own_to, own_from, block);
      for (int step = 1; step < nproc; step++) {
        int p = (r + step) % nproc;
        for (size_t o = 0; o < block; o += chunk) {
          size_t n = chunk < block - o ? chunk : block - o;
          if (pull(s, p, bounce, r * block + o, n)) return 1;
          copy_nt(out + p * block + o, bounce, n);
        }
      }
    } else {
      if (!strcmp(way, "own-first")) memcpy(own_to, own_from, block);
      if (!strcmp(way, "nt")) copy_nt(own_to, own_from, block);
      for (int step = 1; step < nproc; step++) {
        int p = (r + step) % nproc;
        for (size_t o = 0; o < block; o += chunk) {
          size_t n = chunk < block - o ? chunk : block - o;
          if (pull(s, p, out + p * block + o, r * block + o, n)) return 1;
        }
      }
      if (!strcmp(way, "pull-first")) memcpy(own_to, own_from, block);
    }
    barrier(s, r, &gen);
    if (it >= 0) t[it] = now() - t0;
  }
  double loop = (now() - loop0) / iters;
  int bad = 0;
  for (size_t i = 0; i < all; i += 4093)
    bad += out[i] != (char)((i / block) * nproc + r + 1);
  if (r) return bad != 0;
  int failed = 0;
  for (int c = 1; c < nproc; c++) {
    int status = 0;
    wait(&status);
    failed |= !WIFEXITED(status) || WEXITSTATUS(status) != 0;
  }
  double sum = 0;
  for (int i = 0; i < iters; i++) sum += t[i];
  qsort(t, iters, sizeof *t, cmp);
  printf("CMA all-to-all (%s, %s), %d processes, block %zu (chunk %zu): mean %.1f us, median "
         "%.1f us, loop %.1f us a call%s\n",
         way, fresh ? "fresh rounds" : "reused buffers", nproc, block, chunk, sum / iters * 1e6,
         t[iters / 2] * 1e6, loop * 1e6, bad || failed ? " (WRONG RESULT)" : "");
  return 0;
}
