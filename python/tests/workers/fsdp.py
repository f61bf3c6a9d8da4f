"""FSDP2 (`fully_shard`) on a CPU DeviceMesh over the "ferroccl" backend:
the loss trajectory equals one process's on the whole batch (computed here,
alone) within a bound from float32 rounding; then the sharded weights,
gathered, equal the reference's."""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

import ferroccl.torch  # noqa: F401

dist.init_process_group("ferroccl")
R, N = dist.get_rank(), dist.get_world_size()
STEPS, LR, B = 5, 0.05, 12
EPS32 = torch.finfo(torch.float32).eps


def model() -> torch.nn.Module:
    torch.manual_seed(3)
    return torch.nn.Sequential(
        torch.nn.Linear(16, 48),
        torch.nn.Tanh(),
        torch.nn.Linear(48, 48),
        torch.nn.Tanh(),
        torch.nn.Linear(48, 4),
    )


def data(step: int):
    g = torch.Generator().manual_seed(500 + step)
    return torch.randn(B, 16, generator=g), torch.randn(B, 4, generator=g)


ref = model()
opt = torch.optim.SGD(ref.parameters(), lr=LR)
ref_losses = []
gmax = 0.0
for s in range(STEPS):
    opt.zero_grad()
    x, y = data(s)
    loss = torch.nn.functional.mse_loss(ref(x), y)
    loss.backward()
    ref_losses.append(loss.item())
    gmax = max(gmax, max(p.grad.abs().max().item() for p in ref.parameters()))
    opt.step()

mesh = init_device_mesh("cpu", (N,))
m = model()
for layer in m:
    if isinstance(layer, torch.nn.Linear):
        fully_shard(layer, mesh=mesh)
fully_shard(m, mesh=mesh)
opt = torch.optim.SGD(m.parameters(), lr=LR)
k = B // N
for s in range(STEPS):
    opt.zero_grad()
    x, y = data(s)
    loss = torch.nn.functional.mse_loss(m(x[R * k : (R + 1) * k]), y[R * k : (R + 1) * k])
    loss.backward()
    opt.step()
    # The whole batch's loss: the mean of the ranks' means (equal shards).
    whole = loss.detach().clone()
    dist.all_reduce(whole, op=dist.ReduceOp.AVG)
    # Bound: losses are means of squares of outputs whose weights differ
    # from the reference by rounding (each step: LR * B * eps * |g| per
    # weight); 1e-5 relative covers STEPS steps of that with margin, and
    # B * eps covers the mean's own rounding.
    bound = abs(ref_losses[s]) * (B * EPS32 + 4 * s * LR * B * EPS32 * (1 + gmax)) + 1e-6
    diff = abs(whole.item() - ref_losses[s])
    assert diff <= bound, (
        f"rank {R}: step {s}: loss {whole.item()} vs {ref_losses[s]} (diff {diff:.3e} > {bound:.3e})"
    )
    print(
        f"rank {R}: step {s}: loss {whole.item():.6f} ref {ref_losses[s]:.6f} diff {diff:.2e} <= {bound:.2e}",
        flush=True,
    )

# The sharded parameters, gathered, against the reference's.
for (name, p), q in zip(m.named_parameters(), ref.parameters()):
    full = p.full_tensor()
    worst = (full - q.detach()).abs().max().item()
    assert worst <= 4 * STEPS * LR * B * EPS32 * (1 + gmax), f"rank {R}: {name}: differs by {worst}"

dist.destroy_process_group()
print(f"rank {R}/{N}: fsdp checks passed", flush=True)
sys.exit(0)
