"""The six collectives of docs/performance.md's first table through
PyTorch's Gloo backend, timed as bench/peers/mpi_coll.c times an MPI
library, for bench/peers.sh.

    python gloo_coll.py N OP MINBYTES MAXBYTES [FACTOR]

Spawns N local processes. Sizes are nccl-tests sizes (the whole gathered
array for allgather and reduce-scatter, a rank's whole send buffer for
all-to-all); f32 sum, root 0; each size runs 5 untimed calls, then at
least 20 timed calls and at least about 50 ms of them, and prints the
slowest rank's mean time per call: SIZE TIME_US.
"""

import socket
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

OPS = ("allreduce", "allgather", "reducescatter", "broadcast", "reduce", "alltoall")


def caller(op, n, rank, count):
    """A function that runs one call of `op` on `count` floats in all."""
    per = count // n
    src = torch.full((count,), float(rank + 1))
    out = torch.empty(count)
    if op == "allreduce":
        return lambda: dist.all_reduce(src)
    if op == "allgather":
        mine = torch.full((per,), float(rank + 1))
        return lambda: dist.all_gather_into_tensor(out, mine)
    if op == "reducescatter":
        block = torch.empty(per)
        return lambda: dist.reduce_scatter_tensor(block, src)
    if op == "broadcast":
        return lambda: dist.broadcast(src, 0)
    if op == "alltoall":
        return lambda: dist.all_to_all_single(out, src)
    return lambda: dist.reduce(src, 0)


def timed(run, k):
    """The slowest rank's mean seconds per call over `k` calls."""
    dist.barrier()
    start = time.perf_counter()
    for _ in range(k):
        run()
    t = torch.tensor([(time.perf_counter() - start) / k], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item()


def worker(rank, n, op, sizes, port):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=n)
    if rank == 0:
        print(f"# gloo_coll {op} n={n}\n#{'bytes':>12} {'time_us':>10}", flush=True)
    for nbytes in sizes:
        run = caller(op, n, rank, nbytes // 4)
        for _ in range(5):
            run()
        trial = timed(run, 3)
        k = 20 if trial <= 0 else min(20000, max(20, int(0.05 / trial)))
        t = timed(run, k)
        if rank == 0:
            print(f"{nbytes:13d} {t * 1e6:10.2f}", flush=True)
    dist.destroy_process_group()


def main():
    if len(sys.argv) < 5 or sys.argv[2] not in OPS:
        sys.exit(f"usage: gloo_coll.py N {'|'.join(OPS)} MINBYTES MAXBYTES [FACTOR]")
    n, op = int(sys.argv[1]), sys.argv[2]
    minb, maxb = int(sys.argv[3]), int(sys.argv[4])
    factor = max(2, int(sys.argv[5])) if len(sys.argv) > 5 else 4
    # Whole floats, for allgather, reduce-scatter and all-to-all whole
    # floats a rank (as ferroccl-perf rounds).
    unit = 4 * n if op in ("allgather", "reducescatter", "alltoall") else 4
    sizes, want = [], minb
    while want <= maxb:
        sizes.append(-(-want // unit) * unit)
        want *= factor
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(worker, args=(n, op, sizes, port), nprocs=n)


if __name__ == "__main__":
    main()
