/* The floor of a small call between two processes on this machine: only
 * the cache-line traffic a check-in protocol like ferroccl's cannot avoid,
 * with none of a library's bookkeeping.
 *
 * Each rank has a ring of D announcement slots (one cache line each: the
 * call's position and 8 bytes of data) and a "finished" word in a line of
 * its own. A call at position t:
 *
 *   bcast      the root waits until the receiver has finished t - D (slot
 *              t % D is free again), writes its 8 bytes and then the
 *              position into slot t % D, and returns; the receiver waits
 *              for that position, reads the data, and says it finished t
 *              (every F calls: F = 1 is ferroccl's rule today).
 *   allreduce  both ranks write their 8 bytes into their own slot t % D
 *              (once the peer finished t - D), wait for the peer's, add,
 *              and say they finished t.
 *
 * Time per call (median of 5 runs of N calls, rank 0's clock) printed per
 * mode and F. What a library adds above this is its own cost; what is
 * below any peer's time is what no protocol of this shape can beat here.
 *
 * build: gcc -O2 -o /tmp/small bench/bound/small.c
 * run:   /tmp/small [N] [D]          (default 2000000 24)
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

#define MAXD 64
#define RUNS 5

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
    perror("small: sched_setaffinity");
    exit(2);
  }
}

struct slot {
  _Atomic long pos;
  _Atomic double data;
} __attribute__((aligned(64)));

struct page {
  struct slot slot[MAXD];
  _Atomic long finished __attribute__((aligned(64)));
} __attribute__((aligned(64)));

struct shared {
  struct page page[2];
  _Atomic long go __attribute__((aligned(64)));
  double took[RUNS];
};

static long n_calls, depth;

/* Wait until `peer` finished position `t - depth` (its slot is free). */
static void wait_free(struct page *peer, long t, long *seen) {
  long need = t - depth + 1; /* finished counts positions done */
  if (need <= *seen) return;
  long f;
  while ((f = atomic_load_explicit(&peer->finished, memory_order_acquire)) < need)
    __builtin_ia32_pause();
  *seen = f;
}

static double run_bcast(struct shared *sh, int me, long every) {
  struct page *mine = &sh->page[me], *peer = &sh->page[1 - me];
  long seen = 0;
  double sink = 0, t0 = now();
  for (long t = 0; t < n_calls; t++) {
    struct slot *s;
    if (me == 0) {
      wait_free(peer, t, &seen);
      s = &mine->slot[t % depth];
      atomic_store_explicit(&s->data, (double)t, memory_order_relaxed);
      atomic_store_explicit(&s->pos, t + 1, memory_order_release);
    } else {
      s = &peer->slot[t % depth];
      while (atomic_load_explicit(&s->pos, memory_order_acquire) != t + 1) __builtin_ia32_pause();
      sink += atomic_load_explicit(&s->data, memory_order_relaxed);
      if ((t + 1) % every == 0 || t + 1 == n_calls)
        atomic_store_explicit(&mine->finished, t + 1, memory_order_release);
    }
  }
  double dt = now() - t0;
  if (sink < 0) puts("");
  return dt;
}

static double run_allreduce(struct shared *sh, int me, long every) {
  struct page *mine = &sh->page[me], *peer = &sh->page[1 - me];
  long seen = 0;
  double sink = 0, t0 = now();
  for (long t = 0; t < n_calls; t++) {
    wait_free(peer, t, &seen);
    struct slot *s = &mine->slot[t % depth], *p = &peer->slot[t % depth];
    atomic_store_explicit(&s->data, (double)me, memory_order_relaxed);
    atomic_store_explicit(&s->pos, t + 1, memory_order_release);
    while (atomic_load_explicit(&p->pos, memory_order_acquire) != t + 1) __builtin_ia32_pause();
    sink += atomic_load_explicit(&p->data, memory_order_relaxed) + me;
    if ((t + 1) % every == 0 || t + 1 == n_calls)
      atomic_store_explicit(&mine->finished, t + 1, memory_order_release);
  }
  double dt = now() - t0;
  if (sink < 0) puts("");
  return dt;
}

static int cmp(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

int main(int argc, char **argv) {
  n_calls = argc > 1 ? atol(argv[1]) : 2000000;
  depth = argc > 2 ? atol(argv[2]) : 24;
  if (depth < 1 || depth > MAXD || n_calls < 1) {
    fprintf(stderr, "small: N >= 1 and 1 <= D <= %d\n", MAXD);
    return 2;
  }
  const char *modes[] = {"bcast", "allreduce"};
  long everys[] = {1, 8};
  for (int m = 0; m < 2; m++) {
    for (int e = 0; e < 2; e++) {
      double took[RUNS];
      for (int r = 0; r < RUNS; r++) {
        struct shared *sh = mmap(NULL, sizeof *sh, PROT_READ | PROT_WRITE,
                                 MAP_SHARED | MAP_ANONYMOUS, -1, 0);
        if (sh == MAP_FAILED) {
          perror("small: mmap");
          return 2;
        }
        memset(sh, 0, sizeof *sh);
        pid_t child = fork();
        int me = child == 0 ? 1 : 0;
        pin(me);
        atomic_fetch_add(&sh->go, 1);
        while (atomic_load(&sh->go) < 2) __builtin_ia32_pause();
        double dt = m == 0 ? run_bcast(sh, me, everys[e]) : run_allreduce(sh, me, everys[e]);
        if (child == 0) _exit(0);
        waitpid(child, NULL, 0);
        took[r] = dt;
        munmap(sh, sizeof *sh);
      }
      qsort(took, RUNS, sizeof took[0], cmp);
      printf("%-9s D=%ld F=%ld: %.1f ns per call\n", modes[m], depth, everys[e],
             took[RUNS / 2] / n_calls * 1e9);
    }
  }
  return 0;
}
