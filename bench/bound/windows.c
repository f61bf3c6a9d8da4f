/* The bound of a collective between windows on N processes of this
 * machine: only the memory traffic every rank must make, between buffers
 * that all processes map (as ferroccl's windows are: `-R 2`), and the two
 * meetings any such call needs (every rank's buffers are ready; every
 * rank is done with the others' buffers), with nothing of a library
 * around it. Calls run back to back on the same buffers, as ferroccl-perf
 * and the MPI benchmarks time them.
 *
 * SIZE is the nccl-tests size (what ferroccl-perf prints: the gathered
 * array for allgather and reduce-scatter, a rank's whole send buffer for
 * all-to-all, the buffer otherwise); f32 sum.
 * Rank r's work, each way it may be shared out (the bound is the faster):
 *   allreduce      pieces: piece r (of N) of every input summed into piece
 *                  r of every output (ferroccl's direct allreduce); or
 *                  pull: every input summed into its own output;
 *   allgather      push: its input copied into block r of every output;
 *                  or pull: every input copied into its own output;
 *   reducescatter  block r of every input summed into its output;
 *   broadcast      pull: the root's (rank 0's) input copied into its own
 *                  output; or pieces: piece r of the root's input copied
 *                  into every rank's output (the root shares the
 *                  copying); or chunks: the pieces 128 KiB at a time into
 *                  every output, the chunk read out of memory once
 *                  (ferroccl's order). The calls are out of place, so the
 *                  root's output is written too, as ferroccl-perf's and
 *                  the MPI benchmarks' broadcasts write it (until
 *                  2026-12-05 it was left out, which halved the writes
 *                  of a 2-rank call);
 *   reduce         pieces: piece r of every input summed into piece r of
 *                  the root's output; or pull: the root sums them all;
 *   alltoall       push: block j of its input copied into block r of
 *                  rank j's output, for every j; or pull: block r of
 *                  rank j's input copied into block j of its own output;
 * and, for every call, staged: one meeting instead of two, as ferroccl's
 * inline exchange runs small calls: each rank copies its whole input (the
 * root alone in a broadcast) into a staging area of its own that every
 * process maps, meets, and makes its output out of the staging areas (an
 * allreduce sums every rank's whole input, a reduce's root sums them; a
 * rank returns once it has read them). ferroccl's inline reduce-scatter
 * puts only the blocks its peers reduce, and a reduce's root nothing, so
 * this way copies up to 1/N more than it must there. The
 * areas alternate between two halves by call, so a rank writing call
 * g's never overwrites call g - 2's while a peer reads it (that peer met
 * this rank at call g - 1 after it had read).
 * Each way runs ITERS calls, with ordinary stores and again with streaming
 * (non-temporal) ones, as ferroccl writes large outputs; the fastest one's
 * time is printed, and which (" streaming" where those stores won).
 * A meeting is a generation number each rank stores in its own cache
 * line and waits to see on every other, yielding the CPU between looks
 * after a spin, short where the processes outnumber the CPUs (4 on 2
 * cores must give way to each other, as ferroccl's waits do); where they
 * do not, each process has a CPU of its own. Prints the slowest process's
 * mean time per call in microseconds, a call being both its meetings and
 * its traffic, timed over all the calls back to back (until 2026-12-05
 * the time ran from the end of the first meeting to the end of the
 * second, which left out the first: on 4 processes over 2 cores, where
 * every meeting is a round of process switches, that put an 8 KiB
 * allreduce at 5-6 µs against 8-12 for whole calls; docs/
 * performance-log.md, "The windows column on 4 ranks against whole
 * calls of the bare program"); after each way every element of every
 * output is checked against what it must hold (" WRONG" and exit status
 * 1 where one is not).
 *
 * WORKERS=W runs the N ranks' work on W processes, process w doing that of
 * ranks w, w + W, ... one after the other, and the meetings between the W.
 * With W the CPUs where the ranks outnumber them (4 ranks on 2 cores,
 * WORKERS=2), that is the floor of the machine: the same traffic on every
 * CPU there is, nothing spent on processes taking turns (which N processes
 * on fewer CPUs spend, so that a library ran below this program's N-process
 * time in 7 of 19 cells on 4 ranks; docs/performance-log.md, "The windows
 * column against a floor of the machine"). bench/peers.sh's
 * "bound" takes the faster of N processes and as many as the CPUs.
 *
 * build: gcc -O3 -march=native -o /tmp/windows bench/bound/windows.c
 * run:   [WORKERS=W] [WAYS=1] /tmp/windows OP N SIZE [ITERS]
 *        (WAYS=1 also prints every way's time on stderr)
 *        (e.g. /tmp/windows allgather 2 2097152; WORKERS=2 /tmp/windows broadcast 4 32768)
 * bench/peers.sh with PEERS="... bound" runs it beside ferroccl-perf -R 2
 * and the MPIs.
 */
