"""Run a worker script as the ranks of a torch.distributed job (env://
rendezvous, as torchrun sets it), each rank a process, and collect how
each ended. Every rank is killed past the deadline, so nothing here can
hang a test run."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional

WORKERS = Path(__file__).resolve().parent / "workers"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Result:
    def __init__(self, codes: List[Optional[int]], outputs: List[str]) -> None:
        self.codes = codes
        self.outputs = outputs

    def report(self) -> str:
        return "\n".join(
            f"--- rank {r} exit {c}\n{o}" for r, (c, o) in enumerate(zip(self.codes, self.outputs))
        )


def run(
    script: str,
    nprocs: int,
    args: Optional[List[str]] = None,
    deadline_s: float = 240.0,
    env: Optional[Dict[str, str]] = None,
) -> Result:
    port = free_port()
    procs = []
    logs = []
    for rank in range(nprocs):
        e = dict(os.environ)
        e.update(
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
            RANK=str(rank),
            LOCAL_RANK=str(rank),
            WORLD_SIZE=str(nprocs),
            LOCAL_WORLD_SIZE=str(nprocs),
            OMP_NUM_THREADS="1",
        )
        e.update(env or {})
        log = open(_log_path(script, rank), "w+")
        logs.append(log)
        procs.append(
            subprocess.Popen(
                [sys.executable, str(WORKERS / script), *(args or [])],
                env=e,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        )
    end = time.monotonic() + deadline_s
    codes: List[Optional[int]] = [None] * nprocs
    while time.monotonic() < end and any(c is None for c in codes):
        for i, p in enumerate(procs):
            codes[i] = p.poll()
        time.sleep(0.05)
    for i, p in enumerate(procs):
        if codes[i] is None:
            p.kill()
            p.wait()
    outputs = []
    for log in logs:
        log.seek(0)
        outputs.append(log.read())
        log.close()
    return Result(codes, outputs)


def _log_path(script: str, rank: int) -> str:
    d = Path(os.environ.get("FERROCCL_TEST_LOGS", "/tmp")) / f"ferroccl-pytest-{os.getpid()}"
    d.mkdir(parents=True, exist_ok=True)
    return str(d / f"{Path(script).stem}-{rank}.log")


def check(script: str, nprocs: int, args: Optional[List[str]] = None, **kw) -> Result:
    """Run and require every rank to exit 0."""
    r = run(script, nprocs, args, **kw)
    assert all(c == 0 for c in r.codes), f"{script} on {nprocs} ranks:\n{r.report()}"
    return r
