"""Caches keyed by content, not location, and the clean-up of old ones."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import torchvision

from loaderbench.loaders import build_loader
from loaderbench.loaders.memmap import housekeeping
from loaderbench.loaders.memmap._cache import (
    BUILD_FOLDER,
    CACHE_NAME,
    cache_name,
    cache_source,
    in_use_file,
    pixel_library_versions,
)
from loaderbench.loaders.memmap.build import StorePolicy
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


def make_old(path: Path, days: float = 40) -> None:
    """Files and folders as a user leaves them: not touched for ``days``."""
    when = time.time() - days * DAY
    for inner in [*path.rglob("*"), path]:
        os.utime(inner, (when, when), follow_symlinks=False)


@pytest.mark.slow
def test_clean_up_removes_only_what_the_loader_made_and_follows_no_link(
    tiny_root: Path, tmp_path: Path
) -> None:
    """A user's folders beside the caches (``loader.cache_dir`` pointed at scratch space), a
    link to data elsewhere, and folders merely named like caches all survive ``--remove``,
    each listed as left alone; the loader's own old cache and a killed build's remains go."""
    cache_dir = tmp_path / "cache"
    with memmap_val(tiny_root, cache_dir) as loader:
        cache = loader.cache.path
    remains = cache_dir / f".{cache.name}.tmp-999999"  # a killed build of that cache
    (remains / "_tensordict").mkdir(parents=True)
    (remains / "_tensordict" / "images.memmap").write_bytes(b"\0" * 4096)
    outside = tmp_path / "elsewhere" / "data"  # what a link points at: never entered
    outside.mkdir(parents=True)
    (outside / "photo.jpg").write_bytes(b"precious")
    (cache_dir / "imagenet" / "train").mkdir(parents=True)
    (cache_dir / "imagenet" / "train" / "x.JPEG").write_bytes(b"user data")
    impostor = cache_dir / f"val-crop224-{'0' * 16}"  # a cache's name, no cache.json of its own
    impostor.mkdir()
    (impostor / "notes.txt").write_text("mine")
    unclaimed = cache_dir / f".{impostor.name}.tmp-12"  # a build's name, no lock of its cache
    unclaimed.mkdir()
    (cache_dir / "data-link").symlink_to(outside, target_is_directory=True)
    (cache_dir / f"train-fit256-{'1' * 16}").symlink_to(outside, target_is_directory=True)
    for path in cache_dir.iterdir():
        make_old(path)
    make_old(in_use_file(cache_dir, cache.name))
    foreign = {"imagenet", impostor.name, unclaimed.name, "data-link", f"train-fit256-{'1' * 16}"}

    command = ["--cache-dir", str(cache_dir), "--unused-days", "30", "--remove"]
    result = subprocess.run(
        [sys.executable, "-m", "loaderbench.loaders.memmap.housekeeping", *command],
        capture_output=True,
        text=True,
        check=True,
    )
    for name in foreign:
        assert f"not a cache, left alone: {cache_dir / name} (" in result.stdout
    assert "removed 2 caches" in result.stdout, result.stdout
    assert not cache.exists() and not remains.exists()
    assert {path.name for path in cache_dir.iterdir() if not path.is_file()} == foreign
    assert (cache_dir / "imagenet" / "train" / "x.JPEG").read_bytes() == b"user data"
    assert (impostor / "notes.txt").read_text() == "mine"
    assert (outside / "photo.jpg").read_bytes() == b"precious"
    assert (cache_dir / "data-link").is_symlink()
    caches, left_alone = housekeeping.survey(cache_dir)
    assert caches == [] and {item.path.name for item in left_alone} == foreign


def test_a_link_inside_a_cache_is_removed_not_followed(tiny_root: Path, tmp_path: Path) -> None:
    cache_dir = tmp_path / "cache"
    with memmap_val(tiny_root, cache_dir) as loader:
        cache = loader.cache.path
    own_size = housekeeping.folder_size(cache)
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "photo.jpg").write_bytes(b"precious" * 100_000)
    (cache / "link").symlink_to(outside, target_is_directory=True)
    (cache / "file-link").symlink_to(outside / "photo.jpg")
    make_old(cache)
    make_old(in_use_file(cache_dir, cache.name))
    (entry,) = housekeeping.list_caches(cache_dir)
    assert entry.size_bytes == own_size  # nothing counted through a link
    assert housekeeping.remove_unused(cache_dir, 30 * DAY) == [entry]
    assert not cache.exists() and (outside / "photo.jpg").read_bytes() == b"precious" * 100_000


@pytest.mark.parametrize("codec", ["raw", "jpeg"])
@pytest.mark.parametrize("train", [True, False])
def test_every_name_a_cache_gets_is_one_the_clean_up_recognises(
    tiny_root: Path, train: bool, codec: str
) -> None:
    index = folder_index(tiny_root)
    split = index.train if train else index.val
    name = cache_name(split, StorePolicy.for_split(train, 224, 1.14, codec=codec))
    assert CACHE_NAME.fullmatch(name), name
    assert BUILD_FOLDER.fullmatch(f".{name}.tmp-4242")["name"] == name


@pytest.mark.parametrize("library", ["torch", "torchvision", "pillow"])
def test_a_new_version_of_a_library_making_the_pixels_gets_a_new_cache(
    tiny_root: Path, library: str
) -> None:
    """torch resizes the train images, torchvision makes the val crops and the jpeg store's
    bytes, Pillow decodes: an upgrade of any of them may change a stored pixel."""
    split = folder_index(tiny_root).train
    policy = StorePolicy.for_split(True, 32, 1.14)
    versions = pixel_library_versions()
    assert versions["torch"] == str(torch.__version__)
    assert versions["torchvision"] == str(torchvision.__version__)
    today = cache_name(split, policy)
    assert cache_name(split, policy, cache_source(split, policy, versions)) == today
    upgraded = {**versions, library: f"{versions[library]}.post1"}
    assert cache_name(split, policy, cache_source(split, policy, upgraded)) != today
