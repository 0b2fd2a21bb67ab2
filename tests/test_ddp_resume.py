"""A data-parallel run preempted (USR2) in epochs shorter than the log interval, mid-epoch and
at an epoch's last step, continues and ends with the weights of an uninterrupted run; a resume
that would change the run's shape is refused, naming what changed.

The jobs start through the documented launch (``python -m loaderbench.launch``: torchrun with
USR2 ignored, issue 38) and get USR2 in every process, the launcher's too, as SLURM signals
every process of a step: the launcher outlives its ranks, and the same command resumes."""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import threading
import time
from pathlib import Path

import psutil
import pytest
import torch

from tests.conftest import (
    finish,
    reference_checkpoints,
    run_dirs,
    run_entry,
    start_torchrun,
    torchrun,
)
from tests.in_process import run_here

# One xdist worker runs the module: its uninterrupted 2-rank runs (a module fixture) are
# made once, not per worker.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("ddp_resume")]

# 160 train images, 80 a rank: 5 steps of 16 an epoch, far fewer than log_every_n_steps (50).
# Dropout draws from each rank's own generator, so a rank resumed with another's state would
# train other weights.
RECIPE = [
    "device=cpu",
    "loader=torchvision",
    "loader.num_workers=1",
    "loader.batch_size=16",
    "model.name=test_resnet",
    "model.drop_rate=0.3",
    "logger=none",
    "epochs=3",
    "bench.ceiling_batches=0",  # no resident pass at the end: tests/test_ceiling.py's subject
]
STEPS = 5


@pytest.fixture(scope="module")
def uninterrupted(small_root: Path, tmp_path_factory: pytest.TempPathFactory):
    """The checkpoint of the uninterrupted 2-rank run, per extra override (made once each)."""

    def launch(*extra: str, cwd: Path) -> None:
        torchrun(*RECIPE, f"dataset.root={small_root}", *extra, cwd=cwd)

    return reference_checkpoints(tmp_path_factory, launch)


LAUNCH = {"nproc": 2, "launcher": "loaderbench.launch"}  # the documented launch


def signal_every_process(launcher: psutil.Process) -> list[psutil.Process]:
    """USR2 to the launcher and every process under it (ranks, their loader workers), as
    SLURM signals every process of a step; the ranks (the launcher's children)."""
    ranks = launcher.children()
    for process in [launcher, *launcher.children(recursive=True)]:
        with contextlib.suppress(psutil.NoSuchProcess):
            process.send_signal(signal.SIGUSR2)
    return ranks


def ranks_alive_at_its_end(
    proc: subprocess.Popen, ranks: list[psutil.Process]
) -> tuple[list[int], str]:
    """Wait for the launcher (its output drained meanwhile); the ranks still running (not
    zombies its end left unreaped) the moment it had ended, and the rest of its output."""
    assert proc.stdout is not None
    rest: list[str] = []
    reader = threading.Thread(target=lambda: rest.append(proc.stdout.read()), daemon=True)
    reader.start()
    deadline = time.monotonic() + 240  # within the test's timeout: the job ended here, whole
    while proc.poll() is None:
        if time.monotonic() > deadline:
            for process in [*psutil.Process(proc.pid).children(recursive=True), proc]:
                with contextlib.suppress(psutil.NoSuchProcess):
                    process.kill()
            raise AssertionError("the launcher is still running after 240 s")
        time.sleep(0.01)
    alive = []
    for rank in ranks:
        with contextlib.suppress(psutil.NoSuchProcess):
            if rank.is_running() and rank.status() != psutil.STATUS_ZOMBIE:
                alive.append(rank.pid)
    reader.join(timeout=300)
    return alive, "".join(rest)


def preempt_after(
    proc: subprocess.Popen, marker: str, timeout: float = 300
) -> tuple[list[int], str]:
    """Read the job's output until ``marker``, send USR2 to every process of the job; the
    ranks still running when the launcher had ended, and everything it printed."""
    lines, deadline = [], time.monotonic() + timeout
    assert proc.stdout is not None
    for line in proc.stdout:
        lines.append(line)
        if marker in line:
            break
        assert time.monotonic() < deadline, "".join(lines[-20:])
    ranks = signal_every_process(psutil.Process(proc.pid))
    assert len(ranks) == 2, "".join(lines[-20:])
    alive, rest = ranks_alive_at_its_end(proc, ranks)
    return alive, "".join(lines) + rest


