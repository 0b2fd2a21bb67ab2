"""metrics.json, the W&B summary and summary.csv carry the keys they carried before the typed
record (``loaderbench.measure.record``) wrote them: each run of a few kinds is compared with the
keys recorded from the code that wrote metrics.json from a dict (tests/data/run_keys.json). A
key added or renamed on purpose is added or renamed there, in the same change."""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path

import pytest

from tests.conftest import REPO, run_entry, single_run
from tests.in_process import run_here
from tests.wandb_offline import offline_runs

KEYS_FILE = Path(__file__).parent / "data" / "run_keys.json"
QUICK = ["device=cpu", "loader.batch_size=8", "bench.ceiling_batches=3", "bench.max_measure_s=4"]
# Each kind of run: its script and its overrides (with the data set's root added).
RUNS = {
    "train_none_memmap": ("train.py", ["model=none", "loader=memmap", "loader.num_workers=1"]),
    "train_model_torchvision": (
        "train.py",
        ["model.name=test_resnet", "loader=torchvision", "loader.num_workers=1", "logger=wandb"],
    ),
    "eval_none_spdl_auto": (
        "eval.py",
        [
            "model=none",
            "loader=spdl",
            "loader.num_workers=auto",
            "loader.autotune.window_s=0.3",
            "loader.autotune.min_batches=4",
        ],
    ),
}


def run_keys(name: str, root: Path, cwd: Path) -> dict[str, list[str]]:
    """The keys of one run's metrics.json (and of its W&B summary, where it logs to W&B)."""
    script, overrides = RUNS[name]
    task = "train" if script == "train.py" else "eval"
    # A W&B offline run is read back from a real subprocess; the others run in this process.
    run = run_entry if "logger=wandb" in overrides else run_here
    run(script, f"dataset.root={root}", *QUICK, *overrides, cwd=cwd)
    _, metrics = single_run(cwd, task)
    keys = {"metrics": sorted(metrics)}
    if "logger=wandb" in overrides:
        # The W&B summary: metrics.json's keys that hold a value, beside the curves' last
        # points (``epoch/``, ``train/``, ``val/``, the step axes).
        (run,) = offline_runs(cwd)
        valued = {key for key, value in metrics.items() if value is not None}
        summary = {key for key in run.summary if not key.startswith("_")}
        keys["wandb_summary_beside_metrics"] = sorted(summary - valued)
        keys["metrics_missing_from_wandb"] = sorted(valued - summary)
    return keys


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(RUNS))
def test_a_runs_keys_are_todays(name: str, tiny_root: Path, tmp_path: Path) -> None:
    expected = json.loads(KEYS_FILE.read_text())[name]
    assert run_keys(name, tiny_root, tmp_path) == expected


@pytest.mark.slow
def test_a_sweeps_summary_columns_are_todays(tiny_root: Path, tmp_path: Path) -> None:
    run_here(
        "eval.py",
        "--multirun",
        f"dataset.root={tiny_root}",
        *QUICK,
        "model=none",
        "loader=torchvision,memmap",
        "loader.num_workers=1",
        cwd=tmp_path,
    )
    (sweep,) = [path.parent for path in tmp_path.rglob("multirun.yaml")]
    with (sweep / "summary.csv").open() as handle:
        columns = next(csv.reader(handle))
    assert columns == json.loads(KEYS_FILE.read_text())["sweep_summary_csv"]


def test_every_key_docs_metrics_md_names_has_a_place_in_the_record() -> None:
    """A key written only in runs the keys above do not cover (a resume, a data-parallel run's
    rank lists) still has its place: a section's field or a figure the catalog declares; the
    loader's own keys (``loader_<split>_...``) are the loaders'."""
    from loaderbench.measure.record import RunRecord

    documented = set()
    for line in (REPO / "docs" / "metrics.md").read_text().splitlines():
        if line.startswith("| `"):
            documented.update(re.findall(r"`([a-z0-9_<>]+)`", line.split("|")[1]))
    keys = sorted(key for key in documented if not key.startswith(("loader_", "_")))
    assert {"resumed_from", "epoch_rank_images_per_s", "epoch_slowest_rank"} <= set(keys)
    homeless = [key for key in keys if not RunRecord.has_place_for(key)]
    assert not homeless, f"docs/metrics.md names keys the run record has no place for: {homeless}"
    assert not RunRecord.has_place_for("images_per_second")
