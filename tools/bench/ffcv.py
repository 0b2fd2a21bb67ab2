"""FFCV as a peer in the benchmark report: the other store-based loader users would pick.

FFCV writes a split once into a ``.beton`` file (raw pixels or JPEG, shrunk to a maximum side)
and reads it back with numba-compiled pipelines on threads (``num_workers``). It is measured the
way memmap is used, on the same files: ``write_mode=raw`` and ``jpg`` at memmap's train store's
long side and JPEG quality; train with ``RandomResizedCropRGBImageDecoder`` (the same ranges)
and a flip, val with ``CenterCropRGBImageDecoder`` (the centre crop of Resize + CenterCrop);
uint8 NCHW out, ``os_cache=True``. A loader's first pass compiles (seconds) and is a warm-up,
not measured. numba's dispatcher finalizer may print an ignored ``KeyError``: harmless. FFCV
is installed on demand by ``make bench``; the report goes on without its rows where it is not.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from loaderbench.data.discovery import Split
from loaderbench.imaging.files import load_rgb
from loaderbench.imaging.transforms import RRC_RATIO, RRC_SCALE, val_resize_size

if TYPE_CHECKING:
    from loaderbench.loaders.memmap.build import StorePolicy

# Our store names -> FFCV's write modes.
WRITE_MODES = {"raw": "raw", "jpeg": "jpg"}
# Images a writer process takes at a time (FFCV's default, 100, leaves a worker idle on the
# quick data set).
WRITE_CHUNK = 16


def ffcv_unavailable() -> str | None:
    """Why FFCV cannot be used here (the import's error), or None where it can."""
    try:
        importlib.import_module("ffcv.loader")
    except Exception as error:  # a broken build fails with OSError or numba errors too
        return f"{type(error).__name__}: {error}"
    return None


def ffcv_version() -> str | None:
    """FFCV's installed version where it imports (its ``__version__`` is stale), else None."""
    if ffcv_unavailable() is not None:
        return None
    return importlib.metadata.version("ffcv")


@dataclass(frozen=True)
class FfcvStore:
    """One written ``.beton`` file and what it cost."""

    path: Path
    store: str  # raw | jpeg (our names)
    images: int
    file_bytes: int
    payload_bytes: int  # the images' own bytes (pixels or JPEG), without header and padding
    write_s: float
    write_workers: int

    @property
    def bytes_per_image(self) -> float:
        return self.file_bytes / max(1, self.images)

    @property
    def write_images_per_s_per_core(self) -> float:
        return self.images / self.write_s / self.write_workers

    def as_dict(self) -> dict[str, Any]:
        return {
            "store": self.store,
            "write_mode": WRITE_MODES[self.store],
            "images": self.images,
            "bytes_per_image": self.bytes_per_image,
            "payload_bytes_per_image": self.payload_bytes / max(1, self.images),
            "write_images_per_s_per_core": self.write_images_per_s_per_core,
        }


class _DecodedImages:
    """The split as FFCV's writer reads it: (HWC uint8 RGB array, label) by index, decoded with
    the same PIL path as the memmap build (any colour mode, no EXIF rotation)."""

    def __init__(self, split: Split) -> None:
        self.split = split

    def __len__(self) -> int:
        return len(self.split)

    def __getitem__(self, index: int) -> tuple[np.ndarray, int]:
        image = np.asarray(load_rgb(self.split.paths[index]))
        return image, int(self.split.labels[index])


def write_store(
    split: Split, path: Path, store: str, max_side: int, quality: int, workers: int
) -> FfcvStore:
    """Write ``split`` into ``path`` (replaced if there) as FFCV's ``store`` kind."""
    from ffcv.fields import IntField, RGBImageField
    from ffcv.reader import Reader
    from ffcv.writer import DatasetWriter

    if store not in WRITE_MODES:
        raise ValueError(f"FFCV store must be one of {list(WRITE_MODES)}, not {store!r}")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)
    image_field = RGBImageField(
        write_mode=WRITE_MODES[store], max_resolution=max_side, jpeg_quality=quality
    )
    writer = DatasetWriter(
        str(path), {"image": image_field, "label": IntField()}, num_workers=workers
    )
    started = time.perf_counter()
    writer.from_indexed_dataset(_DecodedImages(split), chunksize=WRITE_CHUNK)
    write_s = time.perf_counter() - started
    payload = int(Reader(str(path)).alloc_table["size"].sum())
    return FfcvStore(path, store, len(split), path.stat().st_size, payload, write_s, workers)


