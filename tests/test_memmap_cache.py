"""The memmap cache on disk, on real JPEG files, real memory-mapped files and real subprocesses:
what it stores (raw or JPEG, val crops and whole train images), when a new one is built, and
what a skipped file, a full disk, a SIGKILLed build or two builders at once leave behind. The
loader's reading and augmenting: tests/test_memmap.py."""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from loaderbench.imaging.files import load_rgb
from loaderbench.imaging.stored import decode_fit, fit_size
from loaderbench.imaging.transforms import pil_val_transform
from loaderbench.loaders.memmap._cache import COMPLETE_FILE, cache_name, ensure_cache, open_cache
from loaderbench.loaders.memmap.build import CacheError, StorePolicy
from loaderbench.loaders.memmap.store_raw import ImageCache
from loaderbench.platform.locking import FileLock
from tests.conftest import REPO, folder_index
from tests.test_memmap import SIZE, make_loader


def digest(cache: ImageCache) -> str:
    """A hash of every field's bytes."""
    h = hashlib.sha256()
    for field in ("images", "labels", "heights", "widths"):
        h.update(getattr(cache, field).contiguous().numpy().tobytes())
    return h.hexdigest()


def copy_tree(root: Path, dest: Path) -> Path:
    shutil.copytree(root, dest)
    return dest


# ---------------------------------------------------------------------------------------------
# The cache on disk.


REOPEN = """
import hashlib, sys
from loaderbench.loaders.memmap.store_raw import ImageCache
for path in sys.argv[1:]:
    cache = ImageCache.load_memmap(path)
    h = hashlib.sha256()
    for field in ("images", "labels", "heights", "widths"):
        h.update(getattr(cache, field).contiguous().numpy().tobytes())
    print(h.hexdigest())
"""


@pytest.mark.slow
def test_cache_is_real_files_and_reopens_identically_in_a_fresh_process(
    tiny_root: Path, tmp_path: Path
) -> None:
    index = folder_index(tiny_root)
    caches = []
    for split, train in ((index.val, False), (index.train, True)):
        loader = make_loader(split, tmp_path, train)
        loader.close()
        cache = loader.cache
        assert cache.built and cache.path.parent == tmp_path
        assert cache.path.name.startswith(f"{split.name}-{'fit48' if train else 'crop32'}-")
        images_file = Path(cache.data.images.filename)
        assert images_file.is_relative_to(cache.path)  # a real file, not /dev/shm
        per_image = 48 * 48 * 3 if train else 3 * SIZE * SIZE
        assert images_file.stat().st_size == len(split) * per_image
        assert (cache.path / COMPLETE_FILE).is_file()
        assert not list(tmp_path.glob(".*.tmp-*"))
        assert cache.data.labels.tolist() == list(split.labels)
        caches.append(cache)

        # A second loader finds the cache and builds nothing.
        again = make_loader(split, tmp_path, train)
        again.close()
        assert not again.cache.built and again.cache.path == cache.path

    paths = [str(cache.path) for cache in caches]
    out = subprocess.run(
        [sys.executable, "-c", REOPEN, *paths], capture_output=True, text=True, check=True, cwd=REPO
    )
    assert out.stdout.split() == [digest(cache.data) for cache in caches]


def test_val_images_are_bit_identical_to_the_torchvision_val_pipeline(
    tiny_root: Path, tmp_path: Path
) -> None:
    index = folder_index(tiny_root)
    loader = make_loader(index.val, tmp_path, train=False)
    try:
        batches = list(loader)
        assert len(batches) == len(loader) == 3  # 12 images, batches of 5, the last short
        images = torch.cat([b.images for b in batches])
        labels = torch.cat([b.labels for b in batches])
        reference = torch.stack([pil_val_transform(SIZE)(load_rgb(p)) for p in index.val.paths])
        # Exactly equal: max |difference| = 0 on every pixel of every image.
        assert images.dtype == torch.uint8 and images.shape == (12, 3, SIZE, SIZE)
        assert torch.equal(images, reference)
        assert labels.tolist() == list(index.val.labels)
        assert torch.equal(loader.cache.data.images, reference)
    finally:
        loader.close()


