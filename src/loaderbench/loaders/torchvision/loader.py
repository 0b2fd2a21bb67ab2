"""The baseline: an ImageFolder-style dataset and torch's DataLoader with worker processes.

Each worker opens, decodes (PIL) and transforms one image at a time, as torchvision's ImageNet
references and the tensordict tutorial's "regular" loader do; batches are collated in the
worker, pinned in the main process on CUDA and copied to the device without blocking.

A train image's random-resized crop and flip are drawn from (seed, epoch, image) alone
(``transforms.PilTrainTransform``, by ``seeded_crops`` as in every loader): the
sampler hands each worker (index, epoch), so augmentation does not depend on which worker draws
an image, and no worker (nor the main process, with ``num_workers=0``) touches the global RNG.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from PIL import Image
from torch.utils.data import DataLoader, Dataset, Sampler

from loaderbench.data.discovery import Split
from loaderbench.imaging.decoded_by import add as add_counts
from loaderbench.imaging.decoded_by import counting
from loaderbench.imaging.files import load_rgb
from loaderbench.imaging.transforms import PilTrainTransform, pil_val_transform
from loaderbench.loaders.base import (
    Batch,
    Loader,
    LoaderSpec,
    register_loader,
    stop_workers,
    to_device,
)
from loaderbench.loaders.torchvision.settings import Settings
from loaderbench.measure.metrics import DECODED_BY

# (image, index, epoch) -> uint8 CHW
ImageTransform = Callable[[Image.Image, int, int], torch.Tensor]


class EveryEpoch:
    """A per-image transform that ignores the epoch (validation, the benchmark's peers)."""

    def __init__(self, transform: Callable[[Image.Image], torch.Tensor]) -> None:
        self.transform = transform

    def __call__(self, image: Image.Image, index: int, epoch: int) -> torch.Tensor:
        return self.transform(image)


class ImageFileDataset(Dataset):
    """Map-style dataset over a discovered split: (uint8 CHW image, label), or None if unreadable.

    Equivalent to torchvision's ImageFolder with a PIL loader, but fed by the shared discovery
    step so every loader sees the same files in the same order. Keys are indices, or (index,
    epoch) for a transform that depends on the epoch.
    """

    def __init__(self, split: Split, transform: ImageTransform, skip_errors: bool) -> None:
        self.split = split
        self.transform = transform
        self.skip_errors = skip_errors

    def __len__(self) -> int:
        return len(self.split)

    def __getitem__(
        self, key: int | tuple[int, int]
    ) -> tuple[torch.Tensor, int] | tuple[None, tuple[int, str]]:
        """(image, label), or (None, (index, error)) for an unreadable file when skipping."""
        index, epoch = key if isinstance(key, tuple) else (key, 0)
        path = self.split.paths[index]
        try:
            image = load_rgb(path)
        except Exception as error:
            if not self.skip_errors:
                raise OSError(f"cannot read image {path}: {error}") from error
            # Logged by the main process, once per file (a worker would repeat it each epoch).
            return None, (index, f"{type(error).__name__}: {error}")
        return self.transform(image, index, epoch), self.split.labels[index]

    def __getitems__(self, keys: Sequence[int | tuple[int, int]]) -> CountedItems:
        """A batch's items (DataLoader's fetcher calls this in the worker), with the images
        counted by the library that decoded them, for ``collate_skipping`` to send back."""
        with counting() as counts:
            items = CountedItems(self[key] for key in keys)
        items.decoded_by = counts
        items.indices = [key[0] if isinstance(key, tuple) else key for key in keys]
        return items


class CountedItems(list):
    """A batch's items, how many images each library decoded (``loaderbench.imaging.decoded_by``)
    and the dataset indices they were read for."""

    decoded_by: dict[str, int] | None = None
    indices: list[int] | None = None


def collate_skipping(
    items: CountedItems,
) -> tuple[Batch, list[tuple[int, str]], dict[str, int]]:
    """Stack the readable items into a batch with their dataset indices; (index, error) of
    unreadable ones, and the images by the library that decoded them, travel with the batch
    (from the worker process)."""
    keys = items.indices or []
    good = [(image, label, key) for (image, label), key in zip(items, keys, strict=True)]
    good = [item for item in good if item[0] is not None]
    failed = [failure for image, failure in items if image is None]
    counts = dict(items.decoded_by or {})
    indices = torch.tensor([key for _, _, key in good], dtype=torch.int64)
    if not good:
        empty = torch.empty(0, dtype=torch.uint8), torch.empty(0, dtype=torch.int64)
        return Batch(*empty, indices), failed, counts
    images = torch.stack([image for image, _, _ in good])
    labels = torch.tensor([label for _, label, _ in good], dtype=torch.int64)
    return Batch(images, labels, indices), failed, counts


class EpochSampler(Sampler[tuple[int, int]]):
    """The shared epoch order, this rank's share of it, as (index, epoch) keys."""

    def __init__(self, spec: LoaderSpec) -> None:
        self.spec = spec
        self.epoch = 0
        self.start_batch = 0

    def set_epoch(self, epoch: int, start_batch: int = 0) -> None:
        self.epoch, self.start_batch = epoch, start_batch

    def __iter__(self) -> Iterator[tuple[int, int]]:
        epoch = self.epoch
        return iter((i, epoch) for i in self.spec.epoch_order(epoch, self.start_batch).tolist())

    def __len__(self) -> int:
        return len(self.spec.epoch_order(self.epoch, self.start_batch))


@register_loader("torchvision")
class TorchvisionLoader(Loader):
    def __init__(self, spec: LoaderSpec) -> None:
        super().__init__(spec)
        settings: Settings = spec.settings  # type: ignore[assignment]
        transform = (
            PilTrainTransform(spec.image_size, spec.seed, spec.rrc_scale, spec.rrc_ratio)
            if spec.train
            else EveryEpoch(pil_val_transform(spec.image_size))
        )
        self.sampler = EpochSampler(spec)
        workers = spec.num_workers
        self.dataloader = DataLoader(
            ImageFileDataset(spec.split, transform, skip_errors=spec.skip_errors),
            batch_size=spec.batch_size,
            sampler=self.sampler,
            num_workers=workers,
            collate_fn=collate_skipping,
            pin_memory=spec.use_pinned_memory,
            drop_last=False,  # the sampler already cut the epoch to whole batches
            persistent_workers=workers > 0 and settings.persistent_workers,
            prefetch_factor=settings.per_worker_prefetch() if workers > 0 else None,
            timeout=(settings.timeout_s or 0) if workers > 0 else 0,
            # Its own generator for the workers' base seed: DataLoader would otherwise draw it
            # from the global RNG at every epoch's start.
            generator=torch.Generator().manual_seed(spec.seed * 1_000 + spec.rank),
        )
        self._decoded_by: dict[str, int] = {}  # the delivered batches' images, by library

    def set_epoch(self, epoch: int, start_batch: int = 0, *, next_epoch: bool = False) -> None:
        super().set_epoch(epoch, start_batch, next_epoch=next_epoch)
        self.sampler.set_epoch(epoch, start_batch)

    def queue_depth(self) -> int:
        """Every worker's ``prefetch_factor`` batches are asked for at once (at each epoch's
        start, persistent workers or not), so that many can be decoded ahead of the loop."""
        workers = self.dataloader.num_workers
        return workers * int(self.dataloader.prefetch_factor or 1) if workers else 0

    def __iter__(self) -> Iterator[Batch]:
        non_blocking = self.spec.use_pinned_memory
        self.position = self.start_batch
        try:
            # One item a batch of the order (the sampler cuts it to whole batches).
            for batch, failed, counts in self.dataloader:
                self._account(failed)
                add_counts(self._decoded_by, counts)
                self.position += 1
                if len(batch.labels):
                    yield to_device(batch, self.spec.device, non_blocking)
        except (RuntimeError, OSError) as error:
            # A worker that dies while its batch is in transfer shows first as an OSError
            # (ConnectionResetError, receiving the batch's shared memory), and torch's SIGCHLD
            # handler raises its own RuntimeError whenever Python runs it: in the middle of
            # this handler too. Looked at again until it is said once, naming the worker.
            for _ in range(3):
                try:
                    explained = self._explained(error)
                    break
                except RuntimeError as late:  # torch's handler, run while this looked
                    error = late
            else:
                explained = None
            if explained is None:
                raise error
            raise explained from error

    def _explained(self, error: Exception) -> Exception | None:
        """The error to raise for the loop's ``error``: a dead worker named, or a timeout
        without one; None where it is neither (raised as it is)."""
        dead = self._dead_workers()
        if not dead and isinstance(error, OSError):  # its death is seen a moment later
            deadline = time.monotonic() + 1.0
            while not (dead := self._dead_workers()) and time.monotonic() < deadline:
                time.sleep(0.01)
        timed_out = str(error).startswith("DataLoader timed out after")
        if not dead and self.dataloader.timeout > 0 and timed_out:  # none died
            timeout = self.dataloader.timeout
            return TimeoutError(
                f"torchvision loader: no batch for loader.timeout_s={timeout:g} s in epoch "
                f"{self.epoch} from {self.dataloader.num_workers} worker processes, none of "
                "them dead; is the file system stuck, or a worker deadlocked?"
            )
        if not dead:
            return None
        return RuntimeError(
            f"torchvision loader: {dead} in epoch {self.epoch} ({error}); out of memory "
            f"(see `dmesg`), or a crash in an image codec?"
        )

    def _account(self, failed: list[tuple[int, str]]) -> None:
        for index, error in failed:
            self.skip_unreadable(index, error)

    def _dead_workers(self) -> str:
        """'worker pid N killed by SIGKILL, ...' for worker processes that died, else ''."""
        workers = getattr(getattr(self.dataloader, "_iterator", None), "_workers", [])
        dead = []
        for worker in workers:
            code = worker.exitcode
            if code is None or code == 0:
                continue
            how = f"killed by {signal.Signals(-code).name}" if code < 0 else f"exit code {code}"
            dead.append(f"worker pid {worker.pid} {how}")
        return ", ".join(dead)

    def stats(self) -> dict[str, Any]:
        return {**super().stats(), DECODED_BY: dict(self._decoded_by)}

    def close(self) -> None:
        # Persistent workers live as long as the iterator; dropping it shuts them down.
        stop_workers(getattr(self.dataloader, "_iterator", None))
        self.dataloader._iterator = None
