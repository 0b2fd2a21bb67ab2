"""Run folders (loaderbench.run.folders): one reader of a multirun's job folders for the sweep
summary and the GPU check's report, which therefore agree on every job; the report is written
without torch, hydra or omegaconf (and without PyYAML), as where the GPU check's kit did not
install."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from loaderbench.run.folders import job_dirs, read_jobs
from loaderbench.run.sweeps import collect_rows
from tests.conftest import REPO
from tests.markdown_rows import unpadded
from tools.gpu_check import report as gpu_report

SWEPT = ["loader=memmap,spdl", "loader.num_workers=0,1,2,3,4,5,6,7,8,9,10,11"]


def write_job(sweep: Path, number: int, overrides: list[str], metrics: dict | str | None) -> Path:
    """A job folder as Hydra and a run leave it: .hydra/overrides.yaml saved the way Hydra saves
    it (OmegaConf.save of the override strings), metrics.json where the job got that far."""
    job = sweep / str(number)
    (job / ".hydra").mkdir(parents=True)
    OmegaConf.save(OmegaConf.create(overrides), job / ".hydra" / "overrides.yaml")
    if metrics is not None:
        text = metrics if isinstance(metrics, str) else json.dumps(metrics)
        (job / "metrics.json").write_text(text)
    return job


def make_sweep(sweep: Path) -> None:
    """Twelve jobs (so that 10 and 11 sort after 9), one that never wrote its metrics, one the
    process ended while it ran, one with a torn metrics.json, one whose overrides add a key."""
    sweep.mkdir(parents=True)
    OmegaConf.save(
        OmegaConf.create({"hydra": {"overrides": {"task": SWEPT}}}), sweep / "multirun.yaml"
    )
    for n in range(12):
        loader = "memmap" if n % 2 else "spdl"
        overrides = [f"loader={loader}", f"loader.num_workers={n}", "model=none"]
        metrics: dict | str | None = {
            "status": "ok",
            "loader": loader,
            "num_workers": n,
            "images_per_s": 100.0 + n,
        }
        if n == 3:
            metrics = None
        elif n == 4:
            metrics = {"status": "running", "loader": loader}
        elif n == 5:
            metrics = '{"status": "ok", '  # a job killed while writing it
        elif n == 6:
            overrides = [*overrides, "+loader.store=jpeg", "~logger"]
        write_job(sweep, n, overrides, metrics)
    (sweep / "summary.md").write_text("not a job\n")
    (sweep / "stray").mkdir()  # no .hydra: not a job


def test_the_sweep_summary_and_the_gpu_report_read_each_job_alike(tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    make_sweep(sweep)
    names = [str(n) for n in range(12)]
    assert [p.name for p in job_dirs(sweep)] == names

    jobs = read_jobs(sweep)
    assert [job.name for job in jobs] == names
    assert jobs[6].overrides["loader.store"] == "jpeg" and "logger" in jobs[6].overrides
    assert jobs[4].metrics["status"] == "running"  # as written: each reader names it
    for torn in (jobs[3], jobs[5]):
        assert torn.metrics["status"] == "failed"
        assert torn.metrics["error"].startswith("no readable metrics.json")

    keys, summary = collect_rows(sweep)
    report = gpu_report.collect(sweep, "sweep")
    assert keys == ["loader", "loader.num_workers"]
    assert [row["job"] for row in summary] == [row.job for row in report] == names
    assert [row["loader.num_workers"] for row in summary] == [row.workers for row in report]
    assert [row["status"] for row in summary][3:6] == ["failed", "failed", "failed"]
    assert [row.status for row in report][3:6] == ["failed", "killed", "failed"]
    assert summary[5]["error"] == report[5].error == jobs[5].metrics["error"]
    assert report[6].loader == "spdl (jpeg)" and report[7].loader == "memmap"
    assert [row["images_per_s"] for row in summary][:3] == [100.0, 101.0, 102.0]


def test_overrides_that_are_not_a_list_name_their_file(tmp_path: Path) -> None:
    job = write_job(tmp_path / "sweep", 0, ["loader=spdl"], {"status": "ok"})
    overrides = job / ".hydra" / "overrides.yaml"
    overrides.write_text("- loader=spdl\n- [unclosed\n")
    with pytest.raises(ValueError, match=str(overrides)):
        gpu_report.collect(tmp_path / "sweep", "sweep")
    overrides.write_text("loader: spdl\n")
    with pytest.raises(ValueError, match=f"{overrides}: expected a list"):
        read_jobs(tmp_path / "sweep")


@pytest.mark.slow
@pytest.mark.parametrize("without_yaml", [False, True], ids=["pyyaml", "no-pyyaml"])
def test_the_gpu_report_is_written_without_torch_hydra_or_omegaconf(
    tmp_path: Path, without_yaml: bool
) -> None:
    """The report phase runs where the kit did not install: nothing it imports may need
    torch, hydra or omegaconf; without PyYAML the overrides are read line by line."""
    sweep = tmp_path / "runs" / "train-none-spdl"
    make_sweep(sweep)
    absent = tmp_path / "absent"
    for name in ["torch", "hydra", "omegaconf"] + (["yaml"] if without_yaml else []):
        (absent / name).mkdir(parents=True)
        (absent / name / "__init__.py").write_text(f"raise ImportError('{name} is absent')\n")
    plan = tmp_path / "plan.tsv"
    plan.write_text("train-none-spdl\ttrain.py model=none, spdl\t13\n")
    out = tmp_path / "report.md"
    args = ["--out", str(out), "--runs", str(tmp_path / "runs"), "--plan", str(plan)]
    proc = subprocess.run(
        [sys.executable, "-m", "tools.gpu_check", "report", *args, "--title", "bare"],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": f"{absent}{os.pathsep}{REPO / 'src'}"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 1, proc.stderr  # not every job ran ok: the phase fails
    assert f"{out}: 9 of 13 benchmark jobs ok" in proc.stdout
    text = unpadded(out.read_text())
    assert "12 of 13 jobs ran" in text and "**1 job(s) never started**" in text
    # The model column first (these jobs name none), then images_per_s at its catalog format.
    assert (
        "| spdl (jpeg) | 6 | ok |  | 106.0 |" in text and "| memmap | 11 | ok |  | 111.0 |" in text
    )
    assert "| spdl | 4 | killed |" in text and "no readable metrics.json" in text
