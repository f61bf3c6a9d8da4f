/*
 * The NCCL C API of ferroccl-nccl, called as a C program calls it, on host
 * memory. Started by nccl/tests/c_abi.rs as one process per rank.
 *
 * Why one file of about 860 lines: it is one C program (one binary the
 * test compiles with cc and runs in every mode below), its modes share the
 * checking macros, the reference arithmetic and the init helpers, and a
 * program of several files would need a build step of its own.
 *
 *
 *   abi collectives RANK NRANKS DIR   every collective x type x op, groups,
 *                                     split, PreMulSum, abort
 *   abi peerdeath   RANK NRANKS DIR   the last rank dies; the others must
 *                                     see it through ncclCommGetAsyncError,
 *                                     then shrink and go on (ncclCommShrink)
 *   abi errors                        bad arguments and configs, one rank
 *   abi lonely                        rank 0 of 2 whose peer never comes
 *   abi symbols     LIBPATH           dlopen(RTLD_NOW), the 38 symbols
 *                                     PyTorch imports, and the SONAME
 *
 * Rank 0 writes the unique id to DIR/id; the other ranks wait for it.
 * Every expected value is computed here, in double precision, from the
 * inputs' formula: never by the library. Exit status 0 means every check
 * passed; a failed check prints what and where and exits 1.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <link.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "nccl.h"

static int g_rank = 0;
static int g_failures = 0;

#define CHECK(cond, ...)                                              \
  do {                                                                \
    if (!(cond)) {                                                    \
      fprintf(stderr, "rank %d: %s:%d: check failed: ", g_rank,       \
              __FILE__, __LINE__);                                    \
      fprintf(stderr, __VA_ARGS__);                                   \
      fprintf(stderr, "\n");                                          \
      exit(1);                                                        \
    }                                                                 \
  } while (0)

#define NCCLOK(call)                                                  \
  do {                                                                \
    ncclResult_t r_ = (call);                                         \
    CHECK(r_ == ncclSuccess, "%s returned %d (%s): %s", #call, r_,    \
          ncclGetErrorString(r_), ncclGetLastError(NULL));            \
  } while (0)

/* ---- element access: every type through double ---- */

static size_t type_size(int t) {
  switch (t) {
    case ncclInt8: case ncclUint8: return 1;
    case ncclFloat16: case ncclBfloat16: return 2;
    case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
    default: return 8;
  }
}

static int is_float(int t) {
  return t == ncclFloat16 || t == ncclBfloat16 || t == ncclFloat32 || t == ncclFloat64;
}

static int is_signed_int(int t) {
  return t == ncclInt8 || t == ncclInt32 || t == ncclInt64;
}

static const char* type_name(int t) {
  static const char* names[] = {"int8", "uint8", "int32", "uint32", "int64",
                                "uint64", "float16", "float32", "float64", "bfloat16"};
  return names[t];
}

/* IEEE half from a float that half represents exactly (the tests' values). */
static uint16_t to_half(float f) {
  uint32_t x;
  memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000;
  int exp = (int)((x >> 23) & 0xff);
  uint32_t man = x & 0x7fffff;
  if (exp == 0 && man == 0) return (uint16_t)sign;
  int e = exp - 127 + 15;
  if (e <= 0) { /* subnormal half */
    man |= 0x800000;
    return (uint16_t)(sign | (man >> (14 - e)));
  }
  return (uint16_t)(sign | ((uint32_t)e << 10) | (man >> 13));
}

static float from_half(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000) << 16;
  int exp = (h >> 10) & 0x1f;
  uint32_t man = h & 0x3ff;
  float f;
  if (exp == 0) {
    f = ldexpf((float)man, -24);
    return sign ? -f : f;
  }
  if (exp == 31) return man ? NAN : (sign ? -INFINITY : INFINITY);
  uint32_t x = sign | ((uint32_t)(exp - 15 + 127) << 23) | (man << 13);
  memcpy(&f, &x, 4);
  return f;
}

static uint16_t to_bf16(float f) {
  uint32_t x;
  memcpy(&x, &f, 4);
  return (uint16_t)(x >> 16);
}

static float from_bf16(uint16_t b) {
  uint32_t x = (uint32_t)b << 16;
  float f;
  memcpy(&f, &x, 4);
  return f;
}

static void put(void* buf, int t, size_t i, double v) {
  switch (t) {
    case ncclInt8: ((int8_t*)buf)[i] = (int8_t)v; break;
    case ncclUint8: ((uint8_t*)buf)[i] = (uint8_t)v; break;
    case ncclInt32: ((int32_t*)buf)[i] = (int32_t)v; break;
    case ncclUint32: ((uint32_t*)buf)[i] = (uint32_t)v; break;
    case ncclInt64: ((int64_t*)buf)[i] = (int64_t)v; break;
    case ncclUint64: ((uint64_t*)buf)[i] = (uint64_t)v; break;
    case ncclFloat16: ((uint16_t*)buf)[i] = to_half((float)v); break;
    case ncclFloat32: ((float*)buf)[i] = (float)v; break;
    case ncclFloat64: ((double*)buf)[i] = v; break;
    case ncclBfloat16: ((uint16_t*)buf)[i] = to_bf16((float)v); break;
  }
}

static double get(const void* buf, int t, size_t i) {
  switch (t) {
    case ncclInt8: return ((const int8_t*)buf)[i];
    case ncclUint8: return ((const uint8_t*)buf)[i];
    case ncclInt32: return ((const int32_t*)buf)[i];
    case ncclUint32: return ((const uint32_t*)buf)[i];
    case ncclInt64: return (double)((const int64_t*)buf)[i];
    case ncclUint64: return (double)((const uint64_t*)buf)[i];
    case ncclFloat16: return from_half(((const uint16_t*)buf)[i]);
    case ncclFloat32: return ((const float*)buf)[i];
    case ncclFloat64: return ((const double*)buf)[i];
    case ncclBfloat16: return from_bf16(((const uint16_t*)buf)[i]);
  }
  return NAN;
}

/* ---- inputs and the reference ---- */

/* Element i of rank r's input for operator op: small integers, so that
 * every sum, product, minimum and maximum over 4 ranks is exact in every
 * type (int8 and bfloat16 included); signed types also get negatives. */
static double input(int op, int t, int r, size_t i) {
  if (op == ncclProd) return (double)((r + i) % 3 + 1); /* product <= 81 */
  double v = (double)((r * 5 + i * 3) % 13 + 1);         /* 1..13, sum <= 52 */
  if ((is_signed_int(t) || is_float(t)) && (i + r) % 4 == 1) v = -v;
  return v;
}

