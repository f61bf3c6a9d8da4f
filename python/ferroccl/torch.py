"""The torch.distributed backend "ferroccl".

Importing this module registers the backend; then

    dist.init_process_group("ferroccl")

runs every collective of the group through the library: CPU tensors on
the host path, CUDA tensors through the library's device entry points on
the tensor's current stream. The backend is a Python subclass of c10d's
C++ `Backend`, so DDP's reducer, FSDP2 and the functional collectives reach
it the way they reach Gloo. Each group (the default one, every `new_group`,
every `DeviceMesh` dimension) gets a communicator of its own, met through
the store torch gives the backend: rank 0 of the group publishes the
library's rendezvous address and a fresh token there.
"""

from __future__ import annotations

import atexit
import os
import socket
import threading
import weakref
from collections import deque
from datetime import timedelta
from typing import Any, Callable, Deque, Dict, List, Optional, Sequence, Tuple

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import Backend as _C10dBackend
from torch._C._distributed_c10d import Work as _C10dWork

import ferroccl
from ferroccl import FerrocclError, _c10d
from ferroccl._ferroccl import native_api as _native_api
from ferroccl._torch_types import CARRIED, carried

__all__ = ["ProcessGroupFerroccl", "FerrocclError", "BACKEND_NAME"]

BACKEND_NAME = "ferroccl"

_RedOp = dist.ReduceOp.RedOpType
_OPS = {
    _RedOp.SUM: "sum",
    _RedOp.AVG: "avg",
    _RedOp.PRODUCT: "prod",
    _RedOp.MIN: "min",
    _RedOp.MAX: "max",
}

# The same by the enum's value: hashing the enum itself costs a call into
# torch's bindings per lookup (see `_plain`).
_OPS_BY_VALUE = {int(k): v for k, v in _OPS.items()}


class _Op:
    """A torch reduction as the library runs it: a name, and PREMUL_SUM's
    factor (inputs scaled by it, then summed)."""

    __slots__ = ("name", "factor")

    def __init__(self, name: str, factor: Optional[float] = None) -> None:
        self.name = name
        self.factor = factor


def _op_of(reduce_op: Any, t: torch.Tensor, call: str) -> _Op:
    kind = getattr(reduce_op, "op", reduce_op)
    if kind in _OPS:
        return _Op(_OPS[kind])
    if kind == _RedOp.PREMUL_SUM:
        factor = getattr(reduce_op, "factor", None)
        if factor is None:
            raise ValueError(
                f"ferroccl: {call}: PREMUL_SUM's factor is not readable from Python in "
                f"torch {torch.__version__}; multiply the input and use SUM"
            )
        if isinstance(factor, torch.Tensor):
            factor = factor.item()
        return _Op("sum", float(factor))
    if t.dtype == torch.bool and kind in (_RedOp.BOR, _RedOp.BAND):
        return _Op("max" if kind == _RedOp.BOR else "min")
    raise ValueError(f"ferroccl: {call}: reduction {kind} on {t.dtype} is not supported")


class _Work(_C10dWork):
    """The c10d `Work` of a call: `wait()` raises the call's error (a
    `FerrocclError`, a `RuntimeError`), `get_future()` completes with the
    call's output tensors when the call ends."""

    def __init__(
        self,
        work: Optional[ferroccl.Work | _Later],
        result: List[torch.Tensor],
        after: Optional[Callable[[], None]] = None,
        comm: Optional[ferroccl.Communicator] = None,
    ) -> None:
        super().__init__()
        self._comm = comm
        self._work = work
        self._result = result
        self._after = after
        # Only a call with work left after it ends needs the lock that
        # runs that work once (the fast path makes none).
        self._lock = threading.Lock() if after is not None else None
        self._error: Optional[BaseException] = None

    def _finish(self) -> None:
        if self._lock is None:
            return
        with self._lock:
            after, self._after = self._after, None
        if after is not None:
            after()

    def wait(self, timeout: Any = None) -> bool:
        if self._work is not None:
            self._work.wait()
        self._finish()
        return True

    def is_completed(self) -> bool:
        return self._work is None or self._work.is_completed()

    def is_success(self) -> bool:
        return self.is_completed() and (self._work is None or self._work.error() is None)

    def exception(self) -> Optional[BaseException]:
        return None if self._work is None else self._work.error()

    def result(self) -> List[torch.Tensor]:
        return self._result

    def get_future(self) -> torch.futures.Future:
        fut: torch.futures.Future = torch.futures.Future()
        work = self._work

        def done() -> None:
            err = None if work is None else work.error()
            if err is not None:
                fut.set_exception(err)
                return
            try:
                self._finish()
            except BaseException as e:  # noqa: BLE001 - handed to the future
                fut.set_exception(e)
                return
            fut.set_result(self._result)

        if work is None or self._comm is None:
            done()
        else:
            # Completed by the worker at this place in the call order, not
            # when the call happens to end: callbacks chained on the future
            # (then) issue calls, which must come at the same place on
            # every rank.
            self._comm.enqueue_callback(done)
        return fut


