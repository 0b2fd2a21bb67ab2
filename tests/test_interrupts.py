"""Stopping a run with SIGTERM or Ctrl-C: workers gone, partial metrics written."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_stops_cleanly(sig: int, small_root: Path, tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [
            sys.executable,
            str(REPO / "train.py"),
            f"dataset.root={small_root}",
            "logger=none",
            "model.name=test_resnet",
            "epochs=50",
            "loader.num_workers=2",
            "device=cpu",
        ],
        cwd=tmp_path,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    parent = psutil.Process(proc.pid)
    deadline = time.monotonic() + 120
    # Wait until training is under way: the DataLoader workers exist.
    while time.monotonic() < deadline and len(parent.children(recursive=True)) < 2:
        time.sleep(0.2)
    time.sleep(2)
    workers = parent.children(recursive=True)
    assert workers, "training never started"
    proc.send_signal(sig)
    output, _ = proc.communicate(timeout=60)
    assert proc.returncode != 0, output[-3000:]
    _, alive = psutil.wait_procs(workers, timeout=10)
    assert not alive, f"workers outlived the run: {alive}"
    (metrics_path,) = list((tmp_path / "outputs").rglob("metrics.json"))
    metrics = json.loads(metrics_path.read_text())
    assert metrics["status"] == "interrupted"
    assert not list(metrics_path.parent.glob(".*.tmp"))
