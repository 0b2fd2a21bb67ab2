"""The baseline loader on real JPEG files."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
import torch

from loaderbench.images import load_rgb
from loaderbench.loaders import LoaderSpec, build_loader
from loaderbench.transforms import pil_val_transform
from tests.conftest import cpu_spec, folder_index


def spec(split, train: bool, **kwargs) -> LoaderSpec:
    return cpu_spec(split, train, loader="torchvision", **kwargs)


def test_val_epoch_is_the_reference_pipeline_in_order(tiny_root: Path) -> None:
    index = folder_index(tiny_root)
    loader = build_loader(spec(index.val, train=False))
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
    loader = build_loader(spec(index.train, train=True, num_workers=2))
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


@pytest.mark.timeout(120)
def test_a_killed_worker_ends_the_epoch_with_its_cause(tiny_root: Path) -> None:
    """A worker process gone (the OOM killer, a segfault in a codec): an error naming it, not
    a hang; and close() still releases the rest."""
    index = folder_index(tiny_root)
    loader = build_loader(spec(index.train, train=True, num_workers=2, batch_size=2, prefetch=1))
    iterator = iter(loader)
    next(iterator)
    workers = loader.dataloader._iterator._workers  # the live worker processes
    os.kill(workers[0].pid, signal.SIGKILL)
    with pytest.raises(RuntimeError, match=f"worker pid {workers[0].pid} killed by SIGKILL"):
        for _ in iterator:
            pass
    loader.close()
    assert not any(worker.is_alive() for worker in workers)