/* PreMulSum scalars: exact products in every type. */
static double premul_scalar(int t) { return is_float(t) ? 0.5 : 2.0; }

/* op over ranks 0..n-1 of input(op, t, r, i); `scalar` for PreMulSum. */
static double reference(int op, int t, int n, size_t i, int premul, double scalar) {
  int base = premul ? ncclSum : op;
  double acc = input(base, t, 0, i);
  if (premul) acc *= scalar;
  for (int r = 1; r < n; r++) {
    double v = input(base, t, r, i);
    if (premul) v *= scalar;
    switch (base) {
      case ncclSum: case ncclAvg: acc += v; break;
      case ncclProd: acc *= v; break;
      case ncclMax: acc = v > acc ? v : acc; break;
      case ncclMin: acc = v < acc ? v : acc; break;
    }
  }
  if (op == ncclAvg && !premul) {
    acc = acc / n;
    if (!is_float(t)) acc = trunc(acc); /* integers: truncated toward zero */
  }
  return acc;
}

static double tolerance(int t, double want) {
  double rel = t == ncclFloat16 ? 1e-3 : t == ncclBfloat16 ? 8e-3 : t == ncclFloat32 ? 1e-6 : 1e-12;
  return is_float(t) ? rel * fabs(want) + 1e-12 : 0.0;
}

static void expect(const char* what, int t, int op, const void* buf, size_t i, double want) {
  double got = get(buf, t, i);
  CHECK(fabs(got - want) <= tolerance(t, want),
        "%s %s op %d element %zu: got %g, want %g", what, type_name(t), op, i, got, want);
}

/* ---- meeting: rank 0 publishes the id in a file ---- */

static void share_id(ncclUniqueId* id, int rank, const char* dir) {
  char path[4096], tmp[4096];
  snprintf(path, sizeof path, "%s/id", dir);
  snprintf(tmp, sizeof tmp, "%s/id.tmp", dir);
  if (rank == 0) {
    NCCLOK(ncclGetUniqueId(id));
    FILE* f = fopen(tmp, "wb");
    CHECK(f && fwrite(id, sizeof *id, 1, f) == 1 && fclose(f) == 0, "writing %s", tmp);
    CHECK(rename(tmp, path) == 0, "renaming to %s", path);
    return;
  }
  for (int tries = 0; tries < 6000; tries++) { /* at most 60 s */
    FILE* f = fopen(path, "rb");
    if (f) {
      size_t got = fread(id, sizeof *id, 1, f);
      fclose(f);
      if (got == 1) return;
    }
    usleep(10000);
  }
  CHECK(0, "no id appeared at %s", path);
}

/* ---- the collectives ---- */

#define COUNT 37

static void* alloc(size_t bytes) {
  void* p = calloc(bytes ? bytes : 1, 1);
  CHECK(p, "out of memory");
  return p;
}

static void reductions(ncclComm_t comm, int rank, int n) {
  for (int t = 0; t < 10; t++) {
    size_t es = type_size(t);
    for (int opi = 0; opi < 6; opi++) {
      int premul = opi == 5;
      int op = premul ? ncclSum : opi;
      int base = premul ? ncclSum : op;
      double scalar = premul_scalar(t);
      ncclRedOp_t use = (ncclRedOp_t)op;
      /* A device-residence scalar in host memory is read at each call:
       * make it with a wrong value and set the right one before calling. */
      unsigned char scalar_bytes[8];
      if (premul) {
        put(scalar_bytes, t, 0, scalar + 1);
        NCCLOK(ncclRedOpCreatePreMulSum(&use, scalar_bytes, (ncclDataType_t)t, ncclScalarDevice, comm));
        CHECK(use >= ncclNumOps, "PreMulSum op %d below ncclNumOps", use);
        put(scalar_bytes, t, 0, scalar);
      }
      void* send = alloc(COUNT * n * es);
      void* recv = alloc(COUNT * n * es);

      /* allreduce, out of place and in place */
      for (size_t i = 0; i < COUNT; i++) put(send, t, i, input(base, t, rank, i));
      NCCLOK(ncclAllReduce(send, recv, COUNT, (ncclDataType_t)t, use, comm, NULL));
      for (size_t i = 0; i < COUNT; i++)
        expect("allreduce", t, opi, recv, i, reference(op, t, n, i, premul, scalar));
      for (size_t i = 0; i < COUNT; i++)
        CHECK(get(send, t, i) == input(base, t, rank, i), "allreduce changed its input");
      NCCLOK(ncclAllReduce(send, send, COUNT, (ncclDataType_t)t, use, comm, NULL));
      for (size_t i = 0; i < COUNT; i++)
        expect("allreduce in place", t, opi, send, i, reference(op, t, n, i, premul, scalar));

      /* reduce to the last rank; NULL recvbuff elsewhere */
      int root = n - 1;
      for (size_t i = 0; i < COUNT; i++) put(send, t, i, input(base, t, rank, i));
      memset(recv, 0, COUNT * n * es);
      NCCLOK(ncclReduce(send, rank == root ? recv : NULL, COUNT, (ncclDataType_t)t, use, root, comm, NULL));
      if (rank == root)
        for (size_t i = 0; i < COUNT; i++)
          expect("reduce", t, opi, recv, i, reference(op, t, n, i, premul, scalar));

      /* reduce-scatter: element i of the whole vector is input(.., i) */
      for (size_t i = 0; i < COUNT * (size_t)n; i++) put(send, t, i, input(base, t, rank, i));
      NCCLOK(ncclReduceScatter(send, recv, COUNT, (ncclDataType_t)t, use, comm, NULL));
      for (size_t i = 0; i < COUNT; i++)
        expect("reduce_scatter", t, opi, recv, i,
               reference(op, t, n, rank * COUNT + i, premul, scalar));
      /* in place: recvbuff is block `rank` of sendbuff */
      NCCLOK(ncclReduceScatter(send, (char*)send + rank * COUNT * es, COUNT, (ncclDataType_t)t, use, comm, NULL));
      for (size_t i = 0; i < COUNT; i++)
        expect("reduce_scatter in place", t, opi, send, rank * COUNT + i,
               reference(op, t, n, rank * COUNT + i, premul, scalar));

      if (premul) NCCLOK(ncclRedOpDestroy(use, comm));
      free(send);
      free(recv);
    }
  }
}

