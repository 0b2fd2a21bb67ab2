"""Decoding with SPDL's I/O (``spdl.io``): the decode functions by name (turbo, ffmpeg,
nvjpeg), the run's geometry (a crop plan per image, ``imaging.plans``), and what flows through a
pipeline that runs them (samples, opened files, failures, batches). The spdl loader composes
these; the benchmark times them alone."""

from __future__ import annotations

from loaderbench.imaging.spdl.decoders import (
    DECODERS,
    FFmpegDecoder,
    ImageDecoder,
    NvjpegDecoder,
    TurboDecoder,
    build_decoder,
    open_file,
)
from loaderbench.imaging.spdl.geometry import Geometry
from loaderbench.imaging.spdl.records import (
    DecodedBatch,
    Failure,
    Opened,
    Sample,
    is_encoded,
)

__all__ = [
    "DECODERS",
    "DecodedBatch",
    "FFmpegDecoder",
    "Failure",
    "Geometry",
    "ImageDecoder",
    "NvjpegDecoder",
    "Opened",
    "Sample",
    "TurboDecoder",
    "build_decoder",
    "is_encoded",
    "open_file",
]
