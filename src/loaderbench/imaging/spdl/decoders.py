"""Decode functions of the spdl loader, by name: ``ffmpeg``, ``turbo`` and ``nvjpeg``. Each must
release the GIL for its heavy parts, since the pipeline runs ``loader.num_workers`` batch
decodes at once in a thread pool (docs/decoding.md, "The spdl decoders"):

* ``ffmpeg``: ``spdl.io`` with an FFmpeg filter graph doing the whole geometry in one pass;
  its chroma upsampling is not libjpeg's, so its pixels differ slightly from PIL's;
* ``turbo``: a batch read in one call and decoded by libjpeg-turbo, cut, resized and flipped
  in another (``decode.cpu_batch``), else image by image through ``loaderbench.imaging.decode``;
  PIL's decoder and filter, so the torchvision reference's pixels;
* ``nvjpeg``: the threads read bytes and sizes; one later stage makes one batched nvJPEG call
  a batch (train boxes only) and finishes it on the GPU (``device_resize``); CUDA only.

Which files a fast decoder takes is ``files.fast_jpeg``'s one rule; the rest is PIL's, so every
loader gives a file the same verdict and pixels. Each refuses an image over
``dataset.max_image_pixels`` from its header, applies no EXIF orientation, and makes a file
nothing decodes a ``Failure`` naming it. ``records`` and ``geometry`` describe what they decode.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import ClassVar

import numpy as np
import torch

from loaderbench.imaging import decode, decoded_by
from loaderbench.imaging.decode import Decoded, batch_decoder, cpu_batch, decode_cpu, require_cuda
from loaderbench.imaging.device_resize import resize_images
from loaderbench.imaging.files import check_size, fast_jpeg, load_rgb
from loaderbench.imaging.plans import Plan, PlanTable, apply_plan, plan_table, split_region
from loaderbench.imaging.spdl.geometry import Geometry
from loaderbench.imaging.spdl.records import (
    DecodedBatch,
    Failure,
    Opened,
    ReadBatch,
    Sample,
    is_encoded,
)
from loaderbench.platform.buffers import BatchBuffers

# FFmpeg's scaler: bilinear, widened when shrinking like PIL's antialiased filter. Interpolating
# chroma at full resolution brings its colours closer to libjpeg's for a few per cent more
# decode time (docs/measurements.md, "Figures moved from the comments").
FFMPEG_SCALE_FLAGS = "bilinear+full_chroma_int"
# Fail on a damaged stream (truncated file) instead of returning a half-grey image; PIL and
# libjpeg-turbo refuse those too.
FFMPEG_DECODER_OPTIONS = {"err_detect": "explode"}


# ---------------------------------------------------------------------------------------------
# Reading and the generic fallback.


def read_bytes(path: str) -> torch.Tensor:
    """The file's bytes as a uint8 tensor (numpy's reader releases the GIL; torchvision's
    would too, but importing torchvision costs a pipeline seconds of CPU)."""
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
    return open_read(sample, read_bytes(sample.path))


def open_read(sample: Sample, data: torch.Tensor) -> Opened:
    """``open_file`` of a file whose bytes were read already."""
    header = fast_jpeg(data.numpy())
    if header is None:
        image = decode_generic(sample.path)
        return Opened(sample, image.shape[-2], image.shape[-1], image)
    check_size(header.width, header.height, sample.path)
    return Opened(sample, header.height, header.width, data)


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}"


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
# Decoders.


class ImageDecoder(abc.ABC):
    """Decodes one batch of samples per call; the pipeline runs num_workers calls at once.

    A call opens every file of the batch first (read, size from the header), draws the batch's
    plans at once (``Geometry.plans``), then decodes the images one after the other into one
    (pinned) batch tensor. A batch per pipeline task rather than an image per task matters:
    SPDL's per-task dispatch costs a sizeable part of a JPEG decode's CPU (docs/decoding.md);
    per batch it vanishes.
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
        """Where ``loaderbench.imaging.decode`` decodes this decoder's JPEGs (None: it does not)."""
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
    """libjpeg-turbo + uint8 antialiased resize, on the CPU: a batch read in one call and its
    JPEGs decoded, cut, resized and flipped in another, neither holding the GIL
    (``decode.cpu_batch``); image by image (``finish``) where those calls cannot run here, for
    the files PIL reads, for a plan that is not a box resized to the output size, and for a
    batch where a file fails (so that the failure names it)."""

    name = "turbo"

    def __init__(self, geometry: Geometry, device: torch.device) -> None:
        self.batched = cpu_batch.available()
        super().__init__(geometry, device)
        if self.batched:  # a val crop's box cut from the whole image: the region's pixels
            self.geometry = replace(self.geometry, val_region=True)
            cpu_batch.warm_up()

    def open(self, sample: Sample) -> Opened:
        return open_file(sample)

    def decode_batch(self, samples: Sequence[Sample], buffers: BatchBuffers) -> DecodedBatch:
        if not self.batched:
            return super().decode_batch(samples, buffers)
        try:
            datas = cpu_batch.read_files([sample.path for sample in samples])
        except Exception:  # a file missing or unreadable: image by image names it
            return super().decode_batch(samples, buffers)
        opened: list[Opened] = []
        failures: list[Failure] = []
        for sample, data in zip(samples, datas, strict=True):
            try:
                opened.append(open_read(sample, data))
            except Exception as error:
                failures.append(Failure(sample.index, sample.path, _first_line(error)))
        plans = self.geometry.plans(opened)
        images, labels = buffers.take(len(opened))
        labels.copy_(torch.tensor([item.sample.label for item in opened], dtype=labels.dtype))
        size = (self.geometry.size, self.geometry.size)
        at_once = [
            k
            for k, (item, plan) in enumerate(zip(opened, plans, strict=True))
            if is_encoded(item) and plan.crop is None and plan.resize == size
        ]
        try:
            cpu_batch.decode_into(
                [opened[k].payload for k in at_once],
                [list(plans[k].box) for k in at_once],
                [plans[k].flip for k in at_once],
                at_once,
                images,
            )
            done = set(at_once)
        except Exception:  # a JPEG libjpeg-turbo refuses: each decoded alone, the bad one named
            done = set()
        kept = list(range(len(opened)))
        for k in (k for k in range(len(opened)) if k not in done):
            try:
                images[k].copy_(self.finish(opened[k], plans[k]))
            except Exception as error:
                item = opened[k].sample
                failures.append(Failure(item.index, item.path, _first_line(error)))
                kept.remove(k)
        if len(kept) < len(opened):  # the failed files' rows taken out, the order kept
            rows = torch.tensor(kept, dtype=torch.long)
            images[: len(kept)] = images[rows]
            labels[: len(kept)] = labels[rows]
        return DecodedBatch(images[: len(kept)], labels[: len(kept)], failures)

    def jpeg_backend(self) -> str:
        return cpu_batch.LIBRARY if self.batched else super().jpeg_backend()

    def decodes_regions(self) -> bool:
        return not self.batched and super().decodes_regions()

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
    stream in a few kernels (``to_device``). Whether a decoder per thread and stream would feed
    the hardware engine faster is the GPU check's ``sharing`` phase's question (not measured
    yet); the host work around the call is ``tools.bench.host_cost``'s."""

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
        """The JPEGs decoded in one call, then finished as one batch on the decoder's stream:
        every plan's resize, crop and flip in a few kernels (``device_resize``)."""
        device = self.device
        failures = list(read.failures)
        regions, table = plan_table([plan for _, plan in read.jpegs])
        labels = [item.sample.label for item, _ in read.jpegs]

        def finish(decoded: list[Decoded]) -> DecodedBatch:
            kept = [k for k, image in enumerate(decoded) if not isinstance(image, BaseException)]
            for k in sorted(set(range(len(decoded))) - set(kept)):
                sample = read.jpegs[k][0].sample
                failures.append(Failure(sample.index, sample.path, _first_line(decoded[k])))
            images = self._finished([decoded[k] for k in kept], table, kept, read, buffers)
            label_list = [labels[k] for k in kept] + read.staged_labels
            pinned = buffers.labels.take(len(label_list))
            pinned.copy_(torch.tensor(label_list, dtype=torch.int64))
            return DecodedBatch(images, buffers.labels.to_device(pinned, device), failures)

        datas = [opened.payload for opened, _ in read.jpegs]
        batch, ready = self.batched.run(datas, finish, regions)
        return batch._replace(ready=ready)

    def _finished(
        self,
        images: list[torch.Tensor],
        table: PlanTable,
        kept: list[int],
        read: ReadBatch,
        buffers: BatchBuffers,
    ) -> torch.Tensor:
        """The decoded regions resized by their plans, then the staged (non-JPEG) images."""
        size, device = self.geometry.size, self.device
        staged = len(read.staged_labels)
        out = torch.empty((len(images) + staged, 3, size, size), dtype=torch.uint8, device=device)
        if images:
            pick = torch.tensor(kept, dtype=torch.int64)
            resize_images(
                images,
                size,
                table.flips[pick],
                out[: len(images)],
                resized=table.resized[pick],
                offsets=table.offsets[pick],
            )
        if staged:
            out[len(images) :].copy_(buffers.images.to_device(read.staged, device))
        return out

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
    "FFmpegDecoder",
    "ImageDecoder",
    "NvjpegDecoder",
    "TurboDecoder",
    "build_decoder",
    "ffmpeg_filter",
    "open_file",
]
