"""Decoding with SPDL's I/O (``spdl.io``): the decode functions by name (turbo, ffmpeg,
nvjpeg), the plan each image is decoded by (box, resize, crop, flip), and what flows through a
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
from loaderbench.imaging.spdl.geometry import (
    Geometry,
    Plan,
    apply_plan,
    split_region,
    train_plans,
    val_plan,
    val_region_plan,
)
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
    "Plan",
    "Sample",
    "TurboDecoder",
    "apply_plan",
    "build_decoder",
    "is_encoded",
    "open_file",
    "split_region",
    "train_plans",
    "val_plan",
    "val_region_plan",
]