static void movements(ncclComm_t comm, int rank, int n) {
  for (int t = 0; t < 10; t++) {
    size_t es = type_size(t);
    void* send = alloc(COUNT * n * es);
    void* recv = alloc(COUNT * n * es);
    /* allgather, out of place and in place */
    for (size_t i = 0; i < COUNT; i++) put(send, t, i, input(ncclSum, t, rank, i));
    NCCLOK(ncclAllGather(send, recv, COUNT, (ncclDataType_t)t, comm, NULL));
    for (int q = 0; q < n; q++)
      for (size_t i = 0; i < COUNT; i++)
        expect("allgather", t, -1, recv, q * COUNT + i, input(ncclSum, t, q, i));
    memset(recv, 0, COUNT * n * es);
    for (size_t i = 0; i < COUNT; i++) put(recv, t, rank * COUNT + i, input(ncclSum, t, rank, i));
    NCCLOK(ncclAllGather((char*)recv + rank * COUNT * es, recv, COUNT, (ncclDataType_t)t, comm, NULL));
    for (int q = 0; q < n; q++)
      for (size_t i = 0; i < COUNT; i++)
        expect("allgather in place", t, -1, recv, q * COUNT + i, input(ncclSum, t, q, i));

    /* broadcast from rank 0 (sendbuff NULL elsewhere), bcast from the last */
    for (size_t i = 0; i < COUNT; i++) put(send, t, i, input(ncclSum, t, rank, i));
    memset(recv, 0, COUNT * n * es);
    NCCLOK(ncclBroadcast(rank == 0 ? send : NULL, recv, COUNT, (ncclDataType_t)t, 0, comm, NULL));
    for (size_t i = 0; i < COUNT; i++) expect("broadcast", t, -1, recv, i, input(ncclSum, t, 0, i));
    NCCLOK(ncclBcast(send, COUNT, (ncclDataType_t)t, n - 1, comm, NULL));
    for (size_t i = 0; i < COUNT; i++) expect("bcast", t, -1, send, i, input(ncclSum, t, n - 1, i));

    /* all-to-all: block q of rank r's send goes to rank q */
    for (int q = 0; q < n; q++)
      for (size_t i = 0; i < COUNT; i++) put(send, t, q * COUNT + i, input(ncclSum, t, rank * 7 + q, i));
    NCCLOK(ncclAlltoAll(send, recv, COUNT, (ncclDataType_t)t, comm, NULL));
    for (int q = 0; q < n; q++)
      for (size_t i = 0; i < COUNT; i++)
        expect("alltoall", t, -1, recv, q * COUNT + i, input(ncclSum, t, q * 7 + rank, i));
    /* gather to the last rank (recvbuff NULL elsewhere), then in place */
    int last = n - 1;
    for (size_t i = 0; i < COUNT; i++) put(send, t, i, input(ncclSum, t, rank + 40, i));
    memset(recv, 0, COUNT * n * es);
    NCCLOK(ncclGather(send, rank == last ? recv : NULL, COUNT, (ncclDataType_t)t, last, comm, NULL));
    if (rank == last)
      for (int q = 0; q < n; q++)
        for (size_t i = 0; i < COUNT; i++)
          expect("gather", t, -1, recv, q * COUNT + i, input(ncclSum, t, q + 40, i));
    if (rank == last) {
      memset(recv, 0, COUNT * n * es);
      for (size_t i = 0; i < COUNT; i++) put(recv, t, last * COUNT + i, input(ncclSum, t, rank + 40, i));
    }
    NCCLOK(ncclGather(rank == last ? (char*)recv + last * COUNT * es : send,
                      rank == last ? recv : NULL, COUNT, (ncclDataType_t)t, last, comm, NULL));
    if (rank == last)
      for (int q = 0; q < n; q++)
        for (size_t i = 0; i < COUNT; i++)
          expect("gather in place", t, -1, recv, q * COUNT + i, input(ncclSum, t, q + 40, i));

    /* scatter from rank 0 (sendbuff NULL elsewhere) */
    if (rank == 0)
      for (int q = 0; q < n; q++)
        for (size_t i = 0; i < COUNT; i++) put(send, t, q * COUNT + i, input(ncclSum, t, q + 60, i));
    memset(recv, 0, COUNT * n * es);
    NCCLOK(ncclScatter(rank == 0 ? send : NULL, recv, COUNT, (ncclDataType_t)t, 0, comm, NULL));
    for (size_t i = 0; i < COUNT; i++) expect("scatter", t, -1, recv, i, input(ncclSum, t, rank + 60, i));
    free(send);
    free(recv);
  }
}

/* Send/receive in groups: a ring, then every rank with every rank (itself
 * included), with messages of many slots (the test sets a small
 * FERROCCL_BUFFSIZE), which deadlock unless the group schedules them. */
static void point_to_point(ncclComm_t comm, int rank, int n) {
  const size_t big = 50000; /* int32 elements: 200 KB, many slots */
  int32_t* out = alloc(big * 4 * n);
  int32_t* in = alloc(big * 4 * n);
  for (size_t i = 0; i < big; i++) out[i] = (int32_t)(rank * 1000003 + i);
  int next = (rank + 1) % n, prev = (rank + n - 1) % n;
  NCCLOK(ncclGroupStart());
  NCCLOK(ncclSend(out, big, ncclInt32, next, comm, NULL));
  NCCLOK(ncclRecv(in, big, ncclInt32, prev, comm, NULL));
  NCCLOK(ncclGroupEnd());
  for (size_t i = 0; i < big; i++)
    CHECK(in[i] == (int32_t)(prev * 1000003 + i), "ring element %zu: got %d", i, in[i]);

  /* all pairs, receives posted before sends this time */
  for (int q = 0; q < n; q++)
    for (size_t i = 0; i < big; i++) out[q * big + i] = (int32_t)(rank * 100 + q + (int32_t)i * 7);
  memset(in, 0, big * 4 * n);
  NCCLOK(ncclGroupStart());
  for (int q = 0; q < n; q++) NCCLOK(ncclRecv(in + q * big, big, ncclInt32, q, comm, NULL));
  for (int q = 0; q < n; q++) NCCLOK(ncclSend(out + q * big, big, ncclInt32, q, comm, NULL));
  NCCLOK(ncclGroupEnd());
  for (int q = 0; q < n; q++)
    for (size_t i = 0; i < big; i++)
      CHECK(in[q * big + i] == (int32_t)(q * 100 + rank + (int32_t)i * 7),
            "pairs: from %d element %zu: got %d", q, i, in[q * big + i]);

  /* collectives inside a group run in order with the sends around them */
  float x = (float)rank, sum = -1;
  NCCLOK(ncclGroupStart());
  NCCLOK(ncclAllReduce(&x, &sum, 1, ncclFloat32, ncclSum, comm, NULL));
  NCCLOK(ncclSend(out, 3, ncclInt32, next, comm, NULL));
  NCCLOK(ncclRecv(in, 3, ncclInt32, prev, comm, NULL));
  NCCLOK(ncclGroupEnd());
  CHECK(sum == (float)(n * (n - 1) / 2), "grouped allreduce: got %g", sum);
  for (int i = 0; i < 3; i++)
    CHECK(in[i] == (int32_t)(prev * 100 + i * 7), "grouped send %d: got %d", i, in[i]);
  free(out);
  free(in);
}

