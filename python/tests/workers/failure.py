"""A killed rank: every survivor's next call raises a FerrocclError (a
RuntimeError) naming the dead rank within the group's timeout, and
destroy_process_group then returns."""

from __future__ import annotations

import os
import signal
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist

import ferroccl
import ferroccl.torch  # noqa: F401

TIMEOUT = 30.0
dist.init_process_group("ferroccl", timeout=timedelta(seconds=TIMEOUT))
R, N = dist.get_rank(), dist.get_world_size()
VICTIM = N - 1
t = torch.ones(1000)
dist.all_reduce(t)
assert torch.equal(t, torch.full((1000,), float(N)))
if R == VICTIM:
    os.kill(os.getpid(), signal.SIGKILL)
start = time.monotonic()
try:
    for _ in range(100):
        dist.all_reduce(t)
except ferroccl.FerrocclError as e:
    took = time.monotonic() - start
    assert isinstance(e, RuntimeError)
    assert f"rank {VICTIM}" in str(e), e
    assert e.failed_rank == VICTIM, (e.failed_rank, e)
    assert e.rank == R and e.call == "all_reduce" and e.seq >= 2, (e.rank, e.call, e.seq)
    assert took < TIMEOUT + 10, took
    print(f"rank {R}: raised after {took:.2f}s: {e}", flush=True)
else:
    raise AssertionError(f"rank {R}: calls went on with rank {VICTIM} dead")
# A later call fails at once, and tear-down returns.
try:
    dist.barrier()
except RuntimeError as e:
    print(f"rank {R}: barrier after failure: {e}", flush=True)
else:
    raise AssertionError("barrier succeeded after a failure")
# The error reaches a future too (DDP's comm hooks wait on futures), as
# the same exception with its facts.
fut = dist.all_reduce(t, async_op=True).get_future()
try:
    fut.wait()
except ferroccl.FerrocclError as e:
    assert e.rank == R and e.call == "all_reduce", (e.rank, e.call)
    print(f"rank {R}: future after failure: {e}", flush=True)
else:
    raise AssertionError("a future completed after a failure")
dist.destroy_process_group()
print(f"rank {R}/{N}: failure checks passed", flush=True)
sys.exit(0)
