"""``loader=memmap``: whole batches gathered from a decoded uint8 cache on disk, then augmented.

The tensordict tutorial's "Batched data loading with tensorclasses", made to be relied on and
faster: the cache (``cache``) is built once, atomically, and reused; a batch is one gather from
the memory-mapped store into a pooled buffer (numpy's ``take``: steadier than ``index_select``
on busy cores) or, for a raw train batch on the CPU, each box resized straight from its row;
reading threads (``reading``) work ahead through the run. Each store makes its batches its own
way, on the CPU or the device (``rows`` for the raw store, ``jpegs`` for the jpeg store, chosen
once by ``store_batches``); how, and the measurements behind it: docs/loaders.md, "How a batch
is made".
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from collections.abc import Iterator
from typing import Any, Protocol

import torch

from loaderbench.data.discovery import resolve_path
from loaderbench.imaging.batch_resize import warm_up
from loaderbench.imaging.decode import hand_over
from loaderbench.imaging.decoded_by import add as add_counts
from loaderbench.loaders.base import Batch, Loader, LoaderSpec, register_loader
from loaderbench.loaders.memmap._cache import OpenedCache, ensure_cache
from loaderbench.loaders.memmap._device_work import ThreadStreams
from loaderbench.loaders.memmap._jpegs import DecodedOnCpu, DecodedOnDevice
from loaderbench.loaders.memmap._parts import BatchParts, Gathered
from loaderbench.loaders.memmap._reading import ReadingThreads
from loaderbench.loaders.memmap._rows import CroppedRows, GatheredRows, RowsOnDevice
from loaderbench.loaders.memmap._store_jpeg import JpegCache
from loaderbench.loaders.memmap.build import StorePolicy
from loaderbench.loaders.memmap.settings import Settings
from loaderbench.measure.metrics import DECODED_BY


class StoreBatches(Protocol):
    """How one store's batches are made (``rows`` for the raw store, ``jpegs`` for the jpeg
    store), by the reading threads."""

    def read(self, epoch: int, indices: torch.Tensor) -> Gathered: ...

    def stored_bytes(self) -> int: ...

    def stats(self) -> dict[str, Any]: ...


def store_policy(spec: LoaderSpec) -> StorePolicy:
    """How ``spec``'s split is stored: the store, its size and quality."""
    settings: Settings = spec.settings  # type: ignore[assignment]
    return StorePolicy.for_split(
        spec.train,
        spec.image_size,
        settings.train_store_ratio,
        settings.train_store_min_side,
        codec=settings.store if spec.train else settings.val_store,
        quality=settings.store_quality,
        max_side=settings.store_max_side,
    )


def store_batches(
    cache: OpenedCache, parts: BatchParts, policy: StorePolicy, *, on_device: bool | None = None
) -> StoreBatches:
    """How the run's batches are made from ``cache``'s store: where (``on_device``: the
    reading threads finish them on the run's device; by default where the device allows) and
    with what (rows gathered or cropped, or JPEG bytes decoded)."""
    data, spec = cache.data, parts.spec
    if isinstance(data, JpegCache):
        if on_device is None:
            on_device = spec.device.type == "cuda"
        return (DecodedOnDevice if on_device else DecodedOnCpu)(data, parts, str(cache.path))
    if on_device is None:  # val crops go as they are, but for a copy on a CUDA thread's stream
        on_device = spec.device.type == "cuda" or (spec.train and spec.device.type != "cpu")
    if on_device:
        return RowsOnDevice(data, parts, policy.channels_last)
    return (CroppedRows if spec.train else GatheredRows)(data, parts, policy.channels_last)


def open_cache(spec: LoaderSpec, policy: StorePolicy) -> OpenedCache:
    """The split's cache, built first with ``spec.num_workers`` processes if missing."""
    settings: Settings = spec.settings  # type: ignore[assignment]
    return ensure_cache(
        spec.split,
        policy,
        resolve_path(settings.cache_dir),
        num_workers=spec.num_workers,
        skip_errors=spec.skip_errors,
    )


