"""Batch-sized host buffers from a bounded pool: reused, pinned on CUDA runs, counted.

A fresh batch tensor is fresh memory, whose page faults cost about what the copy filling it
does; a fresh pinned one stays page-locked for the process's life (torch's caching host
allocator), taken from the page cache memmap lives on. So a ``BufferPool`` holds at most
``capacity`` buffers (``loader_<split>_pinned_mb``) and hands one out again only when no tensor
shares its storage and its last copy to the device has finished (a CUDA event). With every
buffer busy it gives a fresh pageable one (counted in ``overflows``): a slower copy rather than
a wait that could deadlock. Where torch does not expose the storage count, every batch is fresh.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from typing import Any

import torch

_use_count = getattr(torch._C, "_storage_Use_Count", None)


class BufferPool:
    """Buffers of ``shape`` (batch first) and ``dtype``; ``take(rows)`` gives a view of one."""

    def __init__(
        self,
        shape: tuple[int, ...],
        capacity: int,
        *,
        dtype: torch.dtype = torch.uint8,
        pin: bool = False,
    ) -> None:
        self.shape = shape
        self.capacity = capacity
        self.dtype = dtype
        self.pin = pin
        self.overflows = 0
        self._buffers: list[torch.Tensor] = []
        self._copies: dict[int, Any] = {}  # storage address -> CUDA event after its last copy
        self._lock = threading.Lock()

    def _free(self, buffer: torch.Tensor) -> bool:
        assert _use_count is not None
        # The buffer itself and the temporary storage object: nobody else.
        if _use_count(buffer.untyped_storage()._cdata) > 2:
            return False
        copy = self._copies.get(buffer.data_ptr())
        return copy is None or copy.query()

    def _fresh(self, shape: tuple[int, ...], pin: bool) -> torch.Tensor:
        return torch.empty(shape, dtype=self.dtype, pin_memory=pin)

    def take(self, rows: int) -> torch.Tensor:
        """A ``(rows, ...)`` tensor that nobody else holds."""
        if _use_count is None:
            return self._fresh((rows, *self.shape[1:]), self.pin)
        with self._lock:  # the view made under the lock marks the buffer taken
            for buffer in self._buffers:
                if self._free(buffer):
                    return buffer[:rows]
            if len(self._buffers) < self.capacity:
                buffer = self._fresh(self.shape, self.pin)
                self._buffers.append(buffer)
                return buffer[:rows]
            self.overflows += 1
        return self._fresh((rows, *self.shape[1:]), False)

    def to_device(self, tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
        """Copy a view of one of this pool's buffers to ``device`` on the current stream,
        asynchronously when pinned; the buffer is not handed out again before the copy ends."""
        if tensor.device == device:
            return tensor
        out = tensor.to(device, non_blocking=self.pin)
        if self.pin and device.type == "cuda":
            event = torch.cuda.Event()
            event.record(torch.cuda.current_stream(device))
            with self._lock:
                self._copies[tensor.untyped_storage().data_ptr()] = event
        return out

    @property
    def buffers(self) -> int:
        return len(self._buffers)

    @property
    def nbytes(self) -> int:
        return sum(b.numel() * b.element_size() for b in self._buffers)


class BatchBuffers:
    """The pools of one loader's batches: images (uint8) and labels (int64)."""

    def __init__(
        self, batch_size: int, image_shape: tuple[int, ...], capacity: int, *, pin: bool
    ) -> None:
        self.images = BufferPool((batch_size, *image_shape), capacity, pin=pin)
        self.labels = BufferPool((batch_size,), capacity, dtype=torch.int64, pin=pin)

    @property
    def pin(self) -> bool:
        return self.images.pin

    def take(self, rows: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.images.take(rows), self.labels.take(rows)

    def to_device(
        self, images: torch.Tensor, labels: torch.Tensor, device: torch.device
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return self.images.to_device(images, device), self.labels.to_device(labels, device)

    def stats(self) -> dict[str, Any]:
        return pool_stats([self.images, self.labels], pinned=self.pin)


def pool_stats(pools: Iterable[BufferPool], pinned: bool) -> dict[str, Any]:
    """For metrics.json: the pools' total (``pinned_mb`` on CUDA runs) and the batches that
    found them full."""
    pools = list(pools)
    return {
        "pinned_mb" if pinned else "buffers_mb": sum(pool.nbytes for pool in pools) / 2**20,
        "buffer_pool_overflows": sum(pool.overflows for pool in pools),
    }
