"""One way to seed augmentation: every loader draws an image's crop and flip from (seed, epoch,
image) alone, with a generator of its own, and never touches the global RNG."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from loaderbench.loaders import build_loader
from loaderbench.transforms import RRC_RATIO, RRC_SCALE, seeded_crops
from tests.conftest import cpu_spec, folder_index

SIZE = 16
LOADERS = ("torchvision", "memmap", "spdl")


@pytest.fixture(scope="module")
def small_pngs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Lossless images small enough that memmap stores them as they are (it never enlarges):
    then every loader crops the very same pixels, and only the box and flip can differ."""
    root = tmp_path_factory.mktemp("pngs")
    rng = np.random.default_rng(0)
    for split, count in (("train", 6), ("val", 2)):
        for label in range(2):
            folder = root / split / f"class{label}"
            folder.mkdir(parents=True)
            for i in range(count):
                h, w = (30, 40) if i % 2 else (44, 36)
                noise = rng.integers(0, 256, (h // 4 + 1, w // 4 + 1, 3), dtype=np.uint8)
                image = Image.fromarray(noise).resize((w, h), Image.BILINEAR)
                image.save(folder / f"{i}.png")
    return root


def train_batches(loader_name: str, root: Path, tmp_path: Path, seed: int, epoch: int):
    split = folder_index(root).train
    extra = {"cache_dir": str(tmp_path / "cache")} if loader_name == "memmap" else {}
    spec = cpu_spec(
        split,
        True,
        loader=loader_name,
        image_size=SIZE,
        batch_size=4,
        num_workers=0,
        seed=seed,
        **extra,
    )
    with build_loader(spec) as loader:
        loader.set_epoch(epoch)
        batches = list(loader)
    images = torch.cat([b.images for b in batches]).contiguous()
    labels = torch.cat([b.labels for b in batches])
    return images, labels, spec


def test_the_same_seed_and_epoch_give_every_loader_the_same_crops(
    small_pngs: Path, tmp_path: Path
) -> None:
    out = {name: train_batches(name, small_pngs, tmp_path, seed=3, epoch=1) for name in LOADERS}
    memmap_images, labels, _ = out["memmap"]
    for name in LOADERS:
        assert torch.equal(out[name][1], labels)  # the same images in the same order
    # memmap and spdl crop the same pixels with the same uint8 kernel: equal to a grey level.
    spdl_diff = (out["spdl"][0].int() - memmap_images.int()).abs()
    assert spdl_diff.max() <= 1
    # torchvision resizes with PIL's filter: close, not bit-identical.
    pil_diff = (out["torchvision"][0].int() - memmap_images.int()).abs().float()
    assert pil_diff.mean() < 1.5
    # Another epoch (or seed) is another crop: far further apart than the loaders are.
    other_epoch, _, _ = train_batches("memmap", small_pngs, tmp_path, seed=3, epoch=2)
    other_seed, _, _ = train_batches("memmap", small_pngs, tmp_path, seed=4, epoch=1)
    for other in (other_epoch, other_seed):
        assert (other.int() - memmap_images.int()).abs().float().mean() > 10 * pil_diff.mean()


def test_crops_depend_on_the_image_not_on_its_batch_or_rank() -> None:
    heights, widths = [300, 200, 500, 375], [400, 300, 375, 500]
    boxes, flips = seeded_crops(heights, widths, seed=0, epoch=5, indices=[7, 8, 9, 10])
    alone = [
        seeded_crops([h], [w], 0, 5, [i])
        for h, w, i in zip(heights, widths, [7, 8, 9, 10], strict=True)
    ]
    assert torch.equal(boxes, torch.cat([b for b, _ in alone]))
    assert torch.equal(flips, torch.cat([f for _, f in alone]))
    again, _ = seeded_crops(heights[::-1], widths[::-1], 0, 5, [10, 9, 8, 7])
    assert torch.equal(again, boxes.flip(0))


def test_crop_distribution_is_torchvisions_random_resized_crop() -> None:
    from torchvision.transforms import RandomResizedCrop

    n = 4000
    heights, widths = torch.full((n,), 300), torch.full((n,), 400)
    boxes, flips = seeded_crops(heights, widths, seed=1, epoch=0, indices=range(n))
    top, left, h, w = boxes.unbind(1)
    assert (top >= 0).all() and (left >= 0).all() and (top + h <= 300).all()
    assert (left + w <= 400).all()
    area = (h * w).double() / (300 * 400)
    assert area.min() >= RRC_SCALE[0] * 0.95 and area.max() <= 1.0
    torch.manual_seed(0)
    image = torch.empty(3, 300, 400)
    reference = torch.tensor(
        [RandomResizedCrop.get_params(image, list(RRC_SCALE), list(RRC_RATIO)) for _ in range(n)]
    ).double()
    reference_area = reference[:, 2] * reference[:, 3] / (300 * 400)
    assert abs(area.mean() - reference_area.mean()) < 0.02
    assert abs(area.std() - reference_area.std()) < 0.02
    aspect = (w / h).double()
    assert aspect.min() >= RRC_RATIO[0] * 0.95 and aspect.max() <= RRC_RATIO[1] * 1.05
    assert 0.45 < flips.double().mean() < 0.55
    assert len({tuple(b) for b in boxes.tolist()}) > 0.95 * n


@pytest.mark.parametrize("loader_name", LOADERS)
def test_an_epoch_in_the_main_process_leaves_the_global_rng_alone(
    small_pngs: Path, tmp_path: Path, loader_name: str
) -> None:
    torch.manual_seed(123)
    before = torch.get_rng_state()
    expected = torch.rand(3)
    torch.set_rng_state(before)
    train_batches(loader_name, small_pngs, tmp_path, seed=0, epoch=0)
    assert torch.equal(torch.get_rng_state(), before)
    assert torch.equal(torch.rand(3), expected)
