"""Images one pixel tall or wide (issue 29, A7): every loader reads them, on the val path with
the same pixels as the torchvision reference (whose Resize upsamples the short side 256-fold),
and none skips them on the train path."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from loaderbench.imaging.plans import val_region_plan
from loaderbench.loaders import build_loader
from tests.conftest import READERS, cpu_spec, folder_index

SIZE = 32
THIN = ("wide_1x1000.JPEG", "tall_1000x1.JPEG")


def ramp(length: int) -> np.ndarray:
    """Grey levels along the long side: flat, then a steep ramp across the centre (where the
    val crop looks), so a crop taken half a source pixel off would show."""
    x = np.arange(length)
    return np.clip((x - length / 2 + 8) * 16, 0, 255).astype(np.uint8)


@pytest.fixture(scope="module")
def thin_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("thin")
    line = ramp(1000)
    rgb = np.stack([line, 255 - line, np.full_like(line, 90)], axis=-1)  # (1000, 3)
    for split in ("train", "val"):
        folder = root / split / "n00000001"
        folder.mkdir(parents=True)
        Image.fromarray(rgb[None]).save(folder / THIN[0], quality=95)  # 1 tall, 1000 wide
        Image.fromarray(rgb[:, None]).save(folder / THIN[1], quality=95)  # 1000 tall, 1 wide
        plain = np.stack([np.tile(ramp(50), (40, 1))] * 3, axis=-1)  # 50 wide, 40 tall
        Image.fromarray(plain).save(folder / "plain.JPEG", quality=90)
    return root


def test_the_val_region_of_a_thin_image_is_never_empty() -> None:
    for height, width in ((1, 1000), (1000, 1), (1, 1), (2, 5000), (3, 100_000), (375, 500)):
        for size in (32, 224):
            top, left, h, w = val_region_plan(height, width, size).box
            assert h >= 1 and w >= 1, (height, width, size)
            assert top >= 0 and left >= 0 and top + h <= height and left + w <= width
    # The long side of a 1 x 1000 image: the two source pixels the reference blends there,
    # at its scale (2 x 256) and cut where it cuts (its crop starts at 127888 = 499 * 256 + 144).
    wide = val_region_plan(1, 1000, 224)
    assert (wide.box, wide.resize, wide.crop) == ((0, 499, 1, 2), (224, 512), (0, 144, 224, 224))
    tall = val_region_plan(1000, 1, 224)
    assert (tall.box, tall.resize, tall.crop) == ((499, 0, 2, 1), (512, 224), (144, 0, 224, 224))
    # Boxes that round to whole pixels are unchanged (the measured geometry of the photos).
    assert val_region_plan(375, 500, 224).box == (23, 85, 329, 328)


def read_all(root: Path, train: bool, loader: str, options: dict, tmp_path: Path):
    split = folder_index(root).train if train else folder_index(root).val
    cache = {"cache_dir": str(tmp_path / "cache")} if loader == "memmap" else {}
    spec = cpu_spec(
        split,
        train,
        loader=loader,
        image_size=SIZE,
        batch_size=3,
        on_error="skip",
        **cache,
        **options,
    )
    with build_loader(spec) as built:
        images = torch.cat([batch.images for batch in built])
        skipped = built.stats()["skipped_files"]
    return split, images, skipped


@pytest.mark.parametrize(("loader", "options"), READERS)
def test_thin_images_decode_alike_in_every_loader(
    thin_root: Path, loader: str, options: dict, tmp_path: Path
) -> None:
    split, reference, _ = read_all(thin_root, False, "torchvision", {}, tmp_path / "ref")
    _, images, skipped = read_all(thin_root, False, loader, options, tmp_path)
    assert skipped == 0 and images.shape == reference.shape == (3, 3, SIZE, SIZE)
    names = [Path(p).name for p in split.paths]
    assert set(THIN) <= set(names)
    # libjpeg-turbo and the reference's geometry: within a grey level (a thin image's region
    # is cut where the reference cuts); FFmpeg's chroma is its own (tests/test_messy.py).
    ffmpeg = options.get("decoder") == "ffmpeg"
    for name, got, want in zip(names, images, reference, strict=True):
        diff = (got.float() - want.float()).abs()
        if ffmpeg:
            assert diff.mean() <= 6.0, f"{name}: mean |diff| {diff.mean():.2f}"
        elif name in THIN:
            assert diff.max() <= 1, f"{name}: max |diff| {diff.max():.0f}"


@pytest.mark.parametrize(("loader", "options"), READERS)
def test_thin_images_are_not_skipped_in_training(
    thin_root: Path, loader: str, options: dict, tmp_path: Path
) -> None:
    _, images, skipped = read_all(thin_root, True, loader, options, tmp_path)
    assert skipped == 0 and images.shape == (3, 3, SIZE, SIZE)