static void split(ncclComm_t comm, int rank, int n) {
  /* Rank 0 takes no part where there are 3 or more; the others split by
   * parity, ordered by descending rank (key = -rank). */
  int color = (rank == 0 && n > 2) ? NCCL_SPLIT_NOCOLOR : rank % 2;
  ncclComm_t sub = (ncclComm_t)(uintptr_t)1;
  NCCLOK(ncclCommSplit(comm, color, -rank, &sub, NULL));
  if (color == NCCL_SPLIT_NOCOLOR) {
    CHECK(sub == NULL, "NOCOLOR gave a communicator");
    return;
  }
  int members[4], m = 0;
  for (int q = n - 1; q >= 0; q--)
    if (!(q == 0 && n > 2) && q % 2 == color) members[m++] = q;
  int count = -1, me = -1;
  NCCLOK(ncclCommCount(sub, &count));
  NCCLOK(ncclCommUserRank(sub, &me));
  CHECK(count == m, "split: %d members, want %d", count, m);
  CHECK(members[me] == rank, "split: rank %d became %d", rank, me);
  int64_t v = rank, total = 0, want = 0;
  for (int i = 0; i < m; i++) want += members[i];
  NCCLOK(ncclAllReduce(&v, &total, 1, ncclInt64, ncclSum, sub, NULL));
  CHECK(total == want, "split allreduce: got %lld want %lld", (long long)total, (long long)want);
  NCCLOK(ncclCommDestroy(sub));
  CHECK(ncclAllReduce(&v, &total, 1, ncclInt64, ncclSum, sub, NULL) == ncclInvalidUsage,
        "a call on a destroyed comm was not refused");
}

static ncclComm_t join(int rank, int n, const char* dir) {
  ncclUniqueId id;
  share_id(&id, rank, dir);
  ncclComm_t comm = NULL;
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  config.commName = "abi-test";
  NCCLOK(ncclCommInitRankConfig(&comm, n, id, rank, &config));
  int count = -1, me = -1, dev = -2;
  NCCLOK(ncclCommCount(comm, &count));
  NCCLOK(ncclCommUserRank(comm, &me));
  NCCLOK(ncclCommCuDevice(comm, &dev));
  CHECK(count == n && me == rank, "count %d rank %d", count, me);
  return comm;
}

static int collectives(int rank, int n, const char* dir) {
  ncclComm_t comm = join(rank, n, dir);
  reductions(comm, rank, n);
  movements(comm, rank, n);
  point_to_point(comm, rank, n);
  split(comm, rank, n);
  ncclResult_t async = ncclInternalError;
  NCCLOK(ncclCommGetAsyncError(comm, &async));
  CHECK(async == ncclSuccess, "async error %d on a healthy comm", async);
  NCCLOK(ncclCommFinalize(comm));
  NCCLOK(ncclCommDestroy(comm));
  CHECK(ncclCommDestroy(comm) == ncclInvalidUsage, "a second destroy was not refused");
  printf("rank %d of %d: collectives OK\n", rank, n);
  return 0;
}

static int peerdeath(int rank, int n, const char* dir) {
  ncclComm_t comm = join(rank, n, dir);
  float x = 1, y = 0;
  NCCLOK(ncclAllReduce(&x, &y, 1, ncclFloat32, ncclSum, comm, NULL));
  CHECK(y == (float)n, "allreduce before the death: got %g", y);
  if (rank == n - 1) {
    raise(SIGKILL); /* dies as a crashed process does: no goodbye */
  }
  /* Poll as PyTorch's watchdog does: never blocks, must turn to an error
   * (the bound only ends a broken run; FERROCCL_TIMEOUT is far shorter). */
  ncclResult_t async = ncclSuccess;
  for (int i = 0; i < 6000 && async == ncclSuccess; i++) {
    NCCLOK(ncclCommGetAsyncError(comm, &async));
    if (async == ncclSuccess) usleep(10000);
  }
  CHECK(async != ncclSuccess && async != ncclInProgress, "no async error after the peer died");
  const char* why = ncclGetLastError(comm);
  printf("rank %d: async error %d (%s): %s\n", rank, async, ncclGetErrorString(async), why);
  CHECK(strstr(why, "rank") != NULL, "the message names no rank: %s", why);
  /* A later call fails instead of hanging. */
  ncclResult_t r = ncclAllReduce(&x, &y, 1, ncclFloat32, ncclSum, comm, NULL);
  CHECK(r != ncclSuccess, "allreduce after the death succeeded");
  /* The survivors go on without the dead rank (NCCL 2.27's recovery). */
  int dead = n - 1, shrunk_n = 0, shrunk_rank = -1;
  ncclComm_t shrunk = NULL;
  NCCLOK(ncclCommShrink(comm, &dead, 1, &shrunk, NULL, NCCL_SHRINK_ABORT));
  NCCLOK(ncclCommCount(shrunk, &shrunk_n));
  NCCLOK(ncclCommUserRank(shrunk, &shrunk_rank));
  CHECK(shrunk_n == n - 1 && shrunk_rank == rank, "shrunk to rank %d of %d", shrunk_rank, shrunk_n);
  x = (float)(rank + 1);
  NCCLOK(ncclAllReduce(&x, &y, 1, ncclFloat32, ncclSum, shrunk, NULL));
  CHECK(y == (float)((n - 1) * n / 2), "allreduce on the shrunken comm: got %g", y);
  NCCLOK(ncclCommAbort(comm));
  NCCLOK(ncclCommDestroy(shrunk));
  printf("rank %d: peer death seen, OK\n", rank);
  return 0;
}

