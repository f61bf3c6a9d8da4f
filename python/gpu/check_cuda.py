"""GPU check of the "ferroccl" torch backend's CUDA path: collectives on
CUDA tensors go through the library's raw device entry points on the
tensor's current stream. Run on a machine with a GPU, after
`pip install ./python` (or with the built package on PYTHONPATH):

    python python/gpu/check_cuda.py --ranks 2

It starts the ranks itself (all on cuda:0 unless there are as many GPUs
as ranks), checks every result against a CPU reference, and exits 0 only
if every rank passed. Without a usable GPU it says so and exits 2."""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys


def worker() -> None:
    import torch
    import torch.distributed as dist

    import ferroccl.torch  # noqa: F401

    dist.init_process_group("ferroccl")
    r, n = dist.get_rank(), dist.get_world_size()
    if r == 0:
        # Which face serves the group (ferroccl/_c10d.py): the C++ one hands
        # CUDA tensors to the Python one.
        be = dist.distributed_c10d._get_default_group()
        try:
            be = be._get_backend(torch.device("cuda"))
        except Exception:  # noqa: BLE001 - torch 2.11: the group itself
            pass
        print(f"backend: {type(be).__name__}", flush=True)
    dev = torch.device("cuda", r % torch.cuda.device_count())
    torch.cuda.set_device(dev)

    def val(rank: int, k: int, dtype: torch.dtype) -> torch.Tensor:
        return (torch.arange(k, dtype=torch.float64) % 7 + rank).to(dtype)

    checks = 0
    for dtype in (torch.float32, torch.float16, torch.bfloat16, torch.int32):
        for k in (1, 1000, 1 << 20):
            t = val(r, k, dtype).to(dev)
            # Work on the current stream before the call, as a model would.
            t.mul_(1)
            dist.all_reduce(t)
            want = sum(val(q, k, torch.float64) for q in range(n)).to(dtype)
            assert torch.equal(t.cpu(), want), (r, "all_reduce", dtype, k)
            out = torch.empty(k * n, dtype=dtype, device=dev)
            dist.all_gather_into_tensor(out, val(r, k, dtype).to(dev))
            assert torch.equal(out.cpu(), torch.cat([val(q, k, dtype) for q in range(n)])), (r, "ag", dtype)
            rs = torch.empty(k, dtype=dtype, device=dev)
            full = torch.cat([val(r, k, dtype) for _ in range(n)]).to(dev)
            dist.reduce_scatter_tensor(rs, full)
            assert torch.equal(rs.cpu(), want), (r, "rs", dtype, k)
            b = val(r, k, dtype).to(dev)
            dist.broadcast(b, src=n - 1)
            assert torch.equal(b.cpu(), val(n - 1, k, dtype)), (r, "broadcast", dtype, k)
            checks += 4
    # async on a side stream: the result is visible after wait on it.
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        t = val(r, 4096, torch.float32).to(dev)
        w = dist.all_reduce(t, async_op=True)
        w.wait()
    s.synchronize()
    assert torch.equal(t.cpu(), sum(val(q, 4096, torch.float32) for q in range(n))), (r, "side stream")
    checks += 1
    dist.destroy_process_group()
    print(f"rank {r}/{n}: {checks} CUDA checks passed", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=300)
    a = ap.parse_args()
    try:
        import torch

        if not torch.cuda.is_available():
            print("no CUDA device visible to torch: nothing checked", flush=True)
            return 2
    except ImportError:
        print("torch is not installed: nothing checked", flush=True)
        return 2
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    procs = []
    for rank in range(a.ranks):
        env = dict(
            os.environ,
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
            RANK=str(rank),
            WORLD_SIZE=str(a.ranks),
            LOCAL_RANK=str(rank),
            FERROCCL_CHECK_CUDA_WORKER="1",
        )
        procs.append(subprocess.Popen([sys.executable, __file__], env=env))
    codes = []
    for p in procs:
        try:
            codes.append(p.wait(timeout=a.timeout))
        except subprocess.TimeoutExpired:
            p.kill()
            codes.append(None)
    print(f"exit codes: {codes}", flush=True)
    return 0 if all(c == 0 for c in codes) else 1


if __name__ == "__main__":
    if os.environ.get("FERROCCL_CHECK_CUDA_WORKER") == "1":
        worker()
    else:
        sys.exit(main())
