"""``loader.store=jpeg``: every image decoded and shrunk once as the raw store keeps it, then
re-encoded as JPEG at ``loader.store_quality``; the bytes lie back to back in one flat mapped
file, found by offset and length, and are decoded again per batch by the loader.
"""

from __future__ import annotations

import math
import os

import torch
from tensordict import TensorClass

from loaderbench.imaging.stored import encode_jpeg_bytes
from loaderbench.loaders.memmap.build import (
    BuildChunks,
    BuildJob,
    BuildRecord,
    Store,
    StorePolicy,
    run_chunks,
)

# What JPEG at quality 90-95 keeps of raw pixels, for the space check before a build: above
# what photos keep (docs/measurements.md, "Figures moved from the comments").
JPEG_BYTES_ESTIMATE = 0.25
# The bytes as the build appends them; renamed to the data field's file at its end.
BYTES_FILE = "jpeg-bytes.tmp"


class JpegCache(TensorClass):
    """One split, re-encoded (``loader.store=jpeg``): every image's JPEG bytes back to back in
    one flat memory-mapped byte tensor, found by offset and length; no batch dimension, since
    the bytes and the per-image fields differ in length."""

    data: torch.Tensor  # uint8 (total bytes,)
    offsets: torch.Tensor  # int64 (N,): where image i's bytes start in data
    lengths: torch.Tensor  # int32 (N,): how many (0: skipped file)
    labels: torch.Tensor  # int64 (N,)
    heights: torch.Tensor  # int32 (N,): the stored image's height (0: skipped file)
    widths: torch.Tensor  # int32 (N,)


def encode_stored(pixels: torch.Tensor, policy: StorePolicy) -> torch.Tensor:
    """JPEG bytes (uint8, 1-D) of a decoded stored image, at ``policy.quality``."""
    chw = pixels if policy.kind == "crop" else pixels.permute(2, 0, 1)
    return encode_jpeg_bytes(chw, policy.quality)


class _JpegChunks(BuildChunks):
    """Re-encoded JPEG bytes, sent back to the main process, which appends them to the
    store's one file. Plain bytes, not tensors: a tensor crosses from a worker as a
    shared-memory file descriptor, one per image, which is a lot of descriptor traffic."""

    missing = b""

    def keep(self, index: int, pixels: torch.Tensor) -> bytes:
        return encode_stored(pixels, self.policy).numpy().tobytes()


class JpegStore(Store):
    name = "jpeg"
    cache_type = JpegCache

    def bytes_per_image(self, policy: StorePolicy) -> int:
        return math.ceil(math.prod(policy.image_shape()) * JPEG_BYTES_ESTIMATE)

    def build(self, job: BuildJob) -> tuple[JpegCache, BuildRecord]:
        """Re-encoded JPEGs: the workers encode, this process appends the bytes to one file,
        which then becomes the ``data`` field's memory-mapped file (no second copy)."""
        n, dest = len(job.split), job.dest
        offsets = torch.zeros(n, dtype=torch.int64)
        lengths = torch.zeros(n, dtype=torch.int32)
        dest.mkdir(parents=True, exist_ok=True)
        with open(dest / BYTES_FILE, "wb") as out:  # a full disk: ENOSPC here, at once

            def append(start: int, encoded: list[bytes]) -> None:
                for i, data in enumerate(encoded, start):
                    offsets[i], lengths[i] = out.tell(), len(data)
                    out.write(data)

            decoded = run_chunks(job, _JpegChunks(job), append)
            total = out.tell()
        template = JpegCache(
            data=torch.empty(1, dtype=torch.uint8).expand(total),
            offsets=offsets,
            lengths=lengths,
            labels=torch.tensor(job.split.labels, dtype=torch.int64),
            heights=decoded.heights,
            widths=decoded.widths,
            batch_size=[],
        )
        cache = template.memmap_like(dest)
        cache.offsets.copy_(offsets)
        cache.lengths.copy_(lengths)
        cache.labels.copy_(template.labels)
        data_file = cache.data.filename
        del cache  # the placeholder file (sparse, of the same size) gives way to the bytes
        os.replace(dest / BYTES_FILE, data_file)
        return JpegCache.load_memmap(dest), decoded

    def stored_bytes(self, cache: JpegCache, row: int) -> torch.Tensor:
        start = int(cache.offsets[row])
        return cache.data[start : start + int(cache.lengths[row])]

    def per_image_fields(self, cache: JpegCache) -> list[torch.Tensor]:
        return [*super().per_image_fields(cache), cache.offsets, cache.lengths]

    def shape_problem(self, cache: JpegCache, policy: StorePolicy, n: int) -> str:
        ends = cache.offsets + cache.lengths
        if len(cache.offsets) != n or (n and int(ends.max()) > cache.data.numel()):
            return f"{len(cache.offsets)} images ending at {int(ends.max())}, expected {n} images"
        return ""
