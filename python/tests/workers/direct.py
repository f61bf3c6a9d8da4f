"""The package without its torch backend: `ferroccl.Communicator` on torch
tensors and numpy arrays in a process that never imports `ferroccl.torch`
(the tensor path loads its type table on first use; an earlier version
found None there in such a process). Checked against references each rank
computes alone."""

from __future__ import annotations

import gc
import sys
import threading
import weakref

import numpy as np
import torch

import ferroccl

assert "ferroccl.torch" not in sys.modules, "this check needs a process without the backend"
comm = ferroccl.Communicator.from_env()
R, N = comm.rank, comm.size

# A torch tensor, in place, blocking.
t = torch.arange(5, dtype=torch.float64) * (R + 1)
comm.all_reduce(t)
want = torch.arange(5, dtype=torch.float64) * sum(r + 1 for r in range(N))
assert torch.equal(t, want), (t, want)

# Out of place, async, another type.
src = torch.full((3,), R + 2, dtype=torch.int32)
dst = torch.empty(3, dtype=torch.int32)
comm.all_reduce(src, dst, op="max", async_op=True).wait()
assert torch.equal(dst, torch.full((3,), N + 1, dtype=torch.int32)), dst

# A gather of tensors, and a numpy array.
g = torch.empty(2 * N, dtype=torch.bfloat16)
comm.all_gather(torch.tensor([R, -R], dtype=torch.bfloat16), g)
assert g.tolist() == [float(v) for r in range(N) for v in (r, -r)], g
a = np.full(4, R + 1, dtype=np.float32)
comm.all_reduce(a, op="prod")
assert (a == float(np.prod([r + 1 for r in range(N)]))).all(), a


# A queued call holds its buffer's owner until it ends, even after the
# caller drops both the Work and the buffer: the worker is held in a
# callback, so the call below waits in the queue while this checks.
class Owned(bytearray):
    """A buffer that can be watched through a weak reference."""


gate = threading.Event()
comm.enqueue_callback(gate.wait)
b = Owned(np.full(1024, R + 1, dtype=np.uint8).tobytes())
watch = weakref.ref(b)
w = comm.all_reduce(b, op="max", async_op=True)
del w, b
gc.collect()
assert watch() is not None, "a queued call's buffer was freed while the call waited"
held = watch()
gate.set()
comm.barrier()
assert held is not None and bytes(held) == bytes([N]) * 1024, "the kept buffer's result"

comm.destroy()
print(f"rank {R}: direct checks passed", flush=True)
