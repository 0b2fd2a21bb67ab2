"""train.py and eval.py through their real entry points, in subprocesses, on generated JPEGs."""

from __future__ import annotations

import datetime
import json
from pathlib import Path

import pytest
import torch

from loaderbench.loaders import file_loader_names
from tests.conftest import read_metrics, run_dirs, run_entry, single_run
from tests.in_process import run_here
from tests.wandb_offline import offline_runs

# One xdist worker runs the module: its trained run (a module fixture) is made once, not per worker.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("entrypoints")]

CONTRACT_KEYS = {
    "loader",
    "model",
    "device",
    "batch_size",
    "num_workers",
    "images",
    "images_per_s",
    "ttfb_s",
    "data_wait_frac",
    "cpu_s_per_1k_images",
    "peak_rss_mb",
    "skipped_files",
    "wall_s",
}
QUICK = ["model.name=test_resnet", "device=cpu", "loader.batch_size=16", "loader.num_workers=1"]


@pytest.fixture(scope="module")
def trained(small_root: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    cwd = tmp_path_factory.mktemp("train")
    run_entry(
        "train.py",
        f"dataset.root={small_root}",
        "epochs=2",
        "logger.log_every_n_steps=4",
        "logger.log_checkpoint=true",
        *QUICK,
        cwd=cwd,
    )
    return single_run(cwd, "train")


def test_train_writes_metrics_checkpoint_and_wandb(trained: tuple[Path, dict]) -> None:
    run_dir, metrics = trained
    assert CONTRACT_KEYS | {"top1", "top5", "loss", "epochs"} <= metrics.keys()
    assert metrics["status"] == "ok" and metrics["epochs"] == 2
    assert metrics["images"] == 2 * (160 // 16) * 16
    # top1 is a count of the 40 val images (top5, 1 by construction with 4 classes, is
    # counted where it can miss: tests/test_loops.py).
    assert metrics["val_size"] == 40
    assert metrics["top1"] * 40 == pytest.approx(round(metrics["top1"] * 40), abs=1e-9)
    assert metrics["images_per_s"] > 0 and 0.0 <= metrics["data_wait_frac"] <= 1.0
    assert metrics["cpu_s_per_1k_images"] > 0 and metrics["peak_rss_mb"] > 100
    assert (run_dir / ".hydra" / "config.yaml").is_file()
    assert (run_dir / "train.log").is_file()
    state = torch.load(run_dir / "checkpoint.pt", weights_only=True)
    assert state["epoch"] == 2 and len(state["classes"]) == 4

    (wandb_run,) = offline_runs(run_dir)
    assert wandb_run.job_type == "train"
    assert wandb_run.summary["top1"] == pytest.approx(metrics["top1"])
    assert wandb_run.summary["images_per_s"] == pytest.approx(metrics["images_per_s"])
    assert wandb_run.config["loader"]["name"] == "torchvision"
    epochs = [row for row in wandb_run.history if "epoch" in row]
    assert [row["epoch"] for row in epochs] == [1, 2]
    for row in epochs:  # each epoch's top1 a count of the 40 val images
        assert row["val/top1"] * 40 == pytest.approx(round(row["val/top1"] * 40), abs=1e-9)
    assert epochs[-1]["val/top1"] == pytest.approx(metrics["top1"])


def test_train_logs_step_curves_and_the_checkpoint_artifact(trained: tuple[Path, dict]) -> None:
    """10 steps an epoch, logger.log_every_n_steps=4: a row at steps 4 and 8 and at each
    epoch's end, against a global step; the checkpoint as a model artifact."""
    run_dir, metrics = trained
    (wandb_run,) = offline_runs(run_dir)
    steps = [row for row in wandb_run.history if "trainer/global_step" in row]
    assert [row["trainer/global_step"] for row in steps] == [4, 8, 10, 14, 18, 20]
    for row in steps:
        assert {"train/loss", "train/lr", "train/images_per_s", "train/data_wait_frac"} <= set(row)
        assert row["train/loss"] > 0 and row["train/images_per_s"] > 0
        assert 0.0 <= row["train/data_wait_frac"] <= 1.0
    epochs = [row for row in wandb_run.history if "epoch" in row]
    # The epoch's loss is the mean of its intervals' losses, weighted by their steps.
    first = steps[:3]
    weighted = (
        4 * first[0]["train/loss"] + 4 * first[1]["train/loss"] + 2 * first[2]["train/loss"]
    ) / 10
    assert epochs[0]["epoch/train_loss"] == pytest.approx(weighted, rel=1e-5)
    assert epochs[-1]["epoch/train_loss"] == pytest.approx(metrics["loss"], rel=1e-6)
    (artifact,) = wandb_run.artifacts
    assert artifact["type"] == "model" and artifact["name"].endswith("-checkpoint")
    assert artifact["files"] == ["checkpoint.pt"] and "latest" in artifact["aliases"]
    assert artifact["metadata"] == {"epoch": 2}


def test_eval_reproduces_train_top1(
    trained: tuple[Path, dict], small_root: Path, tmp_path: Path
) -> None:
    run_dir, train_metrics = trained
    run_here(
        "eval.py",
        f"checkpoint={run_dir / 'checkpoint.pt'}",
        f"dataset.root={small_root}",
        "device=cpu",
        "logger=none",
        cwd=tmp_path,
    )
    _, metrics = single_run(tmp_path, "eval")
    assert CONTRACT_KEYS | {"top1", "top5"} <= metrics.keys()
    assert metrics["model"] == "test_resnet" and metrics["image_size"] == 64
    assert abs(metrics["top1"] - train_metrics["top1"]) <= 0.005
    assert metrics["images"] == 40 * metrics["passes"]  # top-1 is the first pass's


def test_every_loader_gives_the_same_top1_from_one_checkpoint(
    trained: tuple[Path, dict], small_root: Path, tmp_path: Path
) -> None:
    """Every loader's val pipeline feeds the model the same images (memmap stores
    torchvision's val crop, spdl's turbo decoder matches it to a grey level): top1 within one
    image."""
    run_dir, _ = trained
    run_here(
        "eval.py",
        "--multirun",
        f"loader={','.join(file_loader_names())}",
        f"checkpoint={run_dir / 'checkpoint.pt'}",
        f"dataset.root={small_root}",
        "device=cpu",
        "logger=none",
        "loader.num_workers=1",
        cwd=tmp_path,
    )
    top1 = {read_metrics(d)["loader"]: read_metrics(d)["top1"] for d in run_dirs(tmp_path, "eval")}
    assert sorted(top1) == sorted(file_loader_names())
    assert max(top1.values()) - min(top1.values()) <= 1 / 40 + 1e-9, top1


def test_eval_model_none_measures_the_loader(small_root: Path, tmp_path: Path) -> None:
    run_here(
        "eval.py",
        "model=none",
        f"dataset.root={small_root}",
        "logger=none",
        "loader.num_workers=1",
        "loader.batch_size=8",
        "bench.epochs=2",  # an explicit count: exactly 2 passes of 5 batches, one measurement
        cwd=tmp_path,
    )
    _, metrics = single_run(tmp_path, "eval")
    assert metrics["passes"] == 2 and metrics["images"] == 80 and metrics["images_per_s"] > 0
    assert "top1" not in metrics and metrics["model"] == "none"


def test_train_model_none_runs_the_train_pipeline(tiny_root: Path, tmp_path: Path) -> None:
    run_here(
        "train.py",
        "model=none",
        f"dataset.root={tiny_root}",
        "logger=none",
        "loader.batch_size=8",
        "loader.num_workers=1",
        cwd=tmp_path,
    )
    _, metrics = single_run(tmp_path, "train")
    assert metrics["images"] == 24 * metrics["passes"] and "top1" not in metrics
    assert metrics["epochs"] == metrics["passes"] and metrics["images_per_s"] > 0
    assert not any(p.name == "checkpoint.pt" for p in (tmp_path / "outputs").rglob("*"))


def test_multirun_leaves_one_run_dir_and_one_wandb_run_per_job(
    tiny_root: Path, tmp_path: Path
) -> None:
    run_entry(
        "eval.py",
        "--multirun",
        "model=none",
        f"dataset.root={tiny_root}",
        "loader.num_workers=0,1",
        "loader.batch_size=4",
        cwd=tmp_path,
    )
    dirs = run_dirs(tmp_path, "eval")
    assert len(dirs) == 2
    assert sorted(read_metrics(d)["num_workers"] for d in dirs) == [0, 1]
    runs = [r for r in offline_runs(tmp_path / "outputs") if r.job_type != "summary"]
    assert len(runs) == 2 and len({r.run_id for r in runs}) == 2
    assert len({r.group for r in runs}) == 1 and runs[0].group.startswith("eval-")
    assert sorted(r.name for r in runs) == [f"loader.num_workers={n}" for n in (0, 1)]
    assert all(r.job_type == "eval" for r in runs)


def test_bad_override_fails_fast_naming_the_key(tmp_path: Path) -> None:
    proc = run_entry(
        "train.py",
        "loader.num_workers=-2",
        "logger=none",
        "dataset.root=/nowhere",
        cwd=tmp_path,
        check=False,
    )
    assert proc.returncode != 0
    assert "loader.num_workers" in proc.stderr
    metrics = read_metrics(single_run(tmp_path, "train")[0])
    assert metrics["status"] == "failed" and "loader.num_workers" in metrics["error"]


def test_a_batch_larger_than_the_train_set_fails_before_any_heavy_work(
    tiny_root: Path, tmp_path: Path
) -> None:
    proc = run_entry(
        "train.py",
        f"dataset.root={tiny_root}",
        "loader=memmap",
        f"loader.cache_dir={tmp_path / 'cache'}",
        "loader.batch_size=25",  # 24 train images; training drops the last partial batch
        "logger=none",
        cwd=tmp_path,
        check=False,
    )
    assert proc.returncode != 0
    assert "loader.batch_size=25 is larger than the train set (24 images)" in proc.stderr
    # No cache was built first (the dataset index beside them is a file, not a cache folder).
    assert not [p for p in (tmp_path / "cache").glob("*") if p.is_dir()]
    _, metrics = single_run(tmp_path, "train")
    assert metrics["status"] == "failed"


def test_wandb_online_without_key_goes_offline(tiny_root: Path, tmp_path: Path) -> None:
    env = {
        "WANDB_MODE": "online",
        "WANDB_API_KEY": "",
        "HOME": str(tmp_path),
        "NETRC": str(tmp_path / "none"),
    }
    # A run waiting at a login prompt would be stopped by the timeout, failing the test.
    proc = run_entry(
        "eval.py",
        "model=none",
        f"dataset.root={tiny_root}",
        "loader.num_workers=0",
        cwd=tmp_path,
        env=env,
        timeout=300,
    )
    assert "offline" in proc.stderr and "API key" in proc.stderr
    run_dir, metrics = single_run(tmp_path, "eval")
    assert metrics["status"] == "ok"
    assert len(offline_runs(run_dir)) == 1


def wandb_started_after_s(run_dir: Path) -> float:
    """Seconds from the run's start (its folder's time stamp, made as its config was composed)
    to its log's line saying which W&B run it started."""
    stamp = datetime.datetime.strptime(
        f"{run_dir.parent.name} {run_dir.name}", "%Y-%m-%d %H-%M-%S-%f"
    )
    (log_file,) = run_dir.glob("*.log")
    for line in log_file.read_text().splitlines():
        if "W&B run " in line:
            logged = datetime.datetime.strptime(line[1:24], "%Y-%m-%d %H:%M:%S,%f")
            return (logged - stamp).total_seconds()
    raise AssertionError(f"no W&B run in {log_file}:\n{log_file.read_text()[-3000:]}")


def test_wandb_refusing_server_goes_offline(tiny_root: Path, tmp_path: Path) -> None:
    env = {
        "WANDB_MODE": "online",
        "WANDB_API_KEY": "x" * 40,
        "WANDB_BASE_URL": "http://127.0.0.1:9",
        "HOME": str(tmp_path),
    }
    run_entry(
        "eval.py",
        "model=none",
        f"dataset.root={tiny_root}",
        "loader.num_workers=0",
        "logger.init_timeout_s=5",
        cwd=tmp_path,
        env=env,
    )
    run_dir, metrics = single_run(tmp_path, "eval")
    # The online attempt gave up after its 5 s, then the offline run started: well within
    # 30 s of the run's start, where W&B's own init_timeout (90 s) would have waited longer.
    assert wandb_started_after_s(run_dir) < 30
    assert metrics["status"] == "ok"
    written = json.loads((run_dir / "metrics.json").read_text())
    assert written["images"] == 12 * written["passes"]
