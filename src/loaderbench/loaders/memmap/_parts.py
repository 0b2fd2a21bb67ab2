"""What every memmap store's batches are made of: the batch as a reading thread hands it over
(``Gathered``) and what the stores' batch makers share (``BatchParts``): the run's spec, the
pooled buffers, the labels and stored sizes, and the reading threads' streams."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from loaderbench.loaders.base import LoaderSpec
from loaderbench.loaders.memmap._device_work import ThreadStreams
from loaderbench.platform.buffers import BufferPool, pool_stats


@dataclass
class Gathered:
    """A batch as the reading threads hand it over: finished, on the CPU or (CUDA) on the
    device, where ``ready`` says when the thread's stream has made it."""

    images: torch.Tensor
    labels: torch.Tensor
    ready: torch.cuda.Event | None = None
    decoded_by: dict[str, int] | None = None  # a jpeg store's images, by decoding library
    indices: torch.Tensor | None = None  # the images' dataset indices (CPU), set by the loader


class BatchParts:
    """The pieces every store's batches use. The small fields (labels, stored sizes) are held
    in memory: a gather from them costs nothing."""

    def __init__(
        self,
        spec: LoaderSpec,
        data: Any,
        stored_row: tuple[int, ...],
        capacity: int,
        threads: ThreadStreams,
    ) -> None:
        self.spec = spec
        self.threads = threads
        self.labels = data.labels.clone()
        self.heights = data.heights.clone()
        self.widths = data.widths.clone()
        pin, size = spec.use_pinned_memory, spec.image_size
        self.gather_pool = BufferPool((spec.batch_size, *stored_row), capacity, pin=pin)
        self.crop_pool = BufferPool((spec.batch_size, size, size, 3), capacity)
        self.label_pool = BufferPool((spec.batch_size,), capacity, dtype=torch.int64, pin=pin)

    def labels_of(self, indices: torch.Tensor) -> torch.Tensor:
        """The batch's labels, in a pooled buffer."""
        out = self.label_pool.take(len(indices))
        return torch.index_select(self.labels, 0, indices, out=out)

    def train_boxes(self, epoch: int, indices: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Boxes inside each image's stored size (the distribution of a crop of the original
        file) and flips, from the run's seed, ``epoch`` and the image."""
        heights, widths = self.heights[indices], self.widths[indices]
        return self.spec.random_crops(heights, widths, epoch, indices)

    def crop_out(self, count: int) -> torch.Tensor:
        """A pooled (count, 3, S, S) batch for crops made on the CPU (channels-last memory)."""
        return self.crop_pool.take(count).permute(0, 3, 1, 2)

    def deliver(self, images: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """A batch on the run's device (a no-op for one already there)."""
        device = self.spec.device
        return self.gather_pool.to_device(images, device), self.label_pool.to_device(labels, device)

    def stats(self) -> dict[str, Any]:
        pools = (self.gather_pool, self.crop_pool, self.label_pool)
        return pool_stats(pools, pinned=self.spec.use_pinned_memory)