#define _GNU_SOURCE
#include <immintrin.h>
#include <sched.h>
#include <stdint.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MAXN 8
/* Floats a chunk of the broadcast's third way (128 KiB). */
#define CHUNK 32768

struct shared {
  _Atomic long gen[MAXN][16];
  double took[2][4][MAXN]; /* [streaming][way][process] */
};

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

/* How many looks a waiter spins before it yields: long where every
 * process has a CPU of its own, short where they share. */
static long patience;

static void meet(struct shared *s, int r, int n, long *gen) {
  ++*gen;
  atomic_store_explicit(&s->gen[r][0], *gen, memory_order_release);
  for (int j = 0; j < n; j++) {
    long spins = 0;
    while (atomic_load_explicit(&s->gen[j][0], memory_order_acquire) < *gen)
      if (++spins > patience) sched_yield();
  }
}

/* Whether the calls store with streaming (non-temporal) stores, as
 * ferroccl does from large sizes on: the lines written are not read
 * first, and do not stay in cache. Each way runs with both; the faster
 * counts. */
static int streaming;

#define STREAM_FLOATS 8 /* floats of one 32-byte streaming store */

/* Whether this build has 32-byte streaming stores to make (AVX): without
 * them the calls run with ordinary stores alone. */
#ifdef __AVX__
#define STREAMS 1
#else
#define STREAMS 0
#endif

#ifdef __AVX__
/* Floats before `p` reaches a 32-byte boundary (all of them where `len`
 * is shorter). */
static size_t head(const float *p, size_t len) {
  size_t h = ((32 - (uintptr_t)p % 32) % 32) / 4;
  return h < len ? h : len;
}
#endif

/* dst = src, len floats. */
static void copy(float *restrict dst, const float *restrict src, size_t len) {
  if (!STREAMS || !streaming) {
    memcpy(dst, src, len * 4);
    return;
  }
#ifdef __AVX__
  size_t i = head(dst, len);
  memcpy(dst, src, i * 4);
  for (; i + STREAM_FLOATS <= len; i += STREAM_FLOATS)
    _mm256_stream_ps(dst + i, _mm256_loadu_ps(src + i));
  memcpy(dst + i, src + i, (len - i) * 4);
  _mm_sfence();
#endif
}

/* out[i] = in[0][off + i] + ... + in[n - 1][off + i] over len floats, in
 * rank order. With cached stores: out = a + b, then out += c for more;
 * streaming: 8 floats at a time summed in a register and streamed out. */
static void sum_into(float *restrict out, float *const *in, int n, size_t off, size_t len) {
  if (!STREAMS || !streaming) {
    const float *a = in[0] + off, *b = in[1] + off;
    for (size_t i = 0; i < len; i++) out[i] = a[i] + b[i];
    for (int j = 2; j < n; j++) {
      const float *c = in[j] + off;
      for (size_t i = 0; i < len; i++) out[i] += c[i];
    }
    return;
  }
#ifdef __AVX__
  size_t i = 0, h = head(out, len);
  for (; i < h; i++) {
    float t = in[0][off + i];
    for (int j = 1; j < n; j++) t += in[j][off + i];
    out[i] = t;
  }
  for (; i + STREAM_FLOATS <= len; i += STREAM_FLOATS) {
    __m256 t = _mm256_loadu_ps(in[0] + off + i);
    for (int j = 1; j < n; j++) t = _mm256_add_ps(t, _mm256_loadu_ps(in[j] + off + i));
    _mm256_stream_ps(out + i, t);
  }
  for (; i < len; i++) {
    float t = in[0][off + i];
    for (int j = 1; j < n; j++) t += in[j][off + i];
    out[i] = t;
  }
  _mm_sfence();
#endif
}

static void *shared_buffer(size_t bytes) {
  void *p = mmap(0, bytes ? bytes : 64, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    perror("mmap");
    exit(1);
  }
  return p;
}

