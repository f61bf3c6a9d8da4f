/* How fast a copy out of memory another core just wrote can go, walked
 * line after line (`memcpy`) or eight 4 KiB pages side by side, a line of
 * each in turn (Intel MPI's shared-memory copy, `I_MPI_memcpy_multipage`
 * in its library, works this way; seen in its disassembly, 2026-12-01).
 *
 * Out of another core's cache each line waits for a snoop. A copy that
 * walks its source in order keeps the misses of one stream in flight, and
 * the prefetchers follow a stream within a page; eight pages walked side
 * by side keep eight streams in flight.
 *
 * copy: two processes each write BYTES of fresh data into their block of
 * a shared buffer, meet, and copy the peer's block into a private buffer:
 * the copy alone is timed (both at once, as in a collective).
 *
 * allreduce: a 2-process allreduce of BYTES of plain (private) buffers
 * through shared buffers in three passes over each half, as ferroccl's
 * 2-rank ring through slots: copy the peer's half of the input in, meet;
 * add the peer's copy of this rank's half to the input, into the output,
 * and copy that sum in, meet; copy the peer's sums out, meet. Before each
 * round (untimed) each process reads its whole output and rewrites its
 * input, as a training step does (ferroccl-perf --fresh 1,
 * MPI_COLL_FRESH=1); FRESH=0 leaves that out, as back-to-back calls
 * (ferroccl-perf's default, bench/peers.sh without FRESH=1) run. SETS
 * shared buffer sets are taken in turn (ferroccl's slots rotate through 8).
 *
 * ADD=lines (with OUT=pages): the sum reads the peer's copy line after
 * line, only the copies out go by pages.
 *
 * WHOLE=1 (allreduce): each process copies its whole input in, meets its
 * peer, and adds the peer's whole copy to its input into its output (one
 * meeting, every element added on both; CHUNK bytes at a time, each
 * chunk's copy in, its meeting and its sum before the next: CHUNK=BYTES
 * by default).
 *
 * allgather: a 2-process allgather of BYTES gathered (BYTES/2 a process)
 * with the steps of ferroccl's 2-rank allgather through slots: copy the
 * input into shared memory, copy it into this rank's block of the output
 * (OWN=0 leaves that out), meet, copy the peer's block out.
 *
 * OUT=pages (default memcpy): the copies out of shared memory and the
 * sum's reads of the peer's copy walk eight pages side by side. IN=pages:
 * the copies into shared memory too.
 *
 * build: gcc -O3 -march=native -o /tmp/pages bench/bound/pages.c
 * run:   [OUT=pages] [IN=pages] [SETS=2] [OWN=0] [ADD=lines] [WHOLE=1 [CHUNK=B]] /tmp/pages copy|allreduce|allgather BYTES [ITERS]
 *        [FRESH=0] (e.g. OUT=pages /tmp/pages allreduce 524288 1000)
 * Prints the mean and best of ITERS rounds, in microseconds.
 */
#include <immintrin.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define PAGE 4096
#define BLOCK (8 * PAGE)

static _Atomic long *words;

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

/* Say this process reached point v; wait until the peer did. */
static void meet(int r, long v) {
  atomic_store_explicit(&words[r * 16], v, memory_order_release);
  while (atomic_load_explicit(&words[(1 - r) * 16], memory_order_acquire) < v) {
  }
}

/* memcpy, or whole blocks of eight pages a line of each in turn. */
static void copy(int pages, void *dst, const void *src, size_t bytes) {
  char *d = dst;
  const char *s = src;
  size_t o = 0;
  for (; pages && o + BLOCK <= bytes; o += BLOCK)
    for (size_t line = 0; line < PAGE; line += 64) {
      __m256i v[16];
      for (int p = 0; p < 8; p++) {
        v[2 * p] = _mm256_loadu_si256((const __m256i *)(s + o + p * PAGE + line));
        v[2 * p + 1] = _mm256_loadu_si256((const __m256i *)(s + o + p * PAGE + line + 32));
      }
      for (int p = 0; p < 8; p++) {
        _mm256_storeu_si256((__m256i *)(d + o + p * PAGE + line), v[2 * p]);
        _mm256_storeu_si256((__m256i *)(d + o + p * PAGE + line + 32), v[2 * p + 1]);
      }
    }
  memcpy(d + o, s + o, bytes - o);
}

/* out = a + b, n floats; with `pages`, eight pages of b side by side. */
static void add(int pages, float *out, const float *a, const float *b, size_t n) {
  const size_t pf = PAGE / 4, bf = BLOCK / 4;
  size_t o = 0;
  for (; pages && o + bf <= n; o += bf)
    for (size_t line = 0; line < pf; line += 8)
      for (int p = 0; p < 8; p++) {
        size_t q = o + p * pf + line;
        _mm256_storeu_ps(out + q, _mm256_add_ps(_mm256_loadu_ps(a + q), _mm256_loadu_ps(b + q)));
      }
  for (; o < n; o++) out[o] = a[o] + b[o];
}

