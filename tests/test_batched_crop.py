"""Memmap's raw train crops on CUDA: the whole batch cut and resized in a few kernels
(``device_resize.resize_boxes``), checked here on CPU tensors against the per-image path the
CPU run keeps (``crop_resize_flip_batch``, torch's uint8 antialiased kernel): the same filter,
so within 1 grey level on textured rows (the kernel's fixed-point weights), and its operator
count does not grow with the batch."""

from __future__ import annotations

from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from loaderbench.imaging.device_resize import resize_boxes
from loaderbench.imaging.transforms import crop_resize_flip_batch, seeded_crops
from loaderbench.loaders.memmap.store_raw import write_fit
from tests.conftest import folder_index
from tests.test_memmap import SIZE, make_loader

MAX_DIFF = 1  # grey levels: the CPU kernel's 16-bit weights round a few pixels apart
MEAN_DIFF = 0.05  # measured: 0.004-0.04 (the most where a box is enlarged 2.5x)


def stored_rows(n: int, height: int, width: int, side: int, seed: int = 0) -> torch.Tensor:
    """(n, 3, side, side) channels-last uint8 rows, each a textured (noise) (height, width)
    image at the top left with its edge repeated once, as the raw store writes them."""
    generator = torch.Generator().manual_seed(seed)
    images = torch.randint(0, 256, (n, height, width, 3), dtype=torch.uint8, generator=generator)
    rows = torch.zeros(n, side, side, 3, dtype=torch.uint8)
    for row, image in zip(rows, images, strict=True):
        write_fit(row, image)
    return rows.permute(0, 3, 1, 2)


def assert_close(mine: torch.Tensor, reference: torch.Tensor) -> None:
    diff = (mine.int() - reference.int()).abs()
    assert diff.max() <= MAX_DIFF and diff.float().mean() < MEAN_DIFF, diff.float().mean()


def test_the_batched_crop_is_the_per_image_crop_on_textured_rows() -> None:
    rows = stored_rows(16, 90, 120, 130)
    boxes, flips = seeded_crops([90] * 16, [120] * 16, 0, 0, range(16))
    flips[:4] = torch.tensor([True, False, True, False])  # both ways, whatever the seed drew
    for size in (24, 64, 200):  # boxes average ~68 px: shrunk ~3x, ~1x, enlarged ~3x
        reference = crop_resize_flip_batch(rows, boxes, size, flips)
        assert_close(resize_boxes(rows, boxes, size, flips), reference)
    # Boxes inside the stored image: the box's own edge repeated, never its neighbours.
    inner = torch.tensor([[10, 20, 40, 50]] * 16)
    assert_close(
        resize_boxes(rows, inner, 100, flips), crop_resize_flip_batch(rows, inner, 100, flips)
    )


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
    crop(rows, boxes, 32, flips)
    with _OpCounter() as counter:
        crop(rows, boxes, 32, flips)
    return counter.ops


def test_the_batched_crop_launches_the_same_few_ops_for_any_batch_size() -> None:
    """The per-image path's operator count grows with the batch (each a kernel on CUDA:
    ~2,000 a batch of 256); the batched one's does not."""
    small, large = ops_for(resize_boxes, 4), ops_for(resize_boxes, 64)
    assert small == large and large <= 160  # ~5 us of CPU each: 0.7 ms a batch
    assert ops_for(crop_resize_flip_batch, 64) > 4 * ops_for(crop_resize_flip_batch, 4)


def test_the_batched_crop_of_the_loaders_own_rows_is_its_batches(
    tiny_root: Path, tmp_path: Path
) -> None:
    """What the CUDA loader computes, on the CPU: its stored rows, its boxes and flips, cut in
    one batch, against the CPU loader's batches (tests/test_gpu.py holds the CUDA loader to
    these figures)."""
    loader = make_loader(folder_index(tiny_root).train, tmp_path, train=True, batch_size=8)
    try:
        rows = loader.cache.data.images.as_subclass(torch.Tensor).permute(0, 3, 1, 2)
        for batch, indices in zip(loader, loader.spec.epoch_batches(0), strict=True):
            boxes, flips = loader.parts.train_boxes(0, indices)
            assert_close(resize_boxes(rows[indices], boxes, SIZE, flips), batch.images)
    finally:
        loader.close()