@register_loader("memmap")
class MemmapLoader(Loader):
    """Builds or opens the split's cache on construction (so ``ttfb_s`` is a read, never a
    build), then serves shuffled, sharded, augmented batches from it."""

    def __init__(self, spec: LoaderSpec) -> None:
        super().__init__(spec)
        self.policy = store_policy(spec)
        self.cache: OpenedCache = open_cache(spec, self.policy)
        skipped = self.cache.skipped
        if skipped and not spec.skip_errors:
            first = skipped[0]  # named by this run's path: the cache may be from a copy
            raise OSError(
                f"dataset.on_error=raise, but memmap cache {self.cache.path} was built skipping "
                f"{len(skipped)} unreadable files, the first {spec.split.paths[first['index']]}: "
                f"{first['error']}"
            )
        data = self.cache.data
        self._valid: torch.Tensor | None = None
        if skipped:
            self._valid = torch.ones(len(spec.split), dtype=torch.bool)
            self._valid[[item["index"] for item in skipped]] = False
        # Why the build could not read each file it left out; named when an epoch meets it.
        self._errors: dict[int, str] = {item["index"]: item["error"] for item in skipped}
        self._decoded_by: dict[str, int] = {}  # a jpeg store's delivered images, by library
        self._live: weakref.WeakSet = weakref.WeakSet()  # iterators not yet finished
        self._reading: ReadingThreads[Gathered | None] | None = None  # for the run
        self._lock = threading.Lock()
        jpeg = isinstance(data, JpegCache)
        stored_row = () if jpeg else tuple(data.images.shape[1:])
        # Enough buffers for the batches in flight, the one the caller holds, and one spare.
        capacity = self.batches_in_flight() + 2
        # Raw train rows are cropped where the batch goes (the GPU); a jpeg store's batch is
        # decoded there too, by one batched nvJPEG call; both by the reading threads, each on
        # its own stream (``device_work``).
        what = "loader=memmap with a jpeg store on CUDA"
        threads = ThreadStreams(spec.device, jpeg=jpeg, what=what)
        self.parts = BatchParts(spec, data, stored_row, capacity, threads)
        self.batches = store_batches(self.cache, self.parts, self.policy)
        self.batches.stats()  # a jpeg store's decoder chosen now, not by the first reading thread
        if spec.train and spec.device.type == "cpu":  # the crop loops compiled now, too
            warm_up()

    @classmethod
    def prepare(cls, spec: LoaderSpec) -> dict[str, Any]:
        """The cache built (when missing) with ``spec.num_workers`` processes, so that a
        loader built later with fewer reading threads opens it instead of building it."""
        opened = open_cache(spec, store_policy(spec))
        opened.release()
        return {"cache_built": True} if opened.built else {}

    def batches_in_flight(self) -> int:
        """``prefetch`` batches ahead in total, at least one per reading thread."""
        return max(self.spec.prefetch, self.spec.num_workers)

    def queue_depth(self) -> int:
        """The batches submitted to the reading threads ahead of the loop (none: read in the
        loop's thread when asked)."""
        return self.batches_in_flight() if self.spec.num_workers > 0 else 0

    def batches_ahead(self) -> tuple[int, int] | None:
        """The reading threads' batches read and being read (None: read in the loop's thread)."""
        reading = self._reading
        return reading.in_flight() if reading is not None and self.spec.num_workers else None

    def _read(self, epoch: int, indices: torch.Tensor) -> Gathered | None:
        """Read one batch of the order (runs in a reading thread), less the files the cache
        was built without; None when all its files were."""
        if self._valid is not None:
            indices = indices[self._valid[indices]]
            if not len(indices):
                return None
        gathered = self.batches.read(epoch, indices)
        gathered.indices = indices
        return gathered

    def _deliver(self, gathered: Gathered) -> Batch:
        """A gathered batch on the device (runs in the caller): one finished on a reading
        thread's stream is waited for there (no host wait); CPU rows are copied."""
        hand_over(gathered.ready, gathered.images, gathered.labels)
        add_counts(self._decoded_by, gathered.decoded_by)
        images, labels = self.parts.deliver(gathered.images, gathered.labels)
        assert gathered.indices is not None, "a batch is read by ``_read``"
        return Batch(images, labels, gathered.indices)

    def _account(self, indices: torch.Tensor) -> None:
        """Count, and name once, the files of a batch that the cache was built without (as
        the other loaders do when an epoch meets a file they cannot read)."""
        if not self._errors:
            return
        for index in indices.tolist():
            if index in self._errors:
                self.skip_unreadable(index, self._errors[index])

    def __iter__(self) -> Iterator[Batch]:
        reading, batches = self._reading, None
        if reading is not None and self.start_batch == 0:  # the order read ahead, not again
            batches = reading.order_read_ahead(self.epoch)
        if batches is None:
            batches = self.spec.epoch_batches(self.epoch, self.start_batch)
        self.position = self.start_batch
        iterator = self._iterate(self.epoch, batches)
        self._live.add(iterator)
        return iterator

    def _iterate(self, epoch: int, batches: list[torch.Tensor]) -> Iterator[Batch]:
        if self.spec.num_workers == 0:
            for indices in batches:
                gathered = self._read(epoch, indices)
                self._account(indices)
                self.position += 1  # a batch of files the cache was built without: left out
                if gathered is not None:
                    yield self._deliver(gathered)
            return
        reading = self._reading_threads()
        from_start = self.start_batch == 0
        # Train epochs read ahead into the next one; a val pass is one pass (an evaluation, or
        # between train epochs) whose few batches a read ahead would mostly make before it.
        ahead = self.next_epoch and self.spec.train
        for indices, gathered in reading.iterate(epoch, batches, from_start, ahead):
            self._account(indices)
            self.position += 1
            if gathered is not None:
                yield self._deliver(gathered)

    def _reading_threads(self) -> ReadingThreads[Gathered | None]:
        """The run's reading threads, started at the first epoch and kept until ``close``."""
        with self._lock:
            if self._reading is None:
                self._reading = ReadingThreads(
                    self.spec.num_workers,
                    self.batches_in_flight(),
                    self._read,
                    self.spec.epoch_batches,
                )
            return self._reading

    def queued_at_start(self) -> int:
        """The next epoch's first batches, read ahead while the last one ended."""
        reading = self._reading
        if reading is None or self.start_batch != 0:
            return 0
        return reading.ahead_of(self.epoch)

    def stats(self) -> dict[str, Any]:
        meta = self.cache.meta
        return {
            **super().stats(),
            "cache_path": str(self.cache.path),
            "cache_built": self.cache.built,
            "cache_build_s": meta["build_s"],
            "cache_build_workers": meta["build_workers"],
            "cache_build_images_per_s": meta["build_images_per_s"],
            "cache_build_steady_images_per_s": meta["build_steady_images_per_s"],
            "cache_store": self.policy.codec,
            "cache_gb": self.stored_bytes() / 1e9,
            "bytes_per_image": self.stored_bytes() / max(1, len(self.spec.split)),
            **self.batches.stats(),
            **self._decoded_by_stats(),
            **self.parts.stats(),
        }

    def _decoded_by_stats(self) -> dict[str, Any]:
        """``decoded_by``: the images this run decoded, by library: a jpeg store's batch by
        batch; a raw store's, its build's where this run built the cache (a run served from
        an earlier build decodes nothing). ``cache_decoded_by``: what made the stored pixels
        or re-encoded bytes, as the build counted (absent for a cache built before it
        counted)."""
        build = self.cache.meta.get(DECODED_BY)
        if isinstance(self.cache.data, JpegCache):
            counts: dict[str, int] = dict(self._decoded_by)
        else:
            counts = dict(build or {}) if self.cache.built else {}
        return {
            DECODED_BY: counts,
            **({} if build is None else {"cache_decoded_by": dict(build)}),
        }

    def stored_bytes(self) -> int:
        """The images' bytes on disk: rows of pixels, or the JPEG bytes."""
        return self.batches.stored_bytes()

    def close(self) -> None:
        for iterator in list(self._live):
            # ValueError: running in another thread right now; its pool is shut down below.
            with contextlib.suppress(ValueError):
                iterator.close()
        with self._lock:
            reading, self._reading = self._reading, None
        if reading is not None:
            reading.close()
        self.cache.release()
