"""What bounds a loader's work per image, so that the benchmark holds each row to the limit of
the same work. Kept here, by loader name, since only the benchmark asks it.

First one of "decode" (decoding and resizing whole JPEGs), "copy" (copying stored pixels) or
"crop" (cutting, resizing and flipping stored pixels); then any further yardsticks: "pool" (a
plain thread pool of the decode limit's own decoder), "region" (decoding only each train crop's
region). Decoding every image, for a loader this table does not name.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from loaderbench.config.loader import LoaderSettings


def _memmap(settings: Any, train: bool) -> tuple[str, ...]:
    if (settings.store if train else settings.val_store) == "raw":
        return ("crop",) if train else ("copy",)
    return ("decode", "region") if train else ("decode",)


def _spdl(settings: Any, train: bool) -> tuple[str, ...]:
    if settings.decoder != "turbo":
        return ("decode",)
    return ("decode", "region") if train else ("decode", "pool")


BOUNDS: dict[str, Callable[[Any, bool], tuple[str, ...]]] = {"memmap": _memmap, "spdl": _spdl}


def work_bounds(settings: LoaderSettings, train: bool) -> tuple[str, ...]:
    """What bounds the work of a loader with ``settings`` on the train (else val) pipeline."""
    bounds = BOUNDS.get(settings.name)
    return bounds(settings, train) if bounds else ("decode",)