class _Later:
    """A part of a call that runs as a callback on the communicator's
    worker (a tagged recv): it ends when the callback has run, with the
    callback's error if it raised one."""

    def __init__(self) -> None:
        self._ended = threading.Event()
        self._error: Optional[BaseException] = None

    def run(self, fn: Callable[[], None]) -> None:
        try:
            fn()
        except BaseException as e:  # noqa: BLE001 - handed to wait()
            self._error = e
        finally:
            self._ended.set()

    def wait(self) -> bool:
        # Bounded: every library call the callback makes is bounded by the
        # communicator's timeout, and a destroyed communicator runs no
        # callback and refuses to queue one.
        self._ended.wait()
        if self._error is not None:
            raise self._error
        return True

    def is_completed(self) -> bool:
        return self._ended.is_set()

    def error(self) -> Optional[BaseException]:
        return self._error


def _as_bytes(c: torch.Tensor) -> torch.Tensor:
    """The bytes of a contiguous tensor, as a flat uint8 view."""
    return c.reshape(-1).view(torch.uint8)


def _done(result: List[torch.Tensor]) -> _Work:
    """A call that ran to its end already (blocking composites)."""
    return _Work(None, result)


def _joined(works: Sequence[Optional[ferroccl.Work]]) -> Optional[ferroccl.Work]:
    handles: List[Any] = []
    keep: List[Any] = []
    for w in works:
        if w is not None:
            handles.extend(w._handles)
            keep.append(w)
    return ferroccl.Work(handles, keep) if handles else None


def _meeting_host(store: Any) -> str:
    """Where rank 0 of a group can be reached: FERROCCL_MASTER_ADDR, else
    MASTER_ADDR (torchrun, env://), else the host of torch's TCP store,
    else this host's name."""
    for var in ("FERROCCL_MASTER_ADDR", "MASTER_ADDR"):
        if os.environ.get(var):
            return os.environ[var]
    s = store
    for _ in range(8):
        host = getattr(s, "host", None)
        if isinstance(host, str) and host:
            return host
        s = getattr(s, "underlying_store", None)
        if s is None:
            break
    return socket.gethostname()


