"""``loader=memmap``: whole batches gathered from a decoded uint8 cache on disk, then augmented.

The tensordict tutorial's "Batched data loading with tensorclasses", made to be relied on and
faster: the cache (``cache``) is built once, atomically, and reused; a batch is one gather from
the memory-mapped store into a pooled buffer (numpy's ``take``: steadier than ``index_select``
on busy cores) or, for a raw train batch on the CPU, each box resized straight from its row;
reading threads (``reading``) work ahead through the run. How each store and device makes its
batch, and the measurements behind it: docs/loaders.md, "How a batch is made".
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from loaderbench.batch_resize import warm_up
from loaderbench.buffers import BufferPool, pool_stats
from loaderbench.data import resolve_path
from loaderbench.decode import (
    CPU,
    Box,
    Decoded,
    backend,
    decode_batch,
    hand_over,
    region_decode,
)
from loaderbench.decoded_by import add as add_counts
from loaderbench.decoded_by import counting
from loaderbench.device_resize import resize_boxes, resize_images
from loaderbench.loaders.base import Batch, Loader, LoaderSpec, register_loader
from loaderbench.loaders.memmap.build import StorePolicy
from loaderbench.loaders.memmap.cache import OpenedCache, ensure_cache
from loaderbench.loaders.memmap.device_work import ThreadStreams
from loaderbench.loaders.memmap.reading import ReadingThreads
from loaderbench.loaders.memmap.settings import Settings
from loaderbench.loaders.memmap.store_jpeg import JpegCache
from loaderbench.transforms import crop_resize_flip_rows, resized_crop_images


@dataclass
class _Gathered:
    """A batch as the reading threads hand it over: finished, on the CPU or (CUDA) on the
    device, where ``ready`` says when the thread's stream has made it."""

    images: torch.Tensor
    labels: torch.Tensor
    ready: torch.cuda.Event | None = None
    decoded_by: dict[str, int] | None = None  # a jpeg store's images, by decoding library
    indices: torch.Tensor | None = None  # the images' dataset indices (CPU), set by ``_read``


def _regions(boxes: torch.Tensor | None, count: int) -> list[Box | None]:
    """What to decode of each image: its train box, or (val) all of it."""
    if boxes is None:
        return [None] * count
    return [tuple(box) for box in boxes.tolist()]  # type: ignore[misc]


