"""The memmap loader and its cache, on real JPEG files, real memory-mapped files on disk and real
subprocesses (a reopen in a fresh process, a SIGKILLed build, two builders at once, train.py)."""

from __future__ import annotations

import gc
import hashlib
import json
import multiprocessing
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf
from PIL import Image

from loaderbench.config import DatasetConfig
from loaderbench.data import DatasetIndex, Split, discover
from loaderbench.images import load_rgb
from loaderbench.loaders import build_loader
from loaderbench.loaders.memmap.build import CacheError, StorePolicy, decode_fit, fit_size
from loaderbench.loaders.memmap.cache import COMPLETE_FILE, cache_name, ensure_cache, open_cache
from loaderbench.loaders.memmap.loader import MemmapLoader
from loaderbench.loaders.memmap.store_raw import ImageCache
from loaderbench.locking import FileLock
from loaderbench.transforms import (
    crop_resize_flip_batch,
    crop_resize_flip_rows,
    pil_val_transform,
    resize_uint8,
    resized_crop_images,
    seeded_crops,
)
from tests.conftest import REPO, cpu_spec, read_metrics, run_dirs, run_entry, single_run

SIZE = 32  # model input size in these tests; train images are stored with a long side of 48


def index_of(root: Path) -> DatasetIndex:
    cfg = OmegaConf.structured(DatasetConfig(index_dir=None))
    cfg.name, cfg.root = "folder", str(root)
    return discover(cfg)


def make_loader(split: Split, cache_dir: Path, train: bool, **kwargs: object) -> MemmapLoader:
    # train_store_min_side=0: the store is exactly image_size * train_store_ratio here.
    fields: dict = {"cache_dir": str(cache_dir), "image_size": SIZE, "num_workers": 2}
    fields["train_store_min_side"] = 0
    fields.update(kwargs)
    loader = build_loader(cpu_spec(split, train, loader="memmap", **fields))
    assert isinstance(loader, MemmapLoader)
    return loader


def digest(cache: ImageCache) -> str:
    """A hash of every field's bytes."""
    h = hashlib.sha256()
    for field in ("images", "labels", "heights", "widths"):
        h.update(getattr(cache, field).contiguous().numpy().tobytes())
    return h.hexdigest()


def copy_tree(root: Path, dest: Path) -> Path:
    shutil.copytree(root, dest)
    return dest


def reader_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("memmap-loader")]


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
    index = index_of(tiny_root)
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
    index = index_of(tiny_root)
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
    index = index_of(tiny_root)
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
    from loaderbench.decode import decode_cpu
    from loaderbench.loaders.memmap.build import decode_stored
    from loaderbench.loaders.memmap.cache import STORES
    from loaderbench.loaders.memmap.store_jpeg import JpegCache

    index = index_of(tiny_root)
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
    index = index_of(tiny_root)
    with make_loader(index.val, tmp_path, train=False, store="jpeg") as val:
        assert val.stats()["cache_store"] == "raw"
        images = torch.cat([b.images for b in val])
        reference = torch.stack([pil_val_transform(SIZE)(load_rgb(p)) for p in index.val.paths])
        assert torch.equal(images, reference)


def test_jpeg_train_batches_are_the_raw_ones_within_jpeg_error(
    tiny_root: Path, tmp_path: Path
) -> None:
    index = index_of(tiny_root)
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
    before = index_of(root)
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
    after = index_of(root)
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
    index = index_of(root)
    broken = index.val.paths[3]
    Path(broken).write_bytes(b"not a jpeg at all")
    index = index_of(root)

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
    assert not [
        p for p in (tmp_path / "other").iterdir() if not p.name.endswith((".lock", ".inuse"))
    ]
    # A cache built with skips is refused under on_error=raise, naming the file.
    with pytest.raises(OSError, match=broken):
        make_loader(index.val, tmp_path / "cache", train=False, on_error="raise")


