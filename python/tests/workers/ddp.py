"""DDP on the "ferroccl" backend trains a model to the weights one process
reaches on the whole batch (computed here, alone), within a bound derived
from float32 rounding: several buckets, no_sync, find_unused_parameters,
and comm hooks (fp16 / bf16 compression, PowerSGD)."""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powersgd
from torch.nn.parallel import DistributedDataParallel as DDP

import ferroccl.torch  # noqa: F401

dist.init_process_group("ferroccl")
R, N = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
STEPS, LR, B = 4, 0.05, 12  # B: global batch, divisible by 2 and 3
EPS32 = torch.finfo(torch.float32).eps


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(16, 64)
        self.b = torch.nn.Linear(64, 64)
        self.c = torch.nn.Linear(64, 4)
        self.unused = torch.nn.Linear(8, 8)  # never in the forward pass

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c(torch.tanh(self.b(torch.tanh(self.a(x)))))


def data(step: int, micro: int = 0):
    g = torch.Generator().manual_seed(1000 * step + micro)
    return torch.randn(B, 16, generator=g), torch.randn(B, 4, generator=g)


def shard(t: torch.Tensor) -> torch.Tensor:
    k = B // N
    return t[R * k : (R + 1) * k]


def reference(micros: int):
    """One process, whole batch: weights after STEPS steps, and the
    largest gradient element seen (for the bound)."""
    torch.manual_seed(1)
    m = Net()
    opt = torch.optim.SGD(m.parameters(), lr=LR)
    gmax = 0.0
    for s in range(STEPS):
        opt.zero_grad()
        for mi in range(micros):
            x, y = data(s, mi)
            torch.nn.functional.mse_loss(m(x), y).backward()
        gmax = max(gmax, max(p.grad.abs().max().item() for p in m.parameters() if p.grad is not None))
        opt.step()
    return m, gmax


def train(micros: int, hook=None, state=None, **ddp_kw):
    torch.manual_seed(1)
    m = Net()
    d = DDP(m, **ddp_kw)
    if hook is not None:
        d.register_comm_hook(state, hook)
    opt = torch.optim.SGD(d.parameters(), lr=LR)
    for s in range(STEPS):
        opt.zero_grad()
        for mi in range(micros):
            x, y = data(s, mi)
            if mi < micros - 1:
                with d.no_sync():
                    torch.nn.functional.mse_loss(d(shard(x)), shard(y)).backward()
            else:
                torch.nn.functional.mse_loss(d(shard(x)), shard(y)).backward()
        opt.step()
    return m


def compare(got: torch.nn.Module, want: torch.nn.Module, bound: float, what: str) -> None:
    worst = 0.0
    for p, q in zip(got.parameters(), want.parameters()):
        worst = max(worst, (p.detach() - q.detach()).abs().max().item())
    assert worst <= bound, f"rank {R}: {what}: weights differ by {worst:.3e} > bound {bound:.3e}"
    # The same weights on every rank, bit for bit (DDP's contract).
    flat = torch.cat([p.detach().flatten() for p in got.parameters()])
    everyone = [torch.empty_like(flat) for _ in range(N)]
    dist.all_gather(everyone, flat)
    for r, f in enumerate(everyone):
        assert torch.equal(f, flat), f"rank {R}: {what}: rank {r}'s weights differ from mine"
    print(f"rank {R}: {what}: max diff {worst:.3e} <= {bound:.3e}", flush=True)


def rounding_bound(gmax: float, rel: float, micros: int) -> float:
    # Each step's gradient differs from the reference's by at most
    # rel * (terms summed) * |largest gradient| per element (sums in another
    # order: over ranks and micro-batches, and the local mean over B/N
    # samples against the whole-batch mean over B); the step moves a weight
    # by LR times that, plus a rounding of the weight itself. A factor 4
    # covers the growth through the nonlinear model over STEPS steps.
    per_step = LR * rel * (B + N * N * micros) * gmax + EPS32
    return 4 * STEPS * per_step


# Several buckets (a few KB each), no_sync over two micro-batches, a
# parameter that never takes part (find_unused_parameters).
want, gmax = reference(2)
got = train(2, bucket_cap_mb=0.004, find_unused_parameters=True)
compare(got, want, rounding_bound(gmax, EPS32, 2), "ddp buckets+no_sync+unused")
assert torch.equal(got.unused.weight, want.unused.weight)

# Comm hooks: compression rounds each rank's gradient and the sum to the
# narrow type (relative error 2^-11 for fp16, 2^-8 for bf16, each).
want1, gmax1 = reference(1)
for name, hook, rel in (
    ("fp16 hook", default_hooks.fp16_compress_hook, 2.0**-11),
    ("bf16 hook", default_hooks.bf16_compress_hook, 2.0**-8),
):
    got = train(1, hook=hook, state=None, bucket_cap_mb=0.004, find_unused_parameters=True)
    compare(got, want1, rounding_bound(gmax1, 2 * rel, 1), name)

# PowerSGD at full rank (matrix_approximation_rank >= the layers' smaller
# dimension) after its warm-up steps of plain allreduce: exact up to
# the QR's rounding.
state = powersgd.PowerSGDState(
    process_group=None,
    matrix_approximation_rank=64,
    start_powerSGD_iter=2,
    min_compression_rate=0.0,
    use_error_feedback=False,
    warm_start=False,
)
# One bucket: PowerSGD's hook indexes per-bucket matrices that a bucket of
# biases alone would not have.
got = train(1, hook=powersgd.powerSGD_hook, state=state, find_unused_parameters=True)
compare(got, want1, rounding_bound(gmax1, 64 * EPS32, 1), "powerSGD hook")

dist.destroy_process_group()
print(f"rank {R}/{N}: ddp checks passed", flush=True)
sys.exit(0)
