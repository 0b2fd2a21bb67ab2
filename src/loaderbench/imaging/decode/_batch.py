"""Batched decoding: one call decodes a batch and finishes it, on the CPU (where the loaders'
batch logic is tested) or on a GPU.

``CudaJpegDecoder.for_device(device)`` is the device's one decoder: one batched nvJPEG call a
batch, behind a lock, on its own stream. Before each call the host waits for that stream (the
previous batch's decode and crops only): nvJPEG's hardware engine writes without waiting for
queued work, so a block freed and handed out again could still be read by a queued kernel
(torchvision's batched decoder corrupts images so, pytorch/vision#9606). The batch is finished
on that stream and handed over by an event (``hand_over``), its tensors recorded on the
consumer's stream so the allocator does not reuse them while the model reads them.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import TypeVar

import torch

from loaderbench.imaging.decode._base import Box, Decoded
from loaderbench.imaging.decode._choice import decode_batch

T = TypeVar("T")


def require_cuda(device: torch.device, what: str) -> None:
    """Fail at once, with the reason, where the GPU a decoder needs is missing."""
    if not torch.cuda.is_available():
        raise RuntimeError(
            f"{what} decodes JPEGs on the GPU (nvJPEG), but no CUDA device is available "
            f"here; use loader.decoder=turbo or loader.decoder=ffmpeg on this machine"
        )
    if device.type != "cuda":
        raise RuntimeError(
            f"{what} decodes on the GPU, but the run's device is {device}; "
            f"set device=cuda (or device=auto) or choose loader.decoder=turbo"
        )


class BatchJpegDecoder:
    """Decodes a batch of JPEGs in one call and finishes it, on the CPU (where the loaders'
    batch logic is tested) or, as ``CudaJpegDecoder``, on a GPU."""

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def run(
        self,
        datas: Sequence[torch.Tensor],
        finish: Callable[[list[Decoded]], T],
        boxes: Sequence[Box | None] | None = None,
        *,
        admitted: bool = False,
    ) -> tuple[T, torch.cuda.Event | None]:
        """Decode ``datas`` (each only its box, where given) in one call and ``finish`` the
        images (crop, resize, stack); returns what ``finish`` made and the event after which
        it is ready (None: now). ``admitted``: JPEGs this project encoded
        (``JpegBackend.decode``)."""
        result, _ = self._decode_and_finish(datas, finish, boxes, admitted)
        return result, None

    def _decode_and_finish(
        self,
        datas: Sequence[torch.Tensor],
        finish: Callable[[list[Decoded]], T],
        boxes: Sequence[Box | None] | None,
        admitted: bool = False,
    ) -> tuple[T, list[Decoded]]:
        decoded = decode_batch(datas, self.device, boxes, admitted=admitted) if datas else []
        return finish(decoded), decoded


class CudaJpegDecoder(BatchJpegDecoder):
    """The device's one batched nvJPEG decoder (see this module's notes on stream order)."""

    _instances: dict[torch.device, CudaJpegDecoder] = {}
    _instances_lock = threading.Lock()

    def __init__(self, device: torch.device) -> None:
        super().__init__(device)
        self.stream = torch.cuda.Stream(device)
        self._lock = threading.Lock()
        self._in_flight: list[Decoded] = []  # the last batch's images, until its work is done

    @classmethod
    def for_device(cls, device: torch.device) -> CudaJpegDecoder:
        require_cuda(device, "loader.decoder=nvjpeg")
        with cls._instances_lock:
            if device not in cls._instances:
                cls._instances[device] = cls(device)
            return cls._instances[device]

    def run(
        self,
        datas: Sequence[torch.Tensor],
        finish: Callable[[list[Decoded]], T],
        boxes: Sequence[Box | None] | None = None,
        *,
        admitted: bool = False,
    ) -> tuple[T, torch.cuda.Event | None]:
        with self._lock:
            self.stream.synchronize()  # nvJPEG's hardware path is not ordered with the stream
            self._in_flight = []  # their crops are done: their memory may go
            with torch.cuda.stream(self.stream):
                result, self._in_flight = self._decode_and_finish(datas, finish, boxes, admitted)
                ready = torch.cuda.Event()
                ready.record(self.stream)
        return result, ready


def batch_decoder(device: torch.device) -> BatchJpegDecoder:
    """The batched decoder for ``device``: the GPU's one nvJPEG decoder, or a CPU one."""
    if device.type == "cuda":
        return CudaJpegDecoder.for_device(device)
    return BatchJpegDecoder(device)


def hand_over(ready: torch.cuda.Event | None, *tensors: torch.Tensor) -> None:
    """Make tensors made on a side stream safe to use on the current one: it waits for
    ``ready``, and the allocator keeps their memory until the current stream is done."""
    if ready is None or not tensors or not tensors[0].is_cuda:
        return
    stream = torch.cuda.current_stream(tensors[0].device)
    stream.wait_event(ready)
    for tensor in tensors:
        tensor.record_stream(stream)
