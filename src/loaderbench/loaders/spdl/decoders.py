"""Decode functions of the spdl loader, by name: ``ffmpeg``, ``turbo`` and ``nvjpeg``.

SPDL's pipeline does not care which decoder its decode stage calls, as long as the call releases
the GIL: the stage runs ``loader.num_workers`` batch decodes at once in a thread pool, so the
heavy parts (file read, entropy decoding, colour conversion, resizing) must run in C/C++ without
the GIL. All three do (measured: a Python thread keeps running at full speed beside a 4000x3000
decode or resize in another thread, its longest stall ~12-20 ms against 70-500 ms calls):

* ``ffmpeg``: ``spdl.io.demux_image`` + ``spdl.io.decode_packets`` with an FFmpeg filter graph
  that does the whole geometry in one pass (crop, scale, flip, RGB conversion). FFmpeg's JPEG
  decoder is slower than libjpeg-turbo and its chroma upsampling is not libjpeg's, so its
  pixels differ slightly from PIL's (tests/test_spdl.py measures by how much).
* ``turbo``: the file bytes read by the thread, decoded by libjpeg-turbo on the CPU
  (``loaderbench.decode``: nvImageCodec, which decodes only a train crop's box, or TorchCodec,
  torchvision.io or PIL where it does not load), then resized as uint8 by
  ``torch.nn.functional.interpolate(antialias=True)``: the same decoder and the same filter
  as PIL's, so it matches the torchvision reference to +-1 grey level, and it is the fastest.
* ``nvjpeg``: the pool threads only read the bytes and the sizes (and decode the odd non-JPEG
  file on the CPU, into pinned memory); one stage after them makes one batched nvJPEG call per
  batch, each train image's box only, through the device's one decoder
  (``loaderbench.decode.CudaJpegDecoder``), then resizes the batch on the GPU, on the
  decoder's stream. It needs a CUDA device and says so at once where there is none.

Which files a fast decoder may take is decided by one rule, from the file's bytes
(``images.fast_jpeg``): a whole JPEG of 1 or 3 components without an EXIF orientation tag.
Everything else (a PNG or WebP named .JPEG, BMP, TIFF, 16-bit PNG, a PDF or a tar holding a
JPEG, a cut or CMYK JPEG, ...) is read or refused by PIL through ``loaderbench.images``, the
torchvision and memmap loaders' own path, so every file gets the same verdict and the same
pixels everywhere. Every decoder refuses an image over
``dataset.max_image_pixels`` from its header, before decoding it, and none applies EXIF
orientation (``loaderbench.images`` says why). A file nothing can decode becomes a ``Failure``
naming it; the loader skips or raises it (``dataset.on_error``).

Geometry, the same for every decoder and equal to the torchvision reference:

* val: resize the short side to ``val_resize_size(size)`` keeping the aspect ratio (the
  rounding of torchvision's ``Resize``), then crop the centre ``size`` x ``size``. SPDL's
  default ``scale_mode="pad"`` letterboxes instead, which is a different image. Where the
  JPEG backend decodes regions (``turbo`` and ``nvjpeg`` with nvImageCodec), the centre crop
  is taken as a region of the original instead (``val_region_plan``: ~57% of a 4:3 photo's
  pixels), decoded alone and resized once: 1.73 against 2.34 CPU ms an image at 224 px on
  real ImageNet photos. Its edges are rounded to whole source pixels, so the crop sits up to half
  a source pixel off the reference's (mean |difference| 0.5-0.9 grey levels on the synthetic
  set, 1.9 on real photos); one checkpoint's top-1 on 1000 generated val images (10 classes,
  the hard set: top-1 0.29-0.39) moved by 0.2 points against torchvision's, memmap's and the
  whole decode's, at 64 and at 224 px, inside the loaders' half-point parity. FFmpeg decodes
  whole and keeps the reference's plan.
* train: the random-resized crop is done per image, in the decode stage: the box is drawn by
  ``seeded_crops`` (every loader's) from the image's true size (the header's), decoded alone
  from the file where the backend decodes regions (libjpeg-turbo skips the rows above and
  below it and the IDCT of the columns beside it: the same pixels as a whole decode cut to the
  box, tests/test_decode.py; ``split_region``) and resized once to ``size`` x ``size`` (then
  flipped with probability 1/2). Chosen over a
  fixed-size decode followed by a batched crop (memmap's way) because the image is decoded
  in that stage anyway, so the crop costs nothing extra and the resize shrinks only the box,
  not the whole image: one resize instead of two, no float round trip, and a small box is
  taken from full-resolution pixels (as torchvision's RandomResizedCrop does) rather than
  upsampled from an already shrunken image. The sizes come from the JPEG headers before any
  decoding, so a batch's boxes and flips are computed in one call, each image's from its own
  generator seeded by (seed, epoch, index): reproducible whatever the thread timing, and the
  same boxes as the other loaders draw for the same image.
"""

