"""The dataset index: one scan per data set, loaded by every rank and later run, rescanned
when files come or go (or when asked), and a file rewritten in place seen by its per-file
check."""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from omegaconf import OmegaConf

from loaderbench.config.schema import DatasetConfig
from loaderbench.data._index import index_file
from loaderbench.data.discovery import PathTable, Split, discover
from tests.conftest import rewrite_in_place

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
    from loaderbench.config.schema import DatasetConfig
    from loaderbench.data.discovery import discover
    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    root, index_dir, rescan = sys.argv[1], sys.argv[2], sys.argv[3] == "true"
    cfg = OmegaConf.structured(
        DatasetConfig(name="folder", root=root, index_dir=index_dir, rescan=rescan)
    )
    print(discover(cfg).train.fingerprint())
    """
)


def discover_in(
    root: Path, index_dir: Path, rescan: bool = False, env: dict[str, str] | None = None
) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", DISCOVER, str(root), str(index_dir), str(rescan).lower()],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
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
def test_ranks_starting_together_check_the_files_once(data: Path, tmp_path: Path) -> None:
    """Three ranks of one job (WORLD_SIZE=3) start on an index whose file was rewritten in
    place: the first checks every file, names the one changed and saves its new stats; the
    others take that check as theirs. All three get the new fingerprint."""
    index_dir = tmp_path / "index"
    original, _ = discover_in(data, index_dir).communicate(timeout=120)
    rewrite_in_place(Path(discover(config(data, None)).train.paths[3]), (20, 20, 250))
    env = {**os.environ, "WORLD_SIZE": "3"}
    ranks = [discover_in(data, index_dir, env=env) for _ in range(3)]
    outputs = [rank.communicate(timeout=120) for rank in ranks]
    assert all(rank.returncode == 0 for rank in ranks), outputs
    logs = "".join(err for _, err in outputs)
    assert logs.count("dataset index checked:") == 1 and logs.count("1 of 36 files changed") == 1
    assert "scanned " not in logs
    assert len({out for out, _ in outputs}) == 1 and outputs[0][0] != original


def test_a_file_rewritten_in_place_is_read_anew_by_default(
    data: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A JPEG rewritten in place with other pixels, to the same size, its folder's mtime as
    it was: the folders alone say the index is current, the per-file check (the default) sees
    the file, names it and saves its stats, so the fingerprint (memmap's and auto's key)
    changes. ``dataset.index_check=folders`` does not see it (documented), and says so."""
    index_dir = tmp_path / "index"
    scanned = discover(config(data, index_dir))
    assert scanned.checked == "scan"
    loaded = discover(config(data, index_dir))
    assert (loaded.checked, loaded.files_changed) == ("files", 0)
    assert loaded.train.fingerprint() == scanned.train.fingerprint()
    target = Path(loaded.train.paths[3])
    size = target.stat().st_size
    rewrite_in_place(target, (20, 20, 250), same_size=True)
    assert target.stat().st_size == size
    with caplog.at_level(logging.INFO, logger="loaderbench"):
        seen = discover(config(data, index_dir))
    assert (seen.checked, seen.files_changed) == ("files", 1)
    assert seen.train.fingerprint() != scanned.train.fingerprint()
    assert seen.val.fingerprint() == scanned.val.fingerprint()
    assert seen.train.stats is not None and seen.train.stats[1][3] == target.stat().st_mtime_ns
    changed = [r.getMessage() for r in caplog.records if "changed since" in r.getMessage()]
    assert len(changed) == 1 and str(target) in changed[0]
    assert "36 files' sizes and mtimes" in caplog.text  # the run says what it checked
    again = discover(config(data, index_dir))  # the new stats were saved with the index
    assert again.files_changed == 0 and again.train.fingerprint() == seen.train.fingerprint()

    rewrite_in_place(target, (250, 20, 20), same_size=True)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="loaderbench"):
        folders = discover(config(data, index_dir, index_check="folders"))
    assert (folders.checked, folders.files_changed) == ("folders", 0)
    assert folders.train.fingerprint() == seen.train.fingerprint()  # not seen: folders only
    assert "folders' mtimes only" in caplog.text
    assert discover(config(data, index_dir)).train.fingerprint() != seen.train.fingerprint()


def test_an_unknown_index_check_is_an_error_naming_the_key(data: Path) -> None:
    from loaderbench.run._validation import ConfigError, validate_config
    from tests.helpers import compose_cfg

    cfg = compose_cfg("eval", [f"dataset.root={data}", "dataset.index_check=inodes"])
    with pytest.raises(ConfigError, match="dataset.index_check"):
        validate_config(cfg)


@pytest.mark.slow
def test_rescan_scans_anew(data: Path, tmp_path: Path) -> None:
    index_dir = tmp_path / "index"
    original, _ = discover_in(data, index_dir).communicate(timeout=120)
    fresh, fresh_log = discover_in(data, index_dir, rescan=True).communicate(timeout=120)
    assert fresh == original and "scanned " in fresh_log
    assert index_file(index_dir, data, {}).is_file()