def _within_box(boxes: torch.Tensor) -> torch.Tensor:
    """The boxes in the coordinates of their own decoded region: each the whole region."""
    inside = boxes.clone()
    inside[:, :2] = 0
    return inside


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
        self._jpeg = isinstance(data, JpegCache)
        if isinstance(data, JpegCache):  # memory-mapped bytes, found by offset and length
            self._bytes: torch.Tensor = data.data
            # A plain tensor over the same mapped bytes: an image's bytes are a slice of it,
            # which through the tensordict subclass costs 7x the slice (docs/measurements.md).
            self._plain_bytes = data.data.as_subclass(torch.Tensor)
            self._spans = torch.stack([data.offsets, data.offsets + data.lengths], 1).tolist()
            stored_row: tuple[int, ...] = ()
        else:  # memory-mapped rows: read a batch at a time
            self._images: torch.Tensor = data.images
            self._images_np = self._images.numpy()
            # A plain tensor over the same mapped rows: train boxes are views of it, and a
            # tensor subclass would add its dispatch to every one of them.
            self._rows = self._images.as_subclass(torch.Tensor)
            stored_row = tuple(self._images.shape[1:])
        # The small fields live in memory: a gather from them costs nothing.
        self._labels = data.labels.clone()
        self._heights = data.heights.clone()
        self._widths = data.widths.clone()
        self._valid: torch.Tensor | None = None
        if skipped:
            self._valid = torch.ones(len(spec.split), dtype=torch.bool)
            self._valid[[item["index"] for item in skipped]] = False
        # Why the build could not read each file it left out; named when an epoch meets it.
        self._errors: dict[int, str] = {item["index"]: item["error"] for item in skipped}
        self._decoded_by: dict[str, int] = {}  # a jpeg store's delivered images, by library
        self._live: weakref.WeakSet = weakref.WeakSet()  # iterators not yet finished
        self._reading: ReadingThreads[_Gathered | None] | None = None  # for the run
        self._lock = threading.Lock()
        # Raw train rows are cropped where the batch goes (the GPU); a jpeg store's batch is
        # decoded there too, by one batched nvJPEG call, then cropped image by image; both by
        # the reading threads, each on its own stream (``device_work``).
        self._crop_on_device = spec.train and spec.device.type != "cpu" and not self._jpeg
        self._decode_on_device = self._jpeg and spec.device.type == "cuda"
        # Enough buffers for the batches in flight, the one the caller holds, and one spare.
        capacity = self.batches_in_flight() + 2
        pin, size = spec.use_pinned_memory, spec.image_size
        self._gather_pool = BufferPool((spec.batch_size, *stored_row), capacity, pin=pin)
        self._crop_pool = BufferPool((spec.batch_size, size, size, 3), capacity)
        self._label_pool = BufferPool((spec.batch_size,), capacity, dtype=torch.int64, pin=pin)
        what = "loader=memmap with a jpeg store on CUDA"
        self._threads = ThreadStreams(spec.device, jpeg=self._decode_on_device, what=what)
        if self._jpeg:  # the backend chosen now, not by the first reading thread
            self._jpeg_stats()
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

    def _read(self, epoch: int, indices: torch.Tensor) -> _Gathered | None:
        """Read one batch of the order (runs in a reading thread), less the files the cache
        was built without; None when all its files were."""
        if self._valid is not None:
            indices = indices[self._valid[indices]]
            if not len(indices):
                return None
        gathered = self._gather(epoch, indices)
        gathered.indices = indices
        return gathered

    def _gather(self, epoch: int, indices: torch.Tensor) -> _Gathered:
        """Read the images ``indices``, every one in the cache."""
        if self._jpeg:
            with counting() as counts:
                gathered = self._decode(epoch, indices)
            gathered.decoded_by = counts
            return gathered
        n = len(indices)
        labels = torch.index_select(self._labels, 0, indices, out=self._label_pool.take(n))
        if self.spec.train and not self._crop_on_device:
            return _Gathered(self._crop_rows(epoch, indices), labels)
        rows = self._gather_pool.take(n)
        # numpy's take: one memcpy per row, GIL released, single-threaded. torch.index_select
        # does the same work but through intra-op threads, which on a busy machine wait on each
        # other (2-10x slower when the cores are shared); mode="clip" writes straight to `out`.
        np.take(self._images_np, indices.numpy(), axis=0, out=rows.numpy(), mode="clip")
        # Train rows are stored channels-last: this is an NCHW view of them, not a copy.
        images = rows.permute(0, 3, 1, 2) if self.policy.channels_last else rows
        if not self.spec.train and self.spec.device.type != "cuda":
            return _Gathered(images, labels)
        # Cropped on the device: the whole rows travel, and this thread crops them there.
        boxes, flips = self._train_boxes(epoch, indices) if self.spec.train else (None, None)
        return self._finish_on_thread_stream(images, labels, boxes, flips)

    def _finish_on_thread_stream(
        self,
        images: torch.Tensor,
        labels: torch.Tensor,
        boxes: torch.Tensor | None,
        flips: torch.Tensor | None,
    ) -> _Gathered:
        """Gathered rows copied to the device and (train) cropped there, by this reading
        thread on its own stream: the whole batch in a few kernels (``resize_boxes``)."""
        device, size = self.spec.device, self.spec.image_size
        with self._threads.on_stream():
            on_device = self._gather_pool.to_device(images, device)
            labels = self._label_pool.to_device(labels, device)
            if boxes is not None:
                on_device = resize_boxes(on_device, boxes, size, flips)
            return _Gathered(on_device, labels, self._threads.ready())

    def _train_boxes(self, epoch: int, indices: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Boxes inside each image's stored size (the distribution of a crop of the original
        file) and flips, from the run's seed, ``epoch`` and the image."""
        heights, widths = self._heights[indices], self._widths[indices]
        return self.spec.random_crops(heights, widths, epoch, indices)

    def _crop_rows(self, epoch: int, indices: torch.Tensor) -> torch.Tensor:
        """A raw train batch on the CPU: each box resized (and flipped) straight from the
        memory-mapped rows into a pooled batch, so only the boxes' lines are read and no row is
        gathered first (half of a stored row, on average, is outside its box)."""
        boxes, flips = self._train_boxes(epoch, indices)
        out = self._crop_pool.take(len(indices)).permute(0, 3, 1, 2)
        return crop_resize_flip_rows(self._rows, indices, boxes, self.spec.image_size, flips, out)

    def _decode(self, epoch: int, indices: torch.Tensor) -> _Gathered:
        """A jpeg store's batch: each image's bytes decoded (a train image's box only; GIL
        released), then resized and flipped (train) or taken as stored (val) into one batch."""
        spans = [self._spans[i] for i in indices.tolist()]
        labels = torch.index_select(self._labels, 0, indices, out=self._label_pool.take(len(spans)))
        boxes = flips = None
        if self.spec.train:  # in the stored image's coordinates, from its stored size
            boxes, flips = self._train_boxes(epoch, indices)
        encoded = [self._plain_bytes[start:stop] for start, stop in spans]
        if self._decode_on_device:  # decoded where the batch goes, by this thread's decoder
            encoded = [data.clone() for data in encoded]
            return self._decode_on_thread_stream(encoded, indices, labels, boxes, flips)
        # The store's own JPEGs, which the build encoded: no admission parse (``admitted``),
        # and the batch in one call (as fast as one a file, and one GIL release).
        decoded = decode_batch(encoded, CPU, _regions(boxes, len(spans)), admitted=True)
        out = self._crop_pool.take(len(decoded)).permute(0, 3, 1, 2)
        images = self._whole(decoded, indices)
        return _Gathered(self._finish(images, boxes, flips, out), labels)

    def _whole(self, decoded: list[Decoded], indices: torch.Tensor) -> list[torch.Tensor]:
        """The decoded images of a batch; the cache was built from images that decoded, so
        one that fails now is a damaged cache, named with the image and its source file."""
        for image, index in zip(decoded, indices.tolist(), strict=True):
            if isinstance(image, BaseException):
                raise OSError(
                    f"memmap cache {self.cache.path}: stored image {index} (from "
                    f"{self.spec.split.paths[index]}) does not decode: {image}"
                ) from image
        return decoded  # type: ignore[return-value]

    def _finish(
        self,
        images: list[torch.Tensor],
        boxes: torch.Tensor | None,
        flips: torch.Tensor | None,
        out: torch.Tensor,
    ) -> torch.Tensor:
        """Decoded images into one batch: the stored val crops as they are, train boxes (each
        decoded alone: its image is the box) resized and flipped; off the CPU, each a batched
        call (no Python an image but the list itself)."""
        if boxes is None:
            torch._foreach_copy_(list(out.unbind(0)), images)
            return out
        if out.device.type != "cpu":
            return resize_images(images, self.spec.image_size, flips, out)
        return resized_crop_images(images, _within_box(boxes), self.spec.image_size, flips, out)

    def _decode_on_thread_stream(
        self,
        encoded: list[torch.Tensor],
        indices: torch.Tensor,
        labels: torch.Tensor,
        boxes: torch.Tensor | None,
        flips: torch.Tensor | None,
    ) -> _Gathered:
        """One batched call of this reading thread's decoder (nvJPEG on CUDA) for the batch's
        bytes, its crops and the labels' copy on the thread's stream."""
        device, size = self.spec.device, self.spec.image_size

        def finish(decoded: list[Decoded]) -> torch.Tensor:
            out = torch.empty((len(decoded), 3, size, size), dtype=torch.uint8, device=device)
            return self._finish(self._whole(decoded, indices), boxes, flips, out)

        regions = _regions(boxes, len(encoded))
        with self._threads.on_stream():
            images, _ = self._threads.decoder().run(encoded, finish, regions, admitted=True)
            labels = self._label_pool.to_device(labels, device)
            return _Gathered(images, labels, self._threads.ready())

    def _deliver(self, gathered: _Gathered) -> Batch:
        """A gathered batch on the device (runs in the caller): one finished on a reading
        thread's stream is waited for there (no host wait); CPU rows are copied."""
        hand_over(gathered.ready, gathered.images, gathered.labels)
        add_counts(self._decoded_by, gathered.decoded_by)
        device = self.spec.device
        images = self._gather_pool.to_device(gathered.images, device)
        labels = self._label_pool.to_device(gathered.labels, device)
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

    def _reading_threads(self) -> ReadingThreads[_Gathered | None]:
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
            **(self._jpeg_stats() if self._jpeg else {}),
            **self._decoded_by_stats(),
            **self._buffer_stats(),
        }

    def _decoded_by_stats(self) -> dict[str, Any]:
        """``decoded_by``: the images this run decoded, by library: a jpeg store's batch by
        batch; a raw store's, its build's where this run built the cache (a run served from
        an earlier build decodes nothing). ``cache_decoded_by``: what made the stored pixels
        or re-encoded bytes, as the build counted (absent for a cache built before it
        counted)."""
        build = self.cache.meta.get("decoded_by")
        if self._jpeg:
            counts: dict[str, int] = dict(self._decoded_by)
        else:
            counts = dict(build or {}) if self.cache.built else {}
        return {
            "decoded_by": counts,
            **({} if build is None else {"cache_decoded_by": dict(build)}),
        }

    def _jpeg_stats(self) -> dict[str, Any]:
        """The library that decodes the store, and whether it decodes train boxes alone."""
        where = self.spec.device if self._decode_on_device else torch.device("cpu")
        return {
            "jpeg_backend": backend(where),
            "region_decode": self.spec.train and region_decode(where),
        }

    def _buffer_stats(self) -> dict[str, Any]:
        pools = (self._gather_pool, self._crop_pool, self._label_pool)
        return pool_stats(pools, pinned=self.spec.use_pinned_memory)

    def stored_bytes(self) -> int:
        """The images' bytes on disk: rows of pixels, or the JPEG bytes."""
        return self._bytes.numel() if self._jpeg else self._images.numel()

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