def test_train_images_are_stored_whole_with_aspect_kept(tiny_root: Path, tmp_path: Path) -> None:
    index = folder_index(tiny_root)
    loader = make_loader(index.train, tmp_path, train=True)
    loader.close()
    data = loader.cache.data
    assert data.images.shape == (len(index.train), 48, 48, 3)
    for i, path in enumerate(index.train.paths[:6]):
        original = load_rgb(path)
        w, h = fit_size(*original.size, 48)
        assert (data.heights[i].item(), data.widths[i].item()) == (h, w)
        assert max(h, w) == 48 and abs(w / h - original.width / original.height) < 0.05
        stored = data.images[i]
        assert torch.equal(stored[:h, :w], decode_fit(path, 48))
        # The whole image, shrunk: close to PIL's own resize of the full decode (the JPEG's
        # DCT-domain shrink and torch's kernel are other antialiasing filters than PIL's).
        pil = torch.from_numpy(np.array(original.resize((w, h), Image.Resampling.BILINEAR)))
        assert (stored[:h, :w].int() - pil.int()).abs().float().mean() < 8
        # One replicated edge pixel, then zero padding.
        if w < 48:
            assert torch.equal(stored[:h, w], stored[:h, w - 1])
            assert not stored[:, w + 1 :].any()
        if h < 48:
            assert not stored[h + 1 :].any()


# Mean |difference| in grey levels that re-encoding at quality 90 adds, measured on the synthetic
# set (noisy textures and sharp edges, hard for JPEG) for val crops: 7.8 at 32 px (max 10.8),
# 5.0 at 64 px (max 6.8), 2.9 at 224 px (max 3.3). A wrong decode is off by tens.
JPEG_MEAN_ERROR = 10.0
JPEG_MEAN_ERROR_64 = 7.5  # per image (measured max 6.8)


def test_the_jpeg_store_round_trips_within_jpeg_error_at_a_fraction_of_the_bytes(
    tiny_root: Path, tmp_path: Path
) -> None:
    from loaderbench.imaging.decode import decode_cpu
    from loaderbench.loaders.memmap._cache import STORES
    from loaderbench.loaders.memmap._store_jpeg import JpegCache
    from loaderbench.loaders.memmap.build import decode_stored

    index = folder_index(tiny_root)
    for split, train in ((index.val, False), (index.train, True)):
        raw = make_loader(split, tmp_path, train=train, image_size=64)
        jpeg = make_loader(
            split, tmp_path, train=train, image_size=64, store="jpeg", val_store="jpeg"
        )
        raw.close(), jpeg.close()
        data = jpeg.cache.data
        assert isinstance(data, JpegCache) and data.batch_size == torch.Size([])
        for i, path in enumerate(split.paths):
            stored = decode_cpu(STORES["jpeg"].stored_bytes(data, i))
            direct = decode_stored(path, jpeg.policy)
            direct = direct if not train else direct.permute(2, 0, 1)
            assert stored.shape == direct.shape
            assert (int(data.heights[i]), int(data.widths[i])) == tuple(stored.shape[1:])
            assert (stored.int() - direct.int()).abs().float().mean() < JPEG_MEAN_ERROR_64
        # Train: a fraction of the raw canvas; val: of the raw crop.
        raw_bytes, jpeg_bytes = raw.stats()["bytes_per_image"], jpeg.stats()["bytes_per_image"]
        assert jpeg_bytes < 0.25 * raw_bytes
        assert jpeg.stats()["cache_store"] == "jpeg" and jpeg.cache.path != raw.cache.path


def test_val_stays_raw_unless_asked(tiny_root: Path, tmp_path: Path) -> None:
    index = folder_index(tiny_root)
    with make_loader(index.val, tmp_path, train=False, store="jpeg") as val:
        assert val.stats()["cache_store"] == "raw"
        images = torch.cat([b.images for b in val])
        reference = torch.stack([pil_val_transform(SIZE)(load_rgb(p)) for p in index.val.paths])
        assert torch.equal(images, reference)


def test_jpeg_train_batches_are_the_raw_ones_within_jpeg_error(
    tiny_root: Path, tmp_path: Path
) -> None:
    index = folder_index(tiny_root)
    batches = {}
    for store in ("raw", "jpeg"):
        with make_loader(index.train, tmp_path, train=True, store=store) as loader:
            loader.set_epoch(2)
            batches[store] = torch.cat([b.images for b in loader])
    assert batches["raw"].shape == batches["jpeg"].shape == (20, 3, SIZE, SIZE)
    diff = (batches["raw"].int() - batches["jpeg"].int()).abs().float().mean()
    assert diff < JPEG_MEAN_ERROR  # the same crops and flips, from re-encoded pixels


