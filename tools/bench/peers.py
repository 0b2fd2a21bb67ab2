"""The peers the benchmark report compares against, rebuilt here so they run on the same data.

* ``classic``: the classic torchvision pipeline, as the tensordict tutorial's "regular" loader
  runs it: PIL, transforms and float normalisation per image in DataLoader workers;
* ``tutorial_tensorclass``: the tutorial's tensorclass loader: images resized once into a
  uint8 TensorClass in the folder the caller names, read one batch index at a time, normalised
  (train: cropped at a fixed size and flipped) in a CPU collate function.

Both yield (images, labels) on the CPU, timed with the project's LoopMeter.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import torch
from tensordict import TensorClass
from torch import nn
from torch.utils.data import DataLoader
from torchvision.transforms import v2

from loaderbench.data.discovery import Split
from loaderbench.imaging.transforms import val_resize_size
from loaderbench.loaders.torchvision.loader import EveryEpoch, ImageFileDataset

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def _float_transform(size: int, train: bool) -> v2.Compose:
    geometry = (
        [v2.RandomResizedCrop(size, antialias=True), v2.RandomHorizontalFlip()]
        if train
        else [v2.Resize(val_resize_size(size), antialias=True), v2.CenterCrop(size)]
    )
    return v2.Compose(
        [
            *geometry,
            v2.PILToTensor(),
            v2.ToDtype(torch.float32, scale=True),
            v2.Normalize(IMAGENET_MEAN, IMAGENET_STD),
        ]
    )


def classic_loader(
    split: Split, size: int, train: bool, batch_size: int, num_workers: int
) -> DataLoader:
    """The per-image float pipeline in worker processes."""
    return DataLoader(
        ImageFileDataset(split, EveryEpoch(_float_transform(size, train)), skip_errors=False),
        batch_size=batch_size,
        shuffle=train,
        drop_last=train,
        num_workers=num_workers,
        persistent_workers=num_workers > 0,
    )


class TutorialImages(TensorClass):
    images: torch.Tensor
    targets: torch.Tensor


def build_tutorial_tensorclass(
    split: Split, size: int, train: bool, num_workers: int, prefix: Path
) -> TutorialImages:
    """Fill the tutorial's uint8 tensors (train squashed to (S, S), S = size * 256 / 224),
    memory-mapped files under ``prefix`` (overwritten if there)."""
    stored = val_resize_size(size)
    geometry = (
        [v2.Resize((stored, stored), antialias=True)]
        if train
        else [v2.Resize(stored, antialias=True), v2.CenterCrop(size)]
    )
    transform = EveryEpoch(v2.Compose([*geometry, v2.PILToTensor()]))
    dataset = ImageFileDataset(split, transform, skip_errors=False)
    side = stored if train else size
    # Files of the shape and dtype of these (unallocated) tensors, locked as memmap_() does.
    data = TutorialImages(
        images=torch.empty((len(split), 3, side, side), dtype=torch.uint8),
        targets=torch.empty((len(split),), dtype=torch.int64),
        batch_size=[len(split)],
    ).memmap_like(prefix, existsok=True)
    start = 0
    for images, labels in DataLoader(dataset, batch_size=64, num_workers=num_workers):
        n = images.shape[0]
        data[start : start + n] = TutorialImages(images=images, targets=labels, batch_size=[n])
        start += n
    return data


class _Normalize(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.loc = torch.tensor(IMAGENET_MEAN).view(3, 1, 1) * 255
        self.scale = torch.tensor(IMAGENET_STD).view(3, 1, 1) * 255

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x - self.loc) / self.scale


class _FixedCropFlip(nn.Module):
    """The tutorial's train transform: one fixed-size random crop and a flip per image."""

    def __init__(self, size: int) -> None:
        super().__init__()
        self.size = size

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n, _, h, w = x.shape
        top = torch.randint(0, h - self.size + 1, (n,))
        left = torch.randint(0, w - self.size + 1, (n,))
        rows = (top[:, None] + torch.arange(self.size))[:, None, :, None]
        cols = (left[:, None] + torch.arange(self.size))[:, None, None, :]
        out = x[
            torch.arange(n)[:, None, None, None], torch.arange(3)[None, :, None, None], rows, cols
        ]
        flip = torch.rand(n) < 0.5
        out[flip] = out[flip].flip(-1)
        return out


class _Collate:
    def __init__(self, transform: nn.Module) -> None:
        self.transform = transform

    def __call__(self, batch: TutorialImages) -> tuple[torch.Tensor, torch.Tensor]:
        return self.transform(batch.images), batch.targets


def tutorial_tensorclass_loader(
    data: TutorialImages, size: int, train: bool, batch_size: int
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """The tutorial's single-process reader: normalise (crop, flip) in the collate function."""
    transform = nn.Sequential(_Normalize(), _FixedCropFlip(size)) if train else _Normalize()
    return DataLoader(  # type: ignore[return-value]
        data,
        batch_size=batch_size,
        shuffle=train,
        drop_last=train,
        collate_fn=_Collate(transform),
    )
