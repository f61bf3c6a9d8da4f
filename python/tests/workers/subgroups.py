"""Subgroups on the "ferroccl" backend: `new_group` (every rank calls it
in the same order, members and not), and the groups of a 2-D DeviceMesh;
each group a communicator of its own, checked against sums computed here."""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

import ferroccl.torch  # noqa: F401

dist.init_process_group("ferroccl")
R, N = dist.get_rank(), dist.get_world_size()
assert N == 4, "run on 4 ranks"


def val(rank: int) -> torch.Tensor:
    return torch.arange(5, dtype=torch.float32) * (rank + 1)


evens = dist.new_group([0, 2])
odds = dist.new_group([1, 3])
three = dist.new_group([0, 1, 2])
mine = evens if R % 2 == 0 else odds
t = val(R)
dist.all_reduce(t, group=mine)
assert torch.equal(t, val(R % 2) + val(R % 2 + 2)), (R, t)
if R < 3:
    t = val(R)
    dist.all_reduce(t, group=three)
    assert torch.equal(t, val(0) + val(1) + val(2)), (R, t)
    out = torch.empty(15)
    dist.all_gather_into_tensor(out, val(R), group=three)
    assert torch.equal(out, torch.cat([val(0), val(1), val(2)])), (R, out)
# Broadcast from a global rank inside a subgroup.
t = val(R)
dist.broadcast(t, src=3 if R % 2 else 2, group=mine)
assert torch.equal(t, val(3 if R % 2 else 2)), (R, t)
print(f"rank {R}: new_group ok", flush=True)

mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
# mesh[r // 2][r % 2] = r: "tp" groups {0,1},{2,3}; "dp" groups {0,2},{1,3}.
for dim, peers in (("tp", lambda r: [r - r % 2, r - r % 2 + 1]), ("dp", lambda r: [r % 2, r % 2 + 2])):
    g = mesh.get_group(dim)
    t = val(R)
    dist.all_reduce(t, group=g)
    want = sum(val(p) for p in peers(R))
    assert torch.equal(t, want), (R, dim, t, want)
    out = torch.empty(10)
    dist.all_gather_into_tensor(out, val(R), group=g)
    assert torch.equal(out, torch.cat([val(p) for p in peers(R)])), (R, dim, out)
print(f"rank {R}: device mesh ok", flush=True)
dist.destroy_process_group()
print(f"rank {R}/{N}: subgroup checks passed", flush=True)
sys.exit(0)
