"""torch.distributed on the "ferroccl" backend, each test a job of worker
processes (workers/*.py) checked against references they compute alone."""

import pytest

from launch import check

pytest.importorskip("torch")


@pytest.mark.parametrize("nprocs", [1, 2, 3, 4])
def test_collectives(nprocs: int) -> None:
    r = check("collectives.py", nprocs)
    assert all("checks passed" in o for o in r.outputs), r.report()


@pytest.mark.parametrize("nprocs", [2, 3])
def test_ddp(nprocs: int) -> None:
    r = check("ddp.py", nprocs)
    assert all("ddp checks passed" in o for o in r.outputs), r.report()


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
