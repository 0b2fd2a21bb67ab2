"""Stopping a run with SIGTERM or Ctrl-C: workers gone, partial metrics written, and nothing
half-written (a stop inside an atomic write waits for the file to be in place)."""

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
import torch

from loaderbench.platform.stopping import (
    critical_section,
    stop_requested,
    stop_signals_as_interrupt,
)
from loaderbench.run.checkpoint import load_checkpoint
from tests.conftest import REPO


@pytest.mark.slow
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


@pytest.mark.slow
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
    # Neither a half-written cache folder nor a complete-looking one (lock files and the
    # dataset index may stay).
    assert [p.name for p in cache_dir.iterdir() if p.is_dir()] == []


@pytest.mark.slow
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


# ---------------------------------------------------------------------------------------------
# A stop inside a critical section (an atomic write, a cache's commit) waits for its end.


def test_critical_section_defers_a_stop_signal_to_the_end_of_the_outermost_section() -> None:
    events = []
    with stop_signals_as_interrupt():
        try:
            with critical_section():
                with critical_section():
                    os.kill(os.getpid(), signal.SIGTERM)
                    for _ in range(1000):  # many chances for the handler to run here
                        pass
                    events.append("inner body ran on")
                events.append("inner section left")
                events.append(f"requested {stop_requested()}")
            events.append("outer section left")
        except KeyboardInterrupt as error:
            events.append(f"raised: {error}")
    assert events == [
        "inner body ran on",
        "inner section left",
        f"requested {signal.SIGTERM.value}",
        "raised: stopped by signal SIGTERM",
    ]
    assert stop_requested() is None  # forgotten once the handler is gone


def test_critical_section_lets_a_propagating_or_handled_exception_be() -> None:
    with stop_signals_as_interrupt():
        try:
            with pytest.raises(ValueError, match="the block's own"), critical_section():
                os.kill(os.getpid(), signal.SIGTERM)
                for _ in range(1000):
                    pass
                raise ValueError("the block's own error")
            # A cleanup in an except or finally block runs to its end: the stop stays recorded.
            try:
                raise OSError("being handled")
            except OSError:
                with critical_section():
                    pass
                cleaned_up = True
            assert stop_requested() == signal.SIGTERM
        except KeyboardInterrupt as error:
            pytest.fail(f"KeyboardInterrupt raised too early: {error}")
    assert cleaned_up


ATOMIC_WRITE = """
import os, signal, sys
from pathlib import Path
from loaderbench.platform.atomic import atomic_write
from loaderbench.platform.stopping import stop_signals_as_interrupt

target, sig = Path(sys.argv[1]), int(sys.argv[2])

def write(tmp):
    with open(tmp, "w") as f:
        f.write("new first half\\n")
        f.flush()
        os.kill(os.getpid(), sig)  # the stop arrives halfway through the write
        for _ in range(1000):  # many chances for the handler to run here
            pass
        f.write("new second half\\n")
    print("wrote the second half", flush=True)

with stop_signals_as_interrupt():
    try:
        atomic_write(target, write)
    except KeyboardInterrupt as error:
        print(f"interrupted: {error}", flush=True)
        sys.exit(130)
print("not interrupted", flush=True)
"""


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_stop_inside_an_atomic_write_waits_until_the_file_is_in_place(
    sig: int, tmp_path: Path
) -> None:
    target = tmp_path / "metrics.json"
    target.write_text("old\n")
    proc = subprocess.run(
        [sys.executable, "-c", ATOMIC_WRITE, str(target), str(int(sig))],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 130, proc.stdout + proc.stderr[-3000:]
    assert proc.stdout.splitlines() == [
        "wrote the second half",
        f"interrupted: stopped by signal {signal.Signals(sig).name}",
    ]
    assert target.read_text() == "new first half\nnew second half\n"
    assert os.listdir(tmp_path) == ["metrics.json"]  # no .metrics.json.*.tmp


CHECKPOINT = """
import os, signal, sys
from collections import OrderedDict
import torch
from loaderbench.run.checkpoint import save_checkpoint
from loaderbench.platform.stopping import stop_signals_as_interrupt

class StopWhilePickled:
    # torch.save pickles this with its temporary file open: a SIGTERM halfway through.
    def __reduce__(self):
        os.kill(os.getpid(), signal.SIGTERM)
        for _ in range(1000):
            pass
        return (OrderedDict, ())

path = sys.argv[1]
with stop_signals_as_interrupt():
    save_checkpoint(path, {"epoch": 1, "model": {}, "config": {}})
    state = {
        "epoch": 2,
        "model": {"w": torch.arange(2**20)},
        "config": {},
        "stop": StopWhilePickled(),
        "after": torch.ones(2**20),
    }
    try:
        save_checkpoint(path, state)
    except KeyboardInterrupt as error:
        print(f"interrupted: {error}", flush=True)
        sys.exit(130)
print("not interrupted", flush=True)
"""


@pytest.mark.slow
def test_sigterm_while_a_checkpoint_is_written_leaves_it_whole_and_no_tmp(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint.pt"
    proc = subprocess.run(
        [sys.executable, "-c", CHECKPOINT, str(path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 130, proc.stdout + proc.stderr[-3000:]
    assert proc.stdout.strip() == "interrupted: stopped by signal SIGTERM"
    state = load_checkpoint(path)  # the new one, whole
    assert state["epoch"] == 2 and state["stop"] == {}
    assert torch.equal(state["model"]["w"], torch.arange(2**20))
    assert torch.equal(state["after"], torch.ones(2**20))
    assert os.listdir(tmp_path) == ["checkpoint.pt"]  # no .checkpoint.pt.*.tmp


def test_a_requeue_whose_scontrol_the_requeue_killed_ends_the_job_without_a_result() -> None:
    """submitit's handler raises when ``scontrol requeue`` dies of the SIGTERM its own requeue
    sent (CI saw it): the run ends as after a requeue (SystemExit, no error result for the
    submitter), while a refused requeue (exit status 1) or another kill still raises."""
    from loaderbench.platform import stopping

    def killed_by_the_requeue(signum: int, frame: object) -> None:
        raise subprocess.CalledProcessError(-signal.SIGTERM, ["scontrol", "requeue", "7"])

    def refused(signum: int, frame: object) -> None:
        raise subprocess.CalledProcessError(1, ["scontrol", "requeue", "7"])

    def killed_otherwise(signum: int, frame: object) -> None:
        raise subprocess.CalledProcessError(-signal.SIGKILL, ["scontrol", "requeue", "7"])

    before = stopping._handler_before
    try:
        stopping._handler_before = killed_by_the_requeue
        with pytest.raises(SystemExit):
            stopping.requeue()
        for handler in (refused, killed_otherwise):  # not known to have requeued: raised
            stopping._handler_before = handler
            with pytest.raises(subprocess.CalledProcessError):
                stopping.requeue()
    finally:
        stopping._handler_before = before
