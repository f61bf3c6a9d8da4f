/* The two numbers every shared-memory result on this machine depends on,
 * measured in a few milliseconds: the round trip of one cache line
 * between two processes pinned to CPUs A and B (each waits for the
 * other's store, then stores), and the speed at which one process copies
 * out 64 KiB the other has just written (a slot's handover: the bytes
 * cross from one core's cache to the other's).
 *
 * On the 2-core build VM both move between runs minutes apart, and with
 * them every shared-memory collective of ferroccl and its peers (a 2-rank
 * 128 KiB allreduce took 7.5 us or 27 us by the hour;
 * docs/performance-log.md, "Two speeds of the build machine"), so
 * bench/peers.sh prints this line with every turn: a table's cells are
 * comparable only between turns that printed about the same line.
 *
 * build: gcc -O2 -o /tmp/pingpong bench/bound/pingpong.c
 * run:   /tmp/pingpong [CPU_A CPU_B]      (default 0 1)
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

#define ROUNDS 200000
#define BLOCK (64 << 10)
#define COPIES 2000

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
    perror("pingpong: sched_setaffinity");
    exit(2);
  }
}

static void wait_for(_Atomic long *w, long v) {
  while (atomic_load_explicit(w, memory_order_acquire) != v) __builtin_ia32_pause();
}

struct shared {
  _Atomic long ping __attribute__((aligned(64)));
  _Atomic long turn __attribute__((aligned(64)));
  char block[BLOCK] __attribute__((aligned(64)));
};

int main(int argc, char **argv) {
  int a = argc > 2 ? atoi(argv[1]) : 0, b = argc > 2 ? atoi(argv[2]) : 1;
  struct shared *s = mmap(0, sizeof *s, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (s == MAP_FAILED) {
    perror("pingpong: mmap");
    return 2;
  }
  static char out[BLOCK] __attribute__((aligned(64)));
  pid_t child = fork();
  if (child == 0) {
    pin(b);
    for (long i = 0; i < ROUNDS; i++) {
      wait_for(&s->ping, 2 * i + 1);
      atomic_store_explicit(&s->ping, 2 * i + 2, memory_order_release);
    }
    // The writer of the block: fill it, hand it over, wait for it back.
    for (long i = 0; i < COPIES; i++) {
      memset(s->block, (int)i, BLOCK);
      atomic_store_explicit(&s->turn, 2 * i + 1, memory_order_release);
      wait_for(&s->turn, 2 * i + 2);
    }
    _exit(0);
  }
  pin(a);
  double t0 = now();
  for (long i = 0; i < ROUNDS; i++) {
    atomic_store_explicit(&s->ping, 2 * i + 1, memory_order_release);
    wait_for(&s->ping, 2 * i + 2);
  }
  double rt = (now() - t0) / ROUNDS;
  // The reader: copy the block out once it is handed over. Only the
  // copies are timed (the writer's fill is not).
  double copying = 0;
  for (long i = 0; i < COPIES; i++) {
    wait_for(&s->turn, 2 * i + 1);
    double c0 = now();
    memcpy(out, s->block, BLOCK);
    copying += now() - c0;
    if (out[BLOCK - 1] != (char)i) {
      fprintf(stderr, "pingpong: copy %ld read stale bytes\n", i);
      return 1;
    }
    atomic_store_explicit(&s->turn, 2 * i + 2, memory_order_release);
  }
  int status = 0;
  waitpid(child, &status, 0);
  printf("cpus %d,%d: round trip %.0f ns, 64 KiB from the other core %.1f GB/s\n", a, b, rt * 1e9,
         (double)BLOCK * COPIES / copying / 1e9);
  return 0;
}