/* Rank 0 of 2 alone: its init must end with an error within
 * FERROCCL_TIMEOUT, not wait forever. (The library's message names the
 * rendezvous key of the missing rank, not the rank in words.) */
static int lonely(void) {
  ncclUniqueId id;
  NCCLOK(ncclGetUniqueId(&id));
  ncclComm_t comm = NULL;
  ncclResult_t r = ncclCommInitRank(&comm, 2, id, 0);
  const char* why = ncclGetLastError(NULL);
  printf("init alone: %d (%s): %s\n", r, ncclGetErrorString(r), why);
  CHECK(r != ncclSuccess && comm == NULL, "init without its peer returned %d", r);
  CHECK(strstr(why, "timed out") != NULL, "the message says no timeout: %s", why);
  printf("lonely OK\n");
  return 0;
}

static void expect_code(ncclResult_t got, ncclResult_t want, const char* needle, const char* what) {
  const char* msg = ncclGetLastError(NULL);
  CHECK(got == want, "%s: returned %d, want %d (%s)", what, got, want, msg);
  CHECK(strstr(msg, needle) != NULL, "%s: message '%s' does not mention '%s'", what, msg, needle);
  /* It names its entry point once, first ("ncclX: ..."). */
  const char* colon = strchr(msg, ':');
  CHECK(strncmp(msg, "nccl", 4) == 0 && colon != NULL, "%s: message '%s' names no entry point", what, msg);
  char entry[128];
  size_t len = (size_t)(colon - msg) + 1;
  CHECK(len < sizeof entry, "%s: message '%s'", what, msg);
  memcpy(entry, msg, len);
  entry[len] = '\0';
  CHECK(strstr(colon + 1, entry) == NULL, "%s: message '%s' names %s twice", what, msg, entry);
}

