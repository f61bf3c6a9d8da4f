/* What a single-copy allreduce of *plain* (malloc'd) buffers could reach
 * on 2 processes of this machine with cross-memory attach
 * (process_vm_readv/writev, the mechanism Open MPI's shared-memory
 * transport uses for large messages): process r reads piece r of the
 * peer's input into an L2-sized buffer with process_vm_readv, reduces it
 * with its own input into its own output, and writes the result into the
 * peer's output with process_vm_writev. Prints the best of ITERS rounds
 * and their mean (the peers' benchmarks and ferroccl-perf print means).
 *
 * READS=1 replaces the write: after a barrier each process reads the
 * peer's piece of the result out of the peer's output (no process writes
 * another's memory: ferroccl's `exec::pull`). FRESH=1 makes each round
 * look like a training step's: between rounds (untimed) each process
 * reads its whole output and rewrites its input, so no round finds the
 * last one's lines where the benchmark left them (the peer's input clean
 * in this core's cache, the result written into the peer's output still
 * in this core's cache because the peer never reads it).
 *
 * build: gcc -O3 -march=native -o /tmp/cma bench/bound/cma.c
 * run:   [READS=1] [FRESH=1] [ITERS=N] /tmp/cma BYTES [CHUNK]
 *        (e.g. /tmp/cma 4194304 131072)
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


struct shared {
  _Atomic long flags[16];
  float *in[2], *out[2];
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

int main(int argc, char **argv) {
  size_t bytes = argc > 1 ? strtoul(argv[1], 0, 10) : 4u << 20;
  size_t chunk = argc > 2 ? strtoul(argv[2], 0, 10) : 131072;
  int reads = getenv("READS") && atoi(getenv("READS"));
  int fresh = getenv("FRESH") && atoi(getenv("FRESH"));
  int ITERS = getenv("ITERS") ? atoi(getenv("ITERS")) : 20;
  volatile float sink = 0;
  struct shared *s = mmap(0, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  int r = fork() == 0;
  size_t n = bytes / 4, k = chunk / 4;
  float *in = malloc(bytes), *out = malloc(bytes), *tmp = aligned_alloc(64, chunk);
  for (size_t i = 0; i < n; i++) in[i] = (float)(r + 1), out[i] = 0;
  s->in[r] = in, s->out[r] = out, s->pid[r] = getpid();
  long gen = 0;
  barrier(s, r, &gen);
  pid_t peer = s->pid[1 - r];
  float *peer_in = s->in[1 - r], *peer_out = s->out[1 - r];
  size_t from = r * (n / 2), to = r ? n : n / 2;
  double best = 1e9, sum = 0;
  for (int it = 0; it < ITERS; it++) {
    if (fresh) {
      float acc = 0;
      for (size_t i = 0; i < n; i++) acc += out[i], in[i] = (float)(r + 1);
      sink += acc;
    }
    barrier(s, r, &gen);
    double t = now();
    for (size_t o = from; o < to; o += k) {
      size_t m = o + k > to ? to - o : k;
      struct iovec local = {tmp, m * 4}, remote = {peer_in + o, m * 4};
      if (process_vm_readv(peer, &local, 1, &remote, 1, 0) != (ssize_t)(m * 4)) {
        perror("process_vm_readv");
        return 1;
      }
      for (size_t i = 0; i < m; i++) out[o + i] = tmp[i] += in[o + i];
      if (reads) continue;
      struct iovec back = {tmp, m * 4}, there = {peer_out + o, m * 4};
      if (process_vm_writev(peer, &back, 1, &there, 1, 0) != (ssize_t)(m * 4)) {
        perror("process_vm_writev");
        return 1;
      }
    }
    if (reads) {
      /* The peer's piece of the result, once it is there. */
      barrier(s, r, &gen);
      size_t pf = (1 - r) * (n / 2), pt = r ? n / 2 : n;
      struct iovec local = {out + pf, (pt - pf) * 4}, remote = {peer_out + pf, (pt - pf) * 4};
      if (process_vm_readv(peer, &local, 1, &remote, 1, 0) != (ssize_t)((pt - pf) * 4)) {
        perror("process_vm_readv");
        return 1;
      }
    }
    barrier(s, r, &gen);
    t = now() - t;
    if (t < best) best = t;
    sum += t;
  }
  for (size_t i = 0; i < n; i += 4099)
    if (out[i] != 3.0f) {
      fprintf(stderr, "wrong result at %zu\n", i);
      return 1;
    }
  if (r == 0) {
    double mean = sum / ITERS;
    printf("CMA allreduce (%s, %s), 2 processes, %zu bytes (chunk %zu): best %.1f us, busbw %.2f GB/s; "
           "mean %.1f us, busbw %.2f GB/s\n",
           reads ? "reads" : "read+write", fresh ? "fresh rounds" : "reused buffers", bytes, chunk, best * 1e6, bytes / best / 1e9, mean * 1e6, bytes / mean / 1e9);
    wait(NULL);
  }
  return 0;
}
