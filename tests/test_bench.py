"""`make bench` in its quick mode: the report holds every loader, every peer and both limits."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.slow


def test_quick_benchmark_report(tmp_path: Path) -> None:
    out = tmp_path / "bench"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "loaderbench.bench",
            "--quick",
            "--out",
            str(out),
            "--workers",
            "1",
            "--epochs",
            "2,1",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-5000:]
    report = (out / "report.md").read_text()
    for needle in (
        "CPU decode limit",
        "plain thread pool",
        "of the plain thread pool",
        "memory-copy bandwidth",
        "torchvision",
        "memmap",
        "spdl",
        "classic (float in workers)",
        "tutorial tensorclass",
        "page cache: warm",
    ):
        assert needle in report, needle
    assert (out / "report.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    report_json = json.loads((out / "report.json").read_text())
    limit = report_json["decode_limit"]
    # Measured over every val image the loaders read (4 classes x 24 in quick mode).
    assert {r["images"] for r in limit["rates"]} == {96} and limit["pool"]["images"] == 96
    assert limit["pool"]["images_per_s"] > 0
    rows = report_json["rows"]
    pipelines = {(r["pipeline"], r["name"]) for r in rows}
    for task in ("val", "train"):
        for name in ("torchvision", "memmap", "spdl", "tutorial tensorclass"):
            assert (task, name) in pipelines
    loaders = [r for r in rows if r["name"] in ("torchvision", "memmap", "spdl")]
    assert all(r["images_per_s"] and r["images_per_s"] > 0 for r in loaders)
    assert all(r["share"] and r["share"] > 0 for r in loaders)
