"""The one interface every loader implements, and the registry that picks one by name.

A loader is built for one split and yields, per epoch, ``Batch(images, labels)``: uint8 NCHW
images at the model's input size and int64 labels, both already on the target device.
Normalisation is not the loader's job (the model wrapper does it on the device), so all loaders
hand over the same kind of batch and the comparison between them is fair.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch
from omegaconf import DictConfig

from loaderbench.data import Split
from loaderbench.transforms import RRC_RATIO, RRC_SCALE


class Batch(NamedTuple):
    images: torch.Tensor  # uint8, (N, 3, H, W), on the target device
    labels: torch.Tensor  # int64, (N,), on the target device


@dataclass(frozen=True)
class LoaderSpec:
    """What a loader must deliver, independent of how."""

    split: Split
    train: bool
    image_size: int
    device: torch.device
    seed: int = 0
    batch_size: int = 32
    num_workers: int = 2
    prefetch: int = 2
    pin_memory: bool = True
    # The train pipeline's random-resized crop: area fraction and aspect-ratio ranges.
    rrc_scale: tuple[float, float] = RRC_SCALE
    rrc_ratio: tuple[float, float] = RRC_RATIO
    # Data-parallel sharding: this process reads only its share of every epoch.
    rank: int = 0
    world_size: int = 1
    options: dict[str, Any] = field(default_factory=dict)

    @property
    def drop_last(self) -> bool:
        return self.train

    @property
    def use_pinned_memory(self) -> bool:
        return self.pin_memory and self.device.type == "cuda"


class Loader(abc.ABC):
    """Iterate it once per epoch; ``set_epoch`` first to reshuffle; ``close`` when done."""

    def __init__(self, spec: LoaderSpec) -> None:
        self.spec = spec
        self.epoch = 0

    @abc.abstractmethod
    def __iter__(self) -> Iterator[Batch]: ...

    @abc.abstractmethod
    def __len__(self) -> int:
        """Batches per epoch on this rank."""

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def stats(self) -> dict[str, Any]:
        """Loader-specific numbers for metrics.json (``skipped_files`` at least)."""
        return {"skipped_files": 0}

    def close(self) -> None:  # noqa: B027 - most loaders hold something to release
        """Release workers, threads and files. Safe to call twice."""

    def __enter__(self) -> Loader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


LoaderFactory = Callable[[LoaderSpec], Loader]
LOADERS: dict[str, LoaderFactory] = {}


def register_loader(name: str) -> Callable[[LoaderFactory], LoaderFactory]:
    def decorator(factory: LoaderFactory) -> LoaderFactory:
        LOADERS[name] = factory
        return factory

    return decorator


def epoch_permutation(n: int, seed: int, epoch: int, shuffle: bool) -> torch.Tensor:
    """The order of an epoch: the same on every rank for the same (seed, epoch)."""
    if not shuffle:
        return torch.arange(n)
    generator = torch.Generator().manual_seed(seed * 100_003 + epoch)
    return torch.randperm(n, generator=generator)


def shard_indices(
    order: torch.Tensor, batch_size: int, drop_last: bool, rank: int = 0, world_size: int = 1
) -> torch.Tensor:
    """This rank's share of an epoch's order (strided, like DistributedSampler).

    With ``drop_last`` (training) every rank gets the same number of full batches, which
    DistributedDataParallel needs; without it (validation) the ranks together cover every
    image exactly once and the last batches may be short.
    """
    if not drop_last:
        return order[rank::world_size]
    per_rank = len(order) // world_size
    mine = order[rank : per_rank * world_size : world_size]
    return mine[: per_rank // batch_size * batch_size]


def shard_batches(
    order: torch.Tensor, batch_size: int, drop_last: bool, rank: int = 0, world_size: int = 1
) -> list[torch.Tensor]:
    """This rank's batches of indices for one epoch."""
    mine = shard_indices(order, batch_size, drop_last, rank, world_size)
    return list(torch.split(mine, batch_size)) if len(mine) else []


def batches_per_epoch(spec: LoaderSpec) -> int:
    n = len(
        shard_indices(
            torch.arange(len(spec.split)),
            spec.batch_size,
            spec.drop_last,
            spec.rank,
            spec.world_size,
        )
    )
    return -(-n // spec.batch_size)


def to_device(batch: Batch, device: torch.device, non_blocking: bool) -> Batch:
    """Copy a (possibly pinned) CPU batch to the device; asynchronous from pinned memory."""
    if batch.images.device == device:
        return batch
    return Batch(
        batch.images.to(device, non_blocking=non_blocking),
        batch.labels.to(device, non_blocking=non_blocking),
    )


def _pair(values: Any, key: str) -> tuple[float, float]:
    low, high = (float(v) for v in values)
    if not 0 < low <= high:
        raise ValueError(f"{key} must be two numbers 0 < low <= high, got {list(values)}")
    return low, high


def loader_spec(
    cfg: DictConfig,
    split: Split,
    *,
    train: bool,
    device: torch.device,
    rank: int = 0,
    world_size: int = 1,
) -> LoaderSpec:
    """A LoaderSpec from a run's config (already checked by ``validate_config``); the
    loader-specific keys travel in ``options``."""
    shared = {"name", "batch_size", "num_workers", "prefetch", "pin_memory"}
    loader_cfg = cfg.loader
    return LoaderSpec(
        split=split,
        train=train,
        image_size=cfg.image_size,
        device=device,
        seed=cfg.seed,
        batch_size=loader_cfg.batch_size,
        num_workers=loader_cfg.num_workers,
        prefetch=loader_cfg.prefetch,
        pin_memory=loader_cfg.pin_memory,
        rrc_scale=_pair(cfg.augment.scale, "augment.scale"),
        rrc_ratio=_pair(cfg.augment.ratio, "augment.ratio"),
        rank=rank,
        world_size=world_size,
        options={k: v for k, v in loader_cfg.items() if k not in shared},
    )
