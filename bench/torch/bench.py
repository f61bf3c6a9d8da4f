"""torch.distributed on ferroccl against Gloo, side by side in one run:
allreduce, all_gather_into_tensor and reduce_scatter_tensor from 8 B to
64 MiB through torch (and the same sizes through ferroccl-perf, the
library without the binding), then a DDP training step of a small
transformer (~25M parameters) and a small CNN on each backend.

    python bench/torch/bench.py --ranks 2 --perf target/release/ferroccl-perf
    python bench/torch/bench.py --ranks 2 --no-ddp --rounds 3   # in turns

With --rounds R the torch run and the ferroccl-perf run alternate R
times and each cell is the median over rounds: the binding's added cost
("added us": torch's time less ferroccl-perf's, allreduce in place on
both sides) is then read from runs minutes apart at most, not a run
before and a run after.

Needs the package importable (pip install ./python, or PYTHONPATH at a
folder holding ferroccl/ with the built extension). Sizes are the whole
tensor, as nccl-tests counts them (allgather: the output; reduce-scatter:
the input). Each time is the slowest rank's mean over the timed
iterations. Prints a table and writes JSON (--out).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time

COLLS = ("allreduce", "allgather", "reducescatter")


def sizes(lo: int, hi: int) -> list:
    out, s = [], lo
    while s <= hi:
        out.append(s)
        s *= 8 if s < 64 * 1024 else 4
    return out


def iterations(size: int) -> int:
    """Calls timed at `size` bytes, the same for torch and ferroccl-perf:
    about 200 MB moved, between 20 and 200 calls. With fewer (the first
    version moved 20 MB, 3-5 calls from 4 MiB up), how far apart the
    ranks leave the barrier before the loop weighs on every call's time."""
    return max(20, min(200, int(2e8 // max(size, 1))))


def worker(args: argparse.Namespace) -> None:
    if args.bind:
        # As ferroccl-run pins ferroccl-perf's ranks (`--bind-to share`):
        # rank r to an equal share of the CPUs, before any thread starts.
        cpus = sorted(os.sched_getaffinity(0))
        per = max(1, len(cpus) // args.ranks)
        r = int(os.environ["RANK"])
        start = (r * per) % len(cpus)
        os.sched_setaffinity(0, cpus[start : start + per])
    import torch
    import torch.distributed as dist

    import ferroccl.torch  # noqa: F401

    dist.init_process_group("ferroccl")
    r, n = dist.get_rank(), dist.get_world_size()
    gloo = dist.new_group(backend="gloo")
    ferro = dist.new_group(backend="ferroccl")
    groups = {"ferroccl": ferro, "gloo": gloo}
    if args.python_backend:
        # The same backend without its C++ face (ferroccl/_c10d.py): the
        # variable is read when a group is made.
        before = os.environ.get("FERROCCL_TORCH_BACKEND")
        os.environ["FERROCCL_TORCH_BACKEND"] = "python"
        groups["python"] = dist.new_group(backend="ferroccl")
        if before is None:
            del os.environ["FERROCCL_TORCH_BACKEND"]
        else:
            os.environ["FERROCCL_TORCH_BACKEND"] = before
        if args.python_first:
            # Its runs before the C++ face's (order effects show as a swap).
            groups = {"python": groups["python"], "ferroccl": ferro, "gloo": gloo}
    res: dict = {"colls": {}, "ddp": {}}

    def slowest(x: float) -> float:
        t = torch.tensor([x], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=gloo)
        return t.item()

    def timed(fn, size: int) -> float:
        iters = iterations(size)
        for _ in range(max(2, iters // 10)):
            fn()
        dist.barrier(group=gloo)
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        return slowest((time.perf_counter() - t0) / iters)

    for coll in COLLS:
        for size in sizes(args.min_bytes, args.max_bytes):
            count = max(size // 4, n) // n * n
            row = {}
            for name, g in groups.items():
                if coll == "allreduce":
                    t = torch.ones(count)

                    def fn(t=t, g=g):
                        dist.all_reduce(t, group=g)

                elif coll == "allgather":
                    i, o = torch.ones(count // n), torch.empty(count)

                    def fn(i=i, o=o, g=g):
                        dist.all_gather_into_tensor(o, i, group=g)

                else:
                    i, o = torch.ones(count), torch.empty(count // n)

                    def fn(i=i, o=o, g=g):
                        dist.reduce_scatter_tensor(o, i, group=g)

                row[name] = timed(fn, size) * 1e6
            res["colls"].setdefault(coll, {})[size] = row
            if r == 0:
                print(
                    f"{coll:14s} {size:>10d} B  ferroccl {row['ferroccl']:10.1f} us  "
                    f"gloo {row['gloo']:10.1f} us",
                    flush=True,
                )

    if args.ddp:
        import torch.nn as nn
        from torch.nn.parallel import DistributedDataParallel as DDP

        def transformer() -> nn.Module:
            layer = nn.TransformerEncoderLayer(512, 8, 2048, batch_first=True, dropout=0.0)
            return nn.TransformerEncoder(layer, 8)

        def cnn() -> nn.Module:
            return nn.Sequential(
                nn.Conv2d(3, 32, 3, padding=1),
                nn.ReLU(),
                nn.MaxPool2d(2),
                nn.Conv2d(32, 64, 3, padding=1),
                nn.ReLU(),
                nn.MaxPool2d(2),
                nn.Flatten(),
                nn.Linear(64 * 8 * 8, 256),
                nn.ReLU(),
                nn.Linear(256, 10),
            )

        models = {
            "transformer": (transformer, lambda: torch.randn(4, 32, 512)),
            "cnn": (cnn, lambda: torch.randn(16, 3, 32, 32)),
        }
        for mname, (make, batch) in models.items():
            torch.manual_seed(0)
            m = make()
            params = sum(p.numel() for p in m.parameters())
            x = batch()
            entry = {"params": params}
            for name in ("local", *groups):
                model = m if name == "local" else DDP(m, process_group=groups[name])
                opt = torch.optim.SGD(model.parameters(), lr=1e-4)

                def step(model=model, opt=opt, x=x):
                    opt.zero_grad()
                    model(x).float().pow(2).mean().backward()
                    opt.step()

                step()
                dist.barrier(group=gloo)
                t0 = time.perf_counter()
                for _ in range(args.steps):
                    step()
                entry[name] = slowest((time.perf_counter() - t0) / args.steps) * 1e3
            # Communication: what DDP adds to the same step without it.
            entry["comm_ferroccl"] = entry["ferroccl"] - entry["local"]
            entry["comm_gloo"] = entry["gloo"] - entry["local"]
            if "python" in entry:
                entry["comm_python"] = entry["python"] - entry["local"]
            res["ddp"][mname] = entry
            if r == 0:
                print(
                    f"ddp {mname} ({params / 1e6:.1f}M params): step local {entry['local']:.1f} ms, "
                    f"ferroccl {entry['ferroccl']:.1f} ms, gloo {entry['gloo']:.1f} ms",
                    flush=True,
                )
    if r == 0:
        with open(os.environ["BENCH_OUT"], "w") as f:
            json.dump(res, f)
    dist.destroy_process_group()


def perf(binary: str, ranks: int, coll: str, lo: int, hi: int) -> dict:
    """ferroccl-perf's times (us) by size, for the same sizes."""
    out = {}
    with tempfile.NamedTemporaryFile(suffix=".csv") as f:
        for size in sizes(lo, hi):
            subprocess.run(
                [
                    binary,
                    coll,
                    "--ranks",
                    str(ranks),
                    "-b",
                    str(size),
                    "-e",
                    str(size),
                    "-n",
                    str(iterations(size)),
                    "-w",
                    "3",
                    "-c",
                    "0",
                    "--csv",
                    f.name,
                ],
                check=True,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            with open(f.name) as c:
                for row in csv.DictReader(c):
                    # allreduce through torch is in place, the gathers out of place
                    key = "ip_time_us" if coll == "allreduce" else "oop_time_us"
                    out[int(row["size_bytes"])] = float(row[key])
    return out


def run_torch(a: argparse.Namespace, out: str):
    """One run of every rank's worker; its results, or None if a rank failed."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = [
        subprocess.Popen(
            [sys.executable, __file__, *sys.argv[1:]],
            env=dict(
                os.environ,
                BENCH_WORKER="1",
                BENCH_OUT=out,
                MASTER_ADDR="127.0.0.1",
                MASTER_PORT=str(port),
                RANK=str(r),
                WORLD_SIZE=str(a.ranks),
                LOCAL_RANK=str(r),
                OMP_NUM_THREADS="1",
            ),
        )
        for r in range(a.ranks)
    ]
    if any(p.wait() != 0 for p in procs):
        return None
    with open(out) as f:
        return json.load(f)


def median_of(rounds: list) -> dict:
    """The first round's results with every collective's times the median
    over the rounds (torch, Gloo and ferroccl-perf alike)."""
    res = rounds[0]
    for coll, rows in res["colls"].items():
        for size, row in rows.items():
            for key in ("ferroccl", "gloo", "perf", "python"):
                vals = [r["colls"][coll][size].get(key) for r in rounds]
                vals = [v for v in vals if v is not None]
                if vals:
                    row[key] = statistics.median(vals)
    return res


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--min-bytes", type=int, default=8)
    ap.add_argument("--max-bytes", type=int, default=64 << 20)
    ap.add_argument("--perf", default="target/release/ferroccl-perf")
    ap.add_argument("--no-ddp", dest="ddp", action="store_false")
    ap.add_argument(
        "--bind",
        action="store_true",
        help="pin each torch rank to an equal share of the CPUs, as ferroccl-run pins "
        "ferroccl-perf's ranks (torchrun pins nothing)",
    )
    ap.add_argument(
        "--python-backend",
        action="store_true",
        help="also time the Python backend alone (FERROCCL_TORCH_BACKEND=python) as a column",
    )
    ap.add_argument(
        "--python-first",
        action="store_true",
        help="with --python-backend: run the Python backend before the C++ one",
    )
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--out", default="torch-bench.json")
    ap.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="torch run then ferroccl-perf run, this many times in turn; each cell is the "
        "median over rounds (this machine's speed moves between runs minutes apart)",
    )
    a = ap.parse_args()
    if os.environ.get("BENCH_WORKER") == "1":
        worker(a)
        return 0
    out = os.path.abspath(a.out)
    rounds = []
    for _ in range(max(1, a.rounds)):
        res = run_torch(a, out)
        if res is None:
            return 1
        if os.path.exists(a.perf):
            for coll in COLLS:
                p = perf(a.perf, a.ranks, coll, a.min_bytes, a.max_bytes)
                for size, row in res["colls"][coll].items():
                    row["perf"] = p.get(int(size))
        rounds.append(res)
    res = median_of(rounds)
    res["rounds"] = len(rounds)
    res["load_average"] = os.getloadavg()
    res["ranks"] = a.ranks
    print(f"\n{a.ranks} ranks, {res['rounds']} round(s), load average {res['load_average'][0]:.2f}")
    py = a.python_backend
    print(
        f"{'collective':14s} {'size':>10s} {'ferroccl us':>12s} {'gloo us':>10s} {'x gloo':>7s} "
        f"{'perf us':>9s} {'added us':>9s}" + (f" {'python us':>10s} {'py added':>9s}" if py else "")
    )
    for coll in COLLS:
        for size, row in res["colls"][coll].items():
            pf = row.get("perf")
            added = f"{row['ferroccl'] - pf:9.1f}" if pf is not None else "        -"
            pfs = f"{pf:9.1f}" if pf is not None else "        -"
            extra = ""
            if py and "python" in row:
                pya = f"{row['python'] - pf:9.1f}" if pf is not None else "        -"
                extra = f" {row['python']:10.1f} {pya}"
            print(
                f"{coll:14s} {int(size):>10d} {row['ferroccl']:12.1f} {row['gloo']:10.1f} "
                f"{row['gloo'] / row['ferroccl']:7.1f} {pfs} {added}{extra}"
            )
    for mname, e in res.get("ddp", {}).items():
        print(
            f"ddp {mname}: {e['params'] / 1e6:.1f}M params; step ms: local {e['local']:.1f}, ferroccl "
            f"{e['ferroccl']:.1f} (comm {e['comm_ferroccl']:.1f}), "
            f"gloo {e['gloo']:.1f} (comm {e['comm_gloo']:.1f})"
            + (f", python backend {e['python']:.1f} (comm {e['comm_python']:.1f})" if "python" in e else "")
        )
    with open(out, "w") as f:
        json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
