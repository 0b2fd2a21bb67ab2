"""The batched resize the CUDA paths use (``device_resize``), run here on CPU tensors: on
textured images (noise and real photos, where a different filter shows at once) it gives the
CPU kernel's pixels (``transforms.resize_uint8``, ``crop_resize_flip_batch``) within the one
grey level that kernel's 16-bit fixed-point weights can round apart, and nearly everywhere to
the bit; so one checkpoint sees the same images from a CPU and a GPU run."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from loaderbench.imaging.device_resize import axis_weights, resize_boxes, resize_images
from loaderbench.imaging.plans import apply_plan, val_region_plan
from loaderbench.imaging.transforms import crop_resize_flip_batch, resize_uint8, seeded_crops

PHOTOS = Path("/work/photos/train")
MAX_DIFF = 1  # grey levels: the CPU kernel's fixed-point weights round a few pixels apart
MEAN_DIFF = 0.05  # grey levels on average (measured: 0.002-0.04 on noise)


def noise(n: int, height: int, width: int, seed: int = 0) -> torch.Tensor:
    """Uniform noise: every pixel unlike its neighbours, the hardest texture for a resize."""
    generator = torch.Generator().manual_seed(seed)
    return (torch.rand(n, 3, height, width, generator=generator) * 255).round().to(torch.uint8)


def textured_images() -> list[torch.Tensor]:
    """Real photos (the ImageNet sample) where there are, else noise images of several
    sizes; uint8 CHW."""
    paths = sorted(PHOTOS.glob("*/*"))[:6]
    if paths:
        return [
            torch.from_numpy(np.array(Image.open(p).convert("RGB"))).permute(2, 0, 1) for p in paths
        ]
    return [noise(1, h, w, seed=h)[0] for h, w in ((375, 500), (333, 500), (500, 400))]


def assert_close(mine: torch.Tensor, reference: torch.Tensor) -> None:
    assert mine.shape == reference.shape and mine.dtype == torch.uint8
    diff = (mine.int() - reference.int()).abs()
    assert diff.max() <= MAX_DIFF and diff.float().mean() < MEAN_DIFF, (
        diff.max(),
        diff.float().mean(),
    )


@pytest.mark.parametrize("size", [24, 64, 224])
def test_boxes_of_a_stored_batch_are_the_cpu_kernels_pixels(size: int) -> None:
    """memmap's raw train crops: shrunk (24 px), about 1:1 (64) and enlarged (224) boxes of
    channels-last stored rows, flipped both ways."""
    rows = noise(12, 120, 150).contiguous(memory_format=torch.channels_last)
    boxes, flips = seeded_crops([120] * 12, [150] * 12, 0, 0, range(12))
    flips[:2] = torch.tensor([True, False])
    assert_close(
        resize_boxes(rows, boxes, size, flips), crop_resize_flip_batch(rows, boxes, size, flips)
    )


def test_a_flip_is_the_mirror_and_steps_do_not_change_pixels() -> None:
    rows = noise(10, 60, 80, seed=1)
    boxes, _ = seeded_crops([60] * 10, [80] * 10, 0, 3, range(10))
    flips = torch.tensor([True, False] * 5)
    flipped = resize_boxes(rows, boxes, 32, flips)
    plain = resize_boxes(rows, boxes, 32)
    assert torch.equal(flipped[::2], plain[::2].flip(-1)) and torch.equal(
        flipped[1::2], plain[1::2]
    )
    out = torch.zeros(10, 3, 32, 32, dtype=torch.uint8)
    step = 3 * rows[0].numel() * 4  # three images a step
    assert resize_boxes(rows, boxes, 32, flips, out, chunk_bytes=step) is out
    assert torch.equal(out, flipped)


def test_images_of_any_size_are_the_per_image_resize() -> None:
    """Decoded JPEG boxes (spdl nvjpeg, memmap's jpeg store on CUDA): whole images of
    different sizes, in groups of similar sizes, each as ``resize_uint8`` makes it."""
    images = textured_images()
    reference = torch.stack([resize_uint8(image, (224, 224)) for image in images])
    assert_close(resize_images(images, 224), reference)
    # nvImageCodec hands HWC images over as CHW views; a group a few images (small steps).
    views = [image.permute(1, 2, 0).contiguous().permute(2, 0, 1) for image in images]
    flips = torch.tensor([k % 2 == 0 for k in range(len(images))])
    flipped = reference.clone()
    flipped[flips] = flipped[flips].flip(-1)
    small = 2 * 3 * 500 * 500 * 4
    assert_close(resize_images(views, 224, flips, chunk_bytes=small), flipped)


def test_val_regions_resize_then_cut_like_the_plan() -> None:
    """A val plan with a crop after the resize (a thin image's region), as ``apply_plan``."""
    images = [noise(1, 40, 300, seed=2)[0], noise(1, 257, 256, seed=3)[0]]
    plans = [val_region_plan(int(i.shape[-2]), int(i.shape[-1]), 32) for i in images]
    regions = [
        i[:, p.box[0] : p.box[0] + p.box[2], p.box[1] : p.box[1] + p.box[3]]
        for i, p in zip(images, plans, strict=True)
    ]
    local = [
        apply_plan(region, type(p)(box=(0, 0, *p.box[2:]), resize=p.resize, crop=p.crop))
        for region, p in zip(regions, plans, strict=True)
    ]
    resized = torch.tensor([p.resize for p in plans])
    offsets = torch.tensor([(p.crop or (0, 0))[:2] for p in plans])
    mine = resize_images(regions, 32, resized=resized, offsets=offsets)
    assert_close(mine, torch.stack(local))


def test_the_weights_are_the_triangle_filter_normalised_inside_the_box() -> None:
    one = torch.tensor([0])
    weights = axis_weights(torch.tensor([2]), torch.tensor([6]), torch.tensor([3]), one * 0, 3, 10)
    assert weights.shape == (1, 3, 10)
    assert torch.allclose(weights.sum(-1), torch.ones(1, 3))
    assert (weights[0, :, :2] == 0).all() and (weights[0, :, 8:] == 0).all()  # outside the box
    # 2:1 shrink, support 2: output 0 (centre 1.0) weighs box pixels 0, 1, 2 as 3/8, 3/8, 1/8
    # (the triangle at 0.25, 0.25, 0.75 from its centre), over their sum.
    expected = torch.tensor([0.75, 0.75, 0.25]) / 1.75
    assert torch.allclose(weights[0, 0, 2:5], expected)