from __future__ import annotations

import abc
import ctypes
import functools
import math
import re
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, ClassVar, NamedTuple

import numpy as np
import torch

from loaderbench import decode, decoded_by
from loaderbench.buffers import BatchBuffers
from loaderbench.decode import Box, Decoded, batch_decoder, decode_cpu, require_cuda
from loaderbench.images import check_size, fast_jpeg, load_rgb
from loaderbench.transforms import (
    RRC_RATIO,
    RRC_SCALE,
    resize_uint8,
    seeded_crops,
    val_resize_size,
)

# FFmpeg's scaler: bilinear, widened when shrinking like PIL's antialiased filter. Interpolating
# chroma at full resolution brings its colours closer to libjpeg's (mean |diff| from PIL's
# 0.92 grey levels instead of 1.30, measured) for ~6% more decode time.
FFMPEG_SCALE_FLAGS = "bilinear+full_chroma_int"
# Fail on a damaged stream (truncated file) instead of returning a half-grey image; PIL and
# libjpeg-turbo refuse those too.
FFMPEG_DECODER_OPTIONS = {"err_detect": "explode"}


# ---------------------------------------------------------------------------------------------
# What flows through the pipeline.


class Sample(NamedTuple):
    """One image of an epoch, as the source emits it."""

    index: int  # position in the split
    path: str
    label: int
    epoch: int


class Opened(NamedTuple):
    """A file read, its image size known, not yet (necessarily) decoded."""

    sample: Sample
    height: int
    width: int
    # The decoder's own: the file's bytes (uint8, 1-D), demuxed packets, or an image already
    # decoded (uint8 CHW) because its size could not be known otherwise.
    payload: Any


class Failure(NamedTuple):
    """A file no decoder could read."""

    index: int  # position in the split
    path: str
    error: str


class DecodedBatch(NamedTuple):
    """What a decode task hands on: a whole batch, ready for the device or on it."""

    images: torch.Tensor  # uint8 NCHW, contiguous; pinned for a CUDA run, or already on the GPU
    labels: torch.Tensor  # int64 (N,), on the same device as images
    failures: list[Failure]  # files of this batch no decoder could read, left out of it
    # Made on a side stream: usable on another once this event has passed (jpeg.hand_over).
    ready: torch.cuda.Event | None = None
    # The images of this batch by the library that decoded them (``loaderbench.decoded_by``).
    decoded_by: dict[str, int] | None = None


class ReadBatch(NamedTuple):
    """nvjpeg's batch between its two stages: the JPEGs still encoded, the other files
    already decoded and planned on the CPU (into pinned memory)."""

    jpegs: list[tuple[Opened, Plan]]
    staged: torch.Tensor  # uint8 (k, 3, size, size): the non-JPEG files, finished
    staged_labels: list[int]
    failures: list[Failure]
    decoded_by: dict[str, int] | None = None  # the staged files', by library


# ---------------------------------------------------------------------------------------------
# Geometry: one plan per image, executed by each decoder its own way.


@dataclass(frozen=True)
class Plan:
    """Cut ``box`` (top, left, h, w) from the image, resize it to ``resize`` (h, w), then
    cut ``crop`` (top, left, h, w) from the result (if any) and flip it (if ``flip``)."""

    box: tuple[int, int, int, int]
    resize: tuple[int, int]
    crop: tuple[int, int, int, int] | None = None
    flip: bool = False


