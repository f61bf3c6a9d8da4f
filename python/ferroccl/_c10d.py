"""The torch backend's C++ face (csrc/c10d_backend.cpp): built once per
torch version and source on first use with torch's own extension builder,
cached where torch caches extensions (TORCH_EXTENSIONS_DIR, else
~/.cache/torch_extensions), and loaded from there afterwards.

FERROCCL_TORCH_BACKEND chooses: ``auto`` (default) uses the C++ backend
where it is built or can be built (a C++ compiler and ninja; ``pip install
ninja``) and the Python backend otherwise, with a warning saying why;
``cpp`` requires it (an error names what is missing); ``python`` never
uses it. docs/pytorch.md, "The C++ backend", says what each costs.
"""

from __future__ import annotations

import os
import shutil
import sys
import threading
import warnings
from pathlib import Path
from types import ModuleType
from typing import Optional

SOURCE = Path(__file__).resolve().parent / "csrc" / "c10d_backend.cpp"
NAME = "ferroccl_c10d"
_MODES = ("auto", "cpp", "python")

_lock = threading.Lock()
_loaded: Optional[ModuleType] = None
_why_not: Optional[str] = None
_tried = False
_warned = False


def mode() -> str:
    """FERROCCL_TORCH_BACKEND, checked."""
    m = os.environ.get("FERROCCL_TORCH_BACKEND", "auto").strip().lower() or "auto"
    if m not in _MODES:
        raise ValueError(f"ferroccl: FERROCCL_TORCH_BACKEND={m!r}: expected one of {', '.join(_MODES)}")
    return m


def _ninja_on_path() -> None:
    """Put the ninja of the `ninja` wheel on PATH where none is there
    (torch's builder runs `ninja` by name; a virtual environment's bin/
    is not on PATH when its python is run by path)."""
    if shutil.which("ninja"):
        return
    for d in (Path(sys.executable).parent, Path(sys.prefix) / "bin"):
        if (d / "ninja").exists():
            os.environ["PATH"] = f"{d}{os.pathsep}{os.environ.get('PATH', '')}"
            return
    try:
        import ninja  # type: ignore[import-not-found]

        os.environ["PATH"] = f"{ninja.BIN_DIR}{os.pathsep}{os.environ.get('PATH', '')}"
    except (ImportError, AttributeError):
        pass


def _build() -> ModuleType:
    from torch.utils import cpp_extension

    _ninja_on_path()
    if not cpp_extension.is_ninja_available():
        raise RuntimeError("ninja is not installed (pip install ninja)")
    cxx = os.environ.get("CXX", "c++")
    if shutil.which(cxx) is None:
        raise RuntimeError(f"no C++ compiler ({cxx!r} is not on PATH)")
    # torch's builder takes a lock in the build folder: ranks that start
    # together build once, the others wait for it and load the result.
    return cpp_extension.load(
        name=NAME,
        sources=[str(SOURCE)],
        extra_cflags=["-O2"],
        verbose=os.environ.get("FERROCCL_TORCH_BUILD_VERBOSE") == "1",
    )


def load() -> Optional[ModuleType]:
    """The built C++ module, building it on first use; None where the
    mode is ``python`` or (mode ``auto``) it cannot be built, with a
    warning saying why."""
    global _loaded, _why_not, _tried, _warned
    m = mode()
    if m == "python":
        return None
    with _lock:
        if not _tried:
            _tried = True
            try:
                _loaded = _build()
            except Exception as e:  # noqa: BLE001 - reported below, by mode
                _why_not = f"{type(e).__name__}: {e}"
        if _loaded is not None:
            return _loaded
        if m == "cpp":
            raise RuntimeError(
                f"ferroccl: FERROCCL_TORCH_BACKEND=cpp but the C++ backend cannot be built: {_why_not}"
            )
        if _warned:
            return None
        _warned = True
        warnings.warn(
            f"ferroccl: the C++ torch backend is not available ({_why_not}); the Python backend "
            "serves this process (slower per call; Work.is_completed() through torch stays "
            "False: docs/pytorch.md). FERROCCL_TORCH_BACKEND=python silences this.",
            RuntimeWarning,
            stacklevel=3,
        )
        return None


def why_not() -> Optional[str]:
    """Why the C++ backend could not be built, where it was tried and could not."""
    return _why_not
