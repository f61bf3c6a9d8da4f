"""Every collective, type and reduction through torch.distributed on the
"ferroccl" backend, against a reference this process computes alone from
every rank's inputs (which each rank can make: they are seeded by rank).
One process launch runs every check (torch's import is the slow part)."""

from __future__ import annotations

import os
import sys
import time
from typing import Any

import torch
import torch.distributed as dist

import ferroccl
import ferroccl.torch  # noqa: F401  registers the backend
from ferroccl.torch import ProcessGroupFerroccl

dist.init_process_group("ferroccl")
R = dist.get_rank()
N = dist.get_world_size()
checks = 0

INT_TYPES = [torch.int8, torch.uint8, torch.int32, torch.int64]
if hasattr(torch, "uint32"):
    INT_TYPES += [torch.uint32, torch.uint64]
FLOAT_TYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
SIZES = [1, 7, 1000, 4099]


def backend() -> ProcessGroupFerroccl:
    """The default group's ferroccl object: its CPU backend, or (torch
    2.11, where the backend subclasses ProcessGroup) the group itself."""
    group = dist.distributed_c10d._get_default_group()
    if isinstance(group, ProcessGroupFerroccl):
        return group
    return group._get_backend(torch.device("cpu"))


# Which backend serves the group: the C++ one (where it is built) or the
# Python one; FERROCCL_TORCH_BACKEND=cpp (CI) requires the C++ one.
CPP = type(backend()).__name__ == "FerrocclBackend"
if os.environ.get("FERROCCL_TORCH_BACKEND") == "cpp":
    assert CPP, "FERROCCL_TORCH_BACKEND=cpp but the group's backend is not the C++ one"
if os.environ.get("FERROCCL_TORCH_BACKEND") == "python":
    assert not CPP, "FERROCCL_TORCH_BACKEND=python but the group's backend is the C++ one"
print(f"rank {R}: backend {'C++' if CPP else 'Python'}", flush=True)


def coalesced(pg: Any, old: str, new: str) -> Any:
    """A coalesced call of the backend by the name its class has: the
    Python backend answers to the names of torch 2.11, torch 2.15's C++
    `Backend` binds the newer ones."""
    return getattr(pg, old, None) or getattr(pg, new)


def inp(rank: int, n: int, dtype: torch.dtype, op: str = "sum") -> torch.Tensor:
    """Small integers, so every sum and product is exact in every type
    (at most 4 ranks: |sum| <= 12, products <= 16)."""
    g = torch.Generator().manual_seed(7919 * rank + 31 * n + 3)
    if dtype == torch.bool:
        return torch.randint(0, 2, (n,), generator=g).bool()
    if op == "prod":
        v = torch.randint(1, 3, (n,), generator=g)
    elif dtype in (torch.uint8, getattr(torch, "uint32", None), getattr(torch, "uint64", None)):
        v = torch.randint(0, 4, (n,), generator=g)
    else:
        v = torch.randint(-3, 4, (n,), generator=g)
    if dtype.is_complex:
        w = torch.randint(-3, 4, (n,), generator=g)
        return torch.complex(v.double(), w.double()).to(dtype)
    return v.to(dtype)


def reference(op: str, n: int, dtype: torch.dtype) -> torch.Tensor:
    xs = [inp(r, n, dtype, op) for r in range(N)]
    if dtype == torch.bool:
        s = torch.stack([x.to(torch.uint8) for x in xs])
        out = s.max(0).values if op == "max" else s.min(0).values
        return out.bool()
    wide = (
        torch.complex128 if dtype.is_complex else (torch.float64 if dtype.is_floating_point else torch.int64)
    )
    s = torch.stack([x.to(wide) for x in xs])
    if op == "sum":
        out = s.sum(0)
    elif op == "prod":
        out = s.prod(0)
    elif op == "min":
        out = s.min(0).values
    elif op == "max":
        out = s.max(0).values
    elif op == "avg":
        out = (
            s.sum(0) / N
            if (dtype.is_floating_point or dtype.is_complex)
            else torch.div(s.sum(0), N, rounding_mode="trunc")
        )
    else:
        raise AssertionError(op)
    return out.to(dtype)


