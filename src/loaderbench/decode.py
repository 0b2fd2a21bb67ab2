"""JPEG decoding for every loader: one small interface, backends chosen per device by a registry.

**Backends**, in order of preference, each with what it can do (``Capabilities``): the devices
it decodes on, whether one call decodes a whole batch, whether it decodes only a box of the
image (``region``) and whether it decodes at a reduced, DCT-domain scale (``scale``; none here
is used: see below). Per kind of device the first backend whose decode of a tiny JPEG (whole,
and a region of it) works there is taken, once per process; one that is missing or fails to
load is passed over with one log line naming it and the reason. ``backend(device)`` names the
choice (metrics.json's ``loader_<split>_jpeg_backend``), ``region_decode(device)`` says whether
it decodes regions.

Each keeps its place by a measurement (``python -m loaderbench.bench.backends PHOTOS``: 400
real ImageNet photos, github.com/EliSchwartz/imagenet-sample-images, the boxes
``seeded_crops`` draws for 224 px; CPU ms an image, ranges over three runs on this shared
2-core machine, where wall time is not reliable):

* ``nvimgcodec`` (NVIDIA nvImageCodec: libjpeg-turbo on the CPU, nvJPEG on a GPU, the library
  DALI decodes with): the only one that decodes a region (libjpeg-turbo's
  ``jpeg_crop_scanline`` + ``jpeg_skip_scanlines``; nvJPEG's ROI decode on a GPU, batched).
  A train crop's region costs 1.29-1.31 ms against 1.5-1.9 for the whole image (the same
  libjpeg-turbo as TorchCodec's, the same cost within the noise; entropy decoding still reads
  the file up to the box's last row), a train image decoded and resized to 224 px 1.44-1.64
  ms against 1.8-2.4 with any backend's whole decode; the spdl train pipeline (224 px, batch
  32, 2 threads, 800 of those photos) spends 0.65-0.84x the CPU per image it did with TorchCodec, in
  five runs beside the old tree. It releases the GIL (two threads: 1.6-2.2x one on this busy
  machine). Its pixels are libjpeg-turbo's, identical to Pillow's for 4:2:0, 4:2:2, 4:4:4,
  grey, CMYK, progressive and restart-marker JPEGs, and a region's are identical to the same
  crop of a whole decode, boxes at every edge included (tests/test_decode.py); it is told not
  to apply EXIF orientation (its default does). YCCK JPEGs come out up to 1 grey level off
  Pillow's colour conversion, so those go to PIL with every file that
  ``images.fast_jpeg`` keeps from the fast decoders (the loaders' one rule), as do the
  rare files it refuses (PIL then says why, or decodes them).
* ``torchcodec``: libjpeg-turbo (1.49-1.61 ms) and a batched nvJPEG, whole images only; kept
  for where nvImageCodec does not load (on the GPU machine: where no nvJPEG library is found),
  at no loss for a whole decode. It applies a JPEG's EXIF orientation with no switch to stop
  it, so the loaders send such files to PIL.
* ``torchvision`` (``torchvision.io``, deprecated in favour of TorchCodec; 1.66-1.77 ms): the
  same libraries, for where TorchCodec's native library does not load either (it is built for
  one torch release); then the only GPU decoder left.
* ``pil``: Pillow (2.04-2.39 ms for the same pixels): always there, the CPU's last resort and
  the reference the others match.

**Scaled decode** (libjpeg's DCT-domain 1/2, 1/4, 1/8): worth having only where the kept
region is at least twice the output in both sides. No backend here offers it together with a
region (nvImageCodec's libjpeg-turbo decoder has no scale option); PIL's ``draft`` offers it
for the whole image only. Measured on the same photos at 224 px: 3% of train boxes are that
large (13 of 400: ImageNet's photos are ~500 x 375; none in memmap's jpeg store, whose long
side is 336), and for those PIL's scaled whole decode + crop + resize cost 3.6-4.3 ms against
nvImageCodec's region decode + resize 3.1-3.9 ms, with pixels 3.3 grey levels away from every
other loader's on average. So no backend declares ``scale`` and none is used.

**Val.** The spdl loader decodes a val JPEG's centre crop as a region too, where the backend
decodes regions (``val_region_plan`` in ``loaderbench.loaders.spdl.decoders``, whose docstring
gives the measurement): the same top-1 within 0.2 points on 1000 generated val images.

**EXIF orientation** is never applied (``loaderbench.images`` says why).

**GPU.** ``CudaJpegDecoder.for_device(device)`` is the device's one decoder: one batched
nvJPEG call per batch (with regions where the backend decodes them), from one place at a time
(a lock), on the decoder's own stream. The ordering that keeps its output whole:

* before each call the host waits for the decoder's stream (only the previous batch's decode
  and crops, never the model's work): nvJPEG's hardware engine writes its output without
  waiting for work queued on the stream, so a block freed there and handed out again by the
  caching allocator could still be read by a queued kernel (torchvision's batched decoder
  corrupts images this way on H100s, pytorch/vision#9606; TorchCodec orders its own call but
  not our crops after it). nvImageCodec's images live in its own allocations: each batch's
  are kept until that wait, so none is freed while a crop queued on the stream reads it;
* the batch is finished (cropped, resized, stacked) on that stream, then an event is recorded;
  the consumer's stream waits for the event and the batch's tensors are recorded on the
  consumer's stream (``hand_over``), so the allocator does not reuse them while the model
  reads them.
"""

