"""Sweeps: real multiruns in subprocesses leave a summary that holds every job."""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from loaderbench.data.synthetic import SyntheticSpec, ensure_synthetic
from loaderbench.run.sweeps import collect_rows, write_summary
from tests.conftest import run_entry, shared_data_dir
from tests.helpers import compose_cfg
from tests.in_process import run_here
from tests.markdown_rows import unpadded
from tests.wandb_offline import offline_runs

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def sweep_dir(cwd: Path, task: str) -> Path:
    (path,) = [p.parent for p in (cwd / "outputs" / task / "multirun").rglob("multirun.yaml")]
    return path


def read_csv(path: Path) -> list[dict]:
    with open(path) as f:
        return list(csv.DictReader(f))


@pytest.fixture(scope="session")
def default_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The default data set at its default size (``dataset=synthetic``: 10 classes, 1,000
    train and 300 val JPEGs of ImageNet's sizes), generated once for the session."""
    assert SyntheticSpec() == SyntheticSpec(
        **OmegaConf.to_container(compose_cfg("eval", []).dataset.synthetic)
    )
    return ensure_synthetic(SyntheticSpec(), shared_data_dir(tmp_path_factory))


@pytest.fixture(scope="session")
def photos_300(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder of 300 val images (and a few train ones): 10 passes' worth of batches of 32."""
    spec = SyntheticSpec(num_classes=10, train_per_class=2, val_per_class=30, seed=11)
    return ensure_synthetic(spec, shared_data_dir(tmp_path_factory))


def rated(rows: list[dict]) -> list[float]:
    assert all(r["status"] == "ok" for r in rows), [(r["job"], r["status"]) for r in rows]
    missing = [(r["job"], r["images_per_s_null_reason"]) for r in rows if not r["images_per_s"]]
    assert not missing, missing
    return [float(r["images_per_s"]) for r in rows]


@pytest.mark.slow
def test_the_contracts_eval_sweep_rates_and_ranks_every_job_on_the_default_data(
    default_root: Path, tmp_path: Path
) -> None:
    """The contract's own example, as a user types it, on the data the project ships: all 6
    jobs have a rate (passes of 3 batches of 128, a window that opens after 7 or 11, made one
    measurement by bench.epochs=auto), ranked by it; W&B's summary run shows the same."""
    run_entry(
        "eval.py",
        "--multirun",
        "model=none",
        "loader=torchvision,memmap,spdl",
        "loader.batch_size=32,128",
        f"dataset.root={default_root}",
        "logger=wandb",
        cwd=tmp_path,
    )
    sweep = sweep_dir(tmp_path, "eval")
    rows = read_csv(sweep / "summary.csv")
    assert len(rows) == 6 and list(rows[0])[:4] == ["job", "rank", "loader", "loader.batch_size"]
    rates = rated(rows)
    assert rates == sorted(rates, reverse=True)  # best first: the most images/s
    assert [r["rank"] for r in rows] == [str(n) for n in range(1, 7)]
    for row in rows:
        assert int(row["passes"]) >= 1 and int(row["steady_batches"]) >= 10
        assert float(row["steady_window_s"]) >= 0.5  # bench.min_window_s, within 20 s
        assert int(row["images"]) == 300 * int(row["passes"])
    md = (sweep / "summary.md").read_text()
    assert "6 jobs over loader, loader.batch_size: 6 with a rate, best first" in md
    assert "failed" not in md and "without a rate" not in md
    assert md.count(" leads ") == 2  # three loaders, each against the next
    assert (sweep / "summary.png").read_bytes()[:8] == PNG_MAGIC

    runs = offline_runs(tmp_path / "outputs")
    assert len(runs) == 7 and len({r.group for r in runs}) == 1
    (summary,) = [r for r in runs if r.job_type == "summary"]
    assert summary.summary["jobs_with_a_rate"] == 6 and summary.summary["jobs_failed"] == 0
    assert summary.summary["best_images_per_s"] == pytest.approx(rates[0])
    table = wandb_table(sweep, summary, "summary_table")
    assert len(table["data"]) == 6 and table["columns"][:4] == [
        "rank",
        "job",
        "loader",
        "loader.batch_size",
    ]
    # The native charts: images/s, CPU cost and data wait against the batch, a line a loader.
    for metric in ("images_per_s", "cpu_s_per_1k_images", "data_wait_frac"):
        chart = summary.config[f"_wandb.visualize.chart/{metric}"]
        assert chart["panel_config"]["fieldSettings"] == {"x": "x", "y": metric, "stroke": "series"}
    (chart_file,) = [f for f in summary.files if "chart/" in f and f.endswith(".table.json")]
    (chart_path,) = list(sweep.rglob(Path(chart_file).name))
    chart_table = json.loads(chart_path.read_text())
    columns = chart_table["columns"]
    points = {
        (row[columns.index("series")], row[columns.index("x")]) for row in chart_table["data"]
    }
    assert points == {
        (loader, n) for loader in ("torchvision", "memmap", "spdl") for n in (32, 128)
    }


@pytest.mark.slow
# The contract's counts are more workers than 2 cores, on purpose: torch's warning says so.
@pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")
def test_the_contracts_train_sweep_names_the_worker_count_to_use(
    default_root: Path, tmp_path: Path
) -> None:
    """``train.py --multirun loader.num_workers=8,16,32`` on the default data (2 epochs of the
    default recipe): a rate and ceiling_frac a job, and the count to use named."""
    run_here(
        "train.py",
        "--multirun",
        "loader.num_workers=8,16,32",
        f"dataset.root={default_root}",
        "epochs=2",
        "logger=none",
        cwd=tmp_path,
    )
    sweep = sweep_dir(tmp_path, "train")
    rows = read_csv(sweep / "summary.csv")
    rated(rows)
    assert sorted(r["num_workers"] for r in rows) == ["16", "32", "8"]
    for row in rows:
        assert 0 < float(row["ceiling_frac"]) and row["top1"]
    (chosen,) = [r for r in rows if r["workers_choice"] == "use"]
    md = unpadded((sweep / "summary.md").read_text())
    assert f"## Workers to use: loader.num_workers={chosen['num_workers']}" in md
    header = next(line for line in md.splitlines() if line.startswith("| rank |"))
    assert "| ceiling_frac |" in header and header.endswith("| top-1 |")


@pytest.mark.slow
def test_a_worker_sweep_over_a_300_image_folder_rates_every_loader(
    photos_300: Path, tmp_path: Path
) -> None:
    """``loader.num_workers=1,2`` over a folder of 300 images, every loader: every job has a
    rate, and each loader gets its count to use."""
    run_here(
        "eval.py",
        "--multirun",
        "model=none",
        "loader=torchvision,memmap,spdl",
        "loader.num_workers=1,2",
        f"dataset.root={photos_300}",
        "logger=none",
        cwd=tmp_path,
    )
    sweep = sweep_dir(tmp_path, "eval")
    rows = read_csv(sweep / "summary.csv")
    rates = rated(rows)
    assert len(rows) == 6 and rates == sorted(rates, reverse=True)
    md = (sweep / "summary.md").read_text()
    for loader in ("torchvision", "memmap", "spdl"):
        assert f"## Workers to use for loader={loader}: loader.num_workers=" in md
    assert sum(r["workers_choice"] == "use" for r in rows) == 3


def wandb_table(sweep: Path, run, name: str) -> dict:
    """The W&B table ``name`` that ``run`` logged (its file: ``<name>_<step>_<hash>``)."""
    pattern = re.compile(rf"{re.escape(name)}_\d+_[0-9a-f]+\.table\.json")
    (table_file,) = [f for f in run.files if pattern.fullmatch(Path(f).name)]
    (path,) = list(sweep.rglob(Path(table_file).name))
    return json.loads(path.read_text())


@pytest.mark.slow
def test_failed_job_is_a_failed_row(tiny_root: Path, tmp_path: Path) -> None:
    proc = run_entry(
        "eval.py",
        "--multirun",
        "model=none",
        "logger=none",
        "loader.batch_size=4,0",
        "loader.num_workers=0",
        f"dataset.root={tiny_root}",
        cwd=tmp_path,
    )
    assert "1 of 2 jobs failed" in proc.stderr + proc.stdout
    rows = read_csv(sweep_dir(tmp_path, "eval") / "summary.csv")
    assert [r["status"] for r in rows] == ["ok", "failed"]
    assert "loader.batch_size" in rows[1]["error"]


@pytest.mark.slow
def test_submitit_local_launcher(tiny_root: Path, tmp_path: Path) -> None:
    run_entry(
        "eval.py",
        "--multirun",
        "hydra/launcher=local",
        "model=none",
        "logger=none",
        "loader.num_workers=0,1",
        "loader.batch_size=4",
        f"dataset.root={tiny_root}",
        cwd=tmp_path,
    )
    rows = read_csv(sweep_dir(tmp_path, "eval") / "summary.csv")
    assert sorted(r["num_workers"] for r in rows) == ["0", "1"]
    assert all(r["status"] == "ok" for r in rows)


def test_job_without_metrics_is_a_failed_row(tmp_path: Path) -> None:
    (tmp_path / "multirun.yaml").write_text(
        'hydra:\n  overrides:\n    task: ["loader.num_workers=1,2"]\n'
    )
    for num, workers in ((0, 1), (1, 2)):
        hydra_dir = tmp_path / str(num) / ".hydra"
        hydra_dir.mkdir(parents=True)
        (hydra_dir / "overrides.yaml").write_text(f"- loader.num_workers={workers}\n")
    (tmp_path / "0" / "metrics.json").write_text(
        json.dumps({"status": "ok", "loader": "memmap", "images_per_s": 10.0})
    )
    keys, rows = collect_rows(tmp_path)
    assert keys == ["loader.num_workers"]
    assert [(r["loader.num_workers"], r["status"]) for r in rows] == [("1", "ok"), ("2", "failed")]
    write_summary(tmp_path)
    assert "failed" in (tmp_path / "summary.md").read_text()
    assert (tmp_path / "summary.png").read_bytes()[:8] == PNG_MAGIC