def same(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    global checks
    checks += 1
    if got.dtype != want.dtype or got.shape != want.shape:
        raise AssertionError(f"rank {R}: {what}: got {got.dtype} {got.shape}, want {want.dtype} {want.shape}")
    if not torch.equal(got, want):
        bad = (got != want).nonzero()[:5].flatten().tolist()
        raise AssertionError(
            f"rank {R}: {what}: differs at {bad}: got {got.flatten()[bad]} want {want.flatten()[bad]}"
        )


OPS = {
    "sum": dist.ReduceOp.SUM,
    "prod": dist.ReduceOp.PRODUCT,
    "min": dist.ReduceOp.MIN,
    "max": dist.ReduceOp.MAX,
    "avg": dist.ReduceOp.AVG,
}


def test_all_reduce() -> None:
    for dtype in FLOAT_TYPES + INT_TYPES:
        for op, top in OPS.items():
            for n in SIZES if dtype == torch.float32 else SIZES[:3]:
                t = inp(R, n, dtype, op)
                dist.all_reduce(t, op=top)
                want = reference(op, n, dtype)
                if op == "avg" and dtype in (torch.float16, torch.bfloat16):
                    # Divided once in the type (rounded once): the exact
                    # quotient rounded to the type is the reference.
                    want = (reference("sum", n, torch.float64) / N).to(dtype)
                same(t, want, f"all_reduce {op} {dtype} n={n}")
    # bool: MAX / MIN (and BOR / BAND) are exact on bytes.
    for op, top in (("max", dist.ReduceOp.MAX), ("min", dist.ReduceOp.MIN)):
        t = inp(R, 33, torch.bool)
        dist.all_reduce(t, op=top)
        same(t, reference(op, 33, torch.bool), f"all_reduce {op} bool")
    t = inp(R, 33, torch.bool)
    dist.all_reduce(t, op=dist.ReduceOp.BOR)
    same(t, reference("max", 33, torch.bool), "all_reduce BOR bool")
    # complex: SUM / AVG as pairs of floats.
    for dtype in (torch.complex64, torch.complex128):
        t = inp(R, 17, dtype)
        dist.all_reduce(t)
        same(t, reference("sum", 17, dtype), f"all_reduce sum {dtype}")
    # PREMUL_SUM: every input times the factor, summed.
    t = inp(R, 100, torch.float32)
    premul = dist._make_nccl_premul_sum(2.0)
    if hasattr(premul, "factor"):
        dist.all_reduce(t, op=premul)
        same(t, reference("sum", 100, torch.float32) * 2, "all_reduce premul_sum")
    else:
        # Older torch (2.11) does not show the factor to Python: refused,
        # saying so, before anything moves.
        try:
            dist.all_reduce(t, op=premul)
        except ValueError as e:
            assert "PREMUL_SUM" in str(e), e
        else:
            raise AssertionError("PREMUL_SUM without a readable factor was not refused")
    # async: Work.wait, is_completed, get_future's value.
    t = inp(R, 1000, torch.float32)
    w = dist.all_reduce(t, async_op=True)
    fut = w.get_future()
    w.wait()
    (v,) = fut.wait()
    same(v, reference("sum", 1000, torch.float32), "all_reduce async future")
    # is_completed through torch: the C++ backend answers it for the
    # calls it issues and for those its Python backend makes (torch's own
    # wrapper of a Python backend's Work does not forward it, so with
    # FERROCCL_TORCH_BACKEND=python it stays False: docs/pytorch.md).
    if CPP:
        t = inp(R, 1000, torch.float32)
        w = dist.all_reduce(t, async_op=True)
        w.wait()
        assert w.is_completed() and w.is_success(), "all_reduce: is_completed after wait"
        w = dist.all_reduce(inp(R, 8, torch.float32), async_op=True)
        w.get_future()
        deadline = time.monotonic() + 60
        while not w.is_completed():
            assert time.monotonic() < deadline, "all_reduce: is_completed never became True"
            time.sleep(0.001)
        # bool MAX is mapped by the Python backend (the forwarded route).
        b = torch.tensor([R == 0, False, True])
        w = dist.all_reduce(b, op=dist.ReduceOp.MAX, async_op=True)
        deadline = time.monotonic() + 60
        while not w.is_completed():
            assert time.monotonic() < deadline, "bool all_reduce: is_completed never became True"
            time.sleep(0.001)
        w.wait()
        assert b.tolist() == [True, False, True], b
        # Calls of both routes, async and interleaved, keep one order on
        # every rank (one queue): a native sum, a bool MAX the Python
        # backend maps, a native broadcast, another MAX, then every wait.
        xs = [inp(R, 257, torch.float32), inp(R, 33, torch.float64)]
        bs = [torch.tensor([R == 1, R == 0]), torch.tensor([False, R == N - 1])]
        root = torch.full((5,), float(R))
        works = [
            dist.all_reduce(xs[0], async_op=True),
            dist.all_reduce(bs[0], op=dist.ReduceOp.MAX, async_op=True),
            dist.broadcast(root, src=N - 1, async_op=True),
            dist.all_reduce(bs[1], op=dist.ReduceOp.MAX, async_op=True),
            dist.all_reduce(xs[1], async_op=True),
        ]
        for w in works:
            w.wait()
        same(xs[0], reference("sum", 257, torch.float32), "interleaved routes: sum")
        same(xs[1], reference("sum", 33, torch.float64), "interleaved routes: sum 2")
        assert bs[0].tolist() == [N > 1, True], bs[0]
        assert bs[1].tolist() == [False, True], bs[1]
        assert root.tolist() == [float(N - 1)] * 5, root
    # The backend's own Work: done after wait, and its future's value.
    pg = backend()
    t = inp(R, 64, torch.float32)
    w = pg.allreduce([t], dist.AllreduceOptions())
    fut = w.get_future()
    assert w.wait() and w.is_completed() and w.is_success()
    same(fut.wait()[0], reference("sum", 64, torch.float32), "backend Work future")


def backend_max(t: torch.Tensor) -> None:
    # torch refuses MAX on complex before a backend sees it; the backend
    # refuses it too for callers that reach it directly.
    pg = backend()
    opts = dist.AllreduceOptions()
    opts.reduceOp = dist.ReduceOp.MAX
    pg.allreduce([t], opts)


def test_refusals() -> None:
    global checks
    for what, fn, err, words in [
        (
            "int16 sum",
            lambda: dist.all_reduce(torch.ones(4, dtype=torch.int16)),
            TypeError,
            ["torch.int16", "allreduce"],
        ),
        (
            "bool sum",
            lambda: dist.all_reduce(torch.ones(4, dtype=torch.bool)),
            TypeError,
            ["torch.bool", "allreduce"],
        ),
        (
            "complex max",
            lambda: backend_max(torch.ones(4, dtype=torch.complex64)),
            TypeError,
            ["complex64", "allreduce"],
        ),
        ("strided", lambda: dist.all_reduce(torch.ones(4, 4)[:, 1]), ValueError, ["not contiguous"]),
        (
            "BXOR",
            lambda: dist.all_reduce(torch.ones(4, dtype=torch.int32), op=dist.ReduceOp.BXOR),
            ValueError,
            ["BXOR"],
        ),
    ]:
        try:
            fn()
        except err as e:
            for w in words:
                assert w in str(e), f"rank {R}: {what}: {w!r} not in {e}"
            checks += 1
        else:
            raise AssertionError(f"rank {R}: {what} was not refused")
    # Every rank refused before any byte moved: the group goes on.
    t = torch.ones(3)
    dist.all_reduce(t)
    same(t, torch.full((3,), float(N)), "all_reduce after refusals")


def test_gathers() -> None:
    types = [
        torch.float32,
        torch.bfloat16,
        torch.int64,
        torch.uint8,
        torch.bool,
        torch.int16,
        torch.complex64,
    ]
    for dtype in types:
        for n in (1, 5, 1000):
            mine = inp(R, n, dtype)
            everyone = [inp(r, n, dtype) for r in range(N)]
            out = torch.empty(N * n, dtype=dtype)
            dist.all_gather_into_tensor(out, mine)
            same(out, torch.cat(everyone), f"all_gather_into_tensor {dtype} n={n}")
            # in place: the input is this rank's block of the output
            out2 = torch.zeros(N * n, dtype=dtype)
            out2[R * n : (R + 1) * n].copy_(mine)
            dist.all_gather_into_tensor(out2, out2[R * n : (R + 1) * n])
            same(out2, torch.cat(everyone), f"all_gather_into_tensor in place {dtype} n={n}")
            outs = [torch.empty(n, dtype=dtype) for _ in range(N)]
            dist.all_gather(outs, mine)
            for r in range(N):
                same(outs[r], everyone[r], f"all_gather {dtype} n={n} block {r}")
    # uneven blocks in the list form
    sizes = [3 + 2 * r for r in range(N)]
    outs = [torch.empty(s) for s in sizes]
    dist.all_gather(outs, inp(R, sizes[R], torch.float32))
    for r in range(N):
        same(outs[r], inp(r, sizes[r], torch.float32), f"all_gather uneven block {r}")
    # coalesced, through the backend itself
    pg = backend()
    ins = [inp(R, 4, torch.float32), inp(R, 9, torch.int32)]
    outs = [torch.empty(4 * N), torch.empty(9 * N, dtype=torch.int32)]
    coalesced(pg, "allgather_into_tensor_coalesced", "all_gather_single_coalesced")(
        outs, ins, torch._C._distributed_c10d.AllgatherOptions()
    ).wait()
    same(outs[0], torch.cat([inp(r, 4, torch.float32) for r in range(N)]), "allgather coalesced 0")
    same(outs[1], torch.cat([inp(r, 9, torch.int32) for r in range(N)]), "allgather coalesced 1")


def test_reduce_scatter() -> None:
    for dtype in FLOAT_TYPES + INT_TYPES:
        for op, top in OPS.items():
            if op == "avg" and dtype in (torch.float16, torch.bfloat16):
                continue  # rounding of the quotient: checked in all_reduce
            n = 5
            full = reference(op, n * N, dtype)
            out = torch.empty(n, dtype=dtype)
            dist.reduce_scatter_tensor(out, inp(R, n * N, dtype, op), op=top)
            same(out, full[R * n : (R + 1) * n], f"reduce_scatter_tensor {op} {dtype}")
            outl = torch.empty(n, dtype=dtype)
            x = inp(R, n * N, dtype, op)
            dist.reduce_scatter(outl, list(x.chunk(N)), op=top)
            same(outl, full[R * n : (R + 1) * n], f"reduce_scatter {op} {dtype}")
    # in place: output is this rank's block of the input
    x = inp(R, 6 * N, torch.float32)
    dist.reduce_scatter_tensor(x[R * 6 : (R + 1) * 6], x)
    same(
        x[R * 6 : (R + 1) * 6],
        reference("sum", 6 * N, torch.float32)[R * 6 : (R + 1) * 6],
        "reduce_scatter in place",
    )
    # uneven list blocks
    sizes = [2 + r for r in range(N)]
    ins = [inp(R, sum(sizes), torch.float64)[sum(sizes[:k]) : sum(sizes[: k + 1])] for k in range(N)]
    out = torch.empty(sizes[R], dtype=torch.float64)
    dist.reduce_scatter(out, [i.clone() for i in ins])
    full = reference("sum", sum(sizes), torch.float64)
    same(out, full[sum(sizes[:R]) : sum(sizes[: R + 1])], "reduce_scatter uneven")
    # coalesced, through the backend
    pg = backend()
    outs = [torch.empty(3), torch.empty(2)]
    ins = [inp(R, 3 * N, torch.float32), inp(R, 2 * N, torch.float32)]
    coalesced(pg, "reduce_scatter_tensor_coalesced", "reduce_scatter_single_coalesced")(
        outs, ins, torch._C._distributed_c10d.ReduceScatterOptions()
    ).wait()
    same(outs[0], reference("sum", 3 * N, torch.float32)[R * 3 : R * 3 + 3], "reduce_scatter coalesced 0")
    same(outs[1], reference("sum", 2 * N, torch.float32)[R * 2 : R * 2 + 2], "reduce_scatter coalesced 1")
    # allreduce coalesced
    ts = [inp(R, 5, torch.float32), inp(R, 8, torch.int64)]
    pg.allreduce_coalesced(ts, torch._C._distributed_c10d.AllreduceCoalescedOptions()).wait()
    same(ts[0], reference("sum", 5, torch.float32), "allreduce coalesced 0")
    same(ts[1], reference("sum", 8, torch.int64), "allreduce coalesced 1")


def test_rooted() -> None:
    root = N - 1
    for dtype in (torch.float32, torch.float16, torch.int32, torch.bool, torch.int16):
        t = inp(R, 77, dtype)
        dist.broadcast(t, src=root)
        same(t, inp(root, 77, dtype), f"broadcast {dtype}")
    for op in ("sum", "max"):
        t = inp(R, 50, torch.float32, op)
        dist.reduce(t, dst=root, op=OPS[op])
        if R == root:
            same(t, reference(op, 50, torch.float32), f"reduce {op}")
    # gather / scatter
    mine = inp(R, 9, torch.float32)
    outs = [torch.empty(9) for _ in range(N)] if R == 0 else None
    dist.gather(mine, outs, dst=0)
    if R == 0:
        for r in range(N):
            same(outs[r], inp(r, 9, torch.float32), f"gather block {r}")
    out = torch.empty(4, dtype=torch.int64)
    ins = [inp(100 + r, 4, torch.int64) for r in range(N)] if R == root else None
    dist.scatter(out, ins, src=root)
    same(out, inp(100 + R, 4, torch.int64), "scatter")
    dist.barrier()


def test_all_to_all() -> None:
    # even, single tensor
    n = 6
    x = inp(R, n * N, torch.float32)
    out = torch.empty(n * N)
    dist.all_to_all_single(out, x)
    want = torch.cat([inp(r, n * N, torch.float32)[R * n : (R + 1) * n] for r in range(N)])
    same(out, want, "all_to_all_single even")
    # uneven splits: rank r sends (r + k + 1) rows of 3 to rank k

    def rows(src: int, dst: int) -> int:
        return src + dst + 1

    def block(src: int, dst: int) -> torch.Tensor:
        return inp(1000 + 10 * src + dst, rows(src, dst) * 3, torch.float32).reshape(-1, 3)

    send = torch.cat([block(R, k) for k in range(N)])
    recv = torch.empty(sum(rows(s, R) for s in range(N)), 3)
    dist.all_to_all_single(
        recv,
        send,
        output_split_sizes=[rows(s, R) for s in range(N)],
        input_split_sizes=[rows(R, k) for k in range(N)],
    )
    same(recv, torch.cat([block(s, R) for s in range(N)]), "all_to_all_single uneven")
    # list form, uneven, another type
    outs = [torch.empty(rows(s, R) * 3, dtype=torch.int32) for s in range(N)]
    dist.all_to_all(outs, [block(R, k).flatten().to(torch.int32) for k in range(N)])
    for s in range(N):
        same(outs[s], block(s, R).flatten().to(torch.int32), f"all_to_all list from {s}")


def test_send_recv() -> None:
    if N < 2:
        return
    nxt, prv = (R + 1) % N, (R - 1) % N
    for dtype in (torch.float32, torch.int16):
        t = inp(R, 300, dtype)
        got = torch.empty(300, dtype=dtype)
        # Even ranks send first, odd ranks receive first: no cycle of sends.
        if R % 2 == 0:
            dist.send(t, nxt, tag=3)
            dist.recv(got, prv, tag=3)
        else:
            dist.recv(got, prv, tag=3)
            dist.send(t, nxt, tag=3)
        same(got, inp(prv, 300, dtype), f"send/recv ring {dtype}")
    # isend / irecv with small messages
    t = inp(R, 10, torch.float64)
    got = torch.empty(10, dtype=torch.float64)
    reqs = (
        [dist.isend(t, nxt), dist.irecv(got, prv)]
        if R % 2 == 0
        else [dist.irecv(got, prv), dist.isend(t, nxt)]
    )
    for q in reqs:
        q.wait()
    same(got, inp(prv, 10, torch.float64), "isend/irecv")
    test_tags()


def test_tags() -> None:
    """Tags are matched as Gloo matches them: rank 0 sends three tags (one
    twice) and rank 1 receives them in another order; a gather between
    them takes none of them; a recv whose size differs from the message
    with its tag raises, naming the sender, the tag and both sizes."""
    global checks
    # batch_isend_irecv around a ring, each rank receiving its two tags in
    # the other order than they were sent (c10d asks the backend whether it
    # coalesces first: that question recursed once).
    nxt, prv = (R + 1) % N, (R - 1) % N
    a, b = inp(R, 3, torch.float32), inp(R, 5, torch.int32)
    got_a, got_b = torch.empty(3), torch.empty(5, dtype=torch.int32)
    ops = [
        dist.P2POp(dist.isend, a, nxt, tag=7),
        dist.P2POp(dist.isend, b, nxt, tag=8),
        dist.P2POp(dist.irecv, got_b, prv, tag=8),
        dist.P2POp(dist.irecv, got_a, prv, tag=7),
    ]
    for w in dist.batch_isend_irecv(ops):
        w.wait()
    same(got_a, inp(prv, 3, torch.float32), "batch_isend_irecv tag 7")
    same(got_b, inp(prv, 5, torch.int32), "batch_isend_irecv tag 8")
    msgs = [(5, inp(0, 7, torch.float32)), (9, inp(1, 3, torch.int16)), (5, inp(2, 4, torch.float32))]
    if R == 0:
        works = [dist.isend(t, 1, tag=tag) for tag, t in msgs]
        dist.gather(torch.full((2,), float(R)), None, dst=1)
        for w in works:
            w.wait()
        dist.send(torch.arange(5, dtype=torch.uint8), 1, tag=11)
    elif R == 1:
        rows = [torch.empty(2) for _ in range(N)]
        dist.gather(torch.full((2,), float(R)), rows, dst=1)
        for r in range(N):
            same(rows[r], torch.full((2,), float(r)), f"gather among tagged sends, from {r}")
        nine = torch.empty(3, dtype=torch.int16)
        w9 = dist.irecv(nine, 0, tag=9)
        first, second = torch.empty(7), torch.empty(4)
        w5 = dist.irecv(first, 0, tag=5)
        w9.wait()
        w5.wait()
        dist.recv(second, 0, tag=5)
        same(nine, msgs[1][1], "recv tag 9 ahead of tag 5")
        same(first, msgs[0][1], "first message of tag 5")
        same(second, msgs[2][1], "second message of tag 5, in order")
        pg = backend()
        try:
            pg.recv([torch.empty(8, dtype=torch.uint8)], 0, 11).wait()
        except ValueError as e:
            assert "rank 0 sent 5 bytes with tag 11" in str(e) and "takes 8" in str(e), e
        else:
            raise AssertionError("a recv of 8 bytes took a message of 5")
        checks += 1
    else:
        dist.gather(torch.full((2,), float(R)), None, dst=1)


def test_numpy_api() -> None:
    """The package's own API on numpy arrays (its own communicator, met
    through the job's store as the backend does)."""
    import numpy as np

    pg = backend()
    comm: ferroccl.Communicator = pg.comm
    a = np.arange(10, dtype=np.float64) + R
    comm.all_reduce(a)
    want = sum(np.arange(10, dtype=np.float64) + r for r in range(N))
    assert np.array_equal(a, want), (a, want)
    b = np.zeros(4 * N, dtype=np.int32)
    w = comm.all_gather(np.full(4, R, dtype=np.int32), b, async_op=True)
    w.wait()
    assert w.is_completed()
    assert np.array_equal(b, np.repeat(np.arange(N, dtype=np.int32), 4)), b
    try:
        comm.all_reduce(np.ones(3, dtype=np.int16))
    except TypeError as e:
        assert "int16" in str(e) and "all_reduce" in str(e), e
    else:
        raise AssertionError("int16 numpy array accepted")
    global checks
    checks += 3


for fn in [
    test_all_reduce,
    test_refusals,
    test_gathers,
    test_reduce_scatter,
    test_rooted,
    test_all_to_all,
    test_send_recv,
    test_numpy_api,
]:
    fn()
    print(f"rank {R}: {fn.__name__} ok", flush=True)

dist.destroy_process_group()
print(f"rank {R}/{N}: {checks} checks passed", flush=True)
sys.exit(0)