from __future__ import annotations

import abc
import contextlib
import functools
import io
import logging
import os
import tempfile
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

import torch

from loaderbench import decoded_by

log = logging.getLogger(__name__)

T = TypeVar("T")
Decoded = torch.Tensor | BaseException  # an image, or why that file failed
Box = tuple[int, int, int, int]  # top, left, height, width, in the image's pixels
CPU = torch.device("cpu")


# ---------------------------------------------------------------------------------------------
# The interface.


@dataclass(frozen=True)
class Capabilities:
    devices: frozenset[str]  # torch device types it decodes on
    batch: bool  # one call decodes a whole batch (nvJPEG's batched decode)
    region: bool  # decodes only a box of the image
    scale: bool = False  # decodes at a reduced scale in the DCT domain


class JpegBackend(abc.ABC):
    """Decodes JPEG bytes (uint8, 1-D, on the CPU) into uint8 RGB CHW images on a device.

    ``decode`` gives each image's ``box`` (all of it where the box is None): decoded alone
    where the backend can, else cut from the whole image. A failed image comes back as the
    exception saying why, the others still decode.
    """

    name: ClassVar[str]
    can: ClassVar[Capabilities]

    @abc.abstractmethod
    def load(self) -> None:
        """Import the library; raises where it is missing or does not load."""

    @abc.abstractmethod
    def decode_whole(self, datas: list[torch.Tensor], device: torch.device) -> list[torch.Tensor]:
        """Whole images at once; raises if any fails."""

    def decode(
        self, datas: Sequence[torch.Tensor], device: torch.device, boxes: Sequence[Box | None]
    ) -> list[Decoded]:
        datas = list(datas)
        try:
            images: list[Decoded] = list(self.decode_whole(datas, device))
        except RuntimeError:  # one by one, so that each bad file gets its own error
            images = []
            for data in datas:
                try:
                    images.append(self.decode_whole([data], device)[0])
                except RuntimeError as error:
                    images.append(error)
        decoded_by.note(self.name, sum(not isinstance(i, BaseException) for i in images))
        return [cut(image, box) for image, box in zip(images, boxes, strict=True)]


def cut(image: Decoded, box: Box | None) -> Decoded:
    """The box of a whole decoded image (a view)."""
    if box is None or isinstance(image, BaseException):
        return image
    check_box(box, image.shape[-2], image.shape[-1])
    top, left, h, w = box
    return image[:, top : top + h, left : left + w]


def check_box(box: Box, height: int, width: int) -> None:
    """A box must lie inside its image: the loaders draw them from the image's size, so one
    that does not is a bug, and no backend would agree with another on its pixels."""
    top, left, h, w = box
    if not (h > 0 and w > 0 and 0 <= top and top + h <= height and 0 <= left and left + w <= width):
        raise ValueError(
            f"box (top, left, h, w) = {tuple(box)} is not inside a {width}x{height} image"
        )


# ---------------------------------------------------------------------------------------------
# Backends.


