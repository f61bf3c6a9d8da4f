"""A 2-rank allreduce and allgather through the package on torch tensors
that are 64-byte aligned (torch's allocator) or at 16 mod 64 (where glibc's
large mallocs land), same communicator, in turns: what the alignment of a
user's buffer costs the slot copies and the reductions
(docs/performance-log.md, "Buffer alignment").

    ferroccl-run -n 2 -- python bench/bound/align_torch.py
"""

from __future__ import annotations

import time
from typing import Callable

import numpy as np
import torch

import ferroccl

comm = ferroccl.Communicator.from_env()


def timed(fn: Callable[[], object], iters: int) -> float:
    """The slowest rank's mean time of `fn`, in microseconds."""
    for _ in range(iters // 10 + 2):
        fn()
    comm.barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    t = np.array([(time.perf_counter() - t0) / iters])
    comm.all_reduce(t, op="max")
    return float(t[0]) * 1e6


def offset(n: int, floats: int) -> torch.Tensor:
    """`n` floats starting `floats` elements into a fresh tensor."""
    return torch.ones(n + 64)[floats : floats + n]


def row(size: int) -> str:
    n = size // 4
    iters = max(200, min(3000, int(4e8 // size)))
    a0, a16 = offset(n, 0), offset(n, 4)
    o0, o16 = offset(2 * n, 0), offset(2 * n, 4)
    r = [
        timed(lambda: comm.all_reduce(a0), iters),
        timed(lambda: comm.all_reduce(a16), iters),
        timed(lambda: comm.all_gather(a0, o0), iters),
        timed(lambda: comm.all_gather(a16, o16), iters),
    ]
    where = " ".join(str(x.data_ptr() % 64) for x in (a0, a16, o0, o16))
    return (
        f"{size:>7} allreduce in place: 64-aligned {r[0]:6.2f} us, 16 mod 64 {r[1]:6.2f} | "
        f"allgather out of place: {r[2]:6.2f}, {r[3]:6.2f}  (addr%64 {where})"
    )


for size in (131072, 524288):
    for _ in range(3):
        line = row(size)
        if comm.rank == 0:
            print(line, flush=True)
comm.destroy()
