"""The dataset index: one scan per data set, loaded by every rank and later run, rescanned
when files come or go (or when asked)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
from omegaconf import OmegaConf

from loaderbench.config import DatasetConfig
from loaderbench.data import PathTable, Split, discover
from loaderbench.dataset_index import index_file

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def config(root: Path, index_dir: Path | None, **more: object):
    return OmegaConf.structured(
        DatasetConfig(name="folder", root=str(root), index_dir=str(index_dir), **more)
        if index_dir is not None
        else DatasetConfig(name="folder", root=str(root), index_dir=None, **more)
    )


@pytest.fixture
def data(tiny_root: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "data"
    shutil.copytree(tiny_root, copy, copy_function=shutil.copy2)
    return copy


def test_the_index_is_written_once_then_loaded_and_matches_a_scan(
    data: Path, tmp_path: Path
) -> None:
    index_dir = tmp_path / "index"
    first = discover(config(data, index_dir))
    (saved,) = index_dir.glob("dataset-*.npz")
    written = saved.stat().st_mtime_ns
    second = discover(config(data, index_dir))
    assert saved.stat().st_mtime_ns == written  # loaded, not rewritten
    scanned = discover(config(data, None))
    for split in ("train", "val"):
        a, b, c = first.split(split), second.split(split), scanned.split(split)
        assert list(a.paths) == list(b.paths) == list(c.paths)
        assert list(a.labels) == list(b.labels) == list(c.labels)
        assert isinstance(b.paths, PathTable) and b.paths.blob.dtype == np.uint8
        # The cache key is the same whether the sizes come from the index or from stat.
        plain = Split(split, tuple(c.paths), tuple(c.labels), c.root)
        assert b.fingerprint() == c.fingerprint() == plain.fingerprint()
    assert second.classes == scanned.classes


def test_a_file_added_or_removed_rescans_by_itself(data: Path, tmp_path: Path) -> None:
    index_dir = tmp_path / "index"
    before = discover(config(data, index_dir))
    first = Path(before.train.paths[0])
    shutil.copy2(first, first.with_name("added.JPEG"))
    added = discover(config(data, index_dir))
    assert len(added.train) == len(before.train) + 1
    assert str(first.with_name("added.JPEG")) in list(added.train.paths)
    first.unlink()
    removed = discover(config(data, index_dir))
    assert len(removed.train) == len(before.train) and str(first) not in list(removed.train.paths)


DISCOVER = textwrap.dedent(
    """
    import logging, sys
    from omegaconf import OmegaConf
    from loaderbench.config import DatasetConfig
    from loaderbench.data import discover
    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    root, index_dir, rescan = sys.argv[1], sys.argv[2], sys.argv[3] == "true"
    cfg = OmegaConf.structured(
        DatasetConfig(name="folder", root=root, index_dir=index_dir, rescan=rescan)
    )
    print(discover(cfg).train.fingerprint())
    """
)


def discover_in(root: Path, index_dir: Path, rescan: bool = False) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", DISCOVER, str(root), str(index_dir), str(rescan).lower()],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.mark.slow
def test_ranks_starting_together_scan_once(data: Path, tmp_path: Path) -> None:
    index_dir = tmp_path / "index"
    ranks = [discover_in(data, index_dir) for _ in range(3)]
    outputs = [rank.communicate(timeout=120) for rank in ranks]
    assert all(rank.returncode == 0 for rank in ranks), outputs
    logs = "".join(err for _, err in outputs)
    assert logs.count("scanned ") == 1 and logs.count("loaded") == 2
    assert len({out for out, _ in outputs}) == 1  # one data set, one cache key


@pytest.mark.slow
def test_rescan_sees_a_file_rewritten_in_place(data: Path, tmp_path: Path) -> None:
    index_dir = tmp_path / "index"
    original, _ = discover_in(data, index_dir).communicate(timeout=120)
    path = discover(config(data, None)).train.paths[3]
    later = time.time_ns() + 5 * 10**9
    os.utime(path, ns=(later, later))  # rewritten in place: no folder changes
    stale, stale_log = discover_in(data, index_dir).communicate(timeout=120)
    assert stale == original and "loaded" in stale_log  # documented: needs a rescan
    fresh, fresh_log = discover_in(data, index_dir, rescan=True).communicate(timeout=120)
    assert fresh != original and "scanned " in fresh_log
    assert index_file(index_dir, data, {}).is_file()
