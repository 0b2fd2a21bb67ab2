"""Memmap's raw train crops on CUDA: the whole batch cut and resized in a few kernels
(``crop_resize_flip_sampled``), checked here on CPU tensors against the per-image path the CPU
run keeps (``crop_resize_flip_batch``, PIL's antialiased triangle filter).

The tolerances are the antialias difference, measured: roi_align averages ceil(box / size)
bilinear samples per output pixel and axis where the CPU path weighs every covered pixel, and
at a box's inner edge it reads the neighbouring stored pixel where the CPU path repeats the
box's edge. On smooth rows: upscaled whole images within 1 grey level everywhere (the stored
row repeats the image's edge, ``write_fit``); upscaled inner boxes within 1 level but at
their 2-pixel rim; shrunk boxes (3x at 24 px) within 2 levels on average.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from loaderbench.loaders.memmap.store_raw import write_fit
from loaderbench.transforms import crop_resize_flip_batch, crop_resize_flip_sampled, seeded_crops
from tests.conftest import folder_index
from tests.test_memmap import SIZE, make_loader

UPSCALED_MAX_DIFF = 1  # grey levels: bilinear at the same sample points, rounded apart
SHRUNK_MEAN_DIFF = 2.0  # grey levels on average, smooth rows shrunk up to ~3x


def stored_rows(n: int, height: int, width: int, side: int, seed: int = 0) -> torch.Tensor:
    """(n, 3, side, side) channels-last uint8 rows, each a smooth (height, width) image at the
    top left with its edge repeated once, as the raw store writes them."""
    generator = torch.Generator().manual_seed(seed)
    coarse = torch.rand(n, 3, height // 6, width // 6, generator=generator) * 255
    images = torch.nn.functional.interpolate(coarse, size=(height, width), mode="bilinear")
    rows = torch.zeros(n, side, side, 3, dtype=torch.uint8)
    for row, image in zip(rows, images.round().to(torch.uint8), strict=True):
        write_fit(row, image.permute(1, 2, 0))
    return rows.permute(0, 3, 1, 2)


def test_the_batched_crop_is_the_per_image_crop_within_the_antialias_difference() -> None:
    rows = stored_rows(16, 90, 120, 130)
    boxes, flips = seeded_crops([90] * 16, [120] * 16, 0, 0, range(16))
    flips[:4] = torch.tensor([True, False, True, False])  # both ways, whatever the seed drew
    for size in (24, 64):  # boxes average ~68 px: shrunk ~3x, then ~1x
        sampled = crop_resize_flip_sampled(rows, boxes, size, flips)
        reference = crop_resize_flip_batch(rows, boxes, size, flips)
        assert sampled.shape == (16, 3, size, size) and sampled.dtype == torch.uint8
        assert (sampled.int() - reference.int()).abs().float().mean() < SHRUNK_MEAN_DIFF
    whole = torch.tensor([[0, 0, 90, 120]] * 16)
    sampled = crop_resize_flip_sampled(rows, whole, 200, flips)
    reference = crop_resize_flip_batch(rows, whole, 200, flips)
    assert (sampled.int() - reference.int()).abs().max() <= UPSCALED_MAX_DIFF
    inner = torch.tensor([[10, 20, 40, 50]] * 16)
    diff = crop_resize_flip_sampled(rows, inner, 100, flips).int()
    diff = (diff - crop_resize_flip_batch(rows, inner, 100, flips).int()).abs()
    assert diff[..., 2:-2, 2:-2].max() <= UPSCALED_MAX_DIFF  # the rim: the box's neighbours


def test_the_batched_crop_flips_the_right_way_and_steps_alike() -> None:
    """A flipped image is its unflipped crop mirrored, to the bit; the float rows converted a
    few at a time (bounded memory) give the one-step pixels; ``out`` is written."""
    rows = stored_rows(10, 60, 80, 84, seed=1)
    boxes, _ = seeded_crops([60] * 10, [80] * 10, 0, 3, range(10))
    flips = torch.tensor([True, False] * 5)
    flipped = crop_resize_flip_sampled(rows, boxes, 32, flips)
    plain = crop_resize_flip_sampled(rows, boxes, 32)
    assert torch.equal(flipped[::2], plain[::2].flip(-1))
    assert torch.equal(flipped[1::2], plain[1::2]) and not torch.equal(flipped[::2], plain[::2])
    # Mirrored towards the reference's mirror, not away from it.
    reference = crop_resize_flip_batch(rows, boxes, 32, flips).int()
    flipped_off = (flipped.int() - reference).abs().float().mean()
    assert flipped_off < (plain.int() - reference).abs().float().mean()
    out = torch.zeros(10, 3, 32, 32, dtype=torch.uint8)
    row_bytes = rows[0].numel() * 4
    assert crop_resize_flip_sampled(rows, boxes, 32, flips, out, chunk_bytes=3 * row_bytes) is out
    assert torch.equal(out, flipped)


class _OpCounter(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        self.ops += 1
        return func(*args, **(kwargs or {}))


def ops_for(crop, n: int) -> int:  # type: ignore[no-untyped-def]
    rows = stored_rows(n, 60, 80, 84)
    boxes, flips = seeded_crops([60] * n, [80] * n, 0, 0, range(n))
    crop(rows, boxes, 32, flips)  # a first call's one-off work (torchvision's ops loading)
    with _OpCounter() as counter:
        crop(rows, boxes, 32, flips)
    return counter.ops


def test_the_batched_crop_launches_the_same_few_ops_for_any_batch_size() -> None:
    """The per-image path's operator count grows with the batch (each a kernel on CUDA:
    ~2,000 a batch of 256); the batched one's does not."""
    small, large = ops_for(crop_resize_flip_sampled, 4), ops_for(crop_resize_flip_sampled, 64)
    assert small == large and large <= 30
    assert ops_for(crop_resize_flip_batch, 64) > 4 * ops_for(crop_resize_flip_batch, 4) > large


def test_the_batched_crop_of_the_loaders_own_rows_is_its_batches_within_tolerance(
    tiny_root: Path, tmp_path: Path
) -> None:
    """What the CUDA loader computes, on the CPU: its stored rows, its boxes and flips, cut in
    one batch, against the CPU loader's batches (tests/test_gpu.py holds the CUDA loader to
    these figures)."""
    loader = make_loader(folder_index(tiny_root).train, tmp_path, train=True, batch_size=8)
    try:
        rows = loader.cache.data.images.as_subclass(torch.Tensor).permute(0, 3, 1, 2)
        for batch, indices in zip(loader, loader.spec.epoch_batches(0), strict=True):
            boxes, flips = loader._train_boxes(0, indices)
            sampled = crop_resize_flip_sampled(rows[indices], boxes, SIZE, flips)
            assert (sampled.int() - batch.images.int()).abs().float().mean() < SHRUNK_MEAN_DIFF
    finally:
        loader.close()
