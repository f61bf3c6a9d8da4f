"""ferroccl: collective communication from Rust, for Python.

`Communicator` runs every collective of the library on any C-contiguous
buffer: a numpy array, a torch tensor, or any writable object with the
buffer protocol. The buffer's own memory is used (no copy); the GIL is
released while a call runs; `async_op=True` returns a `Work` with `wait()`
and `is_completed()`. `ferroccl.torch` registers the library as the
torch.distributed backend "ferroccl".
"""

from __future__ import annotations

import ctypes
import sys
from typing import Any, Callable, Optional, Sequence, Tuple

from ._ferroccl import Communicator as _Communicator
from ._ferroccl import FerrocclError, data_types, random_token

__all__ = [
    "Communicator",
    "FerrocclError",
    "Work",
    "data_types",
    "random_token",
    "REDUCE_OPS",
]

#: Reductions the library has (names as the library spells them).
REDUCE_OPS = ("sum", "prod", "min", "max", "avg")

# Type names as the library spells them (DataType::name), by numpy dtype
# name and by buffer-protocol format character.
_NUMPY_TYPES = {
    "float32": "float",
    "float64": "double",
    "float16": "half",
    "bfloat16": "bfloat16",
    "int8": "int8",
    "uint8": "uint8",
    "int32": "int32",
    "uint32": "uint32",
    "int64": "int64",
    "uint64": "uint64",
}
_FORMATS = {
    "f": "float",
    "d": "double",
    "e": "half",
    "b": "int8",
    "B": "uint8",
    "c": "uint8",
    "i": "int32",
    "I": "uint32",
    "q": "int64",
    "Q": "uint64",
    "l": "int64" if ctypes.sizeof(ctypes.c_long) == 8 else "int32",
    "L": "uint64" if ctypes.sizeof(ctypes.c_long) == 8 else "uint32",
}


class Buffer:
    """Where a buffer's elements are: address, element count, type name,
    and the CUDA stream for device memory (None on the host)."""

    __slots__ = ("addr", "count", "dtype", "stream", "owner")

    def __init__(self, addr: int, count: int, dtype: str, stream: Optional[int], owner: Any) -> None:
        self.addr = addr
        self.count = count
        self.dtype = dtype
        self.stream = stream
        # Held so that the memory lives as long as this description.
        self.owner = owner

    def pair(self) -> Tuple[int, int]:
        return (self.addr, self.count)


# The torch type table, imported on first use (so that importing ferroccl
# does not import torch). Not named `_torch_types`: `from . import X` takes
# the package's attribute X when there is one, so a placeholder of that
# name set to None would be taken for the module.
_tt: Any = None


def _torch_buffer(t: Any, call: str) -> Buffer:
    global _tt
    if _tt is None:
        from . import _torch_types as tt

        _tt = tt
    if not t.is_contiguous():
        raise ValueError(
            f"ferroccl: {call}: the tensor is not contiguous (shape {tuple(t.shape)}, "
            f"strides {t.stride()}): pass tensor.contiguous() and copy the result back"
        )
    dtype = _tt.CARRIED.get(t.dtype) or _tt.library_type(t.dtype, call)
    stream = None
    if t.is_cuda:
        stream = sys.modules["torch"].cuda.current_stream(t.device).cuda_stream
    return Buffer(t.data_ptr(), t.numel(), dtype, stream, t)


