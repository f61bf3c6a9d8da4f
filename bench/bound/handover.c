/* A slot's handover between two processes, each copy timed alone: the
 * sender copies BYTES from its own buffer into a 64-aligned slot in
 * shared memory and raises a flag; the receiver copies the slot out into
 * its own buffer and hands the slot back. What ferroccl's shared-memory
 * transport does for every frame, with nothing else around it.
 *
 * Each side's buffer lies at a chosen offset from a 64-byte line (0, or
 * 16 as glibc's large mallocs land), and each side copies with the C
 * library's memcpy (here `rep movsb` for these sizes) or with a loop of
 * 32-byte AVX2 loads and stores (ferroccl_transport::copy_bytes's loop
 * for buffers not aligned like the slot). Prints, for every combination,
 * the sender's and the receiver's copy speed and the handover's time.
 * docs/performance-log.md, "Buffer alignment", is why.
 *
 * build: gcc -O2 -o /tmp/handover bench/bound/handover.c
 * run:   /tmp/handover [BYTES]        (default 65536; CPUs 0 and 1)
 */
#define _GNU_SOURCE
#include <immintrin.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define ROUNDS 4000
#define MAX_BYTES (1 << 20)

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

static void pin(int cpu) {
  cpu_set_t s;
  CPU_ZERO(&s);
  CPU_SET(cpu, &s);
  if (sched_setaffinity(0, sizeof s, &s) != 0) {
    perror("handover: sched_setaffinity");
    exit(2);
  }
}

__attribute__((target("avx2"))) static void copy_loop(char *d, const char *s, size_t n) {
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

static void copy(int loop, char *d, const char *s, size_t n) {
  if (loop)
    copy_loop(d, s, n);
  else
    memcpy(d, s, n);
}

static void wait_for(_Atomic long *w, long v) {
  while (atomic_load_explicit(w, memory_order_acquire) != v) __builtin_ia32_pause();
}

struct shared {
  _Atomic long turn __attribute__((aligned(64)));
  double sender_s __attribute__((aligned(64)));
  char slot[MAX_BYTES] __attribute__((aligned(64)));
};

/* One combination: sender's buffer offset and method, receiver's. */
static void run(struct shared *sh, size_t bytes, int s_off, int s_loop, int r_off, int r_loop) {
  atomic_store(&sh->turn, 0);
  pid_t child = fork();
  if (child == 0) {
    pin(1);
    char *mem = aligned_alloc(64, MAX_BYTES + 128);
    char *src = mem + s_off;
    memset(src, 1, bytes);
    double spent = 0;
    for (long i = 0; i < ROUNDS; i++) {
      wait_for(&sh->turn, 2 * i);  // the slot is free
      src[0] = (char)i;            // the sender's data changes every round
      double t0 = now();
      copy(s_loop, sh->slot, src, bytes);
      spent += now() - t0;
      atomic_store_explicit(&sh->turn, 2 * i + 1, memory_order_release);
    }
    sh->sender_s = spent;
    _exit(0);
  }
  pin(0);
  char *mem = aligned_alloc(64, MAX_BYTES + 128);
  char *dst = mem + r_off;
  double spent = 0, t_start = now();
  for (long i = 0; i < ROUNDS; i++) {
    wait_for(&sh->turn, 2 * i + 1);
    double t0 = now();
    copy(r_loop, dst, sh->slot, bytes);
    spent += now() - t0;
    if (dst[0] != (char)i) {
      fprintf(stderr, "handover: round %ld read stale bytes\n", i);
      exit(1);
    }
    atomic_store_explicit(&sh->turn, 2 * i + 2, memory_order_release);
  }
  double total = now() - t_start;
  int status;
  waitpid(child, &status, 0);
  free(mem);
  printf("sender %2d B off, %-6s %5.1f GB/s | receiver %2d B off, %-6s %5.1f GB/s | handover %6.2f us\n",
         s_off, s_loop ? "loop" : "memcpy", (double)bytes * ROUNDS / sh->sender_s / 1e9, r_off,
         r_loop ? "loop" : "memcpy", (double)bytes * ROUNDS / spent / 1e9, total / ROUNDS * 1e6);
}

int main(int argc, char **argv) {
  size_t bytes = argc > 1 ? strtoull(argv[1], 0, 10) : 65536;
  if (bytes == 0 || bytes > MAX_BYTES) {
    fprintf(stderr, "handover: BYTES must be 1 to %d\n", MAX_BYTES);
    return 2;
  }
  struct shared *sh = mmap(0, sizeof *sh, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (sh == MAP_FAILED) {
    perror("handover: mmap");
    return 2;
  }
  printf("handover of %zu bytes through a 64-aligned slot, %d rounds\n", bytes, ROUNDS);
  // What copy_bytes does: memcpy where the buffer is aligned like the
  // slot, the loop where not; then each method forced on each side.
  int offs[2] = {0, 16};
  for (int so = 0; so < 2; so++)
    for (int ro = 0; ro < 2; ro++)
      for (int sl = 0; sl < 2; sl++)
        for (int rl = 0; rl < 2; rl++) run(sh, bytes, offs[so], sl, offs[ro], rl);
  return 0;
}
