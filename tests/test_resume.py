"""train.resume=true continues a stopped run and ends where an uninterrupted run would."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from loaderbench.loaders import file_loader_names
from tests.conftest import (
    REPO,
    loader_folder_overrides,
    reference_checkpoints,
    run_dirs,
    run_entry,
)
from tests.in_process import run_here
from tests.wandb_offline import offline_runs

# One xdist worker runs the module: its uninterrupted runs (a module fixture) are made once,
# not per worker.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("resume")]

RECIPE = [
    "model.name=test_resnet",
    "device=cpu",
    "logger=none",
    "epochs=3",
    "loader.batch_size=16",
    "loader.num_workers=2",
    "image_size=32",
    "bench.ceiling_batches=0",  # no resident pass at the end: tests/test_ceiling.py's subject
]


@pytest.fixture(scope="module")
def uninterrupted(small_root: Path, tmp_path_factory: pytest.TempPathFactory):
    """The checkpoint of RECIPE's uninterrupted run with a loader (made once a loader: the
    logger does not change what is trained)."""

    def launch(loader: str, cwd: Path) -> None:
        common = [f"dataset.root={small_root}", f"loader={loader}", *RECIPE]
        run_here("train.py", *common, *loader_folder_overrides(loader, cwd), cwd=cwd)

    return reference_checkpoints(tmp_path_factory, launch)


# A subset on purpose: a resume at an epoch's end starts the loader's next epoch from its first
# batch, so what is tested is the loop's state (weights, optimizer, schedule, RNG), not the
# loader; two loaders of unlike kinds (worker processes; a cache the resumed run reuses). Every
# loader resumes mid-epoch in the USR2 test below and in the loader contract.
@pytest.mark.parametrize("loader", ["torchvision", "memmap"])
def test_resume_ends_where_an_uninterrupted_run_would(
    loader: str, uninterrupted, small_root: Path, tmp_path: Path
) -> None:
    common = [f"dataset.root={small_root}", f"loader={loader}", *RECIPE]
    common += loader_folder_overrides(loader, tmp_path)
    part, rest = (tmp_path / name for name in ("part", "rest"))
    for folder in (part, rest):
        folder.mkdir()
    run_here("train.py", *common, "train.stop_after_epochs=2", cwd=part)
    (part_dir,) = run_dirs(part, "train")
    assert torch.load(part_dir / "checkpoint.pt", weights_only=True)["epoch"] == 2
    run_here(
        "train.py",
        *common,
        "train.resume=true",
        f"checkpoint={part_dir / 'checkpoint.pt'}",
        cwd=rest,
    )

    (rest_dir,) = run_dirs(rest, "train")
    expected = uninterrupted(loader)
    resumed = torch.load(rest_dir / "checkpoint.pt", weights_only=True)
    assert resumed["epoch"] == expected["epoch"] == 3
    for name, tensor in expected["model"].items():
        torch.testing.assert_close(
            resumed["model"][name],
            tensor,
            rtol=1e-5,
            atol=1e-6,
            msg=lambda m, name=name: f"{name}: {m}",
        )
    assert resumed["metrics"]["top1"] == pytest.approx(expected["metrics"]["top1"], abs=0.01)


def test_resume_needs_a_checkpoint(tiny_root: Path, tmp_path: Path) -> None:
    proc = run_entry(
        "train.py",
        f"dataset.root={tiny_root}",
        *RECIPE,
        "train.resume=true",
        cwd=tmp_path,
        check=False,
    )
    assert proc.returncode != 0 and "checkpoint=PATH" in proc.stderr


def start_train(*overrides: str, cwd: Path) -> subprocess.Popen:
    env = {**os.environ, "WANDB_MODE": "offline", "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen(
        [sys.executable, str(REPO / "train.py"), *overrides],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def signal_after(proc: subprocess.Popen, marker: str, signum: int, timeout: float = 300) -> str:
    """Read the run's output until ``marker``, send ``signum``, return everything printed."""
    lines, deadline = [], time.monotonic() + timeout
    assert proc.stdout is not None
    for line in proc.stdout:
        lines.append(line)
        if marker in line:
            proc.send_signal(signum)
            break
        assert time.monotonic() < deadline, "".join(lines[-20:])
    rest, _ = proc.communicate(timeout=timeout)
    return "".join(lines) + rest


@pytest.mark.parametrize("loader", file_loader_names())
def test_usr2_checkpoints_mid_epoch_and_the_same_command_continues(
    loader: str, uninterrupted, small_root: Path, tmp_path: Path
) -> None:
    """SLURM's time-limit warning (USR2): the run stops at a step boundary with its state, and
    the same command in the same run directory continues with no flag, ending where an
    uninterrupted run ends (same epochs, same weights), with every loader."""
    common = [f"dataset.root={small_root}", f"loader={loader}", *RECIPE, "epochs=3"]
    common += loader_folder_overrides(loader, tmp_path)
    if loader == "torchvision":  # and the W&B run continues under its id
        common = [arg.replace("logger=none", "logger=wandb") for arg in common]
    run_dir = tmp_path / "preempted" / "run"
    args = [*common, f"hydra.run.dir={run_dir}"]
    proc = start_train(*args, cwd=tmp_path)
    output = signal_after(proc, "epoch 1/3:", signal.SIGUSR2)
    assert proc.returncode != 0, output[-3000:]
    assert "preempted (SIGUSR2)" in output, output[-3000:]
    stopped = torch.load(run_dir / "checkpoint.pt", weights_only=True)
    assert stopped["batches"] > 0 and stopped["requeues"] == 1, (stopped["epoch"], output[-2000:])
    assert json.loads((run_dir / "metrics.json").read_text())["status"] == "preempted"

    run_entry("train.py", *args, cwd=tmp_path)  # the requeued job: same command, no flag
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert metrics["status"] == "ok" and metrics["epochs"] == 3 and metrics["requeues"] == 1
    assert metrics["resumed_from"] == str(run_dir / "checkpoint.pt")
    expected = uninterrupted(loader)
    resumed = torch.load(run_dir / "checkpoint.pt", weights_only=True)
    assert resumed["epoch"] == 3 and resumed["batches"] == 0
    for name, tensor in expected["model"].items():
        torch.testing.assert_close(resumed["model"][name], tensor, rtol=1e-5, atol=1e-6)
    if loader == "torchvision":
        first, second = offline_runs(run_dir)
        assert first.run_id == second.run_id
        steps = [
            row["trainer/global_step"] for row in second.history if "trainer/global_step" in row
        ]
        assert steps and steps[0] > stopped["batches"]  # the step axis goes on