def buffer(obj: Any, call: str) -> Buffer:
    """Describe `obj` (a torch tensor, a numpy array, a writable buffer)
    without copying it; a clear error for what the library cannot carry."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(obj, torch.Tensor):
        return _torch_buffer(obj, call)
    iface = getattr(obj, "__array_interface__", None)
    if iface is not None:
        name = getattr(getattr(obj, "dtype", None), "name", None)
        if name not in _NUMPY_TYPES:
            raise TypeError(
                f"ferroccl: {call}: element type {name} is not one the library carries "
                f"({', '.join(sorted(_NUMPY_TYPES))})"
            )
        if not obj.flags["C_CONTIGUOUS"]:
            raise ValueError(
                f"ferroccl: {call}: the array is not C-contiguous: pass "
                "numpy.ascontiguousarray(a) and copy the result back"
            )
        return Buffer(iface["data"][0], obj.size, _NUMPY_TYPES[name], None, obj)
    try:
        view = memoryview(obj)
    except TypeError:
        raise TypeError(
            f"ferroccl: {call}: {type(obj).__name__} is neither a tensor, an array nor a buffer"
        ) from None
    fmt = view.format.lstrip("@=<")
    if fmt not in _FORMATS:
        raise TypeError(
            f"ferroccl: {call}: buffer format {view.format!r} is not an element type the library carries"
        )
    if not view.c_contiguous:
        raise ValueError(f"ferroccl: {call}: the buffer is not C-contiguous")
    if view.readonly:
        raise ValueError(f"ferroccl: {call}: the buffer is read-only; use a numpy array or a writable buffer")
    count = view.nbytes // view.itemsize
    if count == 0:
        return Buffer(0, 0, _FORMATS[fmt], None, view)
    addr = ctypes.addressof(ctypes.c_char.from_buffer(view))
    return Buffer(addr, count, _FORMATS[fmt], None, view)


class Work:
    """An async call: `wait()` blocks until it ends (raising its error),
    `is_completed()` never blocks. Holds the call's buffers until then."""

    def __init__(self, handles: Sequence[Any], keep: Any, after: Optional[Callable[[], None]] = None) -> None:
        self._handles = list(handles)
        self._keep = keep
        self._after = after

    def wait(self) -> bool:
        for h in self._handles:
            h.wait()
        if self._after is not None:
            after, self._after = self._after, None
            after()
        self._keep = None
        return True

    def is_completed(self) -> bool:
        return all(h.is_completed() for h in self._handles)

    def add_done_callback(self, fn: Callable[[], None]) -> None:
        """Call `fn()` once every part of the call has ended (at once if it
        has); from the communicator's worker thread otherwise."""
        remaining = [len(self._handles)]
        if not self._handles:
            fn()
            return

        def one() -> None:
            remaining[0] -= 1
            if remaining[0] == 0:
                fn()

        for h in self._handles:
            h.add_done_callback(one)

    def error(self) -> Optional[BaseException]:
        for h in self._handles:
            e = h.error()
            if e is not None:
                return e
        return None


def _check_op(op: str, call: str) -> str:
    if op not in REDUCE_OPS:
        raise ValueError(f"ferroccl: {call}: reduction {op!r} is not one of {', '.join(REDUCE_OPS)}")
    return op