def val_plan(height: int, width: int, size: int) -> Plan:
    """torchvision's ``Resize(val_resize_size(size))`` + ``CenterCrop(size)``, to the pixel."""
    short = val_resize_size(size)
    if width <= height:
        new_w, new_h = short, int(short * height / width)
    else:
        new_w, new_h = int(short * width / height), short
    # new_h, new_w >= short >= size, so the crop always fits (no padding case).
    top = round((new_h - size) / 2.0)  # Python's round, as CenterCrop
    left = round((new_w - size) / 2.0)
    return Plan(box=(0, 0, height, width), resize=(new_h, new_w), crop=(top, left, size, size))


def val_region_plan(height: int, width: int, size: int) -> Plan:
    """``val_plan``'s centre crop taken from the original image: its box there, resized to
    ``size`` x ``size`` (the box's edges rounded to whole pixels; never empty: see
    ``source_span`` for a side too thin to hold a whole source pixel of the crop)."""
    reference = val_plan(height, width, size)
    assert reference.crop is not None
    new_h, new_w = reference.resize
    top, left, _, _ = reference.crop
    y0, y1, resize_h, crop_top = source_span(top, size, height, new_h)
    x0, x1, resize_w, crop_left = source_span(left, size, width, new_w)
    crop = (crop_top, crop_left, size, size) if (resize_h, resize_w) != (size, size) else None
    return Plan(box=(y0, x0, y1 - y0, x1 - x0), resize=(resize_h, resize_w), crop=crop)


class Span(NamedTuple):
    """One side of a val region: source pixels [lo, hi), resized to ``resized`` pixels, of
    which the crop starts at ``offset``."""

    lo: int
    hi: int
    resized: int
    offset: int


def source_span(start: int, size: int, source: int, resized: int) -> Span:
    """The source pixels under the crop's pixels [start, start + size) of a side the reference
    resizes from ``source`` to ``resized`` pixels, edges rounded to whole pixels, resized to
    ``size``. Where that rounds to nothing (the crop spans less than a source pixel: the long
    side of a 1 x 1000 image, which the reference upsamples 256-fold), the region would be
    empty: it is then the two source pixels whose centres bracket the crop (those the
    reference's bilinear upsampling blends there), resized at the reference's own scale and
    cut where the reference cuts, so its pixels are the reference's."""
    scale = source / resized
    lo, hi = round(start * scale), round((start + size) * scale)
    if hi > lo:
        return Span(lo, hi, size, 0)
    centre = (start + size / 2) * scale - 0.5  # in source pixel-centre coordinates
    lo = min(max(math.floor(centre), 0), max(source - 2, 0))
    hi = min(lo + 2, source)
    length = max(round((hi - lo) / scale), size)
    offset = min(max(round(start - lo / scale), 0), length - size)
    return Span(lo, hi, length, offset)


def train_plans(boxes: torch.Tensor, flips: torch.Tensor, size: int) -> list[Plan]:
    """Random-resized crop plans from boxes ``(top, left, h, w)`` and flips."""
    return [
        Plan(box=(top, left, h, w), resize=(size, size), flip=flip)
        for (top, left, h, w), flip in zip(boxes.tolist(), flips.tolist(), strict=True)
    ]


@dataclass(frozen=True)
class Geometry:
    """The output size, for training the run's seed and the random-resized crop's ranges, and
    for val whether a JPEG's centre crop is taken as a region of the original
    (``val_region_plan``) or from the resized image (``val_plan``)."""

    size: int
    train: bool
    seed: int = 0
    scale: tuple[float, float] = RRC_SCALE
    ratio: tuple[float, float] = RRC_RATIO
    val_region: bool = False

    def val_plan(self, opened: Opened) -> Plan:
        """The centre crop's region of a JPEG still to be decoded (where regions are decoded);
        the reference's plan for a file decoded already (not a JPEG, or one PIL reads)."""
        plan = val_region_plan if self.val_region and is_encoded(opened) else val_plan
        return plan(opened.height, opened.width, self.size)

    def plans(self, opened: Sequence[Opened]) -> list[Plan]:
        """One plan per opened image; a train image's crop and flip come from its own
        generator (``seeded_crops`` of the run's seed, the epoch and the image)."""
        if not self.train:
            return [self.val_plan(o) for o in opened]
        if not opened:
            return []
        boxes, flips = seeded_crops(
            [o.height for o in opened],
            [o.width for o in opened],
            self.seed,
            opened[0].sample.epoch,
            [o.sample.index for o in opened],
            self.scale,
            self.ratio,
        )
        return train_plans(boxes, flips, self.size)


