/* A 2-process all-to-all of *plain* (malloc'd) buffers by cross-memory
 * attach, with only the unavoidable work: each process's input and output
 * hold 2 x BLOCK bytes; process r copies block r of its input into block
 * r of its output, and pulls block r of the peer's input into block 1-r
 * of its output with process_vm_readv (CHUNK bytes per call); a meeting
 * before (the peer's input is ready) and after (the peer is done reading
 * this input). ferroccl's `exec::pull` moves a large 2-rank all-to-all
 * this way, plus its check-in. Prints the mean and the median of ITERS
 * calls in microseconds (compare with the 2 x 2 x BLOCK rows of
 * `bench/peers.sh alltoall 2`, whose size is a rank's whole input).
 *
 * The ways of ordering the two copies (WAY=):
 *   own-first   (default) the own block, then the pull (ferroccl's order);
 *   pull-first  the pull, then the own block;
 *   interleave  CHUNK of the own block, then CHUNK of the pull, in turn;
 *   nt          as own-first, the own block with streaming stores
 *               (x86-64 with SSE2; elsewhere memcpy).
 *
 * FRESH=1: between calls (untimed) each process reads its whole output
 * and rewrites its input, as a training step would (see cma.c).
 *
 * Needs ptrace permission on the peer (same user; Yama ptrace_scope 0, or
 * root; a container's seccomp profile may forbid the call).
 *
 * build: gcc -O3 -march=native -o /tmp/cma_alltoall bench/bound/cma_alltoall.c
 * run:   [WAY=...] [FRESH=1] /tmp/cma_alltoall BLOCK [CHUNK] [ITERS]
 *        (e.g. WAY=interleave /tmp/cma_alltoall 4194304 262144 200)
 */
#define _GNU_SOURCE
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

struct shared {
  _Atomic long flags[16];
  char *in[2];
  pid_t pid[2];
};

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

static void barrier(struct shared *s, int r, long *gen) {
  ++*gen;
  atomic_store(&s->flags[r * 8], *gen);
  while (atomic_load(&s->flags[(1 - r) * 8]) < *gen) {
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
    fprintf(stderr, "usage: %s BLOCK [CHUNK] [ITERS]\n", argv[0]);
    return 2;
  }
  size_t block = strtoul(argv[1], 0, 10);
  size_t chunk = argc > 2 ? strtoul(argv[2], 0, 10) : block;
  int iters = argc > 3 ? atoi(argv[3]) : 100;
  const char *way = getenv("WAY") ? getenv("WAY") : "own-first";
  if (block == 0 || chunk == 0 || iters <= 0) {
    fprintf(stderr, "BLOCK, CHUNK and ITERS must be positive\n");
    return 2;
  }
  if (strcmp(way, "own-first") && strcmp(way, "pull-first") && strcmp(way, "interleave") &&
      strcmp(way, "nt")) {
    fprintf(stderr, "WAY must be own-first, pull-first, interleave or nt, not %s\n", way);
    return 2;
  }
  struct shared *s = mmap(0, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  int r = fork() == 0, p = 1 - r;
  char *in = aligned_alloc(4096, 2 * block), *out = aligned_alloc(4096, 2 * block);
  double *t = calloc(iters, sizeof *t);
  /* Block b of rank r's input holds r * 2 + b + 1: block b of every
   * output must hold b * 2 + r + 1. */
  for (int b = 0; b < 2; b++) memset(in + b * block, r * 2 + b + 1, block);
  memset(out, 0, 2 * block);
  s->in[r] = in, s->pid[r] = getpid();
  long gen = 0;
  barrier(s, r, &gen);
  int fresh = getenv("FRESH") && atoi(getenv("FRESH"));
  volatile char sink = 0;
  char *own_to = out + r * block, *own_from = in + r * block, *peer_to = out + p * block;
  for (int it = -5; it < iters; it++) {
    if (fresh) {
      char acc = 0;
      for (size_t i = 0; i < 2 * block; i += 64) acc ^= out[i];
      for (int b = 0; b < 2; b++) memset(in + b * block, r * 2 + b + 1, block);
      sink ^= acc;
    }
    barrier(s, r, &gen);
    double t0 = now();
    if (!strcmp(way, "interleave")) {
      for (size_t o = 0; o < block; o += chunk) {
        size_t n = chunk < block - o ? chunk : block - o;
        memcpy(own_to + o, own_from + o, n);
        if (pull(s, p, peer_to + o, r * block + o, n)) return 1;
      }
    } else {
      if (!strcmp(way, "own-first")) memcpy(own_to, own_from, block);
      if (!strcmp(way, "nt")) copy_nt(own_to, own_from, block);
      for (size_t o = 0; o < block; o += chunk) {
        size_t n = chunk < block - o ? chunk : block - o;
        if (pull(s, p, peer_to + o, r * block + o, n)) return 1;
      }
      if (!strcmp(way, "pull-first")) memcpy(own_to, own_from, block);
    }
    barrier(s, r, &gen);
    if (it >= 0) t[it] = now() - t0;
  }
  int bad = 0;
  for (size_t i = 0; i < 2 * block; i += 4093) bad += out[i] != (char)((i / block) * 2 + r + 1);
  if (r) return bad != 0;
  int status = 0;
  wait(&status);
  double sum = 0;
  for (int i = 0; i < iters; i++) sum += t[i];
  qsort(t, iters, sizeof *t, cmp);
  printf("CMA all-to-all (%s, %s), 2 processes, block %zu (chunk %zu): mean %.1f us, median %.1f "
         "us%s\n",
         way, fresh ? "fresh rounds" : "reused buffers", block, chunk, sum / iters * 1e6,
         t[iters / 2] * 1e6, bad || status ? " (WRONG RESULT)" : "");
  return 0;
}
