"""``loader.store=raw``: every image decoded once into a fixed-size uint8 row of one mapped file.

Reading a batch is then one gather from the page cache, with nothing to decode: val rows are
the finished crops (N, 3, S, S); train rows (N, L, L, 3) hold the fitted image at the top left,
its true size in ``heights``/``widths`` (``build`` explains both policies).
"""

from __future__ import annotations

import math
from pathlib import Path

import torch
from tensordict import MemoryMappedTensor, TensorClass

from loaderbench.data.splits import Split
from loaderbench.loaders.memmap.build import (
    BuildChunks,
    BuildJob,
    BuildRecord,
    Store,
    StorePolicy,
    reserve_space,
    run_chunks,
)


class ImageCache(TensorClass):
    """One split, decoded: the memory-mapped fields of a cache folder."""

    images: torch.Tensor  # uint8; val: (N, 3, S, S); train: (N, L, L, 3), image at the top left
    labels: torch.Tensor  # int64 (N,)
    heights: torch.Tensor  # int32 (N,): the stored image's true height (0: skipped file)
    widths: torch.Tensor  # int32 (N,): the stored image's true width (0: skipped file)


def write_fit(row: torch.Tensor, pixels: torch.Tensor) -> None:
    """Put an (h, w, 3) image at the top left of an (L, L, 3) row, plus one replicated pixel
    right of and below it: a bilinear sampler (roi_align) reads up to half a pixel past a box's
    edge, and must find the edge there, not black padding."""
    h, w = pixels.shape[:2]
    row[:h, :w] = pixels
    if w < row.shape[1]:
        row[:h, w] = row[:h, w - 1]
    if h < row.shape[0]:
        row[h, : w + 1] = row[h - 1, : w + 1]


class _RawChunks(BuildChunks):
    """Decoded pixels written straight into the mapped file. Workers open the images file by
    path, shared and writable, so pixels go to the page cache once, with no copy through the
    main process; they return only sizes and errors."""

    def __init__(self, job: BuildJob, images_file: str) -> None:
        super().__init__(job)
        self.images_file = images_file
        self.shape = (len(job.split), *job.policy.image_shape())
        self._images: torch.Tensor | None = None

    def _rows(self) -> torch.Tensor:
        if self._images is None:  # opened in the worker, after the fork
            self._images = MemoryMappedTensor.from_filename(
                self.images_file, torch.uint8, self.shape, mode="r+"
            )
        return self._images

    def keep(self, index: int, pixels: torch.Tensor) -> None:
        if self.policy.kind == "crop":
            self._rows()[index].copy_(pixels)
        else:
            write_fit(self._rows()[index], pixels)

    def payload(self, items: list[object]) -> None:
        return None


def allocate(dest: Path, split: Split, policy: StorePolicy) -> ImageCache:
    """A new raw cache's files in ``dest``, every block reserved, the labels written."""
    n = len(split)
    # Shapes only (one element, expanded): memmap_like allocates the files, sparse, without
    # ever holding the split in memory; unwritten bytes (the padding) read as zeros.
    template = ImageCache(
        images=torch.empty((1, *policy.image_shape()), dtype=torch.uint8).expand(n, -1, -1, -1),
        labels=torch.empty(1, dtype=torch.int64).expand(n),
        heights=torch.empty(1, dtype=torch.int32).expand(n),
        widths=torch.empty(1, dtype=torch.int32).expand(n),
        batch_size=[n],
    )
    cache = template.memmap_like(dest)
    reserve_space(dest)
    cache.labels.copy_(torch.tensor(split.labels, dtype=torch.int64))
    return cache


class RawStore(Store):
    name = "raw"
    cache_type = ImageCache

    def bytes_per_image(self, policy: StorePolicy) -> int:
        return math.prod(policy.image_shape())

    def build(self, job: BuildJob) -> tuple[ImageCache, BuildRecord]:
        """Decoded pixels, written by the workers straight into the mapped rows."""
        cache = allocate(job.dest, job.split, job.policy)
        return cache, run_chunks(job, _RawChunks(job, str(cache.images.filename)))

    def stored_bytes(self, cache: ImageCache, row: int) -> torch.Tensor:
        return cache.images[row]

    def shape_problem(self, cache: ImageCache, policy: StorePolicy, n: int) -> str:
        expected = (n, *policy.image_shape())
        if tuple(cache.images.shape) != expected or cache.images.dtype != torch.uint8:
            return (
                f"images are {cache.images.dtype} {tuple(cache.images.shape)}, "
                f"expected uint8 {expected}"
            )
        return ""
