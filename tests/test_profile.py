"""``make profile``: a real py-spy profile of a real loader's threads, and its summary."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.markdown_rows import unpadded
from tools.bench.profile import frame_name, render, summarise

# python -m tools.bench.profile from another folder: the tools are the repository's, not installed.
TOOLS_ENV = {
    **os.environ,
    "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
}


def test_the_summary_counts_the_loader_threads_samples_by_self_and_total_time() -> None:
    lines = [
        "thread (11): memmap-loader_0;run (a/threading.py:10);_gather (src/loaderbench/x.py:5) 6",
        "thread (11): memmap-loader_0;run (a/threading.py:12);_gather (src/loaderbench/x.py:9);"
        "resize (src/loaderbench/y.py:3) 3",
        "thread (12): memmap-loader_1 1",  # native code only
        "thread (10): MainThread;main (train.py:3);import_all (x.py:1) 50",
        "not a sample line",
    ]
    profile = summarise(lines, ["memmap-loader"])
    assert profile.samples == 10  # the main thread's 50 are not the loader's
    assert dict(profile.top(profile.self_counts, 5)) == {
        "_gather (loaderbench/x.py)": 60.0,
        "resize (loaderbench/y.py)": 30.0,
        "(no Python frame: native code)": 10.0,
    }
    totals = dict(profile.top(profile.total_counts, 5))
    assert totals["_gather (loaderbench/x.py)"] == 90.0 and totals["run (a/threading.py)"] == 90.0
    assert frame_name("f (/x/lib/python3.11/site-packages/torch/nn.py:3)") == "f (torch/nn.py)"
    table = unpadded(render(profile, "title"))  # the share right-aligned, the frame as code
    assert "| self % | frame |\n|---:|:---|\n| 60.0 | `_gather (loaderbench/x.py)` |" in table


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_make_profile_samples_the_memmap_reading_threads_of_a_real_run(
    small_root: Path, tmp_path: Path
) -> None:
    out = tmp_path / "profile"
    command = [
        sys.executable,
        "-m",
        "tools.bench.profile",
        "--out",
        str(out),
        "--rate",
        "500",
        f"dataset.root={small_root}",
        "loader=memmap",
        "loader.num_workers=2",
        "loader.batch_size=8",
        "image_size=64",
        "bench.epochs=4",
        f"loader.cache_dir={tmp_path / 'cache'}",
    ]
    done = subprocess.run(
        command, cwd=tmp_path, env=TOOLS_ENV, capture_output=True, text=True, timeout=280
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    summary = (out / "profile.md").read_text()
    samples = int(summary.split("\n")[2].split()[0])
    assert samples > 20, summary
    # The reading threads' work is the batch read; its crop loop is the run's hot path.
    assert "`CroppedRows.read (loaderbench/loaders/memmap/_rows.py)`" in summary
    assert "resize_rows_into (loaderbench/imaging/batch_resize.py)" in summary
    assert (out / "run" / "metrics.json").exists()


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_make_profile_gil_gives_ms_per_1k_images_of_a_real_spdl_run(
    small_root: Path, tmp_path: Path
) -> None:
    """``--gil``: two real runs under ``py-spy --gil``, their difference per thread group."""
    import json

    out = tmp_path / "gil"
    command = [
        sys.executable,
        "-m",
        "tools.bench.profile",
        "--gil",
        "--gil-epochs",
        "2,8",
        "--rate",
        "500",
        "--out",
        str(out),
        f"dataset.root={small_root}",
        "loader=spdl",
        "loader.num_workers=2",
        "loader.batch_size=8",
        "image_size=64",
    ]
    done = subprocess.run(
        command, cwd=tmp_path, env=TOOLS_ENV, capture_output=True, text=True, timeout=580
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    figures = json.loads((out / "gil.json").read_text())["gil_ms_per_1k_images"]
    assert set(figures) == {"loader", "main", "other"}
    assert all(value >= 0 for value in figures.values())
    # The decode threads were sampled holding the GIL (they take it for a batch's bookkeeping).
    raw = (out / "gil-8.txt").read_text()
    assert "loaderbench_spdl_decode" in raw and "spdl_event_loop" in raw
    metrics = json.loads((out / "gil-8" / "metrics.json").read_text())
    assert 0 <= metrics["gil_frac"] <= 1 and metrics["images"] > 0
    assert "| loader |" in unpadded((out / "gil.md").read_text())
