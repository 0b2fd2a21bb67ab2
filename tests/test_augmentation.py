"""One way to seed augmentation: every loader draws an image's crop and flip from (seed, epoch,
image) alone (crop stream 2, ``loaderbench.imaging.crops``), and never touches the global RNG. Every
loader's crops against the reference's are the loader contract's
(tests/test_loader_contract.py); here how near every loader's crops come to one another, and
the three kernels known here (PIL's filter, the shared uint8 kernel from stored pixels and from
decoded regions) to each other."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from loaderbench.imaging.crops import (
    CROP_STREAM,
    RRC_RATIO,
    RRC_SCALE,
    augmentation_draws,
    random_crops,
    seeded_crops,
)
from loaderbench.loaders import build_loader, file_loader_names
from tests.conftest import cpu_spec, folder_index, loader_folders

SIZE = 16


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
    extra = loader_folders(loader_name, tmp_path)
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
    out = {
        name: train_batches(name, small_pngs, tmp_path, seed=3, epoch=1)
        for name in file_loader_names()
    }
    memmap_images, labels, _ = out["memmap"]
    for name in out:
        assert torch.equal(out[name][1], labels)  # the same images in the same order
    # memmap and spdl crop the same pixels with the same uint8 kernel: equal to a grey level.
    spdl_diff = (out["spdl"][0].int() - memmap_images.int()).abs()
    assert spdl_diff.max() <= 1
    # torchvision resizes with PIL's filter: close, not bit-identical.
    pil_diff = (out["torchvision"][0].int() - memmap_images.int()).abs().float()
    assert pil_diff.mean() < 1.5
    # Another epoch (or seed) is another crop: far further apart than the loaders are.
    # Every loader's crops (whatever its kernel) lie that much nearer memmap's than those do.
    other_epoch, _, _ = train_batches("memmap", small_pngs, tmp_path, seed=3, epoch=2)
    other_seed, _, _ = train_batches("memmap", small_pngs, tmp_path, seed=4, epoch=1)
    for other in (other_epoch, other_seed):
        apart = (other.int() - memmap_images.int()).abs().float().mean()
        for name, (images, _, _) in out.items():
            assert apart > 10 * (images.int() - memmap_images.int()).abs().float().mean(), name


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


def test_the_draws_and_boxes_of_a_run_never_change() -> None:
    """Values recorded from crop stream 2 (``crops.CROP_STREAM``; stream 1 seeded a generator
    per image): a run resumed, or compared, under a later version of the code gets the very
    same crops. A change here is a new crop stream, to be numbered and documented."""
    assert CROP_STREAM == 2
    draws = augmentation_draws(3, 7, [0, 12345, 10**9])
    recorded = [
        ["0x1.b93694fb78204p-1", "0x1.0c29f6945ed00p-7", "0x1.fec942fb99040p-5"],
        ["0x1.b54f36219cb67p-1", "0x1.427f2f626ba5cp-3", "0x1.108e6c7ba0a48p-1"],
        ["0x1.547d2426b77b9p-1", "0x1.6e1cc53e10bb5p-1", "0x1.7dc80fec929ddp-1"],
    ]
    assert [[v.hex() for v in row[[0, 10, 20]].tolist()] for row in draws] == recorded
    boxes, flips = seeded_crops([300, 37, 500], [400, 500, 12], 3, 7, [0, 12345, 10**9])
    # The second and third images are too narrow for any try: the central fallback.
    assert boxes.tolist() == [[10, 119, 129, 157], [0, 225, 37, 49], [242, 0, 16, 12]]
    assert flips.tolist() == [False, True, True]


def test_an_images_draws_do_not_depend_on_its_batch_or_on_the_key_alone() -> None:
    """Counter-based: image i's row is the same drawn alone, in any batch, in any order; other
    seeds, epochs and images give other rows; the values are uniform in [0, 1)."""
    images = np.array([5, 0, 10**9, 77, 3])
    batch = augmentation_draws(11, 4, images)
    for row, image in zip(batch, images, strict=True):
        assert torch.equal(augmentation_draws(11, 4, [int(image)])[0], row)
    assert torch.equal(augmentation_draws(11, 4, images[::-1]), batch.flip(0))
    assert torch.equal(augmentation_draws(11, 4, torch.from_numpy(images)), batch)
    others = [augmentation_draws(12, 4, images), augmentation_draws(11, 5, images)]
    assert all(not torch.isclose(other, batch).any() for other in others)
    assert len(set(batch.flatten().tolist())) == batch.numel()
    many = augmentation_draws(0, 0, range(20_000))
    assert 0.0 <= float(many.min()) and float(many.max()) < 1.0
    assert abs(float(many.mean()) - 0.5) < 0.005 and abs(float(many.std()) - 12**-0.5) < 0.005
    # Neighbouring draws of one image, and one draw of neighbouring images, are uncorrelated.
    assert abs(float(torch.corrcoef(many[:, :2].T)[0, 1])) < 0.03
    assert abs(float(torch.corrcoef(torch.stack([many[:-1, 0], many[1:, 0]]))[0, 1])) < 0.03


def torch_random_crops(
    heights: torch.Tensor,
    widths: torch.Tensor,
    draws: torch.Tensor,
    scale: tuple[float, float],
    ratio: tuple[float, float],
) -> tuple[torch.Tensor, torch.Tensor]:
    """The first implementation of ``random_crops``, in torch, one side at a time: the oracle
    for the faster one."""
    heights, widths = heights.double(), widths.double()
    area = (heights * widths)[:, None]
    target_area = area * (scale[0] + (scale[1] - scale[0]) * draws[:, :10])
    low, high = math.log(ratio[0]), math.log(ratio[1])
    aspect = torch.exp(low + (high - low) * draws[:, 10:20])
    w = torch.round(torch.sqrt(target_area * aspect))
    h = torch.round(torch.sqrt(target_area / aspect))
    ok = (w > 0) & (h > 0) & (w <= widths[:, None]) & (h <= heights[:, None])
    first = torch.where(ok.any(dim=1), ok.to(torch.int8).argmax(dim=1), -1)
    in_ratio = widths / heights
    fb_w = torch.where(
        in_ratio < ratio[0],
        widths,
        torch.where(in_ratio > ratio[1], torch.round(heights * ratio[1]), widths),
    )
    fb_h = torch.where(in_ratio < ratio[0], torch.round(widths / ratio[0]), heights)
    rows, found = torch.arange(len(heights)), first >= 0
    box_w = torch.where(found, w[rows, first.clamp(min=0)], fb_w)
    box_h = torch.where(found, h[rows, first.clamp(min=0)], fb_h)
    top = torch.where(
        found,
        torch.floor(draws[:, -3] * (heights - box_h + 1)),
        torch.floor((heights - box_h) / 2),
    )
    left = torch.where(
        found,
        torch.floor(draws[:, -2] * (widths - box_w + 1)),
        torch.floor((widths - box_w) / 2),
    )
    return torch.stack([top, left, box_h, box_w], 1).long(), draws[:, -1] < 0.5


@pytest.mark.parametrize(
    ("scale", "ratio"),
    [(RRC_SCALE, RRC_RATIO), ((0.35, 1.0), (0.5, 2.0)), ((0.9, 1.0), (1.0, 1.0))],
)
def test_the_batched_boxes_are_the_torch_oracles_to_the_bit(
    scale: tuple[float, float], ratio: tuple[float, float]
) -> None:
    generator = torch.Generator().manual_seed(1)
    for n in (1, 3, 32, 500):  # torch's exp takes another path for a short tail
        heights = torch.randint(1, 1200, (n,), generator=generator, dtype=torch.int32)
        widths = torch.randint(1, 1200, (n,), generator=generator, dtype=torch.int32)
        widths[::4] = torch.randint(1, 6, (len(widths[::4]),), generator=generator).int()
        draws = augmentation_draws(n, 2, range(n))
        boxes, flips = random_crops(heights, widths, draws, scale, ratio)
        expected, expected_flips = torch_random_crops(heights, widths, draws, scale, ratio)
        assert boxes.dtype == torch.int64 and flips.dtype == torch.bool
        assert torch.equal(boxes, expected) and torch.equal(flips, expected_flips)
        top, left, h, w = boxes.unbind(1)
        assert (top >= 0).all() and (left >= 0).all()
        assert (top + h <= heights).all() and (left + w <= widths).all()