def split_region(plan: Plan) -> tuple[Box, Plan]:
    """The region of the image a plan reads (its box) and the plan for that region once
    decoded alone: region decoders decode only the box, the others cut it from the image."""
    _, _, h, w = plan.box
    return plan.box, replace(plan, box=(0, 0, h, w))


def apply_plan(image: torch.Tensor, plan: Plan) -> torch.Tensor:
    """Execute a plan on a uint8 CHW tensor (CPU or GPU); returns a view where it can."""
    top, left, h, w = plan.box
    out = resize_uint8(image[:, top : top + h, left : left + w], plan.resize)
    if plan.crop is not None:
        top, left, h, w = plan.crop
        out = out[:, top : top + h, left : left + w]
    if plan.flip:
        out = out.flip(-1)
    return out


def ffmpeg_filter(plan: Plan, height: int, width: int) -> str:
    """The same plan as an FFmpeg filter graph, ending in packed RGB."""
    parts = []
    top, left, h, w = plan.box
    if (h, w) != (height, width):
        parts.append(f"crop=w={w}:h={h}:x={left}:y={top}:exact=1")
    if (h, w) != plan.resize:
        new_h, new_w = plan.resize
        parts.append(f"scale=w={new_w}:h={new_h}:flags={FFMPEG_SCALE_FLAGS}")
    if plan.crop is not None:
        top, left, h, w = plan.crop
        parts.append(f"crop=w={w}:h={h}:x={left}:y={top}:exact=1")
    if plan.flip:
        parts.append("hflip")
    parts.append("format=pix_fmts=rgb24")
    return ",".join(parts)


# ---------------------------------------------------------------------------------------------
# Threads.

_THREAD = threading.local()


@functools.cache
def _openmp_runtime() -> ctypes.CDLL | None:
    """The OpenMP runtime torch loaded (libgomp / libiomp / libomp), if we can find it."""
    try:
        with open("/proc/self/maps") as maps:
            paths = sorted(
                {
                    line.split()[-1]
                    for line in maps
                    if re.search(r"lib(gomp|iomp5|omp)[^/]*\.so", line)
                }
            )
        return ctypes.CDLL(paths[0]) if paths else None
    except (OSError, IndexError):
        return None


def serial_torch_in_this_thread() -> None:
    """Run torch ops called from this pool thread on one core.

    The pipeline's parallelism is its threads: a torch op (resize, stack) that also splits
    itself over torch's intra-op OpenMP team makes num_workers x intra-op threads fight over
    the cores, and on a busy machine one parallel region waits for a descheduled teammate
    (a 0.6 ms stack took 400 ms here). ``torch.set_num_threads(1)`` would also change the
    default of every later thread in the process, so only this thread's OpenMP setting is
    changed, after torch has initialised it.
    """
    if getattr(_THREAD, "serial", False):
        return
    _THREAD.serial = True
    torch.get_num_threads()  # torch initialises this thread's OpenMP setting on first use
    runtime = _openmp_runtime()
    if runtime is not None and torch.__config__.parallel_info().find("OpenMP") >= 0:
        runtime.omp_set_num_threads(1)


# ---------------------------------------------------------------------------------------------
# Reading and the generic fallback.


def read_bytes(path: str) -> torch.Tensor:
    """The file's bytes as a uint8 tensor (numpy's reader releases the GIL; torchvision's
    would too, but importing torchvision costs a pipeline ~1.5 s of CPU)."""
    return torch.from_numpy(np.fromfile(path, dtype=np.uint8))


def decode_generic(path: str) -> torch.Tensor:
    """Anything that is not a JPEG (PNG, WebP, GIF, BMP, TIFF, ...): PIL, through the same
    function as the torchvision and memmap loaders (size limit, colour modes, 16-bit), so an odd
    file gives the same pixels in every loader. uint8 RGB CHW."""
    return torch.from_numpy(np.array(load_rgb(path))).permute(2, 0, 1)


