"""The memmap loader reading and augmenting from its cache, on real JPEG files and real
memory-mapped files on disk: train epochs, crops and flips to the pixel, the deferred (device)
paths, held buffers and reader threads; and train.py with loader=memmap. The cache itself
(what it stores, rebuilds, a killed or racing build): tests/test_memmap_cache.py."""

from __future__ import annotations

import gc
import threading
from pathlib import Path

import pytest
import torch

from loaderbench.data.discovery import Split
from loaderbench.imaging import batch_resize
from loaderbench.imaging.transforms import (
    crop_resize_flip_batch,
    crop_resize_flip_rows,
    resize_uint8,
    resized_crop_images,
    seeded_crops,
)
from loaderbench.loaders import build_loader
from loaderbench.loaders.memmap.loader import MemmapLoader, store_batches
from tests.conftest import cpu_spec, folder_index, read_metrics, run_dirs, single_run
from tests.in_process import run_here

SIZE = 32  # model input size in these tests; train images are stored with a long side of 48


def make_loader(split: Split, cache_dir: Path, train: bool, **kwargs: object) -> MemmapLoader:
    # train_store_min_side=0: the store is exactly image_size * train_store_ratio here.
    fields: dict = {"cache_dir": str(cache_dir), "image_size": SIZE, "num_workers": 2}
    fields["train_store_min_side"] = 0
    fields.update(kwargs)
    loader = build_loader(cpu_spec(split, train, loader="memmap", **fields))
    assert isinstance(loader, MemmapLoader)
    return loader


def reader_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("memmap-loader")]


# ---------------------------------------------------------------------------------------------
# Reading and augmenting.


def test_train_epochs_drop_last_reshuffle_and_replay_from_the_seed(
    tiny_root: Path, tmp_path: Path
) -> None:
    index = folder_index(tiny_root)
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
    index = folder_index(tiny_root)
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
    # The batch loops run in TorchScript here (no GIL); in Python where it cannot compile, with
    # the same pixels.
    assert batch_resize.scripted_available()
    index, mirror = torch.tensor(indices), flips.clone()
    for scripted in (True, False):
        out.zero_()
        batch_resize.resize_rows_into(rows, index, boxes, mirror, out, scripted=scripted)
        assert torch.equal(out, expected)
        out.zero_()
        batch_resize.resize_images_into(planar, boxes, mirror, out, scripted=scripted)
        assert torch.equal(out, expected)


def test_a_raw_train_batch_is_each_stored_images_reference_crop(
    tiny_root: Path, tmp_path: Path
) -> None:
    """The loader's batches (boxes cut from the memory map in the reading threads) against
    the reference crop of each stored row, with the boxes and flips drawn for the image."""
    index = folder_index(tiny_root)
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


def assert_same_batches(first: MemmapLoader, second: MemmapLoader, max_diff: int = 0) -> None:
    """Both loaders' epochs are the same batches, to the pixel (or within ``max_diff`` grey
    levels, and to the pixel nearly everywhere); both closed after."""
    try:
        for a, b in zip(first, second, strict=True):
            assert torch.equal(a.labels, b.labels)
            diff = (a.images.int() - b.images.int()).abs()
            assert diff.max() <= max_diff and diff.float().mean() < 0.05
    finally:
        first.close()
        second.close()


def test_the_deferred_crop_path_gets_the_same_boxes_and_flips(
    tiny_root: Path, tmp_path: Path
) -> None:
    """On CUDA the crop is deferred until the batch is on the device. Forced here on the CPU,
    where the same batched resize runs (``device_resize``), that path must give the reading
    threads' batches within the 1 grey level its float weights round apart."""
    index = folder_index(tiny_root)
    in_threads = make_loader(index.train, tmp_path, train=True)
    deferred = make_loader(index.train, tmp_path, train=True)
    deferred.batches = store_batches(
        deferred.cache, deferred.parts, deferred.policy, on_device=True
    )
    assert_same_batches(in_threads, deferred, max_diff=1)


@pytest.mark.parametrize("train", [False, True])
def test_the_jpeg_store_decoded_as_one_batch_gives_the_threads_batches(
    tiny_root: Path, tmp_path: Path, train: bool
) -> None:
    """On CUDA a jpeg batch is decoded by one batched call where it goes (nvJPEG). Forced here
    on the CPU, where the same batched call runs libjpeg-turbo, that path must give exactly the
    reading threads' batches."""
    index = folder_index(tiny_root)
    split = index.train if train else index.val
    stores = {"store": "jpeg", "val_store": "jpeg"}
    in_threads = make_loader(split, tmp_path, train=train, **stores)
    batched = make_loader(split, tmp_path, train=train, **stores)
    batched.batches = store_batches(batched.cache, batched.parts, batched.policy, on_device=True)
    assert_same_batches(in_threads, batched)