def _free_port(host: str) -> int:
    """A port free now on this host for rank 0's rendezvous (there is a
    small window before the library binds it, as with NCCL's unique id)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return s.getsockname()[1]


_KEY = "ferroccl/meeting"
_live: weakref.WeakSet[ProcessGroupFerroccl] = weakref.WeakSet()


def _meet(store: Any, rank: int, size: int, timeout: timedelta) -> ferroccl.Communicator:
    seconds = timeout.total_seconds() if timeout else None
    if os.environ.get("FERROCCL_TIMEOUT"):
        seconds = None  # the library reads it; an explicit variable wins
    if rank == 0:
        host = _meeting_host(store)
        port = _free_port(host)
        token = ferroccl.random_token()
        store.set(_KEY, f"{host}|{port}|{token}")
    else:
        # The store's own get waits (bounded by the store's timeout).
        host, port_s, token_s = store.get(_KEY).decode().split("|")
        port, token = int(port_s), int(token_s)
    return ferroccl.Communicator.init(rank, size, host, port, token, seconds)


def _base() -> type:
    """What the backend subclasses: c10d's `Backend` where Python may
    construct one (recent torch), else `ProcessGroup`, which torch 2.11
    and older build from Python and take as the group itself when a
    backend's creator returns one (found on the first GPU run, torch
    2.11: "Backend: No constructor defined!")."""

    class _Probe(_C10dBackend):  # type: ignore[misc, valid-type]
        pass

    try:
        _Probe(0, 1)
    except TypeError:
        return dist.ProcessGroup
    return _C10dBackend


_BASE: Any = _base()


class ProcessGroupFerroccl(_BASE):  # type: ignore[misc, valid-type]
    """c10d backend on a ferroccl communicator (one per group)."""

    def __init__(self, store: Any, rank: int, size: int, timeout: timedelta) -> None:
        super().__init__(rank, size)
        self._rank = rank
        self._size = size
        self._comm = _meet(store, rank, size, timeout)
        # Messages received ahead of the recv naming their tag, by (peer,
        # tag), oldest first; touched only on the communicator's worker.
        self._early: Dict[Tuple[int, int], Deque[torch.Tensor]] = {}
        _live.add(self)

    # -- identity ---------------------------------------------------------
    def _get_backend_name(self) -> str:
        return BACKEND_NAME

    # Where the backend is the group itself (torch 2.11, `_base`), c10d
    # reads the group's name and description from its backends, of which
    # it has none ("ProcessGroup name not set"): kept here instead.
    if _BASE is not _C10dBackend:

        def _set_group_name(self, name: str) -> None:
            self._group_name = name

        def _set_group_desc(self, desc: str) -> None:
            self._group_desc = desc

        def getGroupName(self) -> str:  # noqa: N802  c10d's name
            return getattr(self, "_group_name", "")

        def getGroupDesc(self) -> str:  # noqa: N802  c10d's name
            return getattr(self, "_group_desc", "")

        def getBackendName(self) -> str:  # noqa: N802  c10d's name
            return BACKEND_NAME

    # What c10d asks a backend it may use. Each is given here as a plain
    # property: c10d's Python trampoline answers these by reading the
    # attribute of the Python object, and the inherited attribute asks the
    # trampoline again, so without an answer of its own the first question
    # (batch_isend_irecv asks supports_coalescing) recursed until Python
    # gave up.
    @property
    def supports_coalescing(self) -> bool:
        """No: coalesced calls are issued one by one, in order."""
        return False

    @property
    def supports_splitting(self) -> bool:
        """No: every group gets its own communicator (see `new_group`)."""
        return False

    @property
    def supports_shrinking(self) -> bool:
        """No: the library's shrink is not wired to torch's shrink_group."""
        return False

    @property
    def supports_reconfigure(self) -> bool:
        return False

    @property
    def supports_window(self) -> bool:
        return False

    @property
    def _supports_time_estimate(self) -> bool:
        return False

    @property
    def comm(self) -> ferroccl.Communicator:
        """The group's ferroccl communicator."""
        return self._comm

    def _one(self, tensors: List[torch.Tensor], call: str) -> torch.Tensor:
        if len(tensors) != 1:
            raise ValueError(
                f"ferroccl: {call}: one tensor per process, got {len(tensors)} "
                "(several devices per process are not supported)"
            )
        return tensors[0]

    # -- the fast path ------------------------------------------------------
    def _plain(self, t: torch.Tensor, reduce_op: Any) -> Optional[tuple]:
        """`(address, elements, type, reduction)` of a tensor the library
        takes as it is (contiguous, on the host, a type it carries, a plain
        reduction); None where the general path must map, scale or refuse
        it. A call through torch costs about 10 us of Python before this
        change; each check here is a fraction of a microsecond
        (docs/pytorch.md, "What a call costs")."""
        lib = CARRIED.get(t.dtype)
        if lib is None or t.is_cuda or not t.is_contiguous():
            return None
        if reduce_op is None:
            name: Optional[str] = "sum"
        else:
            name = _OPS_BY_VALUE.get(int(reduce_op.op))
            if name is None:
                return None
        return (t.data_ptr(), t.numel(), lib, name)

    def _issue(
        self, kind: str, send: tuple, recv: tuple, result: List[torch.Tensor], keep: List[torch.Tensor]
    ) -> _Work:
        """Issue a call on plain tensors (see `_plain`) straight to the
        library, whose checks of sizes apply as on every call; `keep` holds
        the tensors until it ends."""
        h = self._comm._c.call_async(kind, send[:2], recv[:2], send[2], send[3], 0, keep)
        return _Work(ferroccl.Work([h], keep), result, comm=self._comm)

    # -- reductions ---------------------------------------------------------
    def _all_reduce(self, t: torch.Tensor, op: _Op, call: str) -> Optional[ferroccl.Work]:
        c, name = carried(t, call, op.name)
        if op.factor is not None:
            c.mul_(op.factor)
        return self._comm.all_reduce(c, op=name, async_op=True)

    def allreduce(self, tensors: List[torch.Tensor], opts: Any = None) -> _Work:
        if len(tensors) == 1:
            p = self._plain(tensors[0], opts.reduceOp if opts is not None else None)
            if p is not None:
                return self._issue("all_reduce", p, p, tensors, tensors)
        t = self._one(tensors, "allreduce")
        op = _op_of(opts.reduceOp if opts is not None else dist.ReduceOp.SUM, t, "allreduce")
        return _Work(self._all_reduce(t, op, "allreduce"), tensors, comm=self._comm)

    def allreduce_coalesced(self, tensors: List[torch.Tensor], opts: Any = None) -> _Work:
        works = []
        for t in tensors:
            op = _op_of(opts.reduceOp, t, "allreduce_coalesced")
            works.append(self._all_reduce(t, op, "allreduce_coalesced"))
        return _Work(_joined(works), tensors, comm=self._comm)

    def reduce(self, tensors: List[torch.Tensor], opts: Any) -> _Work:
        t = self._one(tensors, "reduce")
        op = _op_of(opts.reduceOp, t, "reduce")
        c, name = carried(t, "reduce", op.name)
        if op.factor is not None:
            c.mul_(op.factor)
        w = self._comm.reduce(c, op=name, root=opts.rootRank, async_op=True)
        return _Work(w, tensors, comm=self._comm)

    def _reduce_scatter(
        self, out: torch.Tensor, inp: torch.Tensor, opts: Any, call: str
    ) -> Optional[ferroccl.Work]:
        op = _op_of(opts.reduceOp, inp, call)
        if op.factor is not None:
            inp = inp * op.factor
        ci, name = carried(inp, call, op.name)
        co, _ = carried(out, call, op.name)
        return self._comm.reduce_scatter(ci, co, op=name, async_op=True)

    def reduce_scatter_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any) -> _Work:
        pi, po = self._plain(input, opts.reduceOp), self._plain(output, opts.reduceOp)
        if pi is not None and po is not None and pi[2] == po[2]:
            return self._issue("reduce_scatter", pi, po, [output], [output, input])
        w = self._reduce_scatter(output, input, opts, "reduce_scatter_tensor")
        return _Work(w, [output], comm=self._comm)

    _reduce_scatter_base = reduce_scatter_single

    def reduce_scatter_single_coalesced(
        self, outputs: List[torch.Tensor], inputs: List[torch.Tensor], opts: Any
    ) -> _Work:
        works = [
            self._reduce_scatter(o, i, opts, "reduce_scatter_tensor_coalesced")
            for o, i in zip(outputs, inputs)
        ]
        return _Work(_joined(works), outputs, comm=self._comm)

    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced

    def reduce_scatter(
        self, output_tensors: List[torch.Tensor], input_tensors: List[List[torch.Tensor]], opts: Any
    ) -> _Work:
        out = self._one(output_tensors, "reduce_scatter")
        ins = self._one(input_tensors, "reduce_scatter")
        self._check_list(ins, "reduce_scatter", "inputs")
        sizes = [i.numel() for i in ins]
        if sizes[self._rank] != out.numel():
            raise ValueError(
                f"ferroccl: reduce_scatter: the output has {out.numel()} elements and this "
                f"rank's input block {sizes[self._rank]}"
            )
        m = max(sizes)
        flat = torch.zeros(m * self._size, dtype=out.dtype, device=out.device)
        for k, i in enumerate(ins):
            flat[k * m : k * m + i.numel()].copy_(i.reshape(-1))
        block = torch.empty(m, dtype=out.dtype, device=out.device)
        w = self._reduce_scatter(block, flat, opts, "reduce_scatter")

        def after() -> None:
            out.reshape(-1).copy_(block[: out.numel()])

        return _Work(_joined([w]) if w else None, output_tensors, after, comm=self._comm)

    # -- gathers ------------------------------------------------------------
    def _check_list(self, ts: List[torch.Tensor], call: str, what: str) -> None:
        if len(ts) != self._size:
            raise ValueError(f"ferroccl: {call}: {len(ts)} {what} for a group of {self._size} ranks")

    def all_gather_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> _Work:
        pi, po = self._plain(input, None), self._plain(output, None)
        if pi is not None and po is not None and pi[2] == po[2]:
            return self._issue("all_gather", pi, po, [output], [output, input])
        ci, _ = carried(input, "all_gather_into_tensor", None)
        co, _ = carried(output, "all_gather_into_tensor", None)
        w = self._comm.all_gather(ci, co, async_op=True)
        return _Work(w, [output], comm=self._comm)

    _allgather_base = all_gather_single

    def all_gather_single_coalesced(
        self, outputs: List[torch.Tensor], inputs: List[torch.Tensor], opts: Any = None
    ) -> _Work:
        works = []
        for o, i in zip(outputs, inputs):
            ci, _ = carried(i, "all_gather_into_tensor_coalesced", None)
            co, _ = carried(o, "all_gather_into_tensor_coalesced", None)
            works.append(self._comm.all_gather(ci, co, async_op=True))
        return _Work(_joined(works), outputs, comm=self._comm)

    allgather_into_tensor_coalesced = all_gather_single_coalesced

    def allgather(
        self, output_tensors: List[List[torch.Tensor]], input_tensors: List[torch.Tensor], opts: Any = None
    ) -> _Work:
        outs = self._one(output_tensors, "allgather")
        inp = self._one(input_tensors, "allgather")
        self._check_list(outs, "allgather", "outputs")
        ci, _ = carried(inp, "allgather", None)
        couts = [carried(o, "allgather", None)[0].reshape(-1) for o in outs]
        sizes = [c.numel() for c in couts]
        if sizes[self._rank] != ci.numel():
            raise ValueError(
                f"ferroccl: allgather: the input has {inp.numel()} elements and this rank's "
                f"output {outs[self._rank].numel()}"
            )
        if any(c.dtype != ci.dtype for c in couts):
            raise TypeError("ferroccl: allgather: outputs and input differ in element type")
        # Blocks of unequal size travel padded to the largest (every rank
        # knows every size from its outputs).
        m = max(sizes)
        if ci.numel() == m:
            src = ci.reshape(-1)
        else:
            src = torch.zeros(m, dtype=ci.dtype, device=ci.device)
            src[: ci.numel()].copy_(ci.reshape(-1))
        flat = torch.empty(m * self._size, dtype=ci.dtype, device=ci.device)
        w = self._comm.all_gather(src, flat, async_op=True)

        def after() -> None:
            for k, c in enumerate(couts):
                c.copy_(flat[k * m : k * m + c.numel()])

        return _Work(w, outs, after, comm=self._comm)

    def broadcast(self, tensors: List[torch.Tensor], opts: Any) -> _Work:
        t = self._one(tensors, "broadcast")
        c, _ = carried(t, "broadcast", None)
        return _Work(self._comm.broadcast(c, opts.rootRank, async_op=True), tensors, comm=self._comm)

    def barrier(self, opts: Any = None) -> _Work:
        return _Work(self._comm.barrier(async_op=True), [], comm=self._comm)

    # -- point to point and blocking composites ----------------------------
    def send(self, tensors: List[torch.Tensor], dstRank: int, tag: int = 0) -> _Work:
        t = self._one(tensors, "send")
        c, _ = carried(t, "send", None)
        if c.is_cuda:
            # NCCL's rule on the device: in order per peer, tags not matched.
            return _Work(self._comm.send(c, dstRank, async_op=True), tensors, comm=self._comm)
        return _Work(self._send_tagged(c, dstRank, tag), tensors, comm=self._comm)

    def recv(self, tensors: List[torch.Tensor], srcRank: int, tag: int = 0) -> _Work:
        t = self._one(tensors, "recv")
        c, _ = carried(t, "recv", None)
        if c.is_cuda:
            return _Work(self._comm.recv(c, srcRank, async_op=True), tensors, comm=self._comm)
        return _Work(self._recv_tagged(c, srcRank, tag), tensors, comm=self._comm)

    # Tags on the host, as Gloo matches them: every message between two
    # ranks is a header (tag, bytes) and then its bytes, in order on the
    # library's connection; a recv takes the next message of its peer
    # whose tag it names, keeping the ones it passes (with other tags) for
    # the recvs that name them. gather and scatter use tags of their own
    # (below any a user may pass), so they never take a user's message.
    _GATHER_TAG = -1
    _SCATTER_TAG = -2

    def _send_tagged(self, c: torch.Tensor, peer: int, tag: int) -> Optional[ferroccl.Work]:
        payload = _as_bytes(c)
        head = torch.tensor([tag, payload.numel()], dtype=torch.int64)
        first = self._comm.send(head, peer, async_op=True)
        return _joined([first, self._comm.send(payload, peer, async_op=True)])

    def _blocking_send(self, c: torch.Tensor, peer: int, tag: int) -> None:
        w = self._send_tagged(c, peer, tag)
        if w is not None:
            w.wait()

    def _recv_tagged(self, c: torch.Tensor, peer: int, tag: int) -> _Later:
        """Receive the next message of `peer` with `tag` into `c`; runs on
        the communicator's worker at this place in the call order."""
        later = _Later()
        dst = _as_bytes(c)
        self._comm.enqueue_callback(lambda: later.run(lambda: self._take(dst, peer, tag)))
        return later

    def _take(self, dst: torch.Tensor, peer: int, tag: int) -> None:
        early = self._early.get((peer, tag))
        if early:
            self._fill(dst, early.popleft(), peer, tag)
            return
        head = torch.empty(2, dtype=torch.int64)
        while True:
            self._comm.recv(head, peer)
            got, n = int(head[0]), int(head[1])
            if n < 0:
                raise RuntimeError(f"ferroccl: recv: rank {peer} sent a header of {n} bytes")
            if got == tag and n == dst.numel():
                self._comm.recv(dst, peer)
                return
            buf = torch.empty(n, dtype=torch.uint8)
            self._comm.recv(buf, peer)
            if got == tag:
                self._fill(dst, buf, peer, tag)  # raises: the sizes differ
            self._early.setdefault((peer, got), deque()).append(buf)

    @staticmethod
    def _fill(dst: torch.Tensor, buf: torch.Tensor, peer: int, tag: int) -> None:
        if buf.numel() != dst.numel():
            raise ValueError(
                f"ferroccl: recv: rank {peer} sent {buf.numel()} bytes with tag {tag}, "
                f"and this recv takes {dst.numel()}"
            )
        dst.copy_(buf)

    def recv_anysource(self, tensors: List[torch.Tensor], tag: int = 0) -> _Work:
        raise RuntimeError("ferroccl: recv from any source is not supported: name the source rank")

    def gather(
        self, output_tensors: List[List[torch.Tensor]], input_tensors: List[torch.Tensor], opts: Any
    ) -> _Work:
        inp = self._one(input_tensors, "gather")
        root = opts.rootRank
        ci, _ = carried(inp, "gather", None)
        if self._rank == root:
            outs = self._one(output_tensors, "gather")
            self._check_list(outs, "gather", "outputs")
            pending: List[_Later] = []
            for k, o in enumerate(outs):
                co, _ = carried(o, "gather", None)
                if k == root:
                    co.copy_(ci.reshape(co.shape))
                else:
                    pending.append(self._recv_tagged(co, k, self._GATHER_TAG))
            for p in pending:
                p.wait()
        else:
            self._blocking_send(ci, root, self._GATHER_TAG)
        return _done([])

    def scatter(
        self, output_tensors: List[torch.Tensor], input_tensors: List[List[torch.Tensor]], opts: Any
    ) -> _Work:
        out = self._one(output_tensors, "scatter")
        root = opts.rootRank
        co, _ = carried(out, "scatter", None)
        if self._rank == root:
            ins = self._one(input_tensors, "scatter")
            self._check_list(ins, "scatter", "inputs")
            for k, i in enumerate(ins):
                ci, _ = carried(i.contiguous(), "scatter", None)
                if k == root:
                    co.copy_(ci.reshape(co.shape))
                else:
                    self._blocking_send(ci, k, self._SCATTER_TAG)
        else:
            self._recv_tagged(co, root, self._SCATTER_TAG).wait()
        return _done(output_tensors)

    def _all_to_all_blocks(self, outs: List[torch.Tensor], ins: List[torch.Tensor], call: str) -> None:
        """Blocks of any sizes: padded to the largest block of any rank (one
        small allreduce of MAX agrees on it), one all-to-all, unpacked."""
        if len(outs) != self._size or len(ins) != self._size:
            raise ValueError(f"ferroccl: {call}: one block per rank of {self._size} is needed")
        cin = [carried(i, call, None)[0].reshape(-1) for i in ins]
        cout = [carried(o, call, None)[0].reshape(-1) for o in outs]
        local = max([c.numel() for c in cin] + [c.numel() for c in cout] + [0])
        agreed = torch.tensor([local], dtype=torch.int64)
        self._comm.all_reduce(agreed, op="max")
        m = int(agreed.item())
        dt = cin[0].dtype if cin else torch.uint8
        if cin and any(c.dtype != dt for c in cin + cout):
            raise TypeError(f"ferroccl: {call}: every block must have one element type")
        send = torch.zeros(m * self._size, dtype=dt)
        for k, c in enumerate(cin):
            send[k * m : k * m + c.numel()].copy_(c)
        recv = torch.empty(m * self._size, dtype=dt)
        self._comm.all_to_all(send, recv)
        for k, c in enumerate(cout):
            c.copy_(recv[k * m : k * m + c.numel()])

    def alltoall(
        self, output_tensors: List[torch.Tensor], input_tensors: List[torch.Tensor], opts: Any = None
    ) -> _Work:
        self._all_to_all_blocks(output_tensors, input_tensors, "alltoall")
        return _done(output_tensors)

    def all_to_all_single(
        self,
        output: torch.Tensor,
        input: torch.Tensor,
        output_split_sizes: List[int],
        input_split_sizes: List[int],
        opts: Any = None,
    ) -> _Work:
        call = "all_to_all_single"
        n = self._size
        if not output_split_sizes and not input_split_sizes:
            if input.numel() % n or output.numel() != input.numel():
                raise ValueError(
                    f"ferroccl: {call}: {input.numel()} input and {output.numel()} output "
                    f"elements do not split evenly over {n} ranks"
                )
            ci, _ = carried(input, call, None)
            co, _ = carried(output, call, None)
            return _Work(self._comm.all_to_all(ci, co, async_op=True), [output], comm=self._comm)
        rows_in = input.shape[0] if input.dim() else 1
        rows_out = output.shape[0] if output.dim() else 1
        in_splits = list(input_split_sizes) or [rows_in // n] * n
        out_splits = list(output_split_sizes) or [rows_out // n] * n
        if sum(in_splits) != rows_in or sum(out_splits) != rows_out:
            raise ValueError(
                f"ferroccl: {call}: split sizes {in_splits} / {out_splits} do not add up to "
                f"{rows_in} input and {rows_out} output rows"
            )
        ins = list(torch.split(input, in_splits)) if input.dim() else [input]
        outs = list(torch.split(output, out_splits)) if output.dim() else [output]
        # Splits of dim 0 are contiguous views of contiguous tensors.
        self._all_to_all_blocks(outs, [i.contiguous() for i in ins], call)
        return _done([output])

    alltoall_base = all_to_all_single

    # -- life cycle ---------------------------------------------------------
    def abort(self) -> None:
        self._comm.abort()

    def shutdown(self) -> None:
        self._comm.destroy()


def _create(store: Any, rank: int, size: int, timeout: timedelta) -> Any:
    """The group's backend: the C++ one (`_c10d`) around the Python one
    where it is built, else the Python one."""
    py_backend = ProcessGroupFerroccl(store, rank, size, timeout)
    cpp = _c10d.load()
    if cpp is None:
        return py_backend
    return cpp.FerrocclBackend(rank, size, py_backend, _native_api, py_backend._comm._c._native_ref())


def _register() -> None:
    if BACKEND_NAME.upper() in dist.Backend._plugins:
        return
    dist.Backend.register_backend(BACKEND_NAME, _create, devices=["cpu", "cuda"])
    # torch attaches its flight recorder to groups of backends that do not
    # record themselves, and the recorder asks the C++ backend for its name,
    # which a Python subclass cannot give (c10d's getBackendName is not
    # reachable from Python): the recorder is kept off this backend's
    # groups, as it is off Gloo's.
    recording = getattr(dist.distributed_c10d, "_FR_SELF_RECORDING_BACKENDS", None)
    if isinstance(recording, set):
        recording.add(BACKEND_NAME)


@atexit.register
def _shutdown_all() -> None:
    # Queued calls finish (each bounded by the timeout) and the worker
    # threads end before the interpreter does.
    for pg in list(_live):
        try:
            pg._comm.destroy()
        except Exception:  # noqa: BLE001 - exiting; nothing to report to
            pass


_register()
