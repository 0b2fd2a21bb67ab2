"""The baseline loader on real JPEG files."""

from __future__ import annotations

from pathlib import Path

import torch

from loaderbench.loaders import LoaderSpec, build_loader
from loaderbench.transforms import load_rgb, pil_val_transform
from tests.conftest import cpu_spec, folder_index


def spec(split, train: bool, **kwargs) -> LoaderSpec:
    return cpu_spec(split, train, **kwargs)


def test_val_epoch_is_the_reference_pipeline_in_order(tiny_root: Path) -> None:
    index = folder_index(tiny_root)
    loader = build_loader("torchvision", spec(index.val, train=False))
    try:
        batches = list(loader)
        assert len(batches) == len(loader) == 3  # 12 images, the last batch short
        images = torch.cat([b.images for b in batches])
        labels = torch.cat([b.labels for b in batches])
        assert images.dtype == torch.uint8 and images.shape == (12, 3, 32, 32)
        assert labels.dtype == torch.int64 and labels.tolist() == list(index.val.labels)
        reference = pil_val_transform(32)(load_rgb(index.val.paths[7]))
        assert torch.equal(images[7], reference)
    finally:
        loader.close()


def test_train_epochs_drop_last_and_reshuffle(tiny_root: Path) -> None:
    index = folder_index(tiny_root)
    loader = build_loader("torchvision", spec(index.train, train=True, num_workers=2))
    try:
        orders = []
        for epoch in range(2):
            loader.set_epoch(epoch)
            labels = torch.cat([b.labels for b in loader])
            assert len(labels) == 20  # 24 images, batches of 5, the partial batch dropped
            orders.append(labels.tolist())
        assert orders[0] != orders[1]
        loader.set_epoch(0)
        assert torch.cat([b.labels for b in loader]).tolist() == orders[0]
    finally:
        loader.close()