/* Rank r's share of a call made the given way (the loop in main). */
static void work(int way, int r, int n, int ag, int rs, int ar, int bc, int aa, float **in, float **out,
                 size_t part, size_t total) {
  if (aa && way == 0) {
    for (int j = 0; j < n; j++) copy(out[j] + r * part, in[r] + j * part, part);
  } else if (aa) {
    for (int j = 0; j < n; j++) copy(out[r] + j * part, in[j] + r * part, part);
  } else if (ag && way == 0) {
    for (int j = 0; j < n; j++) copy(out[j] + r * part, in[r], part);
  } else if (ag) {
    for (int j = 0; j < n; j++) copy(out[r] + j * part, in[j], part);
  } else if (rs) {
    sum_into(out[r], in, n, r * part, part);
  } else if (ar && way == 0) {
    sum_into(out[r] + r * part, in, n, r * part, part);
    for (int j = 0; j < n; j++)
      if (j != r) copy(out[j] + r * part, out[r] + r * part, part);
  } else if (ar) {
    sum_into(out[r], in, n, 0, total);
  } else if (bc && way == 0) {
    for (int j = 0; j < n; j++) copy(out[j] + r * part, in[0] + r * part, part);
  } else if (bc && way == 2) {
    /* Pieces a chunk at a time into every output, so that the chunk of
     * the root's buffer is read out of memory once and then out of this
     * CPU's cache. */
    for (size_t at = r * part, end = at + part; at < end; at += CHUNK) {
      size_t len = end - at < CHUNK ? end - at : CHUNK;
      for (int j = 0; j < n; j++) copy(out[j] + at, in[0] + at, len);
    }
  } else if (bc) {
    copy(out[r], in[0], total);
  } else if (way == 0) {
    sum_into(out[0] + r * part, in, n, r * part, part);
  } else if (r == 0) {
    sum_into(out[0], in, n, 0, total);
  }
}

/* The staged way's two halves for rank q's call `it`: what it puts into
 * its own staging area before the meeting (stage), and its output made
 * from every rank's area after it (take). area[j][h] is rank j's area
 * in half h, in_len floats. */
static void stage(int q, int bc, float **in, float *(*area)[2], int h, size_t in_len) {
  if (bc && q != 0) return;
  copy(area[q][h], in[q], in_len);
}

static void take(int q, int n, int ag, int rs, int ar, int bc, int aa, float **in, float **out,
                 float *(*area)[2], int h, size_t part, size_t total) {
  float *from[MAXN];
  for (int j = 0; j < n; j++) from[j] = area[j][h];
  if (aa) {
    for (int j = 0; j < n; j++) copy(out[q] + j * part, from[j] + q * part, part);
  } else if (ag) {
    for (int j = 0; j < n; j++) copy(out[q] + j * part, from[j], part);
  } else if (rs) {
    sum_into(out[q], from, n, q * part, part);
  } else if (ar) {
    sum_into(out[q], from, n, 0, total);
  } else if (bc) {
    copy(out[q], q == 0 ? in[0] : from[0], total);
  } else if (q == 0) {
    sum_into(out[0], from, n, 0, total);
  }
}