def test_held_batches_are_never_overwritten(tiny_root: Path, tmp_path: Path) -> None:
    """Output buffers are reused, but only once nothing refers to them."""
    index = folder_index(tiny_root)
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


def test_the_reading_threads_serve_the_whole_run_and_none_outlives_close(
    tiny_root: Path, tmp_path: Path
) -> None:
    """One pool of reading threads for the run: the same threads read every epoch, an
    abandoned iterator leaves no batch being read, and ``close`` ends them."""
    index = folder_index(tiny_root)
    loader = make_loader(index.train, tmp_path, train=True, num_workers=2, batch_size=2)
    iterator = iter(loader)
    next(iterator)
    assert reader_threads()
    loader.close()
    assert not reader_threads()

    for epoch in range(2):
        loader.set_epoch(epoch)
        for _ in loader:
            pass
        if epoch == 0:
            first = set(reader_threads())
    assert set(reader_threads()) == first and 1 <= len(first) <= 2
    iterator = iter(loader)
    next(iterator)
    del iterator
    gc.collect()
    assert set(reader_threads()) == first  # idle, kept for the next epoch
    loader.close()
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
    run_here("train.py", *quick, "epochs=1", "model.name=test_resnet", cwd=tmp_path)
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
    run_here("train.py", *quick, "model=none", "bench.epochs=2", cwd=tmp_path)
    dirs = run_dirs(tmp_path, "train")
    assert len(dirs) == 2
    metrics = read_metrics(dirs[-1])
    assert metrics["status"] == "ok" and metrics["loader_train_cache_built"] is False
    assert 0 < metrics["ttfb_s"] <= metrics["wall_s"] and metrics["images"] == 2 * 24
    # The very folders of the first run, neither rebuilt nor joined by another.
    assert cache_folders() == caches


def served(loader: MemmapLoader) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(batch.images.clone(), batch.labels.clone()) for batch in loader]


def test_batches_read_ahead_into_the_next_epoch_are_that_epochs_and_only_served_there(
    tiny_root: Path, tmp_path: Path
) -> None:
    """With ``next_epoch`` the reading threads go on into the next epoch's first batches (and
    ``queued_at_start`` says so); that epoch, from its start, serves exactly what a loader
    that never reads ahead serves; a resumed epoch (another start) or another epoch drops
    them and serves its own."""
    index = folder_index(tiny_root)
    options = {"train": True, "num_workers": 2, "batch_size": 2, "prefetch": 3}
    plain = make_loader(index.train, tmp_path, **options)
    ahead = make_loader(index.train, tmp_path, **options)
    try:
        expected = {}
        for epoch, start in ((1, 0), (2, 0), (2, 1), (3, 0)):
            plain.set_epoch(epoch, start)
            expected[epoch, start] = served(plain)
        ahead.set_epoch(0, next_epoch=True)
        served(ahead)
        assert ahead.queued_at_start() == 0  # still epoch 0's
        ahead.set_epoch(1, next_epoch=True)
        assert ahead.queued_at_start() == 3
        got = served(ahead)
        ahead.set_epoch(2, 1)  # epoch 2 read ahead from its start, asked from batch 1
        assert ahead.queued_at_start() == 0
        for (image, label), (want_image, want_label) in zip(
            [*got, *served(ahead)], [*expected[1, 0], *expected[2, 1]], strict=True
        ):
            assert torch.equal(image, want_image) and torch.equal(label, want_label)
        ahead.set_epoch(3, next_epoch=False)  # nothing read ahead for it: served as ever
        third = served(ahead)
        assert len(third) == len(expected[3, 0])
        assert all(torch.equal(a[0], b[0]) for a, b in zip(third, expected[3, 0], strict=True))
    finally:
        plain.close()
        ahead.close()


def test_a_stored_jpeg_that_does_not_decode_is_named_with_its_source_file(
    tiny_root: Path, tmp_path: Path
) -> None:
    """The build admitted and encoded every stored JPEG, so one that fails now is a damaged
    cache: the error names the cache, the stored image and the file it came from."""
    index = folder_index(tiny_root)
    loader = make_loader(index.train, tmp_path, train=True, store="jpeg", num_workers=0)
    try:
        decoded = [torch.zeros(3, 4, 4, dtype=torch.uint8), OSError("broken data")]
        with pytest.raises(OSError) as raised:
            loader.batches.whole(decoded, torch.tensor([0, 5]))
        message = str(raised.value)
        assert str(loader.cache.path) in message and "stored image 5" in message
        assert index.train.paths[5] in message and "broken data" in message
    finally:
        loader.close()
