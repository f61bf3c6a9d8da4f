/* What a 2-process allreduce or allgather of *plain* (private, malloc'd)
 * buffers can reach on this machine through shared staging memory, with
 * nothing of ferroccl around it: the bound of a slot transport.
 *
 * Neither process can touch the other's buffers, so each byte for the peer
 * crosses through a shared FIFO of SLOTS slots of CHUNK bytes per
 * direction.
 *
 * allreduce: process r, chunk by chunk, copies its input's chunk of the
 * peer's half into its FIFO; takes the peer's chunk of its own half out of
 * the peer's FIFO, adds its input to it and writes the sum into its output
 * and, in the same pass, into its FIFO; and copies the peer's sums out of
 * the peer's FIFO into its output. Three passes over each half (copy in,
 * reduce, copy out), the least any exchange through shared staging memory
 * does: the 2-rank ring of ferroccl's slot path.
 *
 * oneshot: an allreduce in two passes over the whole buffer instead of
 * three over each half: process r copies each chunk of its input into its
 * FIFO, and adds the peer's chunk, out of the peer's FIFO, to its own
 * input's into its output (each byte crosses between the cores once, as in
 * the three passes, but nothing is copied out).
 *
 * allgather (BYTES per process in, 2 x BYTES out): process r copies its
 * input's chunk into its block of its output and into its FIFO, and copies
 * the peer's chunk out of the peer's FIFO into the peer's block.
 *
 * Compare with cma.c (kernel copies instead of staging), direct.c and
 * allgather.c (shared buffers, one pass). Prints the busbw as nccl-tests
 * defines it (allreduce on 2 ranks: BYTES / time; allgather: gathered size
 * 2 x BYTES, busbw BYTES / time) of the mean and the best of ITERS rounds,
 * to set against `mpi_bench` and `ferroccl-perf --ranks 2` at the same
 * size (allgather: ferroccl-perf's 2 x BYTES row).
 *
 * FRESH=1: between rounds (untimed) each process reads its whole output
 * and rewrites its input, as a training step would (see cma.c).
 *
 * build: gcc -O3 -march=native -o /tmp/staged bench/bound/staged.c
 * run:   [FRESH=1] /tmp/staged [allreduce|oneshot|allgather] BYTES [CHUNK] [SLOTS] [ITERS]
 *        (e.g. /tmp/staged 4194304 65536 8 50: an allreduce of 4 MiB)
 */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

struct fifo {
  _Atomic long head; /* chunks written by the producer */
  char pad0[56];
  _Atomic long tail; /* chunks taken by the consumer */
  char pad1[56];
};

static size_t chunk, nslots;
static struct fifo *fifos;
static char *slots; /* 2 x nslots x chunk */
static _Atomic long *sync_words;

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

static void barrier(int r, long *gen) {
  ++*gen;
  atomic_store(&sync_words[r * 8], *gen);
  while (atomic_load(&sync_words[(1 - r) * 8]) < *gen) {
  }
}

/* The next free slot of FIFO d (waits for the consumer). */
static float *produce(int d) {
  struct fifo *f = &fifos[d];
  long h = atomic_load_explicit(&f->head, memory_order_relaxed);
  while (h - atomic_load_explicit(&f->tail, memory_order_acquire) >= (long)nslots) {
  }
  return (float *)(slots + ((size_t)d * nslots + (size_t)(h % (long)nslots)) * chunk);
}

static void produced(int d) { atomic_fetch_add_explicit(&fifos[d].head, 1, memory_order_release); }

/* The next full slot of FIFO d (waits for the producer). */
static const float *consume(int d) {
  struct fifo *f = &fifos[d];
  long t = atomic_load_explicit(&f->tail, memory_order_relaxed);
  while (atomic_load_explicit(&f->head, memory_order_acquire) <= t) {
  }
  return (const float *)(slots + ((size_t)d * nslots + (size_t)(t % (long)nslots)) * chunk);
}

static void consumed(int d) { atomic_fetch_add_explicit(&fifos[d].tail, 1, memory_order_release); }

