"""Sweeps: real multiruns in subprocesses leave a summary that holds every job."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from loaderbench.sweeps import collect_rows, write_summary
from tests.conftest import run_entry
from tests.wandb_offline import offline_runs

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def sweep_dir(cwd: Path, task: str) -> Path:
    (path,) = [p.parent for p in (cwd / "outputs" / task / "multirun").rglob("multirun.yaml")]
    return path


def read_csv(path: Path) -> list[dict]:
    with open(path) as f:
        return list(csv.DictReader(f))


@pytest.mark.slow
def test_multirun_over_loaders_and_workers_summarises_every_job(
    tiny_root: Path, tmp_path: Path
) -> None:
    run_entry(
        "eval.py",
        "--multirun",
        "model=none",
        "loader=torchvision,memmap",
        "loader.num_workers=0,1",
        "loader.batch_size=4",
        # 3 batches a pass, all warm-up in the first: the second pass is the steady window.
        "bench.epochs=2",
        f"dataset.root={tiny_root}",
        "logger=wandb",
        cwd=tmp_path,
    )
    sweep = sweep_dir(tmp_path, "eval")
    rows = read_csv(sweep / "summary.csv")
    assert len(rows) == 4
    assert list(rows[0])[:3] == ["job", "loader", "loader.num_workers"]
    assert {(r["loader"], r["loader.num_workers"]) for r in rows} == {
        (loader, n) for loader in ("torchvision", "memmap") for n in ("0", "1")
    }
    for row in rows:
        assert row["status"] == "ok" and int(row["images"]) == 24
        assert float(row["images_per_s"]) > 0 and row["cpu_s_per_1k_images"]
    # Best first.
    rates = [float(r["images_per_s"]) for r in rows]
    assert rates == sorted(rates, reverse=True)
    md = (sweep / "summary.md").read_text()
    assert md.count("\n| ") == 5 and "images_per_s" in md
    assert (sweep / "summary.png").read_bytes()[:8] == PNG_MAGIC

    runs = offline_runs(tmp_path / "outputs")
    assert len(runs) == 5 and len({r.group for r in runs}) == 1
    (summary,) = [r for r in runs if r.job_type == "summary"]
    keys = " ".join(summary.summary)
    assert "summary_table" in keys and "summary_plot" in keys
    table_files = [f for f in summary.files if f.endswith(".table.json")]
    assert table_files
    (table_path,) = list(sweep.rglob(Path(table_files[0]).name))
    table = json.loads(table_path.read_text())
    assert len(table["data"]) == 4 and "images_per_s" in table["columns"]

    # Native W&B charts built from the table: images/s, CPU cost and data wait against the
    # numeric swept key, one series per loader.
    for metric in ("images_per_s", "cpu_s_per_1k_images", "data_wait_frac"):
        chart = summary.config[f"_wandb.visualize.chart/{metric}"]
        assert chart["panel_type"] == "Vega2"
        fields = chart["panel_config"]["fieldSettings"]
        assert fields == {"x": "x", "y": metric, "stroke": "series"}
    (chart_file,) = [f for f in summary.files if "chart/" in f and f.endswith(".table.json")]
    (chart_path,) = list(sweep.rglob(Path(chart_file).name))
    chart_table = json.loads(chart_path.read_text())
    columns = chart_table["columns"]
    points = {
        (row[columns.index("series")], row[columns.index("x")]) for row in chart_table["data"]
    }
    assert points == {(loader, n) for loader in ("torchvision", "memmap") for n in (0, 1)}


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