int main(int argc, char **argv) {
  int ar = argc > 1 && !strcmp(argv[1], "allreduce");
  int ag = argc > 1 && !strcmp(argv[1], "allgather");
  if (argc < 3 || (!ar && !ag && strcmp(argv[1], "copy"))) {
    fprintf(stderr,
            "usage: [OUT=pages] [IN=pages] [SETS=2] [OWN=0] pages copy|allreduce|allgather BYTES [ITERS]\n");
    return 2;
  }
  size_t bytes = strtoul(argv[2], 0, 10);
  int iters = argc > 3 ? atoi(argv[3]) : 1000;
  const char *e;
  int out_pages = (e = getenv("OUT")) && !strcmp(e, "pages");
  int in_pages = (e = getenv("IN")) && !strcmp(e, "pages");
  int sets = (e = getenv("SETS")) ? atoi(e) : 2;
  int own = !((e = getenv("OWN")) && !strcmp(e, "0"));
  int add_pages = out_pages && !((e = getenv("ADD")) && !strcmp(e, "lines"));
  int whole = ar && (e = getenv("WHOLE")) && !strcmp(e, "1");
  int fresh = !((e = getenv("FRESH")) && !strcmp(e, "0"));
  size_t chunk = (e = getenv("CHUNK")) ? strtoul(e, 0, 10) : bytes;
  long staged = 0;
  if (bytes % 64 || bytes < 128 || sets < 1) {
    fprintf(stderr, "BYTES: a multiple of 64, at least 128; SETS >= 1\n");
    return 2;
  }
  int prot = PROT_READ | PROT_WRITE, flags = MAP_SHARED | MAP_ANONYMOUS;
  words = mmap(0, 4096, prot, flags, -1, 0);
  char *shared = mmap(0, 2 * (size_t)sets * bytes, prot, flags, -1, 0);
  memset(shared, 0, 2 * (size_t)sets * bytes);
  int r = fork() == 0, p = 1 - r;
  size_t n = bytes / 4, h = n / 2;
  float *in = aligned_alloc(64, bytes), *out = aligned_alloc(64, bytes);
  for (size_t i = 0; i < n; i++) in[i] = (float)(r + 1), out[i] = 0;
  long point = 0;
  double sum = 0, best = 1e9;
  volatile float sink = 0;
  for (int it = -5; it < iters; it++) {
    if (fresh || it < -4) {
      float acc = 0;
      for (size_t i = 0; i < n; i++) acc += out[i];
      for (size_t i = 0; i < n; i++) in[i] = (float)(r + 1);
      sink += acc;
    }
    int set = (it + 5) % sets;
    float *mine = (float *)(shared + (2 * (size_t)set + r) * bytes);
    float *theirs = (float *)(shared + (2 * (size_t)set + p) * bytes);
    double t;
    if (ag) {
      meet(r, ++point);
      t = now();
      copy(in_pages, mine, in + r * h, h * 4);
      if (own) copy(0, out + r * h, in + r * h, h * 4);
      meet(r, ++point);
      copy(out_pages, out + p * h, theirs, h * 4);
      meet(r, ++point);
      t = now() - t;
    } else if (!ar) {
      copy(in_pages, mine, in, bytes);
      meet(r, ++point);
      t = now();
      copy(out_pages, out, theirs, bytes);
      t = now() - t;
      meet(r, ++point);
    } else if (whole) {
      meet(r, ++point);
      t = now();
      for (size_t o = 0; o < bytes; o += chunk) {
        size_t c = bytes - o < chunk ? bytes - o : chunk;
        copy(in_pages, (char *)mine + o, (char *)in + o, c);
        atomic_store_explicit(&words[r * 16 + 8], ++staged, memory_order_release);
        while (atomic_load_explicit(&words[p * 16 + 8], memory_order_acquire) < staged) {
        }
        add(add_pages, out + o / 4, in + o / 4, theirs + o / 4, c / 4);
      }
      t = now() - t;
    } else {
      meet(r, ++point);
      t = now();
      copy(in_pages, mine + p * h, in + p * h, h * 4);
      meet(r, ++point);
      add(add_pages, out + r * h, in + r * h, theirs + r * h, h);
      copy(in_pages, mine + r * h, out + r * h, h * 4);
      meet(r, ++point);
      copy(out_pages, out + p * h, theirs + p * h, h * 4);
      meet(r, ++point);
      t = now() - t;
    }
    if (it >= 0) {
      sum += t;
      if (t < best) best = t;
    }
  }
  /* allreduce: every element 3; copy: the peer's; allgather: the peer's
     block (this rank's own block is unchecked where OWN=0). */
  float want = ar ? 3.0f : (float)(p + 1);
  size_t from = ag ? p * h : 0, to = ag ? p * h + h : n;
  for (size_t i = from; i < to; i += 1031)
    if (out[i] != want) {
      fprintf(stderr, "wrong result at %zu: %f, not %f\n", i, out[i], want);
      return 1;
    }
  if (r == 0) {
    wait(NULL);
    printf("%s of %zu bytes, 2 processes, copies out %s, in %s, %d set(s)%s: mean %.1f us, best %.1f\n",
           ar ? "allreduce" : ag ? "allgather" : "copy out of shared memory", bytes, out_pages ? "by pages" : "by memcpy",
           in_pages ? "by pages" : "by memcpy", sets, fresh ? "" : ", back to back", sum / iters * 1e6, best * 1e6);
  }
  return 0;
}
