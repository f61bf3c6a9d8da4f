"""What one small call through torch.distributed costs before any data
moves: the floor any backend pays, against ferroccl's.

One process, a group of one, an 8-byte allreduce, timed many times:

- ``fake``: torch's own C++ no-op backend (``FakeProcessGroup``): torch's
  Python front end and dispatcher down to a C++ backend that does nothing;
- ``pynull``: a Python subclass of c10d's ``Backend`` whose allreduce returns
  a finished ``Work`` at once: the same, down to a Python backend;
- ``gloo``: Gloo on one rank;
- ``ferroccl``: the "ferroccl" backend on one rank (its C++ face, where
  it is built: ferroccl/_c10d.py);
- ``ferroccl-py``: the same with FERROCCL_TORCH_BACKEND=python (the Python
  backend alone);
- ``direct``: ``ferroccl.Communicator.all_reduce`` without torch.

Run each mode in a fresh process (one default group per process):

    python bench/torch/floor.py            # every mode, one line each
    python bench/torch/floor.py ferroccl   # one mode
    FLOOR_EVICT_BYTES=1048576 python bench/torch/floor.py   # each call after a 1 MiB copy

With FLOOR_EVICT_BYTES each call follows a copy of that many bytes (what
a large collective does to the caches before the next call), and the
line is the call's time beyond the copy's: torch's front end with cold
caches (``fake``) is the floor a backend cannot go under there.

``ferroccl-perf`` does the same call in 0.2-0.3 us on 2 ranks; what a
backend adds over it is at least the ``fake`` line.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from typing import Any, Callable, Tuple

MODES = ("fake", "pynull", "gloo", "ferroccl", "ferroccl-py", "direct")


def _time(fn: Callable[[], Any], iters: int) -> float:
    for _ in range(iters // 10):
        fn()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    return (time.perf_counter() - t0) / iters * 1e6


def _null_backend() -> None:
    import torch.distributed as dist
    from torch._C._distributed_c10d import Backend, Work

    class Done(Work):
        def wait(self, timeout: Any = None) -> bool:
            return True

        def is_completed(self) -> bool:
            return True

    class Null(Backend):
        def __init__(self, store: Any, rank: int, size: int, timeout: Any) -> None:
            super().__init__(rank, size)

        def allreduce(self, tensors: Any, opts: Any = None) -> Work:
            return Done()

        def _get_backend_name(self) -> str:
            return "pynull"

    dist.Backend.register_backend("pynull", Null, devices=["cpu"])
    recording = getattr(dist.distributed_c10d, "_FR_SELF_RECORDING_BACKENDS", None)
    if isinstance(recording, set):
        recording.add("pynull")
    dist.init_process_group("pynull", store=dist.HashStore(), rank=0, world_size=1)


def one(mode: str, iters: int) -> str:
    import torch
    import torch.distributed as dist

    t = torch.ones(2)
    if mode == "direct":
        import socket

        import ferroccl

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        c = ferroccl.Communicator.init(0, 1, "127.0.0.1", port, ferroccl.random_token(), None)
        us, after = _timed_call(lambda: c.all_reduce(t, op="sum", async_op=True).wait(), iters)
        c.destroy()
        return f"{mode:11s} {us:7.2f} us  ferroccl.Communicator.all_reduce, async, wait{after}"
    if mode == "fake":
        from torch.testing._internal.distributed.fake_pg import FakeStore

        dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=1)
    elif mode == "pynull":
        _null_backend()
    else:
        backend = mode
        if mode.startswith("ferroccl"):
            if mode == "ferroccl-py":
                os.environ["FERROCCL_TORCH_BACKEND"] = "python"
            import ferroccl.torch  # noqa: F401 - registers the backend

            backend = "ferroccl"
        store = dist.HashStore()
        dist.init_process_group(backend, store=store, rank=0, world_size=1)
    us, after = _timed_call(lambda: dist.all_reduce(t, async_op=True).wait(), iters)
    dist.destroy_process_group()
    return f"{mode:11s} {us:7.2f} us  dist.all_reduce(8 B, async_op=True).wait(){after}"


def _timed_call(call: Callable[[], Any], iters: int) -> Tuple[float, str]:
    """The call's time; with FLOOR_EVICT_BYTES=N, its time after a copy of
    N bytes that leaves the caches to the copy (as a large collective does
    before the next call): the copy and the call, less the copy alone,
    timed in turns."""
    evict = int(os.environ.get("FLOOR_EVICT_BYTES", "0"))
    if evict <= 0:
        return _time(call, iters), ""
    import torch

    a = torch.ones(max(1, evict // 4))
    b = torch.empty_like(a)
    iters = max(200, iters // 20)
    copy_only, both = [], []
    for _ in range(5):
        copy_only.append(_time(lambda: b.copy_(a), iters))
        both.append(_time(lambda: (b.copy_(a), call()), iters))
    copy_only.sort()
    both.sort()
    return both[2] - copy_only[2], f", after a {evict} B copy (copy alone {copy_only[2]:.1f} us)"


def main() -> None:
    iters = int(os.environ.get("FLOOR_ITERS", "20000"))
    if len(sys.argv) > 1:
        print(one(sys.argv[1], iters), flush=True)
        return
    for mode in MODES:
        subprocess.run([sys.executable, __file__, mode], check=True)


if __name__ == "__main__":
    main()