int main(int argc, char **argv) {
  int gather = argc > 1 && !strcmp(argv[1], "allgather");
  int oneshot = argc > 1 && !strcmp(argv[1], "oneshot");
  if (argc > 1 && (gather || oneshot || !strcmp(argv[1], "allreduce"))) argc--, argv++;
  size_t bytes = argc > 1 ? strtoul(argv[1], 0, 10) : 4u << 20;
  chunk = argc > 2 ? strtoul(argv[2], 0, 10) : 65536;
  nslots = argc > 3 ? strtoul(argv[3], 0, 10) : 8;
  int iters = argc > 4 ? atoi(argv[4]) : 50;
  if (bytes % (2 * chunk) || chunk % 64 || nslots < 2) {
    fprintf(stderr, "BYTES must be a multiple of 2 x CHUNK, CHUNK of 64; SLOTS >= 2\n");
    return 2;
  }
  int prot = PROT_READ | PROT_WRITE, flags = MAP_SHARED | MAP_ANONYMOUS;
  sync_words = mmap(0, 4096, prot, flags, -1, 0);
  fifos = mmap(0, 4096, prot, flags, -1, 0);
  slots = mmap(0, 2 * nslots * chunk, prot, flags, -1, 0);
  int r = fork() == 0, p = 1 - r;
  size_t n = bytes / 4, k = chunk / 4;
  /* allreduce: halves of the input and output; allgather: the blocks of
     the output, each the size of the input. */
  size_t part = gather ? n : n / 2, out_n = gather ? 2 * n : n;
  float *in = aligned_alloc(64, bytes), *out = aligned_alloc(64, out_n * 4);
  for (size_t i = 0; i < n; i++) in[i] = (float)(r + 1);
  for (size_t i = 0; i < out_n; i++) out[i] = 0;
  const float *mine = in + (gather ? 0 : r * part), *theirs = in + p * part;
  float *out_mine = out + r * part, *out_theirs = out + p * part;
  long gen = 0;
  double best = 1e9, sum = 0;
  int fresh = getenv("FRESH") && atoi(getenv("FRESH"));
  volatile float sink = 0;
  for (int it = -5; it < iters; it++) {
    if (fresh) {
      float acc = 0;
      for (size_t i = 0; i < out_n; i++) acc += out[i];
      for (size_t i = 0; i < n; i++) in[i] = (float)(r + 1);
      sink += acc;
    }
    barrier(r, &gen);
    double t = now();
    for (size_t o = 0; gather && o < part; o += k) {
      /* My input into my block and my FIFO, in one pass. */
      float *y = produce(r);
      for (size_t i = 0; i < k; i++) y[i] = out_mine[o + i] = mine[o + i];
      produced(r);
      /* The peer's input into its block. */
      memcpy(out_theirs + o, consume(p), chunk);
      consumed(p);
    }
    for (size_t o = 0; oneshot && o < n; o += k) {
      /* My input's chunk into my FIFO; the peer's out of its FIFO, added
         to mine into my output. */
      memcpy(produce(r), in + o, chunk);
      produced(r);
      const float *x = consume(p);
      for (size_t i = 0; i < k; i++) out[o + i] = x[i] + in[o + i];
      consumed(p);
    }
    for (size_t o = 0; !gather && !oneshot && o < part; o += k) {
      /* The peer's half of my input, into my FIFO. */
      memcpy(produce(r), theirs + o, chunk);
      produced(r);
      /* The peer's part of my half: add, into my output and my FIFO. */
      const float *x = consume(p);
      float *y = produce(r);
      for (size_t i = 0; i < k; i++) y[i] = out_mine[o + i] = x[i] + mine[o + i];
      consumed(p);
      produced(r);
      /* The peer's sums of its half, into my output. */
      memcpy(out_theirs + o, consume(p), chunk);
      consumed(p);
    }
    barrier(r, &gen);
    t = now() - t;
    if (it >= 0) {
      if (t < best) best = t;
      sum += t;
    }
  }
  for (size_t i = 0; i < out_n; i += 4099)
    if (out[i] != (gather ? (float)(i / n + 1) : 3.0f)) {
      fprintf(stderr, "wrong result at %zu\n", i);
      return 1;
    }
  if (r == 0) {
    double mean = sum / iters;
    wait(NULL);
    printf("staged %s (%s), 2 processes, %zu bytes (chunk %zu, %zu slots): mean %.1f us, busbw "
           "%.2f GB/s, best %.2f GB/s\n",
           gather ? "allgather" : oneshot ? "oneshot allreduce" : "allreduce", fresh ? "fresh rounds" : "reused buffers", bytes,
           chunk, nslots, mean * 1e6, bytes / mean / 1e9, bytes / best / 1e9);
  }
  return 0;
}