class PilBackend(JpegBackend):
    name = "pil"
    can = Capabilities(frozenset({"cpu"}), batch=False, region=False)

    def load(self) -> None:
        import PIL.Image  # noqa: F401

    def decode_whole(self, datas: list[torch.Tensor], device: torch.device) -> list[torch.Tensor]:
        return [decode_pil(data) for data in datas]

    def decode(
        self, datas: Sequence[torch.Tensor], device: torch.device, boxes: Sequence[Box | None]
    ) -> list[Decoded]:
        results: list[Decoded] = []
        for data, box in zip(datas, boxes, strict=True):
            try:
                results.append(decode_pil(data, box))
            except OSError as error:  # PIL's error for a file it cannot read
                results.append(error)
        return results


def decode_pil(data: torch.Tensor, box: Box | None = None) -> torch.Tensor:
    """JPEG bytes decoded by Pillow into RGB (``images.to_rgb``: its CMYK and YCCK conversion
    is the reference), cut to ``box``; uint8 CHW."""
    import numpy as np
    from PIL import Image

    from loaderbench.images import to_rgb

    image = Image.open(io.BytesIO(data.numpy().tobytes()))
    image = to_rgb(image)
    if box is not None:
        check_box(box, image.height, image.width)
        top, left, h, w = box
        image = image.crop((left, top, left + w, top + h))
    pixels = torch.from_numpy(np.array(image)).permute(2, 0, 1)
    decoded_by.note("pil")
    return pixels


class TorchCodecBackend(JpegBackend):
    name = "torchcodec"
    can = Capabilities(frozenset({"cpu", "cuda"}), batch=True, region=False)

    def load(self) -> None:
        from torchcodec.decoders import decode_jpeg  # noqa: F401

    def decode_whole(self, datas: list[torch.Tensor], device: torch.device) -> list[torch.Tensor]:
        from torchcodec.decoders import decode_jpeg

        return list(decode_jpeg(datas, mode="RGB", device=device))


class TorchvisionBackend(JpegBackend):
    name = "torchvision"
    can = Capabilities(frozenset({"cpu", "cuda"}), batch=True, region=False)

    def load(self) -> None:
        from torchvision.io import decode_jpeg  # noqa: F401

        import loaderbench.images  # noqa: F401 - filters torchvision's deprecation warning

    def decode_whole(self, datas: list[torch.Tensor], device: torch.device) -> list[torch.Tensor]:
        from torchvision.io import ImageReadMode, decode_jpeg

        if device.type == "cpu":  # one by one: its CPU list form is a Python loop anyway
            return [decode_jpeg(data, mode=ImageReadMode.RGB) for data in datas]
        return list(decode_jpeg(datas, mode=ImageReadMode.RGB, device=device))


@contextlib.contextmanager
def _stderr_captured() -> Iterator[list[str]]:
    """What native code writes to file descriptor 2 inside the block, kept out of the log.

    nvImageCodec prints a paragraph per missing optional library (nvJPEG, nvJPEG2000, nvTIFF)
    when it is imported, which on a CPU machine is every run; the text is kept as the reason
    to give if its GPU decode is then found not to work.
    """
    lines: list[str] = []
    with tempfile.TemporaryFile(mode="w+b") as sink:
        saved = os.dup(2)
        os.dup2(sink.fileno(), 2)
        try:
            yield lines
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            sink.seek(0)
            text = sink.read().decode(errors="replace")
            lines.extend(line.strip() for line in text.splitlines() if line.strip())


# nvImageCodec's decoder options (docs.nvidia.com/cuda/nvimagecodec/codec_options.html: a
# space-separated list, ``:<option>=<value>`` for every decoder that knows the option,
# ``<decoder_id>:<option>=<value>`` for one). Fancy (interpolating) chroma upsampling is
# libjpeg's and so Pillow's: asked for explicitly, as some releases of the Python binding
# default to ``:fancy_upsampling=0``. nvImageCodec 0.9's nvJPEG decoders then refuse a region
# of a 4:2:0 or 4:2:2 JPEG with nvJPEG older than 13.2 ("ROI decode with fancy upsampling may
# produce wrong results on image edge (1 pixel wide) with nvJPEG < 13.2 ... set
# enable_roi_fancy_upsampling=1", libnvjpeg_ext.so 0.9.0), and every such train crop and val
# centre crop would go to Pillow on one thread: enabled for the CUDA and hardware decoders, a
# box's outermost pixel's chroma being the price (the resize to the model's size blends it).
FANCY_UPSAMPLING = ":fancy_upsampling=1"
NVJPEG_DECODER_IDS = ("nvjpeg_cuda_decoder", "nvjpeg_hw_decoder")