static int errors(const char* dir) {
  int version = 0;
  NCCLOK(ncclGetVersion(&version));
  CHECK(version == NCCL_VERSION_CODE, "version %d, header %d", version, NCCL_VERSION_CODE);
  ncclUniqueId id;
  NCCLOK(ncclGetUniqueId(&id));
  ncclComm_t comm = NULL;

  /* the config's header */
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.size = 12;
  expect_code(ncclCommInitRankConfig(&comm, 1, id, 0, &config), ncclInvalidArgument, "size", "config size 12");
  config.size = sizeof(ncclConfig_t) + 4;
  expect_code(ncclCommInitRankConfig(&comm, 1, id, 0, &config), ncclInvalidArgument, "size", "config size odd");
  config.size = sizeof(ncclConfig_t);
  config.magic = 0xdeadbeef;
  expect_code(ncclCommInitRankConfig(&comm, 1, id, 0, &config), ncclInvalidArgument, "magic", "config magic");
  config.magic = NCCL_API_MAGIC;
  config.version = 100;
  expect_code(ncclCommInitRankConfig(&comm, 1, id, 0, &config), ncclInvalidArgument, "version", "config version");
  config.version = NCCL_VERSION_CODE;
  expect_code(ncclCommInitRankConfig(&comm, 2, id, 2, &config), ncclInvalidArgument, "rank 2", "rank out of range");
  expect_code(ncclCommInitRank(NULL, 1, id, 0), ncclInvalidArgument, "comm", "NULL comm pointer");
  ncclUniqueId foreign;
  memset(&foreign, 0x5a, sizeof foreign);
  expect_code(ncclCommInitRank(&comm, 1, foreign, 0), ncclInvalidArgument, "ncclGetUniqueId", "foreign id");
  CHECK(comm == NULL, "a refused init wrote a communicator");

  /* ncclCommInitRankScalable: the ids every rank passes alike */
  expect_code(ncclCommInitRankScalable(&comm, 1, 0, 0, &id, NULL), ncclInvalidArgument, "nId 0", "no ids");
  ncclUniqueId ids[2];
  NCCLOK(ncclGetUniqueId(&ids[0]));
  NCCLOK(ncclGetUniqueId(&ids[1]));
  NCCLOK(ncclCommInitRankScalable(&comm, 1, 0, 2, ids, NULL));
  int one = 0;
  NCCLOK(ncclCommCount(comm, &one));
  CHECK(one == 1, "scalable init: %d ranks", one);
  NCCLOK(ncclCommDestroy(comm));

  /* a good one, of one rank */
  NCCLOK(ncclCommInitRankConfig(&comm, 1, id, 0, &config));
  float a[4] = {1, 2, 3, 4}, b[4];
  expect_code(ncclAllReduce(NULL, b, 4, ncclFloat32, ncclSum, comm, NULL), ncclInvalidArgument, "sendbuff", "NULL sendbuff");
  expect_code(ncclAllReduce(a, b, 4, (ncclDataType_t)ncclFloat8e4m3, ncclSum, comm, NULL), ncclInvalidArgument, "ncclFloat8e4m3", "fp8");
  expect_code(ncclAllReduce(a, b, 4, (ncclDataType_t)42, ncclSum, comm, NULL), ncclInvalidArgument, "datatype 42", "bad datatype");
  expect_code(ncclAllReduce(a, b, 4, ncclFloat32, (ncclRedOp_t)7, comm, NULL), ncclInvalidArgument, "op 7", "uncreated op");
  expect_code(ncclAllReduce(a, b, 4, ncclFloat32, (ncclRedOp_t)-3, comm, NULL), ncclInvalidArgument, "op -3", "negative op");
  expect_code(ncclAllReduce(a, a + 1, 2, ncclFloat32, ncclSum, comm, NULL), ncclInvalidArgument, "overlap", "overlap");
  expect_code(ncclAllReduce((char*)a + 1, b, 2, ncclFloat32, ncclSum, comm, NULL), ncclInvalidArgument, "aligned", "misaligned");
  expect_code(ncclAllReduce(a, b, (size_t)-1 / 2, ncclFloat32, ncclSum, comm, NULL), ncclInvalidArgument, "overflow", "huge count");
  expect_code(ncclBroadcast(a, b, 4, ncclFloat32, 1, comm, NULL), ncclInvalidArgument, "root 1", "root out of range");
  expect_code(ncclReduce(a, b, 4, ncclFloat32, ncclSum, -1, comm, NULL), ncclInvalidArgument, "root -1", "negative root");
  expect_code(ncclSend(a, 4, ncclFloat32, 3, comm, NULL), ncclInvalidArgument, "peer 3", "peer out of range");
  expect_code(ncclSend(a, 4, ncclFloat32, 0, comm, NULL), ncclInvalidUsage, "group", "self send outside a group");
  expect_code(ncclAllReduce(a, b, 4, ncclFloat32, ncclSum, NULL, NULL), ncclInvalidArgument, "NULL", "NULL comm");
  ncclRedOp_t op;
  double s = 2;
  expect_code(ncclRedOpCreatePreMulSum(&op, &s, ncclFloat64, (ncclScalarResidence_t)9, comm), ncclInvalidArgument, "residence", "bad residence");
  NCCLOK(ncclRedOpCreatePreMulSum(&op, &s, ncclFloat64, ncclScalarHostImmediate, comm));
  s = 100; /* read at creation: the change must not matter */
  expect_code(ncclAllReduce(a, b, 4, ncclFloat32, op, comm, NULL), ncclInvalidArgument, "created for", "PreMulSum type");
  double d[2] = {1.5, -3}, e[2];
  NCCLOK(ncclAllReduce(d, e, 2, ncclFloat64, op, comm, NULL));
  CHECK(e[0] == 3 && e[1] == -6, "PreMulSum on one rank: %g %g", e[0], e[1]);
  NCCLOK(ncclRedOpDestroy(op, comm));
  expect_code(ncclRedOpDestroy(op, comm), ncclInvalidArgument, "op", "destroyed op");
  expect_code(ncclAllReduce(d, e, 2, ncclFloat64, op, comm, NULL), ncclInvalidArgument, "op", "use of a destroyed op");

  /* one rank: results are the inputs (Avg divides by 1) */
  NCCLOK(ncclAllReduce(a, b, 4, ncclFloat32, ncclAvg, comm, NULL));
  CHECK(b[0] == 1 && b[3] == 4, "one-rank avg");
  NCCLOK(ncclAllReduce(a, b, 0, ncclFloat32, ncclSum, comm, NULL));

  /* groups */
  expect_code(ncclGroupEnd(), ncclInvalidUsage, "ncclGroupStart", "GroupEnd without start");
  NCCLOK(ncclGroupStart());
  NCCLOK(ncclGroupStart());
  NCCLOK(ncclSend(a, 4, ncclFloat32, 0, comm, NULL));
  NCCLOK(ncclGroupEnd());
  memset(b, 0, sizeof b);
  NCCLOK(ncclRecv(b, 4, ncclFloat32, 0, comm, NULL));
  CHECK(b[0] == 0, "a nested group ran before its outermost end");
  NCCLOK(ncclGroupEnd());
  CHECK(b[0] == 1 && b[3] == 4, "self send/recv in a group: %g %g", b[0], b[3]);

  /* shrink: bad arguments are refused; a one-rank communicator shrinks to itself */
  ncclComm_t other = NULL;
  int self_rank = 0, nine = 9;
  expect_code(ncclCommShrink(comm, NULL, -1, &other, NULL, 0), ncclInvalidArgument, "negative", "shrink count");
  expect_code(ncclCommShrink(comm, NULL, 1, &other, NULL, 0), ncclInvalidArgument, "NULL", "shrink list");
  expect_code(ncclCommShrink(comm, &nine, 1, &other, NULL, 0), ncclInvalidArgument, "rank 9", "shrink rank");
  expect_code(ncclCommShrink(comm, NULL, 0, &other, NULL, 7), ncclInvalidArgument, "shrinkFlags", "shrink flags");
  expect_code(ncclCommShrink(comm, &self_rank, 1, &other, NULL, NCCL_SHRINK_DEFAULT), ncclInvalidArgument, "left out", "shrink self");
  NCCLOK(ncclCommShrink(comm, NULL, 0, &other, NULL, NCCL_SHRINK_DEFAULT));
  int shrunk_size = 0;
  NCCLOK(ncclCommCount(other, &shrunk_size));
  CHECK(shrunk_size == 1, "shrunk size %d", shrunk_size);
  NCCLOK(ncclAllReduce(a, b, 4, ncclFloat32, ncclSum, other, NULL));
  CHECK(b[0] == 1 && b[3] == 4, "allreduce on the shrunken communicator");
  NCCLOK(ncclCommDestroy(other));
  other = NULL;

  /* what is not supported says so */
  ncclWindow_t win;
  expect_code(ncclCommWindowRegister(comm, a, sizeof a, &win, 0), ncclInvalidUsage, "not supported", "WindowRegister");
  expect_code(ncclCommWindowDeregister(comm, NULL), ncclInvalidUsage, "not supported", "WindowDeregister");
  expect_code(ncclDevCommCreate(comm, NULL, NULL), ncclInvalidUsage, "not supported", "DevCommCreate");
  expect_code(ncclDevCommDestroy(comm, NULL), ncclInvalidUsage, "not supported", "DevCommDestroy");
  expect_code(ncclCommRevoke(comm, 0), ncclInvalidUsage, "not supported", "CommRevoke");
  expect_code(ncclCommSuspend(comm, 0), ncclInvalidUsage, "not supported", "CommSuspend");
  ncclResetDebugInit();
  expect_code(ncclGather(a, NULL, 4, ncclFloat32, 0, comm, NULL), ncclInvalidArgument, "recvbuff is NULL", "gather without recvbuff");
  expect_code(ncclScatter(a, b, 4, ncclFloat32, 1, comm, NULL), ncclInvalidArgument, "root 1", "scatter root");
  ncclSimInfo_t sim = {sizeof(ncclSimInfo_t), 0x74685283, NCCL_VERSION_CODE, NCCL_UNDEF_FLOAT};
  expect_code(ncclGroupSimulateEnd(&sim), ncclInvalidUsage, "not supported", "GroupSimulateEnd");

  /* memory and registration (host memory without a CUDA device) */
  void* mem = NULL;
  NCCLOK(ncclMemAlloc(&mem, 1000));
  CHECK(mem && ((uintptr_t)mem % 4096) == 0, "ncclMemAlloc gave %p", mem);
  void* handle = NULL;
  NCCLOK(ncclCommRegister(comm, mem, 1000, &handle));
  NCCLOK(ncclCommDeregister(comm, handle));
  expect_code(ncclCommDeregister(comm, handle), ncclInvalidArgument, "registration", "double deregister");
  NCCLOK(ncclMemFree(mem));
  expect_code(ncclMemFree(mem), ncclInvalidArgument, "ncclMemAlloc", "double free");

  for (int c = 0; c < 9; c++) CHECK(ncclGetErrorString((ncclResult_t)c) != NULL, "no string for %d", c);
  NCCLOK(ncclCommDestroy(comm));
  expect_code(ncclCommCount(comm, &version), ncclInvalidUsage, "destroyed", "use after destroy");

  /* ncclCommInitAll: ranks as threads of this process; a grouped call
   * drives them all from this one thread */
  ncclComm_t all[3];
  NCCLOK(ncclCommInitAll(all, 3, NULL));
  float in[3][5], res[3][5];
  NCCLOK(ncclGroupStart());
  for (int r = 0; r < 3; r++) {
    for (int i = 0; i < 5; i++) in[r][i] = (float)(r * 10 + i);
    NCCLOK(ncclAllReduce(in[r], res[r], 5, ncclFloat32, ncclMax, all[r], NULL));
  }
  NCCLOK(ncclGroupEnd());
  for (int r = 0; r < 3; r++)
    for (int i = 0; i < 5; i++) CHECK(res[r][i] == (float)(20 + i), "InitAll max [%d][%d] = %g", r, i, res[r][i]);
  /* Abort one rank: returns at once; the others hear of it through
   * ncclCommGetAsyncError (polled, never blocking), then abort too. */
  NCCLOK(ncclCommAbort(all[0]));
  expect_code(ncclCommAbort(all[0]), ncclInvalidUsage, "aborted", "a second abort");
  for (int r = 1; r < 3; r++) {
    ncclResult_t async = ncclSuccess;
    for (int i = 0; i < 6000 && async == ncclSuccess; i++) {
      NCCLOK(ncclCommGetAsyncError(all[r], &async));
      if (async == ncclSuccess) usleep(10000);
    }
    CHECK(async == ncclRemoteError, "rank %d: async error %d after rank 0 aborted", r, async);
    NCCLOK(ncclCommAbort(all[r]));
  }

  /* ncclCommInitRank for every rank from one thread, inside a group */
  ncclUniqueId gid;
  NCCLOK(ncclGetUniqueId(&gid));
  ncclComm_t grp[2];
  NCCLOK(ncclGroupStart());
  for (int r = 0; r < 2; r++) NCCLOK(ncclCommInitRank(&grp[r], 2, gid, r));
  NCCLOK(ncclGroupEnd());
  int64_t gv[2] = {5, 7}, gr[2];
  NCCLOK(ncclGroupStart());
  for (int r = 0; r < 2; r++) NCCLOK(ncclAllReduce(&gv[r], &gr[r], 1, ncclInt64, ncclProd, grp[r], NULL));
  NCCLOK(ncclGroupEnd());
  CHECK(gr[0] == 35 && gr[1] == 35, "grouped init then prod: %lld %lld", (long long)gr[0], (long long)gr[1]);
  for (int r = 1; r >= 0; r--) NCCLOK(ncclCommDestroy(grp[r]));
  (void)dir;
  printf("errors OK\n");
  return 0;
}

