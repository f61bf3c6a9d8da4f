/* A 2-process broadcast of *plain* (malloc'd) buffers by cross-memory
 * attach, with only the unavoidable handshake: the root says "my input is
 * ready" (a flag in shared memory), the receiver copies it into its
 * output with process_vm_readv (CHUNK bytes per call) and says "done",
 * and the root waits for that before its next call may touch its input.
 * Both spin on the flags (no yield). Open MPI's shared-memory transport
 * moves a large broadcast this way (single copy, receiver pulls, a
 * completion message back); ferroccl's `exec::pull` too, plus its
 * check-in. Prints the mean and best of ITERS calls as the receiver saw
 * them, in microseconds (compare with the `broadcast 2` rows of
 * `bench/peers.sh`).
 *
 * SPLIT=1 shares the copy: the receiver pulls the first half while the
 * root pushes the second into the receiver's output with
 * process_vm_writev, and each waits for the other's half (two copies in
 * parallel on two CPUs, and a wait each way).
 *
 * Needs ptrace permission on the peer (same user; Yama ptrace_scope 0, or
 * root).
 *
 * build: gcc -O3 -march=native -o /tmp/cma_bcast bench/bound/cma_bcast.c
 * run:   [SPLIT=1] /tmp/cma_bcast BYTES [CHUNK] [ITERS]   (e.g. /tmp/cma_bcast 1048576)
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
  _Atomic long ready; /* the root's call number whose input is ready */
  char pad[56];
  _Atomic long done; /* the receiver's last call copied */
  char pad2[56];
  _Atomic long pushed; /* the root's last call whose half is written */
  char pad3[56];
  char *in;
  char *out; /* the receiver's output (SPLIT) */
  pid_t root, receiver;
};

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: cma_bcast BYTES [CHUNK] [ITERS]\n");
    return 2;
  }
  size_t bytes = strtoul(argv[1], 0, 10);
  size_t chunk = argc > 2 ? strtoul(argv[2], 0, 10) : bytes;
  int iters = argc > 3 ? atoi(argv[3]) : 1000;
  if (!bytes || !chunk || iters < 1) {
    fprintf(stderr, "BYTES, CHUNK and ITERS must be positive\n");
    return 2;
  }
  struct shared *sh =
      mmap(0, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  char *in = aligned_alloc(64, (bytes + 63) / 64 * 64);
  memset(in, 7, bytes);
  sh->in = in;
  sh->root = getpid();
  const char *split_env = getenv("SPLIT");
  int split = split_env && atoi(split_env);
  /* The receiver pulls [0, half); the root pushes [half, bytes). */
  size_t half = split ? bytes / 2 / 64 * 64 : bytes;
  pid_t child = fork();
  if (child != 0) {
    /* The root: its input is ready; (SPLIT) it writes its half; it waits
     * until the receiver copied the rest. */
    while (split && !atomic_load_explicit(&sh->ready, memory_order_acquire)) {
    }
    for (long it = 1; it <= iters + 5; it++) {
      atomic_store_explicit(&sh->ready, it, memory_order_release);
      for (size_t o = half; o < bytes; o += chunk) {
        size_t n = bytes - o < chunk ? bytes - o : chunk;
        struct iovec here = {in + o, n}, there = {sh->out + o, n};
        if (process_vm_writev(sh->receiver, &here, 1, &there, 1, 0) != (ssize_t)n) {
          perror("process_vm_writev");
          return 1;
        }
      }
      atomic_store_explicit(&sh->pushed, it, memory_order_release);
      while (atomic_load_explicit(&sh->done, memory_order_acquire) < it) {
      }
    }
    int status = 0;
    waitpid(child, &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 1;
  }
  char *out = aligned_alloc(64, (bytes + 63) / 64 * 64);
  memset(out, 0, bytes);
  if (split) {
    /* Where the root may write: published before the first call. */
    sh->out = out;
    sh->receiver = getpid();
    atomic_store_explicit(&sh->ready, -1, memory_order_release);
    while (atomic_load_explicit(&sh->ready, memory_order_acquire) < 1) {
    }
  }
  double sum = 0, best = 1e9, last = 0;
  for (long it = 1; it <= iters + 5; it++) {
    while (atomic_load_explicit(&sh->ready, memory_order_acquire) < it) {
    }
    for (size_t o = 0; o < half; o += chunk) {
      size_t n = half - o < chunk ? half - o : chunk;
      struct iovec here = {out + o, n}, there = {sh->in + o, n};
      if (process_vm_readv(sh->root, &here, 1, &there, 1, 0) != (ssize_t)n) {
        perror("process_vm_readv");
        return 1;
      }
    }
    atomic_store_explicit(&sh->done, it, memory_order_release);
    while (split && atomic_load_explicit(&sh->pushed, memory_order_acquire) < it) {
    }
    /* A call, as a loop of them sees it: from the last call's end. */
    double t = now();
    if (it > 5) {
      sum += t - last;
      if (t - last < best) best = t - last;
    }
    last = t;
  }
  for (size_t i = 0; i < bytes; i += 4093)
    if (out[i] != 7) {
      fprintf(stderr, "wrong byte at %zu\n", i);
      return 1;
    }
  printf("CMA broadcast of %zu bytes (chunk %zu%s), 2 processes: mean %.2f us, best %.2f\n", bytes,
         chunk, split ? ", split" : "", sum / iters * 1e6, best * 1e6);
  return 0;
}
