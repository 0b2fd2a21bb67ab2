"""JPEG decoding for every loader: libjpeg-turbo on the CPU, one batched nvJPEG call on a GPU.

**Backend.** TorchCodec's ``decode_jpeg`` where it loads, else torchvision.io's: the same
libraries underneath (libjpeg-turbo, nvJPEG), behind the same ``loader.decoder`` names.
torchvision 0.29 deprecates its decoders in favour of TorchCodec; TorchCodec's native library
is built for one torch release and may not load on another (the GPU machine's torch 2.11),
so a decode of a tiny JPEG on each kind of device decides, once per process, and
``backend(device)`` says which. On the CPU they measured the same here (500 x 375 q90, one
thread: 0.84 ms an image with TorchCodec, 0.85 with torchvision; identical pixels; both
release the GIL), so TorchCodec is taken for both devices.

**EXIF orientation.** TorchCodec applies a JPEG's EXIF orientation and has no switch for it;
no loader here does (``loaderbench.images`` says why). So these functions are for JPEGs
without an orientation tag: the memmap store's own (written without EXIF), and the files the
spdl loader has checked (``images.jpeg_header``; the others go through PIL).

**GPU.** ``CudaJpegDecoder.for_device(device)`` is the device's one decoder: one batched
nvJPEG call per batch, from one place at a time (a lock), on the decoder's own stream. The
ordering that keeps its output whole:

* before each call the host waits for the decoder's stream (only the previous batch's decode
  and crops, never the model's work): nvJPEG's hardware engine writes its output without
  waiting for work queued on the stream, so a block freed there and handed out again by the
  caching allocator could still be read by a queued kernel (torchvision's batched decoder
  corrupts images this way on H100s, pytorch/vision#9606; TorchCodec orders its own call but
  not our crops after it);
* the batch is finished (cropped, resized, stacked) on that stream, then an event is recorded;
  the consumer's stream waits for the event and the batch's tensors are recorded on the
  consumer's stream (``hand_over``), so the allocator does not reuse them while the model
  reads them.
"""

from __future__ import annotations

import functools
import io
import logging
import threading
from collections.abc import Callable, Sequence
from typing import TypeVar

import torch

log = logging.getLogger(__name__)

T = TypeVar("T")
Decoded = torch.Tensor | BaseException  # an image, or why that file failed


@functools.cache
def _tiny_jpeg() -> torch.Tensor:
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", (8, 8), (200, 30, 90)).save(buffer, "JPEG")
    return torch.frombuffer(bytearray(buffer.getvalue()), dtype=torch.uint8)


def _torchcodec(datas: list[torch.Tensor], device: torch.device) -> list[torch.Tensor]:
    from torchcodec.decoders import decode_jpeg

    return list(decode_jpeg(datas, mode="RGB", device=device))


def _torchvision(datas: list[torch.Tensor], device: torch.device) -> list[torch.Tensor]:
    from torchvision.io import ImageReadMode, decode_jpeg

    import loaderbench.images  # noqa: F401 - filters torchvision's deprecation warning

    if device.type == "cpu":  # one by one: its CPU list form is a Python loop anyway
        return [decode_jpeg(data, mode=ImageReadMode.RGB) for data in datas]
    return list(decode_jpeg(datas, mode=ImageReadMode.RGB, device=device))


BACKENDS: dict[str, Callable[[list[torch.Tensor], torch.device], list[torch.Tensor]]] = {
    "torchcodec": _torchcodec,
    "torchvision": _torchvision,
}


def backend(device: torch.device | str = "cpu") -> str:
    """``torchcodec`` where it loads and decodes on this kind of device, else ``torchvision``."""
    return _backend(torch.device(device).type)


@functools.cache
def _backend(device_type: str) -> str:
    try:
        _torchcodec([_tiny_jpeg()], torch.device(device_type))
        return "torchcodec"
    except Exception as error:  # ImportError, OSError or RuntimeError from its native library
        log.info(
            "TorchCodec does not decode on %s here (%s); decoding JPEGs with torchvision.io",
            device_type,
            error,
        )
        return "torchvision"


def decode_cpu(data: torch.Tensor) -> torch.Tensor:
    """JPEG bytes (uint8, 1-D, no EXIF orientation tag) to uint8 RGB CHW with libjpeg-turbo;
    releases the GIL."""
    return BACKENDS[backend()]([data], torch.device("cpu"))[0]


def decode_batch(datas: list[torch.Tensor], device: torch.device) -> list[Decoded]:
    """Decode JPEGs at once on ``device``; if the batch fails, one by one, so that each bad
    file gets its own error and the good ones still decode."""
    decode = BACKENDS[backend(device)]
    try:
        return list(decode(datas, device))
    except RuntimeError:
        results: list[Decoded] = []
        for data in datas:
            try:
                results.append(decode([data], device)[0])
            except RuntimeError as error:
                results.append(error)
        return results


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
        self, datas: Sequence[torch.Tensor], finish: Callable[[list[Decoded]], T]
    ) -> tuple[T, torch.cuda.Event | None]:
        """Decode ``datas`` in one call and ``finish`` the images (crop, resize, stack);
        returns what ``finish`` made and the event after which it is ready (None: now)."""
        return finish(decode_batch(list(datas), self.device) if datas else []), None


class CudaJpegDecoder(BatchJpegDecoder):
    """The device's one batched nvJPEG decoder (see the module's notes on stream order)."""

    _instances: dict[torch.device, CudaJpegDecoder] = {}
    _instances_lock = threading.Lock()

    def __init__(self, device: torch.device) -> None:
        super().__init__(device)
        self.stream = torch.cuda.Stream(device)
        self._lock = threading.Lock()

    @classmethod
    def for_device(cls, device: torch.device) -> CudaJpegDecoder:
        require_cuda(device, "loader.decoder=nvjpeg")
        with cls._instances_lock:
            if device not in cls._instances:
                cls._instances[device] = cls(device)
            return cls._instances[device]

    def run(
        self, datas: Sequence[torch.Tensor], finish: Callable[[list[Decoded]], T]
    ) -> tuple[T, torch.cuda.Event | None]:
        with self._lock:
            self.stream.synchronize()  # nvJPEG's hardware path is not ordered with the stream
            with torch.cuda.stream(self.stream):
                result, _ = super().run(datas, finish)
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
