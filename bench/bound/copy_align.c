/* How fast this machine copies a block of 4 KiB to 1 MiB between two
 * buffers whose addresses differ modulo 64 by OFFSET bytes: the C
 * library's memcpy against a plain loop of 32-byte AVX2 loads and stores
 * (what ferroccl_transport::copy_bytes runs). On AMD EPYC with glibc 2.36
 * memcpy picks `rep movsb` for these sizes, which crawls when the two
 * buffers are not aligned alike (docs/performance-log.md, "Copies that
 * crawl"). Both buffers stay in cache: the copy is repeated in place.
 *
 * build: gcc -O2 -o /tmp/copy_align bench/bound/copy_align.c
 * run:   /tmp/copy_align
 */
#include <immintrin.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

__attribute__((target("avx2"))) static void copy_avx2(char *d, const char *s, size_t n) {
  size_t i = 0;
  for (; i + 128 <= n; i += 128) {
    __m256i a = _mm256_loadu_si256((const void *)(s + i));
    __m256i b = _mm256_loadu_si256((const void *)(s + i + 32));
    __m256i c = _mm256_loadu_si256((const void *)(s + i + 64));
    __m256i e = _mm256_loadu_si256((const void *)(s + i + 96));
    _mm256_storeu_si256((void *)(d + i), a);
    _mm256_storeu_si256((void *)(d + i + 32), b);
    _mm256_storeu_si256((void *)(d + i + 64), c);
    _mm256_storeu_si256((void *)(d + i + 96), e);
  }
  memcpy(d + i, s + i, n - i);
}

int main(void) {
  char *a = aligned_alloc(4096, 1 << 22), *b = aligned_alloc(4096, 1 << 22);
  memset(a, 1, 1 << 22);
  memset(b, 2, 1 << 22);
  const size_t offsets[] = {0, 8, 16, 48};
  printf("%8s %8s %14s %14s\n", "offset", "bytes", "memcpy GB/s", "avx2 GB/s");
  for (int k = 0; k < 4; k++) {
    for (size_t n = 4096; n <= (1 << 20); n *= 16) {
      /* 16 bytes in, as an allocator's blocks are. */
      char *src = a + 16, *dst = b + 16 + offsets[k];
      int iters = 400000 / (n / 4096) + 10;
      double t0 = now();
      for (int i = 0; i < iters; i++) {
        memcpy(dst, src, n);
        __asm__ volatile("" ::"r"(dst) : "memory");
      }
      double t_memcpy = (now() - t0) / iters;
      t0 = now();
      for (int i = 0; i < iters; i++) {
        copy_avx2(dst, src, n);
        __asm__ volatile("" ::"r"(dst) : "memory");
      }
      double t_avx2 = (now() - t0) / iters;
      printf("%8zu %8zu %14.1f %14.1f\n", offsets[k], n, n / t_memcpy / 1e9, n / t_avx2 / 1e9);
    }
  }
  return 0;
}