def open_file(sample: Sample) -> Opened:
    """Read a file and learn its image size: a JPEG that the admission rule hands to a fast
    decoder (``images.fast_jpeg``) from its frame header without decoding (refused there if
    over the pixel limit), its bytes kept for the decoder; any other file by decoding it
    through the generic decoder (PIL), which reads it or refuses it as in every other loader.
    Every spdl decoder opens files here. Raises for an unreadable file."""
    data = read_bytes(sample.path)
    header = fast_jpeg(data.numpy())
    if header is None:
        image = decode_generic(sample.path)
        return Opened(sample, image.shape[-2], image.shape[-1], image)
    check_size(header.width, header.height, sample.path)
    return Opened(sample, header.height, header.width, data)


def is_encoded(opened: Opened) -> bool:
    return isinstance(opened.payload, torch.Tensor) and opened.payload.dim() == 1


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}"


# ---------------------------------------------------------------------------------------------
# Decoders.


class ImageDecoder(abc.ABC):
    """Decodes one batch of samples per call; the pipeline runs num_workers calls at once.

    A call opens every file of the batch first (read, size from the header), draws the batch's
    plans at once (``Geometry.plans``), then decodes the images one after the other into one
    (pinned) batch tensor. A batch per pipeline task rather than an image per task matters:
    SPDL's per-task dispatch costs about as much CPU as a third of a JPEG decode (measured
    here); per batch it vanishes.
    """

    name: ClassVar[str]

    def __init__(self, geometry: Geometry, device: torch.device) -> None:
        self.device = device
        # Val crops decoded as regions only where the backend decodes regions (the JPEG
        # backend is chosen here, not by the first decode thread).
        self.geometry = replace(geometry, val_region=self.decodes_regions())
        self._copy_stream: torch.cuda.Stream | None = None

    @abc.abstractmethod
    def open(self, sample: Sample) -> Opened:
        """Read the file and learn its image size, decoding as little as possible; raises for
        a file that cannot be used."""

    @abc.abstractmethod
    def finish(self, opened: Opened, plan: Plan) -> torch.Tensor:
        """Decode (if not yet) and execute the plan: uint8 CHW at the output size; raises for a
        file that cannot be decoded."""

    def jpeg_device(self) -> torch.device | None:
        """Where ``loaderbench.decode`` decodes this decoder's JPEGs (None: it does not)."""
        return None

    def jpeg_backend(self) -> str:
        """The library that decodes the JPEGs (metrics.json's ``loader_<split>_jpeg_backend``)."""
        where = self.jpeg_device()
        return self.name if where is None else decode.backend(where)

    def decodes_regions(self) -> bool:
        """Whether only each plan's box of a JPEG is decoded (train crops and val centre crops;
        ``loader_<split>_region_decode``)."""
        where = self.jpeg_device()
        return where is not None and decode.region_decode(where)

    def open_batch(
        self, samples: Sequence[Sample]
    ) -> tuple[list[Opened], list[Plan], list[Failure]]:
        """Every file opened (or a ``Failure`` naming it) and the plans of the opened ones."""
        opened: list[Opened] = []
        failures: list[Failure] = []
        for sample in samples:
            try:
                opened.append(self.open(sample))
            except Exception as error:
                failures.append(Failure(sample.index, sample.path, _first_line(error)))
        return opened, self.geometry.plans(opened), failures

    def decode_batch(self, samples: Sequence[Sample], buffers: BatchBuffers) -> DecodedBatch:
        """Decode into one contiguous uint8 NCHW batch from the pool (pinned on CUDA runs)."""
        opened, plans, failures = self.open_batch(samples)
        images, labels = buffers.take(len(opened))
        kept = 0
        for item, plan in zip(opened, plans, strict=True):
            try:
                image = self.finish(item, plan)
            except Exception as error:
                failures.append(Failure(item.sample.index, item.sample.path, _first_line(error)))
                continue
            images[kept].copy_(image)
            labels[kept] = item.sample.label
            kept += 1
        return DecodedBatch(images[:kept], labels[:kept], failures)

    def to_device(self, batch: DecodedBatch, buffers: BatchBuffers) -> DecodedBatch:
        """The stage after decoding, on CUDA runs: the pinned batch copied to the GPU on a side
        stream (one thread runs this stage), so the copy overlaps the main loop's compute."""
        if self._copy_stream is None:
            self._copy_stream = torch.cuda.Stream(self.device)
        with torch.cuda.stream(self._copy_stream):
            images, labels = buffers.to_device(batch.images, batch.labels, self.device)
            ready = torch.cuda.Event()
            ready.record(self._copy_stream)
        return DecodedBatch(images, labels, batch.failures, ready)