int main(int argc, char **argv) {
  if (argc < 4) {
    fprintf(stderr, "usage: %s allreduce|allgather|reducescatter|broadcast|reduce|alltoall N SIZE [ITERS]\n",
            argv[0]);
    return 2;
  }
  const char *op = argv[1];
  int n = atoi(argv[2]);
  size_t size = strtoull(argv[3], 0, 10);
  int iters = argc > 4 ? atoi(argv[4]) : 0;
  int ag = !strcmp(op, "allgather"), rs = !strcmp(op, "reducescatter");
  int ar = !strcmp(op, "allreduce"), bc = !strcmp(op, "broadcast"), rd = !strcmp(op, "reduce");
  int aa = !strcmp(op, "alltoall");
  if (n < 2 || n > MAXN || !(ag || rs || ar || bc || rd || aa) || size < 4 * (size_t)n) {
    fprintf(stderr, "windows: OP one of the six, 2 <= N <= %d, SIZE at least 4 x N bytes\n", MAXN);
    return 2;
  }
  size_t total = size / (4 * n) * n; /* floats, a whole number a rank */
  size_t part = total / n;
  size_t in_len = ag ? part : total, out_len = rs ? part : total;
  if (!iters) iters = size <= (1 << 20) ? 2000 : size <= (8 << 20) ? 200 : 30;
  int ncpu = (int)sysconf(_SC_NPROCESSORS_ONLN);
  /* The processes that do the N ranks' work: one per rank, or (WORKERS=W)
   * W, each doing the work of ranks w, w + W, ... in turn. With N ranks on
   * fewer CPUs, W = the CPUs is the floor of the machine: the same traffic
   * on every CPU there is, none of it spent on processes taking turns. */
  const char *w_env = getenv("WORKERS");
  int workers = w_env ? atoi(w_env) : n;
  if (workers < 1 || workers > n) {
    fprintf(stderr, "windows: WORKERS between 1 and N\n");
    return 2;
  }
  patience = workers <= ncpu ? 1L << 20 : 200;
  struct shared *s = shared_buffer(sizeof *s);
  float *in[MAXN], *out[MAXN], *area[MAXN][2];
  for (int j = 0; j < n; j++) {
    in[j] = shared_buffer(in_len * 4);
    out[j] = shared_buffer(out_len * 4);
    area[j][0] = shared_buffer(in_len * 4);
    area[j][1] = shared_buffer(in_len * 4);
    for (size_t i = 0; i < in_len; i++) in[j][i] = (float)(j + 1) + (float)(i % 7);
  }
  int r = 0;
  for (int j = 1; j < workers; j++)
    if (fork() == 0) {
      r = j;
      break;
    }
  if (workers <= ncpu) {
    /* One CPU each, as the MPIs bind their ranks: two spinning processes
     * left on one CPU wait out each other's time slices. */
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(r, &one);
    sched_setaffinity(0, sizeof one, &one);
  }
  long gen = 0;
  /* The ways above, then the staged one (always the last). */
  int ways = (rs ? 1 : bc ? 3 : 2) + 1;
  int bad = 0;
  for (streaming = 0; streaming <= STREAMS; streaming++)
    for (int way = 0; way < ways; way++) {
      double start = 0;
      for (int q = r; q < n; q += workers)
        memset(out[q], 0, out_len * 4);
      /* Whole calls back to back, each its two meetings and its traffic,
       * as a library's calls run in ferroccl-perf and the MPI benchmarks:
       * a call between windows checks in and waits for every rank to be
       * done, and the second meeting of one call and the first of the
       * next are not one (a rank returns in between). */
      for (int it = -10; it < iters; it++) {
        if (it == 0) start = now();
        if (way == ways - 1) {
          int h = (it + 10) & 1;
          for (int q = r; q < n; q += workers) stage(q, bc, in, area, h, in_len);
          meet(s, r, workers, &gen);
          for (int q = r; q < n; q += workers) take(q, n, ag, rs, ar, bc, aa, in, out, area, h, part, total);
          continue;
        }
        meet(s, r, workers, &gen);
        for (int q = r; q < n; q += workers) work(way, q, n, ag, rs, ar, bc, aa, in, out, part, total);
        meet(s, r, workers, &gen);
      }
      s->took[streaming][way][r] = (now() - start) / iters;
      /* Every element of this process's ranks' outputs against what it
       * must hold (the outputs were cleared before the way ran). */
      for (int q = r; q < n; q += workers) {
        if (rd && q != 0) continue;
        for (size_t i = 0; i < out_len; i++) {
          float want = 0;
          if (ag) {
            want = (float)(i / part + 1) + (float)(i % part % 7);
          } else if (aa) {
            /* Block j holds block q of rank j's input. */
            want = (float)(i / part + 1) + (float)((q * part + i % part) % 7);
          } else if (bc) {
            want = 1.0f + (float)(i % 7);
          } else {
            size_t at = rs ? q * part + i : i;
            for (int j = 0; j < n; j++) want += (float)(j + 1) + (float)(at % 7);
          }
          bad |= out[q][i] != want;
        }
      }
      meet(s, r, workers, &gen);
    }
  meet(s, r, workers, &gen);
  if (r) return bad;
  int failed = bad;
  for (int j = 1; j < workers; j++) {
    int status = 0;
    wait(&status);
    failed |= !WIFEXITED(status) || WEXITSTATUS(status);
  }
  double best = 0;
  int best_way = 0, best_nt = 0;
  /* WAYS=1: every way's time too, on stderr (way 0 push or pieces, 1
   * pull, 2 chunks where a broadcast has them, the last staged; nt 1 the
   * streaming stores). */
  const char *ways_env = getenv("WAYS");
  int every_way = ways_env && strcmp(ways_env, "1") == 0;
  for (int nt = 0; nt <= STREAMS; nt++)
    for (int way = 0; way < ways; way++) {
      double slowest = 0;
      for (int j = 0; j < workers; j++)
        if (s->took[nt][way][j] > slowest) slowest = s->took[nt][way][j];
      if (every_way) fprintf(stderr, "way %d nt %d: %.3f us\n", way, nt, slowest * 1e6);
      if ((nt == 0 && way == 0) || slowest < best) best = slowest, best_way = way, best_nt = nt;
    }
  const char *name = best_way == ways - 1 ? " staged"
                     : rs                  ? ""
                     : best_way == 0       ? (ag || aa ? " push" : " pieces")
                     : best_way == 1       ? " pull"
                                           : " chunks";
  printf("%13zu %10.2f%s%s%s\n", total * 4, best * 1e6, name, best_nt ? " streaming" : "",
         failed ? " WRONG" : "");
  return failed;
}