def test_a_changed_dataset_or_setting_gets_a_new_cache(tiny_root: Path, tmp_path: Path) -> None:
    root = copy_tree(tiny_root, tmp_path / "data")
    cache_dir = tmp_path / "cache"
    before = folder_index(root)
    first = make_loader(before.val, cache_dir, train=False)
    first.close()

    # Same files, other settings: other caches.
    policy = StorePolicy.for_split(False, SIZE, 1.5)
    assert cache_name(before.val, StorePolicy.for_split(False, 40, 1.5)) != first.cache.path.name
    train_policy = StorePolicy.for_split(True, SIZE, 1.5)
    assert cache_name(before.train, train_policy) != cache_name(
        before.train, StorePolicy.for_split(True, SIZE, 2.0)
    )
    assert cache_name(before.val, policy) == first.cache.path.name

    # Replace one image by another class's image: new size and mtime, so a new cache.
    victim, donor = before.val.paths[0], before.val.paths[-1]
    shutil.copyfile(donor, victim)
    os.utime(victim, ns=(time.time_ns(), time.time_ns() + 10**9))
    after = folder_index(root)
    second = make_loader(after.val, cache_dir, train=False)
    try:
        assert second.cache.built and second.cache.path != first.cache.path
        images = torch.cat([b.images for b in second])
        assert torch.equal(images[0], pil_val_transform(SIZE)(load_rgb(victim)))
        assert torch.equal(images[0], images[-1])
    finally:
        second.close()


def test_unreadable_files_are_skipped_recorded_and_counted(tiny_root: Path, tmp_path: Path) -> None:
    root = copy_tree(tiny_root, tmp_path / "data")
    index = folder_index(root)
    broken = index.val.paths[3]
    Path(broken).write_bytes(b"not a jpeg at all")
    index = folder_index(root)

    loader = make_loader(index.val, tmp_path / "cache", train=False)
    try:
        meta = json.loads((loader.cache.path / "cache.json").read_text())
        assert [item["path"] for item in meta["skipped"]] == [broken]
        assert loader.stats()["skipped_files"] == 0  # counted when an epoch meets it
        labels = torch.cat([b.labels for b in loader])
        expected = [lab for i, lab in enumerate(index.val.labels) if i != 3]
        assert labels.tolist() == expected
        assert loader.stats()["skipped_files"] == 1 and loader.skipped_indices() == {3}
    finally:
        loader.close()

    before = set(multiprocessing.active_children())
    with pytest.raises(OSError, match="not a jpeg|cannot read image|unreadable") as error:
        make_loader(index.val, tmp_path / "other", train=False, on_error="raise")
    assert broken in str(error.value)
    # Its two build workers are gone, though the traceback in `error` still holds their loader.
    assert not set(multiprocessing.active_children()) - before
    # The failed build left nothing behind that could be taken for a cache.
    locks = (".lock", ".inuse", ".lockkind")
    assert not [p for p in (tmp_path / "other").iterdir() if not p.name.endswith(locks)]
    # A cache built with skips is refused under on_error=raise, naming the file.
    with pytest.raises(OSError, match=broken):
        make_loader(index.val, tmp_path / "cache", train=False, on_error="raise")


def test_an_incomplete_cache_folder_is_never_read(tiny_root: Path, tmp_path: Path) -> None:
    index = folder_index(tiny_root)
    policy = StorePolicy.for_split(False, SIZE, 1.5)
    built = ensure_cache(
        index.val, policy, tmp_path, num_workers=0, skip_errors=True, progress=False
    )
    (built.path / COMPLETE_FILE).unlink()
    with pytest.raises(CacheError, match=built.path.name):
        open_cache(built.path, policy)
    rebuilt = ensure_cache(
        index.val, policy, tmp_path, num_workers=0, skip_errors=True, progress=False
    )
    assert rebuilt.built and is_bitwise_equal(rebuilt.data, built.data)