@pytest.mark.parametrize(
    ("extra", "stops_at"),
    [
        # Ranks agree only at an epoch's last step: the stop lands there.
        pytest.param((), {STEPS}, id="epoch_end"),
        # ... and every 2 steps: mid-epoch (unless the signal came late in the epoch).
        pytest.param(("logger.log_every_n_steps=2",), {2, 4, STEPS}, id="mid_epoch"),
        # An epoch cut to 3 batches, stopped at its last (a log point too): the resumed run
        # trains no batch more of it.
        pytest.param(
            ("bench.max_batches=3", "logger.log_every_n_steps=3"), {3}, id="max_batches_end"
        ),
    ],
)
def test_usr2_stops_two_ranks_within_the_bound_and_the_run_continues_exactly(
    extra: tuple[str, ...],
    stops_at: set[int],
    uninterrupted,
    small_root: Path,
    tmp_path: Path,
) -> None:
    run_dir = tmp_path / "run"
    args = [*RECIPE, f"dataset.root={small_root}", *extra, f"hydra.run.dir={run_dir}"]
    # USR2 right after epoch 1's row: the stop comes in epoch 2, at its first agreed step.
    proc = start_torchrun(*args, cwd=tmp_path, **LAUNCH)
    alive, output = preempt_after(proc, "epoch 1/3:")
    # Plain torchrun died of the signal (-12) with its ranks still writing the checkpoint.
    assert proc.returncode != -signal.SIGUSR2 and alive == [], (proc.returncode, alive)
    assert "preempted (SIGUSR2)" in output, output[-4000:]
    stopped = torch.load(run_dir / "checkpoint.pt", weights_only=True)
    assert stopped["epoch"] == 1 and stopped["batches"] in stops_at, output[-3000:]
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert metrics["status"] == "preempted" and metrics["world_size"] == 2

    # The requeued job: the same command, no flag.
    requeued = start_torchrun(*args, cwd=tmp_path, **LAUNCH)
    continued = finish(requeued, 600)
    assert requeued.returncode == 0, continued[-4000:]
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert metrics["status"] == "ok" and metrics["epochs"] == 3, continued[-3000:]
    assert metrics["requeues"] == 1
    assert "loss nan" not in continued, continued[-3000:]
    per_epoch = 2 * 16 * (3 if "bench.max_batches=3" in extra else STEPS)
    assert metrics["epoch_samples"] == [per_epoch] * 3 and metrics["epoch_repeats"] == [0] * 3
    expected = uninterrupted(*[e for e in extra if e.startswith("bench.")])
    resumed = torch.load(run_dir / "checkpoint.pt", weights_only=True)
    assert resumed["epoch"] == 3 and resumed["batches"] == 0
    for name, tensor in expected["model"].items():
        torch.testing.assert_close(
            resumed["model"][name], tensor, rtol=1e-5, atol=1e-6, msg=lambda m, n=name: f"{n}: {m}"
        )
    # The interrupted epoch's loss is the whole epoch's (each rank's running mean was kept).
    for key in ("loss", "top1", "val_loss"):
        assert resumed["metrics"][key] == pytest.approx(expected["metrics"][key], rel=1e-5), key
    assert stopped["world_size"] == 2 and len(stopped["ranks"]) == 2  # each rank's state


def test_a_resume_that_would_change_the_run_is_refused_naming_the_key(
    tiny_root: Path, tmp_path: Path
) -> None:
    common = [
        f"dataset.root={tiny_root}",
        "device=cpu",
        "logger=none",
        "model.name=test_resnet",
        "loader.batch_size=4",
        "loader.num_workers=0",
        "epochs=2",
    ]
    run_here("train.py", *common, "train.stop_after_epochs=1", cwd=tmp_path)
    (run_dir,) = run_dirs(tmp_path, "train")
    resume = ["train.resume=true", f"checkpoint={run_dir / 'checkpoint.pt'}"]

    other = tmp_path / "other_batch"
    other.mkdir()
    proc = run_entry("train.py", *common, *resume, "loader.batch_size=3", cwd=other, check=False)
    assert proc.returncode != 0
    assert "loader.batch_size=3 but checkpoint" in proc.stderr, proc.stderr[-3000:]
    # Another number of ranks may continue it, keeping the global batch: see
    # tests/test_elastic_resume.py (and its refusal where the count does not divide it).
