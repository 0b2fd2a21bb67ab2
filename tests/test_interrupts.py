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


def _start(script: str, cwd: Path, *overrides: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, str(REPO / script), "logger=none", "device=cpu", *overrides],
        cwd=cwd,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _interrupted_metrics(cwd: Path) -> dict:
    (metrics_path,) = list((cwd / "outputs").rglob("metrics.json"))
    metrics = json.loads(metrics_path.read_text())
    assert metrics["status"] == "interrupted"
    return metrics


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_signal_during_a_cache_build_leaves_no_cache(
    sig: int, small_root: Path, tmp_path: Path
) -> None:
    cache_dir = tmp_path / "cache"
    proc = _start(
        "train.py",
        tmp_path,
        f"dataset.root={small_root}",
        "loader=memmap",
        f"loader.cache_dir={cache_dir}",
        "loader.num_workers=1",
        "image_size=224",
        "model=none",
    )
    deadline = time.monotonic() + 120
    while not list(cache_dir.glob(".*.tmp-*")):  # the build has started writing
        assert proc.poll() is None, proc.communicate()[0][-3000:]
        assert time.monotonic() < deadline, "the cache build never started"
        time.sleep(0.01)
    workers = psutil.Process(proc.pid).children(recursive=True)
    proc.send_signal(sig)
    output, _ = proc.communicate(timeout=60)
    assert proc.returncode != 0, output[-3000:]
    assert "built memmap cache" not in output, "the build finished before the signal"
    _, alive = psutil.wait_procs(workers, timeout=10)
    assert not alive, f"build workers outlived the run: {alive}"
    _interrupted_metrics(tmp_path)
    # Neither a half-written folder nor a complete-looking one: only the lock file.
    assert [p.name for p in cache_dir.iterdir() if not p.name.endswith(".lock")] == []


@pytest.mark.timeout(120)
def test_sigterm_during_an_spdl_evaluation_exits_promptly(small_root: Path, tmp_path: Path) -> None:
    """SPDL's threads are not daemons: a pipeline left running would keep the process alive."""
    proc = _start(
        "eval.py",
        tmp_path,
        f"dataset.root={small_root}",
        "loader=spdl",
        "model=none",
        "bench.epochs=100000",
    )
    deadline = time.monotonic() + 60
    while not list((tmp_path / "outputs").rglob("eval.log")):
        assert proc.poll() is None, proc.communicate()[0][-3000:]
        assert time.monotonic() < deadline, "the evaluation never started"
        time.sleep(0.1)
    time.sleep(4)  # start-up done, epochs going round
    proc.send_signal(signal.SIGTERM)
    output, _ = proc.communicate(timeout=30)
    assert proc.returncode != 0, output[-3000:]
    metrics = _interrupted_metrics(tmp_path)
    assert metrics["loader"] == "spdl" and metrics["images"] > 0