def nvimgcodec_options(device_type: str) -> str:
    """The options string of the nvImageCodec decoder made for this kind of device."""
    if device_type == "cpu":
        return FANCY_UPSAMPLING
    roi = [f"{decoder}:enable_roi_fancy_upsampling=1" for decoder in NVJPEG_DECODER_IDS]
    return " ".join([FANCY_UPSAMPLING, *roi])


class NvImageCodecBackend(JpegBackend):
    """nvImageCodec: a decoder per CPU thread (one thread of its own each), one per GPU."""

    name = "nvimgcodec"
    can = Capabilities(frozenset({"cpu", "cuda"}), batch=True, region=True)

    def __init__(self) -> None:
        self._module: Any = None
        self._params: Any = None
        self.import_notes: list[str] = []
        self._thread = threading.local()
        self._gpu_decoders: dict[int, Any] = {}
        self._lock = threading.Lock()
        # nvImageCodec documents that not all its types are thread safe: memmap's reading
        # threads share the device's decoder, so its decode calls take turns (each thread's
        # parsing, copies and crops still run side by side, on the thread's own stream).
        self._gpu_decode_lock = threading.Lock()

    def load(self) -> None:
        if self._module is not None:
            return
        # Its per-image errors (a truncated file) would go to stderr; they come back as a
        # failed image here, and PIL says why. PYNVIMGCODEC_VERBOSITY set by the user wins.
        os.environ.setdefault("PYNVIMGCODEC_VERBOSITY", "0")
        with _stderr_captured() as notes:
            from nvidia import nvimgcodec
        self.import_notes = notes
        self._params = nvimgcodec.DecodeParams(
            apply_exif_orientation=False,  # its default applies it; no loader here does
            color_spec=nvimgcodec.ColorSpec.SRGB,
            allow_any_depth=False,
            sample_format=nvimgcodec.SampleFormat.I_RGB,
        )
        self._module = nvimgcodec

    def _decoder(self, device: torch.device) -> Any:
        nv = self._module
        if device.type == "cpu":
            decoder = getattr(self._thread, "decoder", None)
            if decoder is None:  # the calling thread is the parallelism: one thread each
                decoder = nv.Decoder(
                    device_id=nv.NVIMGCODEC_DEVICE_CPU_ONLY,
                    max_num_cpu_threads=1,
                    backends=[nv.Backend(nv.BackendKind.CPU_ONLY)],
                    options=nvimgcodec_options("cpu"),
                )
                self._thread.decoder = decoder
            return decoder
        index = device.index if device.index is not None else torch.cuda.current_device()
        with self._lock:
            if index not in self._gpu_decoders:
                # nvJPEG's hardware engine where the GPU has one, its CUDA decoder otherwise.
                self._gpu_decoders[index] = nv.Decoder(
                    device_id=index,
                    backends=[
                        nv.Backend(nv.BackendKind.HW_GPU_ONLY),
                        nv.Backend(nv.BackendKind.GPU_ONLY),
                        nv.Backend(nv.BackendKind.HYBRID_CPU_GPU),
                    ],
                    options=nvimgcodec_options("cuda"),
                )
            return self._gpu_decoders[index]

    def decode_whole(self, datas: list[torch.Tensor], device: torch.device) -> list[torch.Tensor]:
        results = self.decode(datas, device, [None] * len(datas))
        for result in results:
            if isinstance(result, BaseException):
                raise RuntimeError(str(result)) from result
        return results  # type: ignore[return-value]

    def decode(
        self, datas: Sequence[torch.Tensor], device: torch.device, boxes: Sequence[Box | None]
    ) -> list[Decoded]:
        results: list[Decoded | None] = [None] * len(datas)
        streams, positions = [], []
        for i, (data, box) in enumerate(zip(datas, boxes, strict=True)):
            try:
                stream = self._code_stream(data, box)
            except RuntimeError as error:  # no JPEG header, a bad box: PIL says why, or reads it
                results[i] = self._with_pil(data, box, device, error)
                continue
            if stream is None:
                results[i] = self._with_pil(data, box, device, None)
                continue
            streams.append(stream)
            positions.append(i)
        if streams:
            images = self._run(streams, device)
            for i, image in zip(positions, images, strict=True):
                if image is None:  # nvImageCodec refused it: PIL says why, or reads it
                    results[i] = self._with_pil(datas[i], boxes[i], device, None)
                else:
                    results[i] = self._tensor(image, device)
            decoded_by.note(self.name, sum(image is not None for image in images))
        return results  # type: ignore[return-value]

    def _run(self, streams: list[Any], device: torch.device) -> list[Any]:
        """nvImageCodec's decode of code streams: an image each, None for one it refused."""
        decoder = self._decoder(device)
        if device.type == "cpu":
            return [decoder.decode(stream, params=self._params) for stream in streams]
        cuda_stream = torch.cuda.current_stream(device).cuda_stream
        with self._gpu_decode_lock:
            return list(decoder.decode(streams, params=self._params, cuda_stream=cuda_stream))

    def _code_stream(self, data: torch.Tensor, box: Box | None) -> Any:
        """The JPEG's code stream (its headers parsed), cut to ``box``; None for a file that
        PIL decodes (``images.fast_jpeg``, the loaders' one rule: CMYK and YCCK, whose colours
        Pillow converts the reference way, among others)."""
        from loaderbench.images import fast_jpeg

        if fast_jpeg(data.numpy()) is None:
            return None
        nv = self._module
        stream = nv.CodeStream(data.numpy())
        if box is None or tuple(box) == (0, 0, stream.height, stream.width):
            return stream
        check_box(box, stream.height, stream.width)
        top, left, h, w = box
        return stream.get_sub_code_stream(region=nv.Region(top, left, top + h, left + w))

    @staticmethod
    def _tensor(image: Any, device: torch.device) -> torch.Tensor:
        """CHW view of an HWC image; it keeps nvImageCodec's buffer alive."""
        if device.type == "cpu":
            import numpy as np

            return torch.from_numpy(np.asarray(image)).permute(2, 0, 1)
        return torch.from_dlpack(image).permute(2, 0, 1)

    @staticmethod
    def _with_pil(
        data: torch.Tensor, box: Box | None, device: torch.device, error: BaseException | None
    ) -> Decoded:
        try:
            return decode_pil(data, box).to(device)
        except OSError as pil_error:
            reason = f"nvImageCodec: {error}; PIL: {pil_error}" if error else str(pil_error)
            return OSError(reason)