class TurboDecoder(ImageDecoder):
    """libjpeg-turbo (torchvision.io.decode_jpeg) + uint8 antialiased resize, on the CPU."""

    name = "turbo"

    def open(self, sample: Sample) -> Opened:
        return open_file(sample)

    def finish(self, opened: Opened, plan: Plan) -> torch.Tensor:
        if not is_encoded(opened):  # decoded whole already (not a JPEG, or one PIL reads)
            return apply_plan(opened.payload, plan)
        region, rest = split_region(plan)
        return apply_plan(decode_cpu(opened.payload, region), rest)

    def jpeg_device(self) -> torch.device | None:
        return torch.device("cpu")


class FFmpegDecoder(ImageDecoder):
    """spdl.io: demux, then decode with one FFmpeg filter graph doing crop, scale, flip, RGB."""

    name = "ffmpeg"

    def __init__(self, geometry: Geometry, device: torch.device) -> None:
        super().__init__(geometry, device)
        import spdl.io

        self._spdl_io = spdl.io
        self._decode_config = spdl.io.decode_config(decoder_options=FFMPEG_DECODER_OPTIONS)

    def open(self, sample: Sample) -> Opened:
        # FFmpeg decodes only the JPEGs every fast decoder may take (``images.fast_jpeg``):
        # what it makes of the rest (YCCK's channels unconverted, a PDF, a tar, a cut PCX, a
        # PNG over the pixel limit) is not what PIL makes.
        opened = open_file(sample)
        if not is_encoded(opened):
            return opened
        try:
            packets = self._spdl_io.demux_image(opened.payload)
            if packets.codec.width < 1 or packets.codec.height < 1:
                raise OSError("no image size in the stream")
        except Exception as ffmpeg_error:
            # Not something FFmpeg reads: the generic decoder, before giving up.
            try:
                image = decode_generic(sample.path)
            except Exception as error:
                raise OSError(
                    f"FFmpeg: {_first_line(ffmpeg_error)}; fallback: {_first_line(error)}"
                ) from error
            return Opened(sample, image.shape[-2], image.shape[-1], image)
        codec = packets.codec
        check_size(codec.width, codec.height, sample.path)
        return Opened(sample, codec.height, codec.width, packets)

    def _decode(self, opened: Opened, plan: Plan) -> torch.Tensor:
        io = self._spdl_io
        frames = io.decode_packets(
            opened.payload,
            filter_desc=ffmpeg_filter(plan, opened.height, opened.width),
            decode_config=self._decode_config,
        )
        try:
            hwc = io.to_torch(io.convert_frames(frames))
        except Exception as error:  # no frame came out: a damaged stream
            raise OSError(f"FFmpeg decoded no frame ({_first_line(error)})") from error
        decoded_by.note(self.name)
        return hwc.reshape(hwc.shape[-3:]).permute(2, 0, 1)

    def finish(self, opened: Opened, plan: Plan) -> torch.Tensor:
        if isinstance(opened.payload, torch.Tensor):  # decoded by the fallback already
            return apply_plan(opened.payload, plan)
        try:
            return self._decode(opened, plan)
        except Exception as ffmpeg_error:
            try:
                image = decode_generic(opened.sample.path)
            except Exception as error:
                raise OSError(
                    f"FFmpeg: {_first_line(ffmpeg_error)}; fallback: {_first_line(error)}"
                ) from error
            return apply_plan(image, plan)


