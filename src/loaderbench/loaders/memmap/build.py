"""What every memmap store shares: its policy, the ``Store`` interface, and the parallel build.

A store (``loader.store``) keeps a split's images in a cache folder, as decoded pixels
(``store_raw``) or re-encoded JPEG bytes (``store_jpeg``). Every store builds the same way, here:
each image decoded once by ``decode_stored`` as ``StorePolicy`` says, in chunks of
``BUILD_CHUNK`` images by ``num_workers`` processes (``run_chunks``); the folder around a build
(key, lock, atomic commit, checks) is ``cache``'s. The policies:

* val (``crop``): exactly ``pil_val_transform(image_size)``, stored (N, 3, S, S), so a val batch
  needs no work after the gather;
* train (``fit``): the whole image, aspect kept, its long side shrunk to fit an L x L canvas
  (L = round(image_size * train_store_ratio)), channels-last (the CPU's uint8 resize is fastest
  on it), with its true size: each epoch's random-resized crop is drawn inside the true region,
  as torchvision's is from the file.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import shutil
import sys
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import torch
from tensordict import TensorClass
from torch.utils.data import DataLoader, Dataset
from tqdm import tqdm

from loaderbench.data.splits import Split
from loaderbench.imaging import stored
from loaderbench.imaging.decoded_by import add as add_counts
from loaderbench.imaging.decoded_by import counting
from loaderbench.loaders.base import stop_workers
from loaderbench.loaders.memmap.settings import Settings
from loaderbench.platform.stopping import raise_if_stop_requested

# Images a build worker decodes per task: small enough for a lively progress bar.
BUILD_CHUNK = 16
# Rows hashed to check a cache on every open: enough to catch an edited or truncated file
# (sizes catch truncation on their own), few enough to cost milliseconds (~10 MB at 224 px).
SAMPLE_ROWS = 64
DEFAULT_QUALITY = Settings.store_quality  # the one default, in the settings


class CacheError(RuntimeError):
    """A cache folder that cannot be used; the message names the folder."""


class CacheChanged(CacheError):
    """A complete cache whose files no longer match what was built: rebuilt, never read."""


@dataclass(frozen=True)
class StorePolicy:
    """How one split's images are stored: what the cache key and the decoders depend on."""

    kind: str  # "crop" (val) or "fit" (train)
    image_size: int  # the model's input size
    stored_size: int  # crop: image_size; fit: the canvas side L (the stored long side)
    codec: str = "raw"  # the store (loader.store): raw pixels or jpeg bytes
    quality: int = DEFAULT_QUALITY  # jpeg only

    @classmethod
    def for_split(
        cls,
        train: bool,
        image_size: int,
        train_store_ratio: float,
        min_side: int = 0,
        codec: str = "raw",
        quality: int = DEFAULT_QUALITY,
        max_side: int | None = None,
    ) -> StorePolicy:
        if not train:
            return cls("crop", image_size, image_size, codec, quality)
        side = max_side or max(round(image_size * train_store_ratio), min_side)
        return cls("fit", image_size, side, codec, quality)

    @property
    def channels_last(self) -> bool:
        return self.kind == "fit"

    def image_shape(self) -> tuple[int, int, int]:
        s = self.stored_size
        return (s, s, 3) if self.channels_last else (3, s, s)

    def describe(self) -> dict[str, Any]:
        described = {
            "kind": self.kind,
            "image_size": self.image_size,
            "stored_size": self.stored_size,
            "layout": "NHWC" if self.channels_last else "NCHW",
        }
        if self.codec != "raw":  # raw caches keep the keys they had
            described.update(codec=self.codec, quality=self.quality)
        return described


# ---------------------------------------------------------------------------------------------
# Decoding one image as the store keeps it.


def decode_stored(path: str, policy: StorePolicy) -> torch.Tensor:
    """The image as every store keeps it: val (3, S, S), train (h, w, 3) fitted."""
    if policy.kind == "crop":
        return stored.decode_crop(path, policy.stored_size)
    return stored.decode_fit(path, policy.stored_size)


# ---------------------------------------------------------------------------------------------
# Building: every image decoded once, chunk by chunk, in parallel.