/* ---- symbols and SONAME ---- */

static const char* TORCH_SYMBOLS[] = {
    "ncclAllGather", "ncclAllReduce", "ncclAlltoAll", "ncclBcast", "ncclBroadcast",
    "ncclReduce", "ncclReduceScatter", "ncclSend", "ncclRecv", "ncclCommAbort",
    "ncclCommCount", "ncclCommDeregister", "ncclCommDestroy", "ncclCommFinalize",
    "ncclCommGetAsyncError", "ncclCommInitAll", "ncclCommInitRank", "ncclCommInitRankConfig",
    "ncclCommInitRankScalable", "ncclCommRegister", "ncclCommShrink", "ncclCommSplit",
    "ncclCommUserRank", "ncclCommWindowRegister", "ncclCommWindowDeregister",
    "ncclDevCommCreate", "ncclDevCommDestroy", "ncclGetErrorString", "ncclGetLastError",
    "ncclGetUniqueId", "ncclGetVersion", "ncclGroupStart", "ncclGroupEnd",
    "ncclGroupSimulateEnd", "ncclMemAlloc", "ncclMemFree", "ncclRedOpCreatePreMulSum",
    "ncclRedOpDestroy"};

static int symbols(const char* path) {
  size_t n = sizeof TORCH_SYMBOLS / sizeof *TORCH_SYMBOLS;
  CHECK(n == 38, "the list has %zu symbols", n);
  void* lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  CHECK(lib, "dlopen(%s, RTLD_NOW): %s", path, dlerror());
  for (size_t i = 0; i < n; i++) CHECK(dlsym(lib, TORCH_SYMBOLS[i]), "missing %s", TORCH_SYMBOLS[i]);
  /* nccl-tests' extra needs */
  CHECK(dlsym(lib, "ncclCommCuDevice"), "missing ncclCommCuDevice");
  /* The SONAME, from the loaded object's dynamic section. */
  struct link_map* map = NULL;
  CHECK(dlinfo(lib, RTLD_DI_LINKMAP, &map) == 0 && map, "dlinfo: %s", dlerror());
  const char* strtab = NULL;
  ElfW(Xword) soname = (ElfW(Xword))-1;
  for (ElfW(Dyn)* d = map->l_ld; d->d_tag != DT_NULL; d++) {
    if (d->d_tag == DT_STRTAB) strtab = (const char*)d->d_un.d_ptr;
    if (d->d_tag == DT_SONAME) soname = d->d_un.d_val;
  }
  CHECK(strtab && soname != (ElfW(Xword))-1, "no DT_SONAME in %s", path);
  CHECK(strcmp(strtab + soname, "libnccl.so.2") == 0, "SONAME is %s", strtab + soname);
  /* The entry points work through dlsym too. */
  ncclResult_t (*get_version)(int*) = (ncclResult_t(*)(int*))dlsym(lib, "ncclGetVersion");
  int v = 0;
  CHECK(get_version(&v) == ncclSuccess && v == NCCL_VERSION_CODE, "ncclGetVersion via dlsym: %d", v);
  /* NCCL's profiling aliases: each p-name calls its entry point. */
  char alias[64];
  for (size_t i = 0; i < n; i++) {
    snprintf(alias, sizeof alias, "p%s", TORCH_SYMBOLS[i]);
    CHECK(dlsym(lib, alias), "missing %s", alias);
  }
  ncclResult_t (*p_get_version)(int*) = (ncclResult_t(*)(int*))dlsym(lib, "pncclGetVersion");
  v = 0;
  CHECK(p_get_version(&v) == ncclSuccess && v == NCCL_VERSION_CODE, "pncclGetVersion: %d", v);
  printf("symbols OK: %zu resolve, SONAME %s\n", n, strtab + soname);
  return 0;
}