def test_an_incomplete_cache_folder_is_never_read(tiny_root: Path, tmp_path: Path) -> None:
    index = index_of(tiny_root)
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
    index = index_of(tiny_root)
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
import loaderbench.loaders.memmap.build as mb
import loaderbench.loaders.memmap.cache as mc
from loaderbench.config import DatasetConfig
from loaderbench.data import discover

root, cache_dir, halfway, codec = sys.argv[1:5]
cfg = OmegaConf.structured(DatasetConfig(index_dir=None))
cfg.name, cfg.root = "folder", root
split = discover(cfg).val
real, count = mb.decode_crop, [0]

def slow(path, size):
    count[0] += 1
    if count[0] == 6:  # halfway through: the files exist and are half written
        Path(halfway).touch()
        time.sleep(600)
    return real(path, size)

mb.decode_crop = slow
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

    index = index_of(tiny_root)
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
import loaderbench.loaders.memmap.build as mb
import loaderbench.loaders.memmap.cache as mc
from loaderbench.config import DatasetConfig
from loaderbench.data import discover

root, cache_dir, go = sys.argv[1:4]
cfg = OmegaConf.structured(DatasetConfig(index_dir=None))
cfg.name, cfg.root = "folder", root
split = discover(cfg).train
real = mb.decode_fit

def slow(path, long_side):
    time.sleep(0.02)
    return real(path, long_side)

mb.decode_fit = slow
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


# ---------------------------------------------------------------------------------------------
# Reading and augmenting.


def test_train_epochs_drop_last_reshuffle_and_replay_from_the_seed(
    tiny_root: Path, tmp_path: Path
) -> None:
    index = index_of(tiny_root)
    loader = make_loader(index.train, tmp_path, train=True)
    try:
        epochs = []
        for epoch in range(2):
            loader.set_epoch(epoch)
            batches = list(loader)
            assert len(batches) == len(loader) == 4  # 24 images, batches of 5, the rest dropped
            for batch in batches:
                assert batch.images.shape == (5, 3, SIZE, SIZE)
                assert batch.images.dtype == torch.uint8 and batch.labels.dtype == torch.int64
            epochs.append(batches)
        labels = [torch.cat([b.labels for b in batches]).tolist() for batches in epochs]
        assert labels[0] != labels[1]
        # The order is the one every loader shares.
        order = loader.spec.epoch_batches(1)
        assert labels[1] == [index.train.labels[i] for i in torch.cat(order).tolist()]

        # Same seed and epoch, in-process or in a new loader, any thread count: same pixels.
        loader.set_epoch(0)
        replay = list(loader)
        other = make_loader(index.train, tmp_path, train=True, num_workers=0)
        other.set_epoch(0)
        for a, b, c in zip(epochs[0], replay, list(other), strict=True):
            assert torch.equal(a.images, b.images) and torch.equal(a.images, c.images)
        other.close()
        seeded = make_loader(index.train, tmp_path, train=True, seed=1)
        assert not torch.equal(next(iter(seeded)).images, epochs[0][0].images)
        seeded.close()
    finally:
        loader.close()


def test_augmentation_boxes_differ_per_image_and_epoch_stay_in_stored_bounds(
    tiny_root: Path, tmp_path: Path
) -> None:
    index = index_of(tiny_root)
    loader = make_loader(index.train, tmp_path, train=True)
    loader.close()
    heights, widths = loader.cache.data.heights.long(), loader.cache.data.widths.long()
    indices = list(range(len(index.train)))
    boxes0, flips0 = loader.spec.random_crops(heights, widths, 0, indices)
    boxes1, _ = loader.spec.random_crops(heights, widths, 1, indices)
    again, flips_again = loader.spec.random_crops(heights, widths, 0, indices)

    assert torch.equal(boxes0, again) and torch.equal(flips0, flips_again)  # from the seed
    assert len({tuple(b) for b in boxes0.tolist()}) == len(indices)  # a box per image
    assert (boxes0 != boxes1).any(dim=1).float().mean() > 0.9  # and per epoch
    assert 0 < flips0.sum() < len(indices)
    for boxes in (boxes0, boxes1):
        top, left, h, w = boxes.unbind(1)
        assert (top >= 0).all() and (left >= 0).all() and (h >= 1).all() and (w >= 1).all()
        assert (top + h <= heights).all() and (left + w <= widths).all()
        area = (h * w).double() / (heights * widths).double()
        assert (area <= 1.0).all() and (area >= 0.08 * 0.8).all()  # rounding of tiny boxes


