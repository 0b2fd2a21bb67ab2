"""The model's own rate (``loader=resident``) and every figure held to it: ``ceiling_frac`` in
metrics.json, the W&B summary and the sweep summary; the job's resident pass leaves the run's
weights alone."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
import torch

from loaderbench.loaders import build_loader
from loaderbench.measure.metrics import combine_over_ranks
from loaderbench.run.ceiling import NO_MODEL_REASON, no_ceiling, with_ceiling
from loaderbench.run.sweeps import apply_sweep_ceilings, ceiling_settings
from tests.conftest import (
    cpu_spec,
    folder_index,
    loader_folder_overrides,
    read_metrics,
    run_entry,
    single_run,
)
from tests.in_process import run_here
from tests.wandb_offline import offline_runs

QUICK = [
    "model.name=test_resnet",
    "device=cpu",
    "loader.batch_size=16",
    "loader.num_workers=1",
    "bench.ceiling_batches=3",
]

# memmap's one epoch with a steady window however loaded the machine: 40 batches of 4, one
# read ahead. The window opens at 3 + 1; a loop that waits keeps it from its first wait, and
# one that never waits (slower than the loader) spans 36 >= AHEAD_WINDOW_DEPTHS x 1 batches.
# With 20 of 8 and 4 ahead, three pytest workers on 2 cores once left no window at all.
WINDOWED = ["loader.batch_size=4", "loader.prefetch=1"]


def test_resident_serves_one_batch_made_once_with_the_splits_labels(tiny_root: Path) -> None:
    """The same images every batch (made once: the same memory), of the run's shape, with
    the labels of the shared order; a short last val batch is a slice of it; iterating
    draws nothing from torch's global RNG."""
    val = folder_index(tiny_root).val
    spec = cpu_spec(val, False, loader="resident", batch_size=5, image_size=24)
    torch.manual_seed(5)
    before = torch.get_rng_state()
    with build_loader(spec) as loader:
        batches = list(loader)
        again = list(loader)
    assert torch.equal(torch.get_rng_state(), before)
    assert [len(b.labels) for b in batches] == [5, 5, 2] and len(loader) == 3
    first = batches[0].images
    assert first.shape == (5, 3, 24, 24) and first.dtype == torch.uint8 and first.float().std() > 50
    assert all(b.images.data_ptr() == first.data_ptr() for b in batches + again)
    labels = torch.cat([b.labels for b in batches])
    assert labels.dtype == torch.int64 and labels.tolist() == list(val.labels)
    assert loader.queue_depth() == 0 and loader.stats()["decoded_by"] == {}


def test_the_fraction_is_the_rate_over_the_ceiling_or_null_with_why() -> None:
    held = with_ceiling({"images_per_s": 90.0}, 100.0, "this job's resident pass")
    assert held["ceiling_frac"] == pytest.approx(0.9) and held["ceiling_frac_null_reason"] is None
    no_rate = {"images_per_s": None, "images_per_s_null_reason": "no steady window: ..."}
    unheld = with_ceiling(no_rate, 100.0, "this job's resident pass")
    assert unheld["ceiling_frac"] is None
    assert "no steady window" in unheld["ceiling_frac_null_reason"]
    assert no_ceiling(NO_MODEL_REASON)["ceiling_frac_null_reason"].startswith("model=none")


def test_ranks_combine_a_missing_rate_as_missing_and_derive_the_fraction() -> None:
    """Two ranks: the rates and ceilings add up, the fraction is derived from the sums; a
    rank without a steady rate makes the combined rate missing, never a partial sum."""
    mine = {"images_per_s": 40.0, "ceiling_images_per_s": 50.0, "ceiling_frac": 0.8}
    out = combine_over_ranks(mine, 0, 2, lambda values, op: [v + 20.0 for v in values])
    assert out["images_per_s"] == 60.0 and out["ceiling_frac"] == pytest.approx(60 / 70)
    missing = {**mine, "images_per_s": None}
    out = combine_over_ranks(missing, 0, 2, lambda values, op: [v + 20.0 for v in values])
    assert out["images_per_s"] is None and out["ceiling_frac"] is None
    assert out["ceiling_images_per_s"] == 70.0


def row(job: str, loader: str, rate: float | None, model: str = "resnet18") -> dict:
    return {"job": job, "loader": loader, "model": model, "status": "ok", "images_per_s": rate}