def test_a_full_disk_is_refused_up_front_naming_the_folder(
    tiny_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    index = folder_index(tiny_root)
    usage = shutil.disk_usage(tmp_path)
    monkeypatch.setattr(shutil, "disk_usage", lambda _: usage._replace(free=1000))
    with pytest.raises(CacheError, match=r"needs 0\.0 GB but .* has 0\.0 GB free") as error:
        make_loader(index.val, tmp_path / "cache", train=False)
    assert str(tmp_path / "cache") in str(error.value)
    assert "or loader.store=jpeg (about" in str(error.value)  # what would fit instead


def is_bitwise_equal(a: ImageCache, b: ImageCache) -> bool:
    return digest(a) == digest(b)


KILLED_BUILD = """
import sys, time
from pathlib import Path
from omegaconf import OmegaConf
import loaderbench.imaging.stored as stored
import loaderbench.loaders.memmap.build as mb
import loaderbench.loaders.memmap._cache as mc
from loaderbench.config.schema import DatasetConfig
from loaderbench.data.discovery import discover

root, cache_dir, halfway, codec = sys.argv[1:5]
cfg = OmegaConf.structured(DatasetConfig(index_dir=None))
cfg.name, cfg.root = "folder", root
split = discover(cfg).val
real, count = stored.decode_crop, [0]

def slow(path, size):
    count[0] += 1
    if count[0] == 6:  # halfway through: the files exist and are half written
        Path(halfway).touch()
        time.sleep(600)
    return real(path, size)

stored.decode_crop = slow
mc.ensure_cache(split, mb.StorePolicy.for_split(False, 32, 1.5, codec=codec), Path(cache_dir),
                num_workers=0, skip_errors=True, progress=False)
print("finished")
"""


@pytest.mark.slow
@pytest.mark.parametrize("codec", ["raw", "jpeg"])
def test_a_killed_build_is_not_used_and_the_next_run_rebuilds(
    tiny_root: Path, tmp_path: Path, codec: str
) -> None:
    cache_dir, halfway = tmp_path / "cache", tmp_path / "halfway"
    script = [KILLED_BUILD, str(tiny_root), str(cache_dir), str(halfway), codec]
    proc = subprocess.Popen(
        [sys.executable, "-c", *script],
        cwd=REPO,
        start_new_session=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 120
        while not halfway.exists():
            assert proc.poll() is None, proc.communicate()[1].decode()[-3000:]
            assert time.monotonic() < deadline, "the build never got halfway"
            time.sleep(0.05)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert proc.returncode == -signal.SIGKILL

    index = folder_index(tiny_root)
    policy = StorePolicy.for_split(False, SIZE, 1.5, codec=codec)
    name = cache_name(index.val, policy)
    assert not (cache_dir / name).exists()
    (partial,) = cache_dir.glob(f".{name}.tmp-*")
    half_written = "jpeg-bytes.tmp" if codec == "jpeg" else "_tensordict/images.memmap"
    assert (partial / half_written).is_file()
    assert not (partial / COMPLETE_FILE).exists()
    with FileLock(cache_dir / f".{name}.lock"):  # the OS released the dead builder's lock
        pass

    loader = make_loader(index.val, cache_dir, train=False, val_store=codec)
    try:
        assert loader.cache.built and loader.cache.path == cache_dir / name
        assert not partial.exists()
        images = torch.cat([b.images for b in loader])
        reference = torch.stack([pil_val_transform(SIZE)(load_rgb(p)) for p in index.val.paths])
        if codec == "raw":
            assert torch.equal(images, reference)
        else:  # JPEG at quality 90 of the same pixels
            assert (images.int() - reference.int()).abs().float().mean() < JPEG_MEAN_ERROR
    finally:
        loader.close()


RACING_BUILD = """
import sys, time
from pathlib import Path
from omegaconf import OmegaConf
import loaderbench.imaging.stored as stored
import loaderbench.loaders.memmap.build as mb
import loaderbench.loaders.memmap._cache as mc
from loaderbench.config.schema import DatasetConfig
from loaderbench.data.discovery import discover

root, cache_dir, go = sys.argv[1:4]
cfg = OmegaConf.structured(DatasetConfig(index_dir=None))
cfg.name, cfg.root = "folder", root
split = discover(cfg).train
real = stored.decode_fit

def slow(path, long_side):
    time.sleep(0.02)
    return real(path, long_side)

stored.decode_fit = slow
while not Path(go).exists():
    time.sleep(0.005)
cache = mc.ensure_cache(split, mb.StorePolicy.for_split(True, 32, 1.5), Path(cache_dir),
                        num_workers=0, skip_errors=True, progress=False)
print(cache.built, cache.path)
"""


@pytest.mark.slow
def test_two_runs_starting_at_once_build_the_cache_once(tiny_root: Path, tmp_path: Path) -> None:
    cache_dir, go = tmp_path / "cache", tmp_path / "go"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", RACING_BUILD, str(tiny_root), str(cache_dir), str(go)],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    time.sleep(0.5)
    go.touch()
    outputs = [proc.communicate(timeout=300) for proc in procs]
    for proc, (_, err) in zip(procs, outputs, strict=True):
        assert proc.returncode == 0, err[-3000:]
    results = [out.split() for out, _ in outputs]
    assert sorted(built for built, _ in results) == ["False", "True"]
    assert results[0][1] == results[1][1]
    assert len([p for p in cache_dir.iterdir() if not p.name.startswith(".")]) == 1
