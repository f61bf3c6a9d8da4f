/* A 2-process allgather of *plain* (malloc'd) buffers with cross-memory
 * attach, the way Open MPI's shared-memory transport moves large messages:
 * process r copies its input into block r of its output, then pulls the
 * peer's input into block 1-r with process_vm_readv, CHUNK bytes per call.
 * One copy per gathered byte (the kernel's), against two through shared
 * staging memory (staged.c allgather). Prints the busbw of the mean of
 * ITERS rounds as nccl-tests defines it (gathered size 2 x BLOCK, busbw
 * BLOCK / time): compare with the 2 x BLOCK rows of `bench/compare.sh
 * allgather 2`.
 *
 * FRESH=1: between rounds (untimed) each process reads its whole output
 * and rewrites its input, as a training step would (see cma.c).
 *
 * Needs ptrace permission on the peer (same user; Yama ptrace_scope 0, or
 * root; a container's seccomp profile may forbid the call).
 *
 * build: gcc -O3 -march=native -o /tmp/cma_allgather bench/bound/cma_allgather.c
 * run:   [FRESH=1] /tmp/cma_allgather BLOCK [CHUNK] [ITERS]   (e.g. /tmp/cma_allgather 2097152)
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
  char *in[2];
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
  if (argc < 2) {
    fprintf(stderr, "usage: %s BLOCK [CHUNK] [ITERS]\n", argv[0]);
    return 2;
  }
  size_t block = strtoul(argv[1], 0, 10);
  size_t chunk = argc > 2 ? strtoul(argv[2], 0, 10) : block;
  int iters = argc > 3 ? atoi(argv[3]) : 50;
  if (block == 0 || chunk == 0) {
    fprintf(stderr, "BLOCK and CHUNK must be positive\n");
    return 2;
  }
  struct shared *s = mmap(0, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  int r = fork() == 0, p = 1 - r;
  char *in = malloc(block), *out = malloc(2 * block);
  memset(in, r + 1, block);
  memset(out, 0, 2 * block);
  s->in[r] = in, s->pid[r] = getpid();
  long gen = 0;
  barrier(s, r, &gen);
  double sum = 0;
  int fresh = getenv("FRESH") && atoi(getenv("FRESH"));
  volatile char sink = 0;
  for (int it = -5; it < iters; it++) {
    if (fresh) {
      char acc = 0;
      for (size_t i = 0; i < 2 * block; i += 64) acc ^= out[i];
      memset(in, r + 1, block);
      sink ^= acc;
    }
    barrier(s, r, &gen);
    double t = now();
    memcpy(out + r * block, in, block);
    for (size_t o = 0; o < block; o += chunk) {
      size_t n = chunk < block - o ? chunk : block - o;
      struct iovec local = {out + p * block + o, n}, remote = {s->in[p] + o, n};
      if (process_vm_readv(s->pid[p], &local, 1, &remote, 1, 0) != (ssize_t)n) {
        perror("process_vm_readv");
        return 1;
      }
    }
    barrier(s, r, &gen);
    if (it >= 0) sum += now() - t;
  }
  int bad = 0;
  for (size_t i = 0; i < 2 * block; i += 4093) bad += out[i] != (char)(i / block + 1);
  if (r) return bad != 0;
  int status = 0;
  wait(&status);
  printf("CMA allgather (%s), 2 processes, block %zu (chunk %zu): mean %.1f us, busbw %.2f GB/s%s\n",
         fresh ? "fresh rounds" : "reused buffers", block, chunk, sum / iters * 1e6,
         block / (sum / iters) / 1e9, bad || status ? " (WRONG RESULT)" : "");
  return 0;
}
