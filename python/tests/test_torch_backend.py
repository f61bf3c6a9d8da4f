"""torch.distributed on the "ferroccl" backend, each test a job of worker
processes (workers/*.py) checked against references they compute alone."""

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
