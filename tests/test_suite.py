"""The suite's own machinery: `make test`'s xdist groups hold (the quick bench and the local
SLURM cluster are module and session fixtures, built once only if their tests share a worker),
and a test not marked slow cannot start a process (`make test-fast` stays fast); each worker
gets its share of the cores."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ProcessInAFastTest, share_the_cores

pytest.importorskip("xdist", reason="make test runs pytest-xdist; this pytest has none")

GROUPED = """
import os
import pytest

pytestmark = pytest.mark.xdist_group("one")


@pytest.fixture(scope="module")
def built():
    with open("setups.txt", "a") as f:
        f.write(os.environ["PYTEST_XDIST_WORKER"] + "\\n")


@pytest.mark.parametrize("i", range(6))
def test_grouped(built, i):
    with open("grouped.txt", "a") as f:
        f.write(os.environ["PYTEST_XDIST_WORKER"] + "\\n")
"""

LOOSE = """
import time
import pytest


@pytest.mark.parametrize("i", range(6))
def test_loose(i):
    time.sleep(0.05)
"""


@pytest.mark.slow
def test_a_group_runs_on_one_worker_and_its_module_fixture_is_built_once(tmp_path: Path) -> None:
    (tmp_path / "pytest.ini").write_text("[pytest]\n")  # its own root: none of our conftest
    (tmp_path / "test_grouped.py").write_text(GROUPED)
    (tmp_path / "test_loose.py").write_text(LOOSE)
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-n",
            "2",
            "--dist",
            "loadgroup",
            "-p",
            "no:cacheprovider",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    workers = (tmp_path / "grouped.txt").read_text().split()
    assert len(workers) == 6 and len(set(workers)) == 1, workers
    assert (tmp_path / "setups.txt").read_text().split() == workers[:1]


def test_a_test_not_marked_slow_that_starts_a_process_is_refused_naming_it(
    process_guard: list[str],
) -> None:
    with pytest.raises(ProcessInAFastTest, match=r"starts a process, \['true', '--flag'\]"):
        subprocess.run(["true", "--flag"], check=False)
    assert process_guard == ["['true', '--flag']"]
    process_guard.clear()  # refused as it should be: not this test's failure


@pytest.mark.slow
def test_a_slow_test_starts_processes(process_guard: list[str]) -> None:
    assert subprocess.run(["true"], check=False).returncode == 0
    assert process_guard == []


def test_each_worker_gets_its_share_of_the_cores_unless_the_environment_says() -> None:
    cpus = len(os.sched_getaffinity(0))
    two = {"PYTEST_XDIST_WORKER_COUNT": "2"}
    share_the_cores(two)
    assert two["OMP_NUM_THREADS"] == str(max(1, cpus // 2))
    given = {"PYTEST_XDIST_WORKER_COUNT": "2", "OMP_NUM_THREADS": "3"}
    share_the_cores(given)
    assert given["OMP_NUM_THREADS"] == "3"
    alone: dict[str, str] = {}  # one process (TEST_WORKERS=0): the machine's, torch's default
    share_the_cores(alone)
    assert "OMP_NUM_THREADS" not in alone