def roi_align_crops(
    images: torch.Tensor, boxes: torch.Tensor, size: int, flips: torch.Tensor
) -> torch.Tensor:
    """An independent implementation: torchvision's roi_align (area-averaging when shrinking)
    over the whole batch in float."""
    from torchvision.ops import roi_align

    top, left, h, w = boxes.float().unbind(1)
    rois = torch.stack([torch.arange(len(boxes)).float(), left, top, left + w, top + h], 1)
    out = roi_align(images.float(), rois, (size, size), 1.0, sampling_ratio=-1, aligned=True)
    out = torch.where(flips[:, None, None, None], out.flip(-1), out)
    return out.round().clamp(0, 255).to(torch.uint8)


def test_uint8_crop_agrees_with_roi_align_and_flips() -> None:
    generator = torch.Generator().manual_seed(0)
    smooth = torch.nn.functional.interpolate(
        torch.rand(4, 3, 12, 16, generator=generator) * 255, size=(48, 64), mode="bilinear"
    )
    images = smooth.round().to(torch.uint8).contiguous(memory_format=torch.channels_last)
    boxes = torch.tensor([[0, 0, 48, 64], [5, 7, 20, 30], [10, 0, 38, 40], [0, 20, 30, 30]])
    flips = torch.tensor([False, True, False, True])
    fast = crop_resize_flip_batch(images, boxes, 24, flips)
    reference = roi_align_crops(images, boxes, 24, flips)
    assert fast.shape == reference.shape == (4, 3, 24, 24) and fast.dtype == torch.uint8
    diff = (fast.int() - reference.int()).abs()
    assert diff.float().mean() < 2.0 and diff.max() <= 40
    unflipped = crop_resize_flip_batch(images, boxes, 24)
    assert torch.equal(fast[1], unflipped[1].flip(-1)) and torch.equal(fast[0], unflipped[0])


def reference_crops(
    rows: torch.Tensor, indices: list[int], boxes: torch.Tensor, size: int, flips: torch.Tensor
) -> torch.Tensor:
    """The per-image reference: each box copied out of its stored (H, W, C) row into a planar
    image of its own, ``resize_uint8`` into a new tensor, then ``flip``."""
    out = []
    for row, (top, left, h, w), flip in zip(indices, boxes.tolist(), flips.tolist(), strict=True):
        box = rows[row, top : top + h, left : left + w].permute(2, 0, 1).contiguous()
        resized = resize_uint8(box, (size, size))
        out.append(resized.flip(-1) if flip else resized)
    return torch.stack(out)


