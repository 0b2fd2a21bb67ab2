"""``loader=spdl``: SPDL's thread pipeline: ``loader`` builds and runs it, ``decoders`` holds
the decode functions (turbo, ffmpeg, nvjpeg), ``records`` what flows through the pipeline
(samples, opened files, failures, batches), ``geometry`` the plan each image is decoded by (box,
resize, crop, flip), ``stats`` SPDL's per-stage statistics.

The names below are the package's public face (what the benchmark uses). They are loaded on
first use: the loader registry imports ``spdl.settings`` in every run to learn its keys, and
that must not load the decoders' libraries where ``loader=spdl`` is not chosen.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from loaderbench.loaders.spdl.decoders import (
        DECODERS,
        FFmpegDecoder,
        ImageDecoder,
        NvjpegDecoder,
        TurboDecoder,
        build_decoder,
        open_file,
    )
    from loaderbench.loaders.spdl.geometry import (
        Geometry,
        Plan,
        apply_plan,
        split_region,
        train_plans,
        val_plan,
        val_region_plan,
    )
    from loaderbench.loaders.spdl.records import (
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


def __getattr__(name: str) -> Any:
    """A public name, imported from its module on first use."""
    if name not in __all__:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    for module in ("records", "geometry", "decoders"):
        found = importlib.import_module(f"{__name__}.{module}")
        if name in found.__all__:
            return getattr(found, name)
    raise AssertionError(f"{__name__}.__all__ names {name!r}, which no module of it defines")
