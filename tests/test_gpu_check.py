"""scripts/gpu_check.sh: refuses without CUDA, and its --dry-run does everything a CPU can."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.conftest import REPO

SCRIPT = REPO / "scripts" / "gpu_check.sh"


def run_check(out: Path, *args: str, timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(SCRIPT), str(out), *args],
        env={**os.environ, "PYTHON": sys.executable},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal where there is no GPU")
def test_without_cuda_it_says_so_and_fails(tmp_path: Path) -> None:
    proc = run_check(tmp_path / "out", timeout=120)
    assert proc.returncode == 3
    assert "no CUDA here" in proc.stdout + proc.stderr and "--dry-run" in proc.stdout + proc.stderr


def phases(report: str) -> dict[str, str]:
    """The report's phase table: phase -> exit code."""
    rows = report.split("## Phases", 1)[1].split("\n## ", 1)[0].splitlines()
    cells = [[c.strip() for c in row.strip("|").split("|")] for row in rows if row.startswith("|")]
    return {c[0]: c[3] for c in cells[2:]}


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="the dry run is for machines without CUDA")
def test_the_dry_run_runs_every_cpu_phase_and_writes_the_report(tmp_path: Path) -> None:
    out = tmp_path / "out"
    kit_made = any((REPO / ".gpu-kit").glob("*.whl"))  # by `make gpu-kit`
    proc = run_check(out, "--dry-run", timeout=600)
    log = proc.stdout[-3000:] + proc.stderr[-3000:]
    assert {p.name for p in out.iterdir()} >= {"report.md", "check.log", "runs.tar.gz"}, log
    report = (out / "report.md").read_text()
    table = phases(report)
    # The kit phase needs `make gpu-kit` (PyPI); every other phase must pass.
    others = {name: rc for name, rc in table.items() if name != "kit"}
    assert {"env", "data", "tests", "train-model-memmap", "eval-none-spdl-turbo"} <= set(others)
    assert set(others.values()) == {"0"}, (table, log)
    assert "| failed |" not in report and "DRY RUN" in report
    if kit_made:  # the check passes whole
        assert table["kit"] == "0" and proc.returncode == 0, log
    else:  # a fresh checkout: the kit phase says what is missing, and the check fails
        assert table["kit"] != "0" and proc.returncode != 0
        assert "make gpu-kit" in (out / "check.log").read_text()
