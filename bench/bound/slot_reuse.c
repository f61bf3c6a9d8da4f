/* What a copy into shared memory costs when the other core still holds
 * the lines it read there last, and what it costs once they have left
 * that core's private cache: a 2-process allgather through SETS shared
 * buffers taken in turn, by data flow alone (no meeting but the buffers'
 * own flags), each phase of each call timed.
 *
 * Each process, call after call: copy its BYTES/2 input into its buffer
 * of the call's set (once the peer has taken what it put in that set SETS
 * calls ago), say so, copy its input into its own half of the output,
 * wait for the peer's word, copy the peer's buffer into the other half,
 * and say it took it. With few sets the buffers' lines are still in the
 * reader's L2 when the writer comes back to them, and every store waits
 * for the reader's core to give its line up; with enough sets (their
 * bytes well past one core's L2) the lines have gone to the shared L3.
 * On the AMD EPYC build VM (1 MiB L2 a core, 32 MiB L3; 2026-12-06):
 * 65,536 bytes through 8 sets 5.4-6.9 us a call (the copy in 3.5-5 us, the
 * copy out 0.8), through 64 sets 2.5-2.7 (the copy in 0.9). The shm
 * transport's slot placement (transports/shm/src/ring.rs) follows from it.
 *
 * build: gcc -O3 -march=native -o /tmp/slot_reuse bench/bound/slot_reuse.c
 * run:   /tmp/slot_reuse BYTES [ITERS] [SETS]    (e.g. 65536 20000 8)
 * Prints the mean time a call and each process's mean time in each phase,
 * in microseconds; checks the peer's half of the output.
 */
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

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: slot_reuse BYTES [ITERS] [SETS]\n");
    return 2;
  }
  size_t bytes = strtoul(argv[1], 0, 10);
  long iters = argc > 2 ? atol(argv[2]) : 20000;
  long sets = argc > 3 ? atol(argv[3]) : 8;
  if (bytes < 128 || bytes % 128 || iters < 1 || sets < 1) {
    fprintf(stderr, "BYTES: a multiple of 128; ITERS, SETS >= 1\n");
    return 2;
  }
  size_t h = bytes / 2;
  int prot = PROT_READ | PROT_WRITE, flags = MAP_SHARED | MAP_ANONYMOUS;
  /* Per process, each on a line of its own: [0] calls put, [4] ready,
     [8] calls taken. */
  _Atomic long *w = mmap(0, 4096, prot, flags, -1, 0);
  char *shared = mmap(0, 2 * sets * h, prot, flags, -1, 0);
  if (w == MAP_FAILED || shared == MAP_FAILED) {
    perror("mmap");
    return 1;
  }
  memset(shared, 0, 2 * sets * h);
  int r = fork() == 0, p = 1 - r;
  char *in = aligned_alloc(64, h), *out = aligned_alloc(64, bytes);
  memset(in, r + 1, h);
  memset(out, 0, bytes);
  double t0 = 0, t_in = 0, t_own = 0, t_wait = 0, t_out = 0, x;
  const long warm = 100;
  for (long it = -warm; it < iters; it++) {
    if (it == 0) {
      atomic_store(&w[r * 16 + 4], 1);
      while (!atomic_load(&w[p * 16 + 4])) {
      }
      t0 = now();
      t_in = t_own = t_wait = t_out = 0;
    }
    long k = it + warm;
    char *mine = shared + (2 * (k % sets) + r) * h, *theirs = shared + (2 * (k % sets) + p) * h;
    while (atomic_load_explicit(&w[p * 16 + 8], memory_order_acquire) < k + 1 - sets) {
    }
    x = now();
    memcpy(mine, in, h);
    t_in += now() - x;
    atomic_store_explicit(&w[r * 16], k + 1, memory_order_release);
    x = now();
    memcpy(out + r * h, in, h);
    t_own += now() - x;
    x = now();
    while (atomic_load_explicit(&w[p * 16], memory_order_acquire) < k + 1) {
    }
    t_wait += now() - x;
    x = now();
    memcpy(out + p * h, theirs, h);
    t_out += now() - x;
    atomic_store_explicit(&w[r * 16 + 8], k + 1, memory_order_release);
  }
  double t = now() - t0, n = (double)iters;
  for (size_t i = 0; i < h; i += 97)
    if (out[p * h + i] != p + 1) {
      fprintf(stderr, "wrong byte at %zu of the peer's half\n", i);
      return 1;
    }
  if (r == 1) usleep(100000); /* rank 0's lines first */
  printf("  process %d: copy in %.2f us, own half %.2f, wait %.2f, copy out %.2f\n", r, t_in / n * 1e6,
         t_own / n * 1e6, t_wait / n * 1e6, t_out / n * 1e6);
  if (r == 0) {
    fflush(stdout);
    wait(NULL);
    printf("allgather of %zu bytes through %ld set(s) of shared buffers: %.2f us a call\n", bytes, sets,
           t / iters * 1e6);
  }
  return 0;
}
