/* The six collectives of docs/performance.md's first table, timed through
 * an MPI library the way ferroccl-perf times ferroccl, for bench/peers.sh.
 *
 *   mpirun -n N mpi_coll OP MINBYTES MAXBYTES [FACTOR]
 *   OP: allreduce | allgather | reducescatter | broadcast | reduce | alltoall
 *
 * Sizes are nccl-tests sizes (what ferroccl-perf prints): the whole
 * gathered array for allgather and reduce-scatter, a rank's whole send
 * buffer for all-to-all (SIZE / N bytes to each rank), the buffer otherwise.
 * f32 sum, out of place (broadcast: in place, as MPI_Bcast is), root 0.
 * Each size runs 5 untimed calls, then at least 20 timed calls and at least
 * about 50 ms of them (the count agreed by all ranks from 3 trial calls),
 * and prints the slowest rank's mean time per call:
 *
 *   SIZE TIME_US
 *
 * With MPI_COLL_BARRIER=1 in the environment every call is followed by an
 * MPI_Barrier: a broadcast or reduce that returns only once every rank has
 * reached it, as ferroccl's do (to measure what that agreement costs).
 *
 * With MPI_COLL_FRESH=1 every timed call is preceded, untimed, by what a
 * training step does between collectives: the whole output read, the input
 * rewritten, then an MPI_Barrier; each call is timed alone (ferroccl-perf
 * --fresh 1). Back to back on the same buffers, a call finds what the last
 * one left in the caches.
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum op { ALLREDUCE, ALLGATHER, REDUCESCATTER, BROADCAST, REDUCE, ALLTOALL };

static int parse_op(const char *s) {
    static const char *names[] = {"allreduce", "allgather", "reducescatter", "broadcast", "reduce", "alltoall"};
    for (int i = 0; i < 6; i++)
        if (!strcmp(s, names[i])) return i;
    return -1;
}

static int barrier_after, fresh;
static volatile float sink;

/* One call of `op` moving `bytes` (nccl-tests size) among `n` ranks. */
static void call(int op, float *in, float *out, size_t bytes, int n) {
    int count = (int)(bytes / sizeof(float));
    switch (op) {
    case ALLREDUCE:
        MPI_Allreduce(in, out, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        break;
    case ALLGATHER:
        MPI_Allgather(in, count / n, MPI_FLOAT, out, count / n, MPI_FLOAT, MPI_COMM_WORLD);
        break;
    case REDUCESCATTER:
        MPI_Reduce_scatter_block(in, out, count / n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        break;
    case BROADCAST:
        MPI_Bcast(in, count, MPI_FLOAT, 0, MPI_COMM_WORLD);
        break;
    case REDUCE:
        MPI_Reduce(in, out, count, MPI_FLOAT, MPI_SUM, 0, MPI_COMM_WORLD);
        break;
    case ALLTOALL:
        MPI_Alltoall(in, count / n, MPI_FLOAT, out, count / n, MPI_FLOAT, MPI_COMM_WORLD);
        break;
    }
    if (barrier_after) MPI_Barrier(MPI_COMM_WORLD);
}

/* The slowest rank's mean seconds per call over `k` calls. */
static double timed(int op, float *in, float *out, size_t bytes, int n, int k) {
    double mine, slowest;
    if (fresh) {
        int rank;
        MPI_Comm_rank(MPI_COMM_WORLD, &rank);
        /* The input of the call: a broadcast's is its (in-place) buffer. */
        size_t in_n = bytes / sizeof(float), out_n = in_n;
        if (op == ALLGATHER) in_n /= (size_t)n;
        if (op == REDUCESCATTER) out_n /= (size_t)n;
        double sum = 0;
        for (int i = 0; i < k; i++) {
            float acc = 0;
            for (size_t j = 0; j < out_n; j++) acc += out[j];
            for (size_t j = 0; j < in_n; j++) in[j] = (float)(rank + 1);
            sink += acc;
            MPI_Barrier(MPI_COMM_WORLD);
            double t0 = MPI_Wtime();
            call(op, in, out, bytes, n);
            sum += MPI_Wtime() - t0;
        }
        mine = sum / k;
    } else {
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = MPI_Wtime();
        for (int i = 0; i < k; i++) call(op, in, out, bytes, n);
        mine = (MPI_Wtime() - t0) / k;
    }
    MPI_Allreduce(&mine, &slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    return slowest;
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank, n;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    const char *sync = getenv("MPI_COLL_BARRIER");
    barrier_after = sync && !strcmp(sync, "1");
    const char *touch = getenv("MPI_COLL_FRESH");
    fresh = touch && !strcmp(touch, "1");
    int op = argc > 1 ? parse_op(argv[1]) : -1;
    if (op < 0 || argc < 4) {
        if (rank == 0)
            fprintf(stderr, "usage: mpi_coll allreduce|allgather|reducescatter|broadcast|reduce|alltoall "
                            "MINBYTES MAXBYTES [FACTOR]\n");
        MPI_Finalize();
        return 2;
    }
    size_t minb = strtoull(argv[2], 0, 10), maxb = strtoull(argv[3], 0, 10);
    size_t factor = argc > 4 ? strtoull(argv[4], 0, 10) : 4;
    if (factor < 2) factor = 2;
    /* Every size rounds up to whole floats, for allgather, reduce-scatter
     * and all-to-all to whole floats a rank (as ferroccl-perf rounds). */
    size_t unit =
        sizeof(float) * ((op == ALLGATHER || op == REDUCESCATTER || op == ALLTOALL) ? (size_t)n : 1);
    float *in = malloc(maxb + unit), *out = malloc(maxb + unit);
    if (!in || !out) {
        fprintf(stderr, "mpi_coll: out of memory for %zu bytes\n", maxb);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    for (size_t i = 0; i < (maxb + unit) / sizeof(float); i++) {
        in[i] = (float)(rank + 1);
        out[i] = 0.0f;
    }
    if (rank == 0) printf("# mpi_coll %s n=%d\n#%12s %10s\n", argv[1], n, "bytes", "time_us");
    for (size_t want = minb; want <= maxb; want *= factor) {
        size_t bytes = (want + unit - 1) / unit * unit;
        for (int w = 0; w < 5; w++) call(op, in, out, bytes, n);
        double trial = timed(op, in, out, bytes, n, 3);
        int k = 20;
        if (trial > 0 && 0.05 / trial > k) k = (int)(0.05 / trial);
        if (k > 20000) k = 20000;
        double t = timed(op, in, out, bytes, n, k);
        if (rank == 0) printf("%13zu %10.2f\n", bytes, t * 1e6);
        fflush(stdout);
    }
    free(in);
    free(out);
    MPI_Finalize();
    return 0;
}
