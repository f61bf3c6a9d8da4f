"""PyTorch DDP on the NCCL backend, for nccl/gpu/run.sh: a small MLP trained
for a fixed number of steps on fixed data; every rank takes an equal slice
of each global batch, so the parameters, and the loss over the global
batch, match a single process's up to float rounding.

    ddp_losses.py --world 1 --out ref.json            # torch's own NCCL
    RANK=r WORLD_SIZE=n MASTER_ADDR=... MASTER_PORT=... \
        ddp_losses.py --world n --out run.json        # one per rank
    ddp_losses.py --compare ref.json run.json         # exit 1 if they differ
"""
import argparse
import faulthandler
import json
import os
import sys


def train(world, out, steps, batch):
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    rank = int(os.environ.get("RANK", "0"))
    # Where a rank hangs, every thread's Python stack on stderr before the
    # run's timeout kills it (the first GPU run's DDP step hung with empty
    # logs).
    faulthandler.dump_traceback_later(int(os.environ.get("FERROCCL_DDP_DUMP_AFTER", "60")))
    print(f"rank {rank}/{world}: init", flush=True)
    if world > 1:
        dist.init_process_group("nccl", rank=rank, world_size=world)
    torch.cuda.set_device(0)  # every rank on the one GPU
    dev = torch.device("cuda", 0)
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1)
    ).to(dev)
    if world > 1:
        model = DDP(model, device_ids=[0])
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    gen = torch.Generator().manual_seed(1)
    x_all = torch.randn(steps, batch, 32, generator=gen)
    y_all = torch.randn(steps, batch, 1, generator=gen)
    per = batch // world
    losses = []
    for s in range(steps):
        x = x_all[s, rank * per:(rank + 1) * per].to(dev)
        y = y_all[s, rank * per:(rank + 1) * per].to(dev)
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()  # DDP averages the gradients over the ranks
        opt.step()
        global_loss = loss.detach().clone()
        if world > 1:
            dist.all_reduce(global_loss)
            global_loss /= world
        losses.append(global_loss.item())
    if rank == 0:
        with open(out, "w") as f:
            json.dump({"world": world, "losses": losses}, f)
        print(f"world {world}: losses {losses[0]:.6f} .. {losses[-1]:.6f}")
    if world > 1:
        dist.destroy_process_group()


def compare(a, b, rel=1e-4):
    ref = json.load(open(a))["losses"]
    got = json.load(open(b))["losses"]
    if len(ref) != len(got):
        print(f"{len(got)} losses, want {len(ref)}")
        return 1
    worst = max(abs(r - g) / max(abs(r), 1e-12) for r, g in zip(ref, got))
    print(f"largest relative difference of a step's loss: {worst:.2e} (bound {rel:.0e})")
    return 0 if worst <= rel else 1


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--world", type=int, default=1)
    p.add_argument("--out", default="losses.json")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--batch", type=int, default=96)  # divisible by 1, 2, 3
    p.add_argument("--compare", nargs=2)
    args = p.parse_args()
    if args.compare:
        sys.exit(compare(*args.compare))
    train(args.world, args.out, args.steps, args.batch)


if __name__ == "__main__":
    main()
