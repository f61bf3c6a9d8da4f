/* The bound of a direct (window) allreduce on 2 processes of this machine:
 * what a kernel does in C, with nothing of ferroccl around it.
 *
 * Two processes share four 64 MiB buffers (in0, in1, out0, out1; anonymous
 * shared memory, like ferroccl's windows). Process r reduces piece r (half)
 * of in0 and in1 and writes the result into piece r of out0 and out1 (the
 * memory traffic of ferroccl's direct allreduce, and the least any 2-rank
 * allreduce has), in one of three ways:
 *   0  out of place, 8 KiB at a time through an L1 buffer, then 32-byte
 *      streaming stores from it (ferroccl's kernel before the fused one);
 *   1  in place, through the buffer with ordinary stores;
 *   2  out of place, fused: each 64-byte line of the result is computed in
 *      a register and streamed to both outputs at once, so loads and
 *      streaming stores interleave (ferroccl's kernel now, see
 *      src/element.rs, stream_kernel; this C version needs AVX-512).
 * Prints the busbw (= algbw on 2 ranks) to set against the memcpy figure
 * of ../../../shared/peers/run.sh.
 *
 * build: gcc -O3 -march=native -o /tmp/direct bench/bound/direct.c
 * run:   /tmp/direct 0     /tmp/direct 1     /tmp/direct 2
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

#define BLOCK 2048 /* floats: 8 KiB */
#define ITERS 10

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

int main(int argc, char **argv) {
  int mode = argc > 1 ? atoi(argv[1]) : 0;
  int in_place = mode == 1, fused = mode == 2;
  size_t n = (64u << 20) / sizeof(float), piece = n / 2;
  _Atomic long *flags = mmap(0, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  float *buf[4];
  for (int i = 0; i < 4; i++)
    buf[i] = mmap(0, n * sizeof(float), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  int r = fork() == 0;
  for (int i = 0; i < 4; i++)
    for (size_t j = r * piece; j < (r + 1) * piece; j++) buf[i][j] = i < 2 ? (float)(i + 1) : 0.0f;
  float *in0 = buf[0], *in1 = buf[1];
  float *out0 = in_place ? buf[0] : buf[2], *out1 = in_place ? buf[1] : buf[3];
  static float tmp[BLOCK] __attribute__((aligned(64)));
  long gen = 0;
  double total = 0;
  for (int it = 0; it < ITERS; it++) {
    barrier(flags, r, &gen);
    double t = now();
    if (fused)
      for (size_t o = r * piece; o < (r + 1) * piece; o += 16) {
        __m512 v = _mm512_add_ps(_mm512_load_ps(in0 + o), _mm512_load_ps(in1 + o));
        _mm512_stream_ps(out0 + o, v);
        _mm512_stream_ps(out1 + o, v);
      }
    else
    for (size_t o = r * piece; o < (r + 1) * piece; o += BLOCK) {
      for (int i = 0; i < BLOCK; i++) tmp[i] = in0[o + i] + in1[o + i];
      if (in_place) {
        memcpy(out0 + o, tmp, sizeof tmp);
        memcpy(out1 + o, tmp, sizeof tmp);
      } else {
        for (int i = 0; i < BLOCK; i += 8) {
          _mm256_stream_ps(out0 + o + i, _mm256_load_ps(tmp + i));
          _mm256_stream_ps(out1 + o + i, _mm256_load_ps(tmp + i));
        }
      }
    }
    _mm_sfence();
    barrier(flags, r, &gen);
    if (it >= 2) total += now() - t; /* two warm-up rounds */
  }
  /* In place each round adds the two buffers again: 3, 6, 12, ... */
  float want = in_place ? 3.0f * (float)(1 << (ITERS - 1)) : 3.0f;
  for (size_t j = r * piece; j < (r + 1) * piece; j += 4099)
    if (out0[j] != want || out1[j] != want) {
      fprintf(stderr, "wrong result at %zu\n", j);
      return 1;
    }
  if (r == 0) {
    double t = total / (ITERS - 2);
    printf("direct allreduce bound, 2 processes, 64 MiB, %s: %.2f ms, busbw %.2f GB/s\n",
           in_place ? "in place" : fused ? "out of place, fused" : "out of place", t * 1e3, (64u << 20) / t / 1e9);
    wait(NULL);
  }
  return 0;
}
