"""Cold-cache runs: files really leave the page cache, and the run says it measured cold."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from loaderbench.platform.pagecache import evict, files_under, resident_fraction
from tests.conftest import single_run
from tests.in_process import run_here


def test_evict_drops_a_file_from_the_page_cache(tmp_path: Path) -> None:
    path = tmp_path / "blob.bin"
    path.write_bytes(os.urandom(8 * 2**20))
    path.read_bytes()
    assert resident_fraction(path) > 0.9
    files, nbytes = evict(files_under(tmp_path))
    assert (files, nbytes) == (1, 8 * 2**20)
    assert resident_fraction(path) < 0.1
    path.read_bytes()
    assert resident_fraction(path) > 0.9


@pytest.mark.slow
def test_cold_run_evicts_the_dataset_first(tiny_root: Path, tmp_path: Path) -> None:
    """eval.py evicts train and val images, then reads only val: the train images, read just
    before the run, are out of the page cache after it."""
    # A copy of its own: another test reading the shared set meanwhile would bring it back.
    root = shutil.copytree(tiny_root, tmp_path / "data")
    train_files = sorted(p for p in (root / "train").rglob("*") if p.is_file())
    assert len(train_files) == 24
    for path in train_files:
        path.read_bytes()
    assert min(resident_fraction(p) for p in train_files) > 0.9  # warm before the run
    run_here(
        "eval.py",
        "model=none",
        f"dataset.root={root}",
        "logger=none",
        "loader.num_workers=0",
        "bench.drop_page_cache=true",
        cwd=tmp_path,
    )
    assert single_run(tmp_path, "eval")[1]["page_cache"] == "cold"
    resident = {p.name: resident_fraction(p) for p in train_files}
    assert max(resident.values()) < 0.1, resident