@dataclass(frozen=True)
class BuildJob:
    """One build: which images, kept how, into which new folder, by how many processes."""

    split: Split
    policy: StorePolicy
    dest: Path  # the folder the store's files go into (renamed into place by the caller)
    num_workers: int  # decoding processes (0: this one)
    skip_errors: bool  # an unreadable image is recorded and skipped (else: OSError)
    progress: bool = True  # a progress bar on stderr


# (first image, sizes, errors, the chunk's payload, its images by decoding library)
ChunkResult = tuple[int, torch.Tensor, list[tuple[int, str]], Any, dict[str, int]]


class BuildChunks(Dataset):
    """Chunk ``c`` decodes images [c * chunk, (c + 1) * chunk) as the store keeps them, and
    hands each to the store's ``keep``; returns a ``ChunkResult``."""

    missing: Any = None  # the payload item of an unreadable image

    def __init__(self, job: BuildJob, chunk: int = BUILD_CHUNK) -> None:
        self.paths = job.split.paths
        self.policy = job.policy
        self.skip_errors = job.skip_errors
        self.chunk = chunk

    def __len__(self) -> int:
        return -(-len(self.paths) // self.chunk)

    def keep(self, index: int, pixels: torch.Tensor) -> Any:
        """Store image ``index``'s decoded pixels; what it returns goes into the payload."""
        raise NotImplementedError

    def payload(self, items: list[Any]) -> Any:
        return items

    def __getitem__(self, chunk: int) -> ChunkResult:
        start = chunk * self.chunk
        stop = min(start + self.chunk, len(self.paths))
        sizes = torch.zeros((stop - start, 2), dtype=torch.int32)
        errors: list[tuple[int, str]] = []
        items: list[Any] = []
        # The images by the library that decoded them, back from the build worker.
        with counting() as decoded_by:
            self._decode_chunk(start, stop, sizes, errors, items)
        return start, sizes, errors, self.payload(items), decoded_by

    def _decode_chunk(
        self,
        start: int,
        stop: int,
        sizes: torch.Tensor,
        errors: list[tuple[int, str]],
        items: list[Any],
    ) -> None:
        for i in range(start, stop):
            path = self.paths[i]
            try:
                pixels = decode_stored(path, self.policy)
            except Exception as error:
                if not self.skip_errors:
                    raise OSError(f"cannot read image {path}: {error}") from error
                errors.append((i, f"{type(error).__name__}: {error}"))
                items.append(self.missing)
                continue
            hw = pixels.shape[1:] if self.policy.kind == "crop" else pixels.shape[:2]
            sizes[i - start] = torch.tensor(hw)
            items.append(self.keep(i, pixels))


@dataclass
class BuildRecord:
    """What a cache build leaves to record: every image's stored size, the files it skipped,
    its timings and the libraries that decoded."""

    heights: torch.Tensor
    widths: torch.Tensor
    skipped: list[dict[str, Any]]
    decode_s: float = 0.0  # worker start-up included
    steady_images_per_s: float | None = None  # from the first chunk's arrival on
    decoded_by: dict[str, int] = dataclasses.field(default_factory=dict)  # images by library


ChunkSink = Callable[[int, Any], None]  # (first image, the chunk's payload)


def run_chunks(job: BuildJob, chunks: BuildChunks, sink: ChunkSink | None = None) -> BuildRecord:
    """Decode every image, chunk by chunk, in ``job.num_workers`` processes; sizes, skipped
    files and timings come back here (and each chunk's payload goes to ``sink``, in order)."""
    split, num_workers = job.split, job.num_workers
    n, started = len(split), time.perf_counter()
    loader = DataLoader(
        chunks,
        batch_size=None,
        shuffle=False,
        num_workers=num_workers,
        prefetch_factor=4 if num_workers > 0 else None,
        generator=torch.Generator(),  # else DataLoader draws its worker seed from the global RNG
    )
    done = BuildRecord(torch.zeros(n, dtype=torch.int32), torch.zeros(n, dtype=torch.int32), [])
    first_at, first_count = 0.0, 0
    bar = tqdm(
        total=n,
        desc=f"building memmap cache ({split.name})",
        unit="img",
        dynamic_ncols=True,
        disable=not job.progress or None,
        file=sys.stderr,
    )
    in_order = iter(loader)
    try:
        with bar:
            for start, sizes, errors, payload, decoded_by in in_order:
                raise_if_stop_requested()
                add_counts(done.decoded_by, decoded_by)
                done.heights[start : start + len(sizes)] = sizes[:, 0]
                done.widths[start : start + len(sizes)] = sizes[:, 1]
                for index, message in errors:  # named by the loader when an epoch meets it
                    done.skipped.append(
                        {"index": index, "path": split.paths[index], "error": message}
                    )
                if sink is not None:
                    sink(start, payload)
                bar.update(len(sizes))
                if not first_count:
                    first_at, first_count = time.perf_counter(), len(sizes)
    finally:  # a failed image or a stop too: the workers go now, not with the traceback
        stop_workers(in_order)
    done.decode_s = time.perf_counter() - started
    if n > first_count:
        done.steady_images_per_s = (n - first_count) / (time.perf_counter() - first_at)
    done.skipped.sort(key=lambda item: item["index"])
    return done


def reserve_space(folder: Path) -> None:
    """Allocate every (sparse) file of a new cache in full now.

    Writing into a sparse memory map when the disk is full kills the writer with SIGBUS, in a
    worker, at some image; reserved blocks cannot run out, so a disk filled by someone else
    after the free-space check fails here, at once, with ENOSPC naming the folder.
    """
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        fd = os.open(path, os.O_RDWR)
        try:
            os.posix_fallocate(fd, 0, os.fstat(fd).st_size)
        except OSError as error:
            free = shutil.disk_usage(folder).free
            raise CacheError(
                f"memmap cache {folder}: cannot reserve {os.fstat(fd).st_size / 1e9:.2f} GB "
                f"for {path.name} ({error.strerror}; {free / 1e9:.2f} GB free); set "
                f"loader.cache_dir to a larger disk"
            ) from error
        finally:
            os.close(fd)


def fsync_path(path: str | Path) -> None:
    """Flush one file (memory-mapped writes included) or folder to disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(folder: Path) -> None:
    """Flush every file and folder under ``folder`` to disk."""
    for dirpath, _, filenames in os.walk(folder):
        for name in filenames:
            fsync_path(os.path.join(dirpath, name))
        fsync_path(dirpath)


# ---------------------------------------------------------------------------------------------
# The stores.


class Store(ABC):
    """One way of keeping a split's images (a ``loader.store`` value): the fields its cache
    folder maps, how they are built, and how an image is read back as stored."""

    name: ClassVar[str]  # the loader.store value
    cache_type: ClassVar[type[TensorClass]]  # its fields, memory-mapped in the cache folder

    @abstractmethod
    def bytes_per_image(self, policy: StorePolicy) -> int:
        """An image's bytes on disk, for the space check before a build (an estimate where
        they are known only after it)."""

    @abstractmethod
    def build(self, job: BuildJob) -> tuple[Any, BuildRecord]:
        """Every image of ``job.split``, decoded by ``run_chunks``, into new files in
        ``job.dest``: the mapped cache (its heights and widths still to be written) and what
        decoding left."""

    @abstractmethod
    def stored_bytes(self, cache: Any, row: int) -> torch.Tensor:
        """Image ``row`` as stored."""

    @abstractmethod
    def shape_problem(self, cache: Any, policy: StorePolicy, n: int) -> str:
        """What does not fit ``policy`` and ``n`` images in a mapped cache ('' when all does)."""

    def per_image_fields(self, cache: Any) -> list[torch.Tensor]:
        """The small fields, one entry per image: hashed in full by ``sample_digest``."""
        return [cache.labels, cache.heights, cache.widths]

    def load(self, folder: Path) -> Any:
        """Map a cache folder's fields."""
        return self.cache_type.load_memmap(folder)

    def sample_digest(self, cache: Any) -> str:
        """A hash of the small fields in full and of ``SAMPLE_ROWS`` image rows spread evenly."""
        n = len(cache.labels)
        digest = hashlib.blake2b(digest_size=16)
        for field in self.per_image_fields(cache):
            digest.update(field.contiguous().numpy().tobytes())
        for row in torch.linspace(0, n - 1, min(n, SAMPLE_ROWS)).round().long().unique().tolist():
            digest.update(self.stored_bytes(cache, row).contiguous().numpy().tobytes())
        return digest.hexdigest()