def smooth_rows(n: int, height: int, width: int, seed: int = 0) -> torch.Tensor:
    """(n, height, width, 3) uint8 rows of smooth noise: every resize weight matters."""
    generator = torch.Generator().manual_seed(seed)
    coarse = torch.rand(n, 3, height // 6, width // 6, generator=generator) * 255
    smooth = torch.nn.functional.interpolate(coarse, size=(height, width), mode="bilinear")
    return smooth.round().to(torch.uint8).permute(0, 2, 3, 1).contiguous()


def test_crops_resized_in_place_are_the_per_image_references_to_the_pixel() -> None:
    """Memmap's train path resizes each box straight from its stored row into the batch (a
    view, the kernel's out= call, a flipped box rather than a flipped output): the pixels of
    resizing a copy of the box into a new tensor and flipping that, exactly; for channels-last
    rows, channels-last batches and planar decoded images alike."""
    size, stored = 24, (60, 80)
    rows = smooth_rows(12, *stored)
    heights, widths = torch.full((12,), 60), torch.full((12,), 80)
    boxes, _ = seeded_crops(heights, widths, 0, 0, range(12))
    # Boxes on every edge, the whole image, one pixel, the output's own size, a thin strip.
    edges = [[0, 0, 60, 80], [0, 0, 10, 12], [50, 70, 10, 10], [59, 0, 1, 80], [0, 79, 60, 1]]
    boxes[:8] = torch.tensor([*edges, [20, 30, size, size], [7, 9, 1, 1], [0, 40, 60, 40]])
    flips = torch.tensor([True, False] * 6)
    indices = [11, 0, 5, 3, 2, 9, 1, 4, 6, 8, 7, 10]  # out of order, as an epoch's batch is
    expected = reference_crops(rows, indices, boxes, size, flips)
    from_rows = crop_resize_flip_rows(rows, indices, boxes, size, flips)
    batch = rows[indices].permute(0, 3, 1, 2)  # gathered rows: memmap's deferred (GPU) path
    planar = [rows[i].permute(2, 0, 1).contiguous() for i in indices]  # decoded images
    for fast in (
        from_rows,
        crop_resize_flip_batch(batch, boxes, size, flips),
        resized_crop_images(planar, boxes, size, flips),
    ):
        assert fast.shape == (12, 3, size, size) and fast.dtype == torch.uint8
        assert fast.is_contiguous(memory_format=torch.channels_last)
        assert torch.equal(fast, expected)
    # An out= batch is written, not replaced; unflipped boxes are the flipped ones mirrored.
    out = torch.zeros(12, size, size, 3, dtype=torch.uint8).permute(0, 3, 1, 2)
    assert crop_resize_flip_rows(rows, indices, boxes, size, flips, out) is out
    unflipped = crop_resize_flip_rows(rows, indices, boxes, size)
    assert torch.equal(unflipped[1::2], out[1::2])
    assert torch.equal(unflipped[::2].flip(-1), out[::2])
    assert not torch.equal(unflipped[::2], out[::2])


def test_a_raw_train_batch_is_each_stored_images_reference_crop(
    tiny_root: Path, tmp_path: Path
) -> None:
    """The loader's batches (boxes cut from the memory map in the reading threads) against
    the reference crop of each stored row, with the boxes and flips drawn for the image."""
    index = index_of(tiny_root)
    loader = make_loader(index.train, tmp_path, train=True, batch_size=7)
    try:
        loader.set_epoch(3)
        stored = loader.cache.data
        rows = stored.images.as_subclass(torch.Tensor)
        order = loader.spec.epoch_batches(3)
        flipped = 0
        for batch, indices in zip(loader, order, strict=True):
            boxes, flips = loader.spec.random_crops(
                stored.heights[indices], stored.widths[indices], 3, indices.tolist()
            )
            expected = reference_crops(rows, indices.tolist(), boxes, SIZE, flips)
            assert torch.equal(batch.images, expected)
            assert torch.equal(batch.labels, stored.labels[indices].long())
            flipped += int(flips.sum())
        assert 0 < flipped < len(index.train)
    finally:
        loader.close()


def assert_same_batches(first: MemmapLoader, second: MemmapLoader) -> None:
    """Both loaders' epochs are the same batches, to the pixel; both closed after."""
    try:
        for a, b in zip(first, second, strict=True):
            assert torch.equal(a.labels, b.labels) and torch.equal(a.images, b.images)
    finally:
        first.close()
        second.close()


def test_the_deferred_crop_path_gets_the_same_boxes_and_flips(
    tiny_root: Path, tmp_path: Path
) -> None:
    """On CUDA the crop is deferred until the batch is on the device. Forced here on the CPU,
    where the same kernel runs, that path must give exactly the reading threads' batches."""
    index = index_of(tiny_root)
    in_threads = make_loader(index.train, tmp_path, train=True)
    deferred = make_loader(index.train, tmp_path, train=True)
    deferred._crop_on_device = True
    assert_same_batches(in_threads, deferred)


@pytest.mark.parametrize("train", [False, True])
def test_the_jpeg_store_decoded_as_one_batch_gives_the_threads_batches(
    tiny_root: Path, tmp_path: Path, train: bool
) -> None:
    """On CUDA a jpeg batch is decoded by one batched call where it goes (nvJPEG). Forced here
    on the CPU, where the same batched call runs libjpeg-turbo, that path must give exactly the
    reading threads' batches."""
    index = index_of(tiny_root)
    split = index.train if train else index.val
    stores = {"store": "jpeg", "val_store": "jpeg"}
    in_threads = make_loader(split, tmp_path, train=train, **stores)
    batched = make_loader(split, tmp_path, train=train, **stores)
    batched._decode_on_device = True
    assert_same_batches(in_threads, batched)


def test_held_batches_are_never_overwritten(tiny_root: Path, tmp_path: Path) -> None:
    """Output buffers are reused, but only once nothing refers to them."""
    index = index_of(tiny_root)
    loader = make_loader(index.val, tmp_path, train=False, batch_size=2, prefetch=1)
    try:
        first = [b.images[:1] for b in loader]  # views keep their buffers busy
        copies = [view.clone() for view in first]
        for _ in range(3):
            for _ in loader:
                pass
        assert all(torch.equal(a, b) for a, b in zip(first, copies, strict=True))
    finally:
        loader.close()


def test_no_reader_thread_outlives_close_or_an_abandoned_iterator(
    tiny_root: Path, tmp_path: Path
) -> None:
    index = index_of(tiny_root)
    loader = make_loader(index.train, tmp_path, train=True, num_workers=2, batch_size=2)
    iterator = iter(loader)
    next(iterator)
    assert reader_threads()
    loader.close()
    assert not reader_threads()

    iterator = iter(loader)
    next(iterator)
    assert reader_threads()
    del iterator
    gc.collect()
    assert not reader_threads()
    loader.close()  # twice is fine


# ---------------------------------------------------------------------------------------------
# Through train.py.


@pytest.mark.slow
def test_train_py_trains_with_loader_memmap_then_reuses_the_cache(
    tiny_root: Path, tmp_path: Path
) -> None:
    quick = [
        f"dataset.root={tiny_root}",
        "loader=memmap",
        "logger=none",
        "device=cpu",
        "loader.batch_size=8",
        "loader.num_workers=1",
    ]
    run_entry("train.py", *quick, "epochs=1", "model.name=test_resnet", cwd=tmp_path)
    _, metrics = single_run(tmp_path, "train")
    assert metrics["status"] == "ok" and metrics["loader"] == "memmap"
    assert metrics["images"] == 24 // 8 * 8 and metrics["epochs"] == 1
    # top1 is a count of the 12 val images (top5: tests/test_loops.py, with 10 classes).
    assert metrics["val_size"] == 12
    assert metrics["top1"] * 12 == pytest.approx(round(metrics["top1"] * 12), abs=1e-9)
    assert metrics["skipped_files"] == 0 and metrics["loader_train_cache_built"] is True
    # 64 px: train rows are the 192 px store canvas (train_store_min_side), val rows the crop.
    assert metrics["loader_train_bytes_per_image"] == 192 * 192 * 3
    assert metrics["loader_val_bytes_per_image"] == 64 * 64 * 3
    assert metrics["loader_train_cache_gb"] == pytest.approx(24 * 192 * 192 * 3 / 1e9)

    def cache_folders() -> dict[str, int]:
        return {p.name: p.stat().st_ino for p in (tmp_path / "cache").glob("[!.]*") if p.is_dir()}

    caches = cache_folders()
    assert sorted(name.split("-")[0] for name in caches) == ["train", "val"]

    # The next run finds the cache and reads it as it is.
    run_entry("train.py", *quick, "model=none", "bench.epochs=2", cwd=tmp_path)
    dirs = run_dirs(tmp_path, "train")
    assert len(dirs) == 2
    metrics = read_metrics(dirs[-1])
    assert metrics["status"] == "ok" and metrics["loader_train_cache_built"] is False
    assert 0 < metrics["ttfb_s"] <= metrics["wall_s"] and metrics["images"] == 2 * 24
    # The very folders of the first run, neither rebuilt nor joined by another.
    assert cache_folders() == caches
