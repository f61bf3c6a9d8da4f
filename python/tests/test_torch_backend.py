"""torch.distributed on the "ferroccl" backend, each test a job of worker
processes (workers/*.py) checked against references they compute alone."""

import os
import subprocess
import sys

import pytest

from launch import check

pytest.importorskip("torch")


@pytest.fixture(scope="session", autouse=True)
def cpp_backend() -> None:
    """Build the C++ backend once, before any job (the first build takes
    about a minute, which a job's ranks would otherwise spend waiting on
    it). FERROCCL_TORCH_BACKEND=cpp (CI) fails here if it cannot be
    built."""
    from ferroccl import _c10d

    if _c10d.mode() != "python":
        _c10d.load()


@pytest.mark.parametrize("nprocs", [1, 2, 3, 4])
def test_collectives(nprocs: int) -> None:
    r = check("collectives.py", nprocs)
    assert all("checks passed" in o for o in r.outputs), r.report()


@pytest.mark.parametrize("nprocs", [2, 3])
def test_ddp(nprocs: int) -> None:
    r = check("ddp.py", nprocs)
    assert all("ddp checks passed" in o for o in r.outputs), r.report()


@pytest.mark.parametrize("script", ["collectives.py", "ddp.py"])
def test_python_backend(script: str) -> None:
    """The Python backend alone (FERROCCL_TORCH_BACKEND=python), which
    serves where the C++ one cannot be built."""
    r = check(script, 2, env={"FERROCCL_TORCH_BACKEND": "python"})
    assert all("checks passed" in o for o in r.outputs), r.report()


def test_fsdp2() -> None:
    r = check("fsdp.py", 2)
    assert all("fsdp checks passed" in o for o in r.outputs), r.report()


def test_subgroups() -> None:
    r = check("subgroups.py", 4)
    assert all("subgroup checks passed" in o for o in r.outputs), r.report()


def test_package_without_the_backend() -> None:
    r = check("direct.py", 2)
    assert all("direct checks passed" in o for o in r.outputs), r.report()


def test_killed_rank() -> None:
    from launch import run

    r = run("failure.py", 3, deadline_s=120)
    # The victim was killed (SIGKILL); every survivor raised, named it,
    # and tore down cleanly.
    assert r.codes[2] == -9, r.report()
    assert r.codes[:2] == [0, 0], r.report()
    assert all("failure checks passed" in o for o in r.outputs[:2]), r.report()


def _load_in_fresh_process(mode: str) -> "subprocess.CompletedProcess[str]":
    code = (
        "import warnings\n"
        "from ferroccl import _c10d\n"
        "with warnings.catch_warnings(record=True) as w:\n"
        "    warnings.simplefilter('always')\n"
        "    try:\n"
        "        m = _c10d.load()\n"
        "    except RuntimeError as e:\n"
        "        print('raised:', e)\n"
        "    else:\n"
        "        print('module:', m)\n"
        "        print('warnings:', [str(x.message) for x in w])\n"
    )
    env = dict(os.environ, CXX="/nonexistent/c++", FERROCCL_TORCH_BACKEND=mode)
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)


def test_without_a_compiler() -> None:
    """auto: the Python backend serves, with a warning naming what is
    missing; cpp: an error naming it."""
    r = _load_in_fresh_process("auto")
    assert "module: None" in r.stdout, r.stdout + r.stderr
    assert "no C++ compiler" in r.stdout and "/nonexistent/c++" in r.stdout, r.stdout
    r = _load_in_fresh_process("cpp")
    assert "raised: ferroccl: FERROCCL_TORCH_BACKEND=cpp" in r.stdout, r.stdout + r.stderr
    assert "no C++ compiler" in r.stdout, r.stdout