class Communicator:
    """A group of ranks running collectives together (the library's
    `Communicator`). Calls run in issue order on every rank."""

    def __init__(self, inner: _Communicator) -> None:
        self._c = inner

    @staticmethod
    def from_env() -> Communicator:
        """Join the job the launcher's environment describes (ferroccl-run,
        mpirun, Slurm)."""
        return Communicator(_Communicator.from_env())

    @staticmethod
    def init(
        rank: int,
        size: int,
        addr: str,
        port: int,
        token: int,
        timeout: Optional[float] = None,
    ) -> Communicator:
        """Join a job explicitly: rank 0 hosts the rendezvous at addr:port,
        every rank gives the same token; `timeout` (s) bounds every wait."""
        return Communicator(_Communicator.init(rank, size, addr, port, token, timeout))

    @property
    def rank(self) -> int:
        return self._c.rank

    @property
    def size(self) -> int:
        return self._c.size

    @property
    def timeout(self) -> float:
        return self._c.timeout

    def __repr__(self) -> str:
        return repr(self._c)

    # The one entry point every collective goes through.
    def _run(
        self,
        kind: str,
        send: Optional[Buffer],
        recv: Optional[Buffer],
        op: str = "sum",
        root: int = 0,
        async_op: bool = False,
    ) -> Optional[Work]:
        bufs = [b for b in (send, recv) if b is not None]
        dtype = bufs[0].dtype if bufs else "uint8"
        for b in bufs:
            if b.dtype != dtype:
                raise TypeError(
                    f"ferroccl: {kind}: input is {send.dtype if send else None} and output "
                    f"{recv.dtype if recv else None}: one element type per call"
                )
        s = send.pair() if send is not None else (0, 0)
        r = recv.pair() if recv is not None else (0, 0)
        streams = {b.stream for b in bufs if b.count > 0}
        if len(streams) > 1:
            raise ValueError(f"ferroccl: {kind}: one buffer is in device memory and the other on the host")
        stream = streams.pop() if streams else None
        if stream is not None:
            h = self._c.call_device(kind, s, r, dtype, stream, op, root)
            w = Work([h], bufs)
            return w if async_op else None
        if not async_op:
            self._c.call(kind, s, r, dtype, op, root)
            return None
        return Work([self._c.call_async(kind, s, r, dtype, op, root, bufs)], bufs)

    def all_reduce(
        self, send: Any, recv: Any = None, op: str = "sum", async_op: bool = False
    ) -> Optional[Work]:
        """recv[i] = op over ranks of send[i]; in place when recv is None."""
        op = _check_op(op, "all_reduce")
        s = buffer(send, "all_reduce")
        r = s if recv is None else buffer(recv, "all_reduce")
        return self._run("all_reduce", s, r, op, async_op=async_op)

    def reduce_scatter(self, send: Any, recv: Any, op: str = "sum", async_op: bool = False) -> Optional[Work]:
        """recv = this rank's block of op over ranks of send
        (len(send) == len(recv) * size)."""
        op = _check_op(op, "reduce_scatter")
        return self._run(
            "reduce_scatter",
            buffer(send, "reduce_scatter"),
            buffer(recv, "reduce_scatter"),
            op,
            async_op=async_op,
        )

    def all_gather(self, send: Any, recv: Any, async_op: bool = False) -> Optional[Work]:
        """recv = every rank's send, in rank order (len(recv) == len(send) * size)."""
        return self._run(
            "all_gather",
            buffer(send, "all_gather"),
            buffer(recv, "all_gather"),
            async_op=async_op,
        )

    def broadcast(self, buf: Any, root: int, async_op: bool = False) -> Optional[Work]:
        """buf = root's buf on every rank."""
        b = buffer(buf, "broadcast")
        return self._run("broadcast", b, b, root=root, async_op=async_op)

    def reduce(
        self,
        send: Any,
        recv: Any = None,
        op: str = "sum",
        root: int = 0,
        async_op: bool = False,
    ) -> Optional[Work]:
        """recv on root = op over ranks of send; in place when recv is None."""
        op = _check_op(op, "reduce")
        s = buffer(send, "reduce")
        r = s if recv is None else buffer(recv, "reduce")
        return self._run("reduce", s, r, op, root=root, async_op=async_op)

    def all_to_all(self, send: Any, recv: Any, async_op: bool = False) -> Optional[Work]:
        """Block j of send goes to rank j; block i of recv came from rank i."""
        return self._run(
            "all_to_all",
            buffer(send, "all_to_all"),
            buffer(recv, "all_to_all"),
            async_op=async_op,
        )

    def send(self, buf: Any, peer: int, async_op: bool = False) -> Optional[Work]:
        """Send buf to peer (matched in order with peer's recv)."""
        return self._run("send", buffer(buf, "send"), None, root=peer, async_op=async_op)

    def recv(self, buf: Any, peer: int, async_op: bool = False) -> Optional[Work]:
        """Receive into buf from peer."""
        return self._run("recv", None, buffer(buf, "recv"), root=peer, async_op=async_op)

    def barrier(self, async_op: bool = False) -> Optional[Work]:
        """Wait until every rank has called barrier."""
        return self._run("barrier", None, None, async_op=async_op)

    def enqueue_callback(self, fn: Callable[[], None]) -> None:
        """Call `fn()` on the communicator's worker once every call issued
        before has ended, at this place in the call order: calls `fn`
        issues run there on every rank alike."""
        self._c.enqueue_callback(fn)

    def async_error(self) -> Optional[str]:
        """The failure that ended this communicator, if any (never blocks)."""
        return self._c.async_error()

    def abort(self) -> None:
        """End every in-flight and queued call with an error."""
        self._c.abort()

    def destroy(self) -> None:
        """Finish queued calls and stop the worker thread (idempotent)."""
        self._c.destroy()
