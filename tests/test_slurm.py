"""The SLURM launchers on a real one-node SLURM cluster (scripts/local_slurm.sh), with the
launchers' GPU settings left as they are: on a CPU node they ask for no GPU by themselves."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from tests.conftest import REPO, run_entry, torchrun

# One cluster (fixed ports) for the session: every SLURM test on the same xdist worker.
pytestmark = [pytest.mark.slow, pytest.mark.slurm, pytest.mark.xdist_group("slurm")]


def sweep_rows(cwd: Path, task: str) -> tuple[Path, list[dict]]:
    (summary,) = (cwd / "outputs" / task / "multirun").rglob("summary.csv")
    with open(summary) as f:
        return summary.parent, list(csv.DictReader(f))


def job_metrics(sweep: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(sweep.glob("*/metrics.json"))]


def slurm_eval_sweep(*overrides: str, root: Path, cwd: Path, env: dict) -> None:
    """eval.py model=none as a multirun of SLURM jobs on the local cluster."""
    run_entry(
        "eval.py",
        "--multirun",
        "hydra/launcher=slurm",
        "model=none",
        "logger=none",
        f"dataset.root={root}",
        *overrides,
        cwd=cwd,
        env=env,
    )


def test_a_slurm_multirun_runs_every_job_and_summarises(
    local_slurm: dict, tiny_root: Path, tmp_path: Path
) -> None:
    slurm_eval_sweep(
        "loader=torchvision,spdl",
        "loader.batch_size=4",
        root=tiny_root,
        cwd=tmp_path,
        env=local_slurm,
    )
    sweep, rows = sweep_rows(tmp_path, "eval")
    assert {r["loader"] for r in rows} == {"torchvision", "spdl"}
    assert all(r["status"] == "ok" and int(r["images"]) == 12 * int(r["passes"]) for r in rows)
    assert all(float(r["images_per_s"]) > 0 for r in rows), rows
    # A SLURM job without -c: the node's CPUs for its one task, less the loader's workers.
    for metrics in job_metrics(sweep):
        assert metrics["intra_op_threads_source"].startswith("SLURM_CPUS_ON_NODE")


def test_a_failing_job_is_a_failed_row_and_the_sweep_goes_on(
    local_slurm: dict, tiny_root: Path, tmp_path: Path
) -> None:
    slurm_eval_sweep("loader.batch_size=4,0", root=tiny_root, cwd=tmp_path, env=local_slurm)
    _, rows = sweep_rows(tmp_path, "eval")
    by_size = {r["loader.batch_size"]: r for r in rows}
    assert by_size["4"]["status"] == "ok"
    assert by_size["0"]["status"] == "failed" and "batch_size" in by_size["0"]["error"]


TRAIN = [
    "device=cpu",
    "epochs=2",
    "model.name=test_resnet",
    "loader.batch_size=16",
    "loader.num_workers=1",
    "logger=none",
]


def squeue_job(env: dict) -> str | None:
    out = subprocess.run(
        ["squeue", "-h", "-o", "%i %T"], env=env, capture_output=True, text=True
    ).stdout.split()
    return out[0] if len(out) >= 2 and out[1] == "RUNNING" else None


def test_usr2_requeues_the_job_which_resumes_and_finishes(
    local_slurm: dict, small_root: Path, tmp_path: Path
) -> None:
    """SLURM's pre-time-limit signal mid-run: the job checkpoints, requeues itself, and the
    requeued job resumes from its run directory and ends with every epoch."""
    proc = subprocess.Popen(
        [
            sys.executable,
            str(REPO / "train.py"),
            "--multirun",
            "hydra/launcher=slurm",
            f"dataset.root={small_root}",
            "loader=torchvision",
            *TRAIN,
            "epochs=3",
        ],
        cwd=tmp_path,
        env=local_slurm,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    deadline = time.monotonic() + 300
    signalled = False
    while proc.poll() is None and time.monotonic() < deadline:
        logs = list((tmp_path / "outputs").rglob("train.log"))
        job = squeue_job(local_slurm)
        if not signalled and job and logs and "epoch 1/3:" in logs[0].read_text():
            subprocess.run(["scancel", "--signal=USR2", job], env=local_slurm, check=True)
            signalled = True
        time.sleep(0.1)
    output, _ = proc.communicate(timeout=300)
    assert signalled and proc.returncode == 0, output[-4000:]
    sweep, rows = sweep_rows(tmp_path, "train")
    (metrics,) = job_metrics(sweep)
    assert metrics["status"] == "ok" and metrics["epochs"] == 3, metrics
    assert metrics["requeues"] == 1 and metrics["resumed_from"].endswith("checkpoint.pt")
    assert rows[0]["status"] == "ok"


def test_a_two_task_job_requeued_by_usr2_ends_as_the_uninterrupted_torchrun_job(
    local_slurm: dict, small_root: Path, tmp_path: Path
) -> None:
    """Two gloo tasks of one slurm_ddp job, one CPU each, sent USR2 in 5-step epochs (far
    fewer than the log interval): the ranks agree to stop at the epoch's last step,
    checkpoint, requeue, and the requeued job ends with the samples, numbers and weights of
    the uninterrupted torchrun job (memmap: the cache built by the SLURM job, reused by
    torchrun). 4 epochs: memmap's are short, and the signal must land before the last."""
    slurm_cwd, torchrun_cwd = tmp_path / "slurm", tmp_path / "torchrun"
    slurm_cwd.mkdir()
    torchrun_cwd.mkdir()
    common = [f"dataset.root={small_root}", "loader=memmap", *TRAIN, "epochs=4"]
    common.append(f"loader.cache_dir={tmp_path / 'cache'}")
    proc = subprocess.Popen(
        [
            sys.executable,
            str(REPO / "train.py"),
            "--multirun",
            "hydra/launcher=slurm_ddp",
            "hydra.launcher.tasks_per_node=2",
            "hydra.launcher.cpus_per_task=1",
            *common,
        ],
        cwd=slurm_cwd,
        env=local_slurm,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    deadline = time.monotonic() + 300
    signalled = False
    while proc.poll() is None and time.monotonic() < deadline:
        logs = list((slurm_cwd / "outputs").rglob("train.log"))
        job = squeue_job(local_slurm)
        if not signalled and job and logs and "epoch 1/4:" in logs[0].read_text():
            subprocess.run(["scancel", "--signal=USR2", job], env=local_slurm, check=True)
            signalled = True
        time.sleep(0.1)
    output, _ = proc.communicate(timeout=300)
    assert signalled and proc.returncode == 0, output[-4000:]
    sweep, rows = sweep_rows(slurm_cwd, "train")
    (slurm,) = job_metrics(sweep)
    assert rows[0]["status"] == slurm["status"] == "ok" and slurm["epochs"] == 4, slurm
    assert slurm["world_size"] == 2 and slurm["requeues"] == 1
    assert slurm["intra_op_threads"] == 1  # 1 CPU a task, less 1 loader thread, at least 1
    torchrun(*common, cwd=torchrun_cwd)
    (reference,) = [json.loads(p.read_text()) for p in torchrun_cwd.rglob("metrics.json")]
    assert reference["status"] == "ok" and reference["world_size"] == 2
    # Each task read its own share, every epoch whole (the requeued job counts on from the
    # checkpoint's ledger).
    assert slurm["epoch_samples"] == reference["epoch_samples"] == [160] * 4
    assert slurm["epoch_repeats"] == reference["epoch_repeats"] == [0] * 4
    assert slurm["loss"] == pytest.approx(reference["loss"], rel=1e-4)
    assert slurm["top1"] == pytest.approx(reference["top1"], abs=1e-9)
    (uninterrupted,) = list(torchrun_cwd.rglob("checkpoint.pt"))
    (resumed,) = list(sweep.rglob("checkpoint.pt"))
    expected = torch.load(uninterrupted, weights_only=True)["model"]
    for name, tensor in torch.load(resumed, weights_only=True)["model"].items():
        torch.testing.assert_close(tensor, expected[name], rtol=1e-5, atol=1e-6)