# In order of preference on every device; ``Capabilities.devices`` says where each decodes.
BACKENDS: dict[str, JpegBackend] = {
    backend.name: backend
    for backend in (
        NvImageCodecBackend(),
        TorchCodecBackend(),
        TorchvisionBackend(),
        PilBackend(),
    )
}


# ---------------------------------------------------------------------------------------------
# The choice per device.


@functools.cache
def _tiny_jpeg() -> torch.Tensor:
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", (16, 16), (200, 30, 90)).save(buffer, "JPEG")
    return torch.frombuffer(bytearray(buffer.getvalue()), dtype=torch.uint8)


def _works(backend: JpegBackend, device: torch.device) -> None:
    """Load the backend and decode the tiny JPEG (4:2:0, as most photos) on ``device``, whole
    and (where the backend can) a region; raises with the reason where it does not work,
    including where it did not decode them itself: a region it refused comes back empty (None)
    and the backend hands that image to Pillow, which would pass for a working region decode
    while every crop of the run went to Pillow."""
    backend.load()
    data = _tiny_jpeg()
    with decoded_by.not_counted(), decoded_by.counting() as counts:
        images = backend.decode([data, data], device, [None, (8, 0, 8, 16)])
    for image, shape in zip(images, ((3, 16, 16), (3, 8, 16)), strict=True):
        if isinstance(image, BaseException):
            raise image
        if tuple(image.shape) != shape or image.device.type != device.type:
            raise RuntimeError(f"decoded {tuple(image.shape)} on {image.device}, not {shape}")
    others = {lib: n for lib, n in counts.items() if lib != backend.name}
    if others:
        raise RuntimeError(
            f"{backend.name} refused {sum(others.values())} of 2 test images (whole, and a "
            f"region of a 4:2:0 JPEG), which fell back to {', '.join(sorted(others))}"
        )


def _device_of(device: torch.device | str) -> torch.device:
    device = torch.device(device)
    return torch.device("cuda", torch.cuda.current_device()) if device.type == "cuda" else device


