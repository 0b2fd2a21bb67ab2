"""The raw store's batches (``loader.store=raw``): rows of pixels read from the memory map.

Three makers, one per place the work is done: ``CroppedRows`` (train on the CPU: each box
resized straight from its row), ``GatheredRows`` (val off CUDA: the stored crops as they are)
and ``RowsOnDevice`` (train off the CPU, val on CUDA: the rows copied, and train boxes cut, by
the reading thread on its own stream). docs/loaders.md, "How a batch is made".
"""

from __future__ import annotations

import numpy as np
import torch

from loaderbench.imaging.device_resize import resize_boxes
from loaderbench.imaging.transforms import crop_resize_flip_rows
from loaderbench.loaders.memmap._parts import BatchParts, Gathered
from loaderbench.loaders.memmap.store_raw import ImageCache


class _RawRows:
    """The store's rows, three ways: the mapped tensor, a numpy view (for ``take``) and a plain
    tensor (train boxes are views of it; a tensor subclass would add its dispatch to each)."""

    def __init__(self, data: ImageCache, parts: BatchParts, channels_last: bool) -> None:
        self.parts = parts
        self.images: torch.Tensor = data.images
        self.images_np = self.images.numpy()
        self.rows = self.images.as_subclass(torch.Tensor)
        self.channels_last = channels_last

    def gather(self, indices: torch.Tensor) -> torch.Tensor:
        """The rows ``indices`` in a pooled buffer, NCHW."""
        rows = self.parts.gather_pool.take(len(indices))
        # numpy's take: one memcpy per row, GIL released, single-threaded. torch.index_select
        # does the same work but through intra-op threads, which on a busy machine wait on each
        # other (docs/measurements.md, "memmap: the gather"); mode="clip" writes to `out`.
        np.take(self.images_np, indices.numpy(), axis=0, out=rows.numpy(), mode="clip")
        # Train rows are stored channels-last: this is an NCHW view of them, not a copy.
        return rows.permute(0, 3, 1, 2) if self.channels_last else rows

    def stored_bytes(self) -> int:
        return self.images.numel()

    def stats(self) -> dict[str, object]:
        return {}


class CroppedRows(_RawRows):
    """A train batch on the CPU: each box resized (and flipped) straight from the mapped rows
    into a pooled batch, so only the boxes' lines are read and no row is gathered first (half
    of a stored row, on average, is outside its box)."""

    def read(self, epoch: int, indices: torch.Tensor) -> Gathered:
        parts = self.parts
        boxes, flips = parts.train_boxes(epoch, indices)
        out = parts.crop_out(len(indices))
        size = parts.spec.image_size
        images = crop_resize_flip_rows(self.rows, indices, boxes, size, flips, out)
        return Gathered(images, parts.labels_of(indices))


class GatheredRows(_RawRows):
    """A val batch off CUDA: the stored crops gathered as they are (the loader copies them)."""

    def read(self, epoch: int, indices: torch.Tensor) -> Gathered:
        return Gathered(self.gather(indices), self.parts.labels_of(indices))


class RowsOnDevice(_RawRows):
    """Rows copied to the device and (train) cropped there, by the reading thread on its own
    stream: the whole batch in a few kernels (``resize_boxes``)."""

    def read(self, epoch: int, indices: torch.Tensor) -> Gathered:
        parts = self.parts
        labels, images = parts.labels_of(indices), self.gather(indices)
        boxes, flips = parts.train_boxes(epoch, indices) if parts.spec.train else (None, None)
        device, size = parts.spec.device, parts.spec.image_size
        with parts.threads.on_stream():
            on_device = parts.gather_pool.to_device(images, device)
            labels = parts.label_pool.to_device(labels, device)
            if boxes is not None:
                on_device = resize_boxes(on_device, boxes, size, flips)
            return Gathered(on_device, labels, parts.threads.ready())