/* ncclCommSplit inside a group is deferred to ncclGroupEnd, as NCCL's is:
 * one thread splits every rank of ncclCommInitAll (each split is a
 * collective of its parent, so run one at a time they would wait for each
 * other forever), and a split may take a parent initialised in the same
 * group. */
static int groupsplit(void) {
  enum { N = 4 };
  ncclComm_t all[N], sub[N];
  NCCLOK(ncclCommInitAll(all, N, NULL));
  /* Rank 0 takes no part; the others by parity, ordered by descending
   * rank (key -r): color 1 is {3, 1}, color 0 is {2}. */
  NCCLOK(ncclGroupStart());
  expect_code(ncclCommSplit(all[1], -7, 0, &sub[1], NULL), ncclInvalidArgument, "color -7", "bad color in a group");
  for (int r = 0; r < N; r++) {
    sub[r] = (ncclComm_t)(uintptr_t)1;
    NCCLOK(ncclCommSplit(all[r], r == 0 ? NCCL_SPLIT_NOCOLOR : r % 2, -r, &sub[r], NULL));
  }
  CHECK(sub[0] == NULL, "NOCOLOR in a group gave a communicator");
  /* Not made until the group ends: refused by name, and in progress. */
  int count = -1, me = -1;
  expect_code(ncclCommCount(sub[1], &count), ncclInvalidUsage, "ncclGroupEnd", "count of a pending split");
  ncclResult_t async = ncclSuccess;
  NCCLOK(ncclCommGetAsyncError(sub[3], &async));
  CHECK(async == ncclInProgress, "a pending split's async error is %d", async);
  NCCLOK(ncclGroupEnd());
  int want_count[N] = {0, 2, 1, 2}, want_rank[N] = {0, 1, 0, 0};
  for (int r = 1; r < N; r++) {
    NCCLOK(ncclCommCount(sub[r], &count));
    NCCLOK(ncclCommUserRank(sub[r], &me));
    CHECK(count == want_count[r] && me == want_rank[r], "rank %d: split rank %d of %d, want %d of %d", r, me,
          count, want_rank[r], want_count[r]);
  }
  int64_t v[N], total[N];
  NCCLOK(ncclGroupStart());
  for (int r = 1; r < N; r++) {
    v[r] = 10 + r;
    NCCLOK(ncclAllReduce(&v[r], &total[r], 1, ncclInt64, ncclSum, sub[r], NULL));
  }
  NCCLOK(ncclGroupEnd());
  CHECK(total[1] == 24 && total[3] == 24 && total[2] == 12, "split sums %lld %lld %lld", (long long)total[1],
        (long long)total[2], (long long)total[3]);
  /* The parents still work. */
  NCCLOK(ncclGroupStart());
  for (int r = 0; r < N; r++) {
    v[r] = r + 1;
    NCCLOK(ncclAllReduce(&v[r], &total[r], 1, ncclInt64, ncclProd, all[r], NULL));
  }
  NCCLOK(ncclGroupEnd());
  for (int r = 0; r < N; r++) CHECK(total[r] == 24, "parent prod on %d: %lld", r, (long long)total[r]);
  for (int r = N - 1; r >= 1; r--) NCCLOK(ncclCommDestroy(sub[r]));
  for (int r = N - 1; r >= 0; r--) NCCLOK(ncclCommDestroy(all[r]));

  /* Inits and splits of them in one group, two splits of each parent (in
   * issue order on every rank), a NULL config inherited. */
  ncclUniqueId id;
  NCCLOK(ncclGetUniqueId(&id));
  ncclComm_t g[2], same[2], swapped[2];
  NCCLOK(ncclGroupStart());
  for (int r = 0; r < 2; r++) NCCLOK(ncclCommInitRank(&g[r], 2, id, r));
  for (int r = 0; r < 2; r++) NCCLOK(ncclCommSplit(g[r], 0, r, &same[r], NULL));
  for (int r = 0; r < 2; r++) NCCLOK(ncclCommSplit(g[r], 5, -r, &swapped[r], NULL));
  NCCLOK(ncclGroupEnd());
  for (int r = 0; r < 2; r++) {
    NCCLOK(ncclCommUserRank(same[r], &me));
    CHECK(me == r, "same order: rank %d became %d", r, me);
    NCCLOK(ncclCommUserRank(swapped[r], &me));
    CHECK(me == 1 - r, "swapped order: rank %d became %d", r, me);
  }
  /* Gathered by new rank: block k comes from the rank that became k. */
  int32_t mine[2], got[2][2];
  NCCLOK(ncclGroupStart());
  for (int r = 0; r < 2; r++) {
    mine[r] = r;
    NCCLOK(ncclAllGather(&mine[r], got[r], 1, ncclInt32, swapped[r], NULL));
  }
  NCCLOK(ncclGroupEnd());
  for (int r = 0; r < 2; r++)
    CHECK(got[r][0] == 1 && got[r][1] == 0, "swapped allgather on %d: %d %d", r, got[r][0], got[r][1]);
  for (int r = 1; r >= 0; r--) {
    NCCLOK(ncclCommDestroy(swapped[r]));
    NCCLOK(ncclCommDestroy(same[r]));
  }
  for (int r = 1; r >= 0; r--) NCCLOK(ncclCommDestroy(g[r]));
  printf("groupsplit OK\n");
  return 0;
}

int main(int argc, char** argv) {
  setvbuf(stdout, NULL, _IONBF, 0);
  if (argc >= 2 && strcmp(argv[1], "errors") == 0) return errors(argc > 2 ? argv[2] : ".");
  if (argc == 3 && strcmp(argv[1], "symbols") == 0) return symbols(argv[2]);
  if (argc == 2 && strcmp(argv[1], "lonely") == 0) return lonely();
  if (argc == 2 && strcmp(argv[1], "groupsplit") == 0) return groupsplit();
  if (argc == 5) {
    g_rank = atoi(argv[2]);
    int n = atoi(argv[3]);
    if (strcmp(argv[1], "collectives") == 0) return collectives(g_rank, n, argv[4]);
    if (strcmp(argv[1], "peerdeath") == 0) return peerdeath(g_rank, n, argv[4]);
  }
  fprintf(stderr, "usage: abi collectives|peerdeath RANK NRANKS DIR | errors | groupsplit | symbols LIB\n");
  (void)g_failures;
  return 2;
}
