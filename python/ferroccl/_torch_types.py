"""Torch element types and the library's: which map exactly, which travel
as bytes or as pairs of floats, which are refused (naming the type and the
call)."""

from __future__ import annotations

from typing import Any, Optional, Tuple

import torch

#: Torch types the library carries as themselves.
CARRIED = {
    torch.float32: "float",
    torch.float64: "double",
    torch.float16: "half",
    torch.bfloat16: "bfloat16",
    torch.int8: "int8",
    torch.uint8: "uint8",
    torch.int32: "int32",
    torch.int64: "int64",
}
# Present in every torch this package supports (2.3+), but looked up by
# name so an older torch only loses them.
for _name, _lib in (("uint32", "uint32"), ("uint64", "uint64")):
    if hasattr(torch, _name):
        CARRIED[getattr(torch, _name)] = _lib

_COMPLEX = {torch.complex64, torch.complex128}


def library_type(dtype: Any, call: str) -> str:
    """The library's name of a torch type it carries as itself."""
    try:
        return CARRIED[dtype]
    except KeyError:
        raise TypeError(
            f"ferroccl: {call}: element type {dtype} is not one the library carries "
            f"({', '.join(str(d) for d in CARRIED)})"
        ) from None


def carried(t: torch.Tensor, call: str, op: Optional[str]) -> Tuple[torch.Tensor, Optional[str]]:
    """`t` as a tensor of a type the library carries, sharing its memory,
    and the reduction to run on it; `op` None for calls that only move
    data. Raises TypeError naming the type and the call where no exact
    mapping exists."""
    if not t.is_contiguous():
        raise ValueError(
            f"ferroccl: {call}: the tensor is not contiguous (shape {tuple(t.shape)}, "
            f"strides {t.stride()}): pass tensor.contiguous() and copy the result back"
        )
    if t.dtype in CARRIED:
        return t, op
    if op is None:
        # Moving bytes is exact for every type.
        return _bytes(t, call), None
    if t.dtype == torch.bool:
        # 0/1 bytes: max is logical or, min logical and, exactly.
        if op in ("max", "min"):
            return t.view(torch.uint8), op
        raise TypeError(
            f"ferroccl: {call}: reduction {op} on torch.bool has no exact mapping "
            "(use MAX for logical or, MIN for logical and, or convert to an integer type)"
        )
    if t.dtype in _COMPLEX:
        # Complex addition is componentwise: a sum (or average) of pairs of
        # floats is the complex sum, bit for bit.
        if op in ("sum", "avg"):
            return torch.view_as_real(t), op
        raise TypeError(
            f"ferroccl: {call}: reduction {op} on {t.dtype} is not defined componentwise "
            "(only SUM and AVG are)"
        )
    raise TypeError(
        f"ferroccl: {call}: element type {t.dtype} cannot be reduced by the library "
        f"(it carries {', '.join(str(d) for d in CARRIED)}; {t.dtype} only moves as bytes "
        "in broadcast, gathers, scatter, all-to-all and send/recv)"
    )


def _bytes(t: torch.Tensor, call: str) -> torch.Tensor:
    if not t.is_contiguous():
        raise ValueError(f"ferroccl: {call}: the tensor is not contiguous")
    if t.numel() == 0:
        return torch.empty(0, dtype=torch.uint8, device=t.device)
    if t.dtype in _COMPLEX:
        t = torch.view_as_real(t)
    return t.reshape(-1).view(torch.uint8)