class NvjpegDecoder(ImageDecoder):
    """Two stages: the pool threads read a batch's files (``decode_batch``: bytes, sizes, plans,
    the non-JPEG files decoded on the CPU into pinned memory); one stage after them decodes the
    JPEGs in one batched nvJPEG call through the device's decoder and finishes the batch on its
    stream (``to_device``). nvJPEG calls from many threads would only queue on its lock, and
    each image's crop would launch kernels from a pool thread."""

    name = "nvjpeg"

    def __init__(self, geometry: Geometry, device: torch.device) -> None:
        require_cuda(device, "loader.decoder=nvjpeg")
        super().__init__(geometry, device)
        self.batched = batch_decoder(device)

    def open(self, sample: Sample) -> Opened:
        return open_file(sample)

    def finish(self, opened: Opened, plan: Plan) -> torch.Tensor:
        """A file decoded on the CPU (not a JPEG, or a JPEG without a usable header)."""
        return apply_plan(opened.payload, plan)

    def decode_batch(  # type: ignore[override]
        self, samples: Sequence[Sample], buffers: BatchBuffers
    ) -> ReadBatch:
        opened, plans, failures = self.open_batch(samples)
        jpegs = [(o, p) for o, p in zip(opened, plans, strict=True) if is_encoded(o)]
        others = [(o, p) for o, p in zip(opened, plans, strict=True) if not is_encoded(o)]
        size = self.geometry.size
        # No pool buffer held for a batch of JPEGs only (the usual case).
        staged = (
            buffers.images.take(len(others))
            if others
            else torch.empty((0, 3, size, size), dtype=torch.uint8)
        )
        labels: list[int] = []
        for item, plan in others:
            staged[len(labels)].copy_(self.finish(item, plan))
            labels.append(item.sample.label)
        return ReadBatch(jpegs, staged[: len(labels)], labels, failures)

    def to_device(  # type: ignore[override]
        self, read: ReadBatch, buffers: BatchBuffers
    ) -> DecodedBatch:
        """The JPEGs decoded at once, every image planned into one batch on the device."""
        size, device = self.geometry.size, self.device
        failures = list(read.failures)
        regions = [split_region(plan) for _, plan in read.jpegs]

        def finish(decoded: list[Decoded]) -> DecodedBatch:
            rows = len(decoded) + len(read.staged_labels)
            images = torch.empty((rows, 3, size, size), dtype=torch.uint8, device=device)
            labels = buffers.labels.take(rows)
            kept = 0
            for (item, _), (_, rest), image in zip(read.jpegs, regions, decoded, strict=True):
                if isinstance(image, BaseException):
                    failures.append(
                        Failure(item.sample.index, item.sample.path, _first_line(image))
                    )
                    continue
                images[kept].copy_(apply_plan(image, rest))
                labels[kept] = item.sample.label
                kept += 1
            staged = len(read.staged_labels)
            if staged:
                images[kept : kept + staged].copy_(buffers.images.to_device(read.staged, device))
                labels[kept : kept + staged] = torch.tensor(read.staged_labels)
                kept += staged
            on_device = buffers.labels.to_device(labels[:kept], device)
            return DecodedBatch(images[:kept], on_device, failures)

        datas = [opened.payload for opened, _ in read.jpegs]
        batch, ready = self.batched.run(datas, finish, [box for box, _ in regions])
        return batch._replace(ready=ready)

    def jpeg_device(self) -> torch.device | None:
        return self.device


DecoderFactory = Callable[[Geometry, torch.device], ImageDecoder]
DECODERS: dict[str, DecoderFactory] = {
    TurboDecoder.name: TurboDecoder,
    FFmpegDecoder.name: FFmpegDecoder,
    NvjpegDecoder.name: NvjpegDecoder,
}


def build_decoder(name: str, geometry: Geometry, device: torch.device) -> ImageDecoder:
    if name not in DECODERS:
        raise ValueError(f"loader.decoder={name!r} is unknown; choose one of {sorted(DECODERS)}")
    return DECODERS[name](geometry, device)


__all__ = [
    "DECODERS",
    "DecodedBatch",
    "Failure",
    "Geometry",
    "ImageDecoder",
    "Opened",
    "Plan",
    "Sample",
    "apply_plan",
    "build_decoder",
    "ffmpeg_filter",
    "train_plans",
    "val_plan",
]