def ffcv_loader(
    path: Path, size: int, train: bool, batch_size: int, workers: int, *, seed: int = 0
) -> Any:
    """FFCV's loader over a written store, yielding (uint8 NCHW images, int64 labels)."""
    from ffcv.fields.decoders import (
        CenterCropRGBImageDecoder,
        IntDecoder,
        RandomResizedCropRGBImageDecoder,
    )
    from ffcv.loader import Loader, OrderOption
    from ffcv.transforms import RandomHorizontalFlip, Squeeze, ToTensor, ToTorchImage

    if train:
        decode = RandomResizedCropRGBImageDecoder((size, size), scale=RRC_SCALE, ratio=RRC_RATIO)
        image = [decode, RandomHorizontalFlip(), ToTensor(), ToTorchImage()]
    else:
        ratio = size / val_resize_size(size)
        image = [CenterCropRGBImageDecoder((size, size), ratio=ratio), ToTensor(), ToTorchImage()]
    return Loader(
        str(path),
        batch_size=batch_size,
        num_workers=max(1, workers),
        os_cache=True,
        order=OrderOption.RANDOM if train else OrderOption.SEQUENTIAL,
        drop_last=train,
        seed=seed,
        pipelines={"image": image, "label": [IntDecoder(), ToTensor(), Squeeze(1)]},
    )


def warm_up(loader: Any) -> float:
    """One unmeasured pass (numba compiles the pipeline on the first): its seconds."""
    started = time.perf_counter()
    for _ in loader:
        pass
    return time.perf_counter() - started


def memmap_train_store(image_size: int) -> StorePolicy:
    """The memmap train store at ``loader=memmap``'s defaults: FFCV's stores take its long side
    and JPEG quality."""
    from loaderbench.loaders.memmap import Settings
    from loaderbench.loaders.memmap.build import StorePolicy

    settings = Settings()
    return StorePolicy.for_split(
        True,
        image_size,
        settings.train_store_ratio,
        settings.train_store_min_side,
        codec="jpeg",
        quality=settings.store_quality,
        max_side=settings.store_max_side,
    )


@dataclass(frozen=True)
class FfcvRun:
    """One store read at one worker count: the meter's figures after the warm-up pass."""

    store: FfcvStore
    workers: int
    warm_up_s: float
    result: dict[str, Any]


def ffcv_runs(
    split: Split,
    train: bool,
    size: int,
    batch_size: int,
    workers: Sequence[int],
    measure: Callable[[Any], dict[str, Any]],
    folder: Path,
) -> Iterator[FfcvRun]:
    """Both stores of ``split`` written into ``folder`` (by ``max(workers)`` processes, as the
    memmap stores are built), each read at every worker count and timed by ``measure``; a
    store's file is removed once read."""
    policy = memmap_train_store(size)
    for store in WRITE_MODES:
        path = folder / f"{split.name}-{store}.beton"
        written = write_store(
            split, path, store, policy.stored_size, policy.quality, max(1, *workers)
        )
        try:
            for count in workers:
                loader = ffcv_loader(path, size, train, batch_size, count)
                warm_up_s = warm_up(loader)
                yield FfcvRun(written, count, warm_up_s, measure(loader))
        finally:
            path.unlink(missing_ok=True)
