"""Caches keyed by content, not location, and the clean-up of old ones."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

from loaderbench.loaders import build_loader
from loaderbench.loaders.memmap import housekeeping
from loaderbench.loaders.memmap.cache import in_use_file
from tests.conftest import cpu_spec, folder_index

DAY = 86_400


def memmap_val(root: Path, cache_dir: Path):
    spec = cpu_spec(folder_index(root).val, False, loader="memmap", cache_dir=str(cache_dir))
    return build_loader(spec)


def test_a_copied_data_set_reuses_the_cache_and_a_changed_file_does_not(
    tiny_root: Path, tmp_path: Path
) -> None:
    cache_dir = tmp_path / "cache"
    with memmap_val(tiny_root, cache_dir) as first:
        assert first.cache.built
    copy = tmp_path / "scratch" / "data"
    shutil.copytree(tiny_root, copy, copy_function=shutil.copy2)  # cp -a: times kept
    with memmap_val(copy, cache_dir) as moved:
        assert not moved.cache.built and moved.cache.path == first.cache.path
        images = [b.images for b in moved]
    with memmap_val(tiny_root, cache_dir) as original:
        assert all(a.equal(b.images) for a, b in zip(images, original, strict=True))
    touched = folder_index(copy).val.paths[0]
    os.utime(touched, ns=(time.time_ns(), time.time_ns()))
    with memmap_val(copy, cache_dir) as changed:
        assert changed.cache.built and changed.cache.path != first.cache.path


def test_old_unused_caches_are_listed_and_removed_but_never_one_in_use(
    tiny_root: Path, tmp_path: Path, capsys
) -> None:
    cache_dir = tmp_path / "cache"
    with memmap_val(tiny_root, cache_dir) as loader:
        old = loader.cache.path
    held = memmap_val(tiny_root, cache_dir)  # the same cache, open in a running job
    long_ago = time.time() - 40 * DAY
    os.utime(in_use_file(cache_dir, old.name), (long_ago, long_ago))
    (entry,) = housekeeping.list_caches(cache_dir)
    assert entry.path == old and entry.complete and entry.size_bytes > 0
    assert 39 < entry.age_days(time.time()) < 41
    assert housekeeping.remove_unused(cache_dir, 30 * DAY) == []  # held: stays
    assert old.is_dir()
    held.close()
    assert housekeeping.remove_unused(cache_dir, 50 * DAY) == []  # not old enough
    housekeeping.main(["--cache-dir", str(cache_dir), "--unused-days", "30", "--remove"])
    printed = capsys.readouterr().out
    assert str(old) in printed and "removed 1 caches" in printed
    assert not old.exists() and housekeeping.list_caches(cache_dir) == []
    with memmap_val(tiny_root, cache_dir) as again:  # and a later run builds it anew
        assert again.cache.built and again.cache.path == old