def chosen(device: torch.device | str = "cpu") -> JpegBackend:
    """The backend decoding on this kind of device: the first in ``BACKENDS`` that works."""
    return BACKENDS[_choose(torch.device(device).type)]


_choices: dict[str, str] = {}
_choices_lock = threading.Lock()


def _choose(device_type: str) -> str:
    """Once per process and kind of device, whichever thread asks first."""
    with _choices_lock:
        if device_type not in _choices:
            _choices[device_type] = choose(device_type, BACKENDS)
        return _choices[device_type]


def choose(device_type: str, backends: dict[str, JpegBackend]) -> str:
    """The first of ``backends`` that decodes on this kind of device; each one passed over
    gets one log line naming it and the reason."""
    device = _device_of(device_type)
    tried: list[str] = []
    for backend in backends.values():
        if device_type not in backend.can.devices:
            continue
        try:
            _works(backend, device)
        except Exception as error:  # ImportError, OSError, RuntimeError from native code
            reason = f"{type(error).__name__}: {error}".strip().splitlines()[0]
            notes = getattr(backend, "import_notes", None)
            if device_type == "cuda" and notes:  # what its import said about nvJPEG
                reason += f" ({notes[0]})"
            log.warning(
                "JPEG decoding on %s: %s does not work here (%s); trying the next backend",
                device_type,
                backend.name,
                reason,
            )
            tried.append(backend.name)
            continue
        return backend.name
    raise RuntimeError(f"no JPEG decoder works on {device_type} here (tried {', '.join(tried)})")


def backend(device: torch.device | str = "cpu") -> str:
    """The name of the backend that decodes JPEGs on this kind of device."""
    return chosen(device).name


def region_decode(device: torch.device | str = "cpu") -> bool:
    """Whether the backend for this kind of device decodes only an image's box."""
    return chosen(device).can.region


# ---------------------------------------------------------------------------------------------
# What the loaders call.


def decode_cpu(data: torch.Tensor, box: Box | None = None) -> torch.Tensor:
    """JPEG bytes (uint8, 1-D, no EXIF orientation tag) to uint8 RGB CHW on the CPU: ``box``
    (top, left, height, width) only, or the whole image; releases the GIL. Raises for a file
    that cannot be decoded."""
    (image,) = BACKENDS[_choose("cpu")].decode([data], CPU, [box])
    if isinstance(image, BaseException):
        raise image
    return image


def decode_batch(
    datas: Sequence[torch.Tensor],
    device: torch.device,
    boxes: Sequence[Box | None] | None = None,
) -> list[Decoded]:
    """Decode JPEGs at once on ``device`` (each only its box where given); a file that fails
    comes back as its error, the others still decode."""
    boxes = [None] * len(datas) if boxes is None else boxes
    return chosen(device).decode(list(datas), device, boxes)


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
    ) -> tuple[T, torch.cuda.Event | None]:
        """Decode ``datas`` (each only its box, where given) in one call and ``finish`` the
        images (crop, resize, stack); returns what ``finish`` made and the event after which
        it is ready (None: now)."""
        result, _ = self._decode_and_finish(datas, finish, boxes)
        return result, None

    def _decode_and_finish(
        self,
        datas: Sequence[torch.Tensor],
        finish: Callable[[list[Decoded]], T],
        boxes: Sequence[Box | None] | None,
    ) -> tuple[T, list[Decoded]]:
        decoded = decode_batch(datas, self.device, boxes) if datas else []
        return finish(decoded), decoded


class CudaJpegDecoder(BatchJpegDecoder):
    """The device's one batched nvJPEG decoder (see the module's notes on stream order)."""

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
    ) -> tuple[T, torch.cuda.Event | None]:
        with self._lock:
            self.stream.synchronize()  # nvJPEG's hardware path is not ordered with the stream
            self._in_flight = []  # their crops are done: their memory may go
            with torch.cuda.stream(self.stream):
                result, self._in_flight = self._decode_and_finish(datas, finish, boxes)
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


__all__ = [
    "BACKENDS",
    "BatchJpegDecoder",
    "Box",
    "Capabilities",
    "CudaJpegDecoder",
    "Decoded",
    "JpegBackend",
    "backend",
    "batch_decoder",
    "chosen",
    "decode_batch",
    "decode_cpu",
    "hand_over",
    "nvimgcodec_options",
    "region_decode",
    "require_cuda",
]