def test_a_sweep_holds_each_row_to_its_resident_job_at_the_same_settings() -> None:
    same = ceiling_settings({"task": "train", "model": "resnet18", "image_size": 224})
    other = ceiling_settings({"task": "train", "model": "resnet18", "image_size": 128})
    rows = [
        row("0", "memmap", 95.0),
        row("1", "resident", 100.0),
        row("2", "spdl", 50.0),  # at another image size: no resident job there
        {**row("3", "memmap", 500.0, model="none"), "ceiling_frac_null_reason": NO_MODEL_REASON},
    ]
    apply_sweep_ceilings(rows, [same, same, other, same])
    assert rows[0]["ceiling_frac"] == pytest.approx(0.95)
    assert rows[0]["ceiling_from"] == "sweep job 1 (loader=resident)"
    assert "ceiling_frac" not in rows[2]  # keeps its job's own (none here)
    assert rows[3].get("ceiling_frac") is None
    assert rows[3]["ceiling_frac_null_reason"] == NO_MODEL_REASON


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_resident_runs_through_train_and_eval(small_root: Path, tmp_path: Path) -> None:
    """loader=resident trains (epochs of the split's length) and evaluates a checkpoint;
    its ceiling is its own rate (ceiling_frac 1), and model=none states why it has none."""
    for name in ("train", "eval", "alone"):
        (tmp_path / name).mkdir()
    run_here(
        "train.py",
        f"dataset.root={small_root}",
        "loader=resident",
        "epochs=1",
        "logger=none",
        *QUICK,
        cwd=tmp_path / "train",
    )
    run_dir, metrics = single_run(tmp_path / "train", "train")
    assert metrics["status"] == "ok" and metrics["loader"] == "resident"
    assert metrics["images"] == (160 // 16) * 16 and metrics["steady_batches"] > 0
    assert metrics["ceiling_frac"] == 1.0 and "loader=resident" in metrics["ceiling_from"]
    assert 0.0 <= metrics["top1"] <= 1.0
    run_here(
        "eval.py",
        f"dataset.root={small_root}",
        "loader=resident",
        "logger=none",
        "bench.warmup_batches=1",  # 3 val batches: 2 past the warm-up
        f"checkpoint={run_dir / 'checkpoint.pt'}",
        *QUICK,
        cwd=tmp_path / "eval",
    )
    _, evaluated = single_run(tmp_path / "eval", "eval")
    assert evaluated["status"] == "ok" and evaluated["images"] == 40 * evaluated["passes"]
    assert evaluated["ceiling_frac"] == 1.0
    run_here(
        "eval.py",
        f"dataset.root={small_root}",
        "loader=resident",
        "model=none",
        "logger=none",
        *QUICK[1:],  # no model.name: model=none's
        cwd=tmp_path / "alone",
    )
    _, alone = single_run(tmp_path / "alone", "eval")
    assert alone["ceiling_frac"] is None
    assert alone["ceiling_frac_null_reason"] == NO_MODEL_REASON


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_a_jobs_resident_pass_states_ceiling_frac_and_leaves_the_weights_alone(
    small_root: Path, tmp_path: Path
) -> None:
    """train.py with memmap: the resident pass's ceiling and the fraction in metrics.json and
    the W&B summary (an offline run read back); the same run without the pass trains the
    same weights to the same top-1 (the pass ran on a copy, its random draws undone)."""
    common = [f"dataset.root={small_root}", "loader=memmap", "epochs=1", *QUICK, *WINDOWED]
    common += loader_folder_overrides("memmap", tmp_path)
    (tmp_path / "with").mkdir()
    (tmp_path / "without").mkdir()
    run_entry("train.py", *common, cwd=tmp_path / "with")
    run_here(
        "train.py", *common, "bench.ceiling_batches=0", "logger=none", cwd=tmp_path / "without"
    )
    with_dir, held = single_run(tmp_path / "with", "train")
    without_dir, unheld = single_run(tmp_path / "without", "train")
    assert held["ceiling_images_per_s"] > 0 and held["ceiling_from"] == "this job's resident pass"
    assert held["ceiling_frac"] == pytest.approx(
        held["images_per_s"] / held["ceiling_images_per_s"]
    )
    (wandb_run,) = offline_runs(with_dir)
    assert wandb_run.summary["ceiling_frac"] == pytest.approx(held["ceiling_frac"])
    assert wandb_run.summary["ceiling_images_per_s"] == pytest.approx(held["ceiling_images_per_s"])
    assert (
        unheld["ceiling_frac"] is None
        and "ceiling_batches=0" in (unheld["ceiling_frac_null_reason"])
    )
    assert held["top1"] == unheld["top1"] and held["loss"] == unheld["loss"]
    ours = torch.load(with_dir / "checkpoint.pt", weights_only=True)["model"]
    theirs = torch.load(without_dir / "checkpoint.pt", weights_only=True)["model"]
    assert all(torch.equal(ours[key], theirs[key]) for key in ours)


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_a_sweeps_summary_holds_each_row_to_the_sweeps_resident_job(
    small_root: Path, tmp_path: Path
) -> None:
    """memmap and resident in one sweep (no job's own pass): the memmap row's ceiling is the
    resident job's rate at the same settings, in summary.csv and summary.md."""
    run_here(
        "train.py",
        "--multirun",
        f"dataset.root={small_root}",
        "loader=memmap,resident",
        "epochs=1",
        "logger=none",
        "hydra.sweep.dir=sweep",
        *QUICK[:-1],
        *WINDOWED,
        "bench.ceiling_batches=0",
        cwd=tmp_path,  # memmap's cache under it (its relative cache_dir)
    )
    with open(tmp_path / "sweep" / "summary.csv") as f:
        rows = {r["loader"]: r for r in csv.DictReader(f)}
    resident = float(rows["resident"]["images_per_s"])
    memmap = rows["memmap"]
    assert float(memmap["ceiling_images_per_s"]) == pytest.approx(resident)
    assert float(memmap["ceiling_frac"]) == pytest.approx(float(memmap["images_per_s"]) / resident)
    assert "loader=resident" in memmap["ceiling_from"]
    assert "ceiling_frac" in (tmp_path / "sweep" / "summary.md").read_text()
    assert read_metrics(tmp_path / "sweep" / "0")["loader"] == "memmap"
