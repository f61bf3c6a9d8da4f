/* The bound of a 2-process allgather on this machine: what a copy loop
 * does in C, with nothing of ferroccl (or MPI) around it.
 *
 * Two processes share their buffers (anonymous shared memory, like
 * ferroccl's windows): in0 and in1 of BLOCK bytes each, out0 and out1 of
 * 2 x BLOCK. Process r puts its input into block r of both outputs, in
 * chunks of CHUNK bytes, in one of these ways:
 *   0  two memcpy calls per chunk (glibc picks its own loop: rep movsb or
 *      vector stores, cached or streaming, by size);
 *   1  two copies with 64-byte cached vector stores;
 *   2  fused: each 64-byte line loaded once and stored to both outputs
 *      (ferroccl's fused kernel, with cached stores);
 *   3  two copies with 64-byte streaming (non-temporal) stores;
 *   4  pull: process r copies both blocks into its own output (its input
 *      and the peer's): a third more memory traffic, all stores local;
 *      what Open MPI does with a cross-memory read of the peer's block.
 * Prints busbw as nccl-tests defines it for allgather (the gathered size
 * is 2 x BLOCK, so busbw = BLOCK / time on 2 ranks): compare it with the
 * rows of `bench/compare.sh allgather 2` at 2 x BLOCK bytes.
 *
 * build: gcc -O3 -march=native -o /tmp/allgather bench/bound/allgather.c
 * run:   /tmp/allgather MODE BLOCK [CHUNK] [ITERS]
 *        (e.g. /tmp/allgather 2 2097152 65536 50: the "4 MiB" row)
 */
#include <immintrin.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

static void barrier(_Atomic long *flags, int r, long *gen) {
  ++*gen;
  atomic_store(&flags[r * 8], *gen);
  while (atomic_load(&flags[(1 - r) * 8]) < *gen) {
  }
}

static void cached(char *d, const char *s, size_t n) {
  for (size_t i = 0; i < n; i += 64)
    _mm512_store_si512((void *)(d + i), _mm512_load_si512((const void *)(s + i)));
}

static void streaming(char *d, const char *s, size_t n) {
  for (size_t i = 0; i < n; i += 64)
    _mm512_stream_si512((void *)(d + i), _mm512_load_si512((const void *)(s + i)));
}

static void fused(char *d0, char *d1, const char *s, size_t n) {
  for (size_t i = 0; i < n; i += 64) {
    __m512i v = _mm512_load_si512((const void *)(s + i));
    _mm512_store_si512((void *)(d0 + i), v);
    _mm512_store_si512((void *)(d1 + i), v);
  }
}

int main(int argc, char **argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: %s MODE BLOCK [CHUNK] [ITERS]\n", argv[0]);
    return 2;
  }
  int mode = atoi(argv[1]);
  size_t block = strtoul(argv[2], 0, 10);
  size_t chunk = argc > 3 ? strtoul(argv[3], 0, 10) : 65536;
  int iters = argc > 4 ? atoi(argv[4]) : 50;
  if (block % 64 || chunk % 64 || chunk == 0) {
    fprintf(stderr, "BLOCK and CHUNK must be multiples of 64\n");
    return 2;
  }
  int prot = PROT_READ | PROT_WRITE, flags = MAP_SHARED | MAP_ANONYMOUS;
  _Atomic long *sync = mmap(0, 4096, prot, flags, -1, 0);
  char *in[2], *out[2];
  for (int i = 0; i < 2; i++) {
    in[i] = mmap(0, block, prot, flags, -1, 0);
    out[i] = mmap(0, 2 * block, prot, flags, -1, 0);
    memset(in[i], i + 1, block);
    memset(out[i], 0, 2 * block);
  }
  int r = fork() == 0, p = 1 - r;
  long gen = 0;
  double t0 = 0;
  for (int it = -5; it < iters; it++) {
    barrier(sync, r, &gen);
    if (it == 0) t0 = now();
    const char *src = in[r];
    char *mine = out[r] + r * block, *theirs = out[p] + r * block;
    for (size_t o = 0; o < block; o += chunk) {
      size_t n = chunk < block - o ? chunk : block - o;
      switch (mode) {
        case 0: memcpy(mine + o, src + o, n); memcpy(theirs + o, src + o, n); break;
        case 1: cached(mine + o, src + o, n); cached(theirs + o, src + o, n); break;
        case 2: fused(mine + o, theirs + o, src + o, n); break;
        case 3: streaming(mine + o, src + o, n); streaming(theirs + o, src + o, n); break;
        default:
          memcpy(mine + o, src + o, n);
          memcpy(out[r] + p * block + o, in[p] + o, n);
      }
    }
    _mm_sfence();
  }
  barrier(sync, r, &gen);
  double t = (now() - t0) / iters;
  int bad = 0;
  for (int b = 0; b < 2; b++)
    for (size_t i = 0; i < block; i += 4096) bad += out[r][b * block + i] != (char)(b + 1);
  if (r) return bad != 0;
  int status = 0;
  wait(&status);
  printf("mode %d block %zu chunk %zu: busbw %.2f GB/s%s\n", mode, block, chunk, block / t / 1e9,
         bad || status ? " (WRONG RESULT)" : "");
  return 0;
}
