"""The baseline loader on real JPEG files."""

from __future__ import annotations

from pathlib import Path

import torch
from omegaconf import OmegaConf

from loaderbench.config import DatasetConfig
from loaderbench.data import discover
from loaderbench.loaders import LoaderSpec, build_loader
from loaderbench.transforms import load_rgb, pil_val_transform


def index_of(root: Path):
    cfg = OmegaConf.structured(DatasetConfig)
    cfg.name, cfg.root = "folder", str(root)
    return discover(cfg)


def spec(split, train: bool, **kwargs) -> LoaderSpec:
    base = dict(
        split=split,
        train=train,
        image_size=32,
        device=torch.device("cpu"),
        batch_size=5,
        num_workers=1,
        prefetch=2,
    )
    base.update(kwargs)
    return LoaderSpec(**base)


def test_val_epoch_is_the_reference_pipeline_in_order(tiny_root: Path) -> None:
    index = index_of(tiny_root)
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
    index = index_of(tiny_root)
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
