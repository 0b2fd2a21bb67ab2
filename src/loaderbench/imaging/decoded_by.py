"""What decoded every image: a count per library, kept by each loader per batch.

Each decode path names the library that produced an image's pixels (``note``):
``nvimgcodec:<engine>`` (``hardware``, ``cuda``, ``hybrid``, ``cpu``: where the Huffman decode
ran), ``torchcodec``, ``torchvision``, ``ffmpeg`` or ``pil`` (the reference, and every fast
decoder's fallback). A loader opens a ``counting`` scope around a batch's decoding, in whichever
thread or process decodes it, and hands the counts on with the batch: no lock per image, and a
batch never delivered is not counted. metrics.json keeps the totals
(``loader_<split>_decoded_by``); ``fallback_warning`` says when more than
``FALLBACK_WARN_SHARE`` of the images were decoded by another library than the loader's own.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

# Above this share of images decoded by another library than the loader's, the run says so.
FALLBACK_WARN_SHARE = 0.01

_local = threading.local()


def note(library: str, images: int = 1) -> None:
    """``images`` were just decoded by ``library`` (counted in the innermost open scope)."""
    counts: dict[str, int] | None = getattr(_local, "counts", None)
    if counts is not None and images:
        counts[library] = counts.get(library, 0) + images


@contextmanager
def counting() -> Iterator[dict[str, int]]:
    """The decodes of this thread inside the block, by library; added to an enclosing scope's
    counts at its end (a batch's scope inside a loader's)."""
    outer: dict[str, int] | None = getattr(_local, "counts", None)
    counts: dict[str, int] = {}
    _local.counts = counts
    try:
        yield counts
    finally:
        _local.counts = outer
        if outer is not None:
            add(outer, counts)


@contextmanager
def not_counted() -> Iterator[None]:
    """Decodes inside the block count nowhere (a backend's self-test)."""
    outer = getattr(_local, "counts", None)
    _local.counts = None
    try:
        yield
    finally:
        _local.counts = outer


def add(total: dict[str, int], more: Mapping[str, int] | None) -> dict[str, int]:
    """``more``'s counts added into ``total`` (returned)."""
    for library, images in (more or {}).items():
        total[library] = total.get(library, 0) + images
    return total


def library(key: str) -> str:
    """The library a count's key names (``nvimgcodec:hardware`` -> ``nvimgcodec``)."""
    return key.split(":", 1)[0]


def fallback_warning(split: str, counts: Mapping[str, int], primary: str | None) -> str | None:
    """A line for the run's log when over ``FALLBACK_WARN_SHARE`` of ``split``'s images were
    decoded by a library other than ``primary`` (the loader's own), naming each and its share;
    None otherwise."""
    decoded = sum(counts.values())
    if not decoded or primary is None:
        return None
    others = {lib: n for lib, n in counts.items() if library(lib) != primary and n}
    if sum(others.values()) <= FALLBACK_WARN_SHARE * decoded:
        return None
    shares = ", ".join(
        f"{lib} {n} ({100 * n / decoded:.1f}%)"
        for lib, n in sorted(others.items(), key=lambda item: -item[1])
    )
    return (
        f"loader {split}: {sum(others.values())} of {decoded} images were not decoded by "
        f"{primary} but fell back to {shares}: files it refuses or does not take (CMYK, PNG, "
        f"damaged), or regions its build cannot decode; throughput reflects the fallback"
    )


def summary_text(metrics: Mapping[str, object]) -> str | None:
    """A run's ``loader_<split>_decoded_by`` in a few words (a sweep summary's cell, a report
    row's note): ``val: nvimgcodec 790, pil 10``; None where no split counted."""
    parts = []
    for split in ("train", "val"):
        counts = metrics.get(f"loader_{split}_decoded_by")
        if isinstance(counts, Mapping) and counts:
            ranked = sorted(counts.items(), key=lambda item: -item[1])
            parts.append(f"{split}: " + ", ".join(f"{lib} {n}" for lib, n in ranked))
    return "; ".join(parts) or None


__all__ = [
    "FALLBACK_WARN_SHARE",
    "add",
    "counting",
    "fallback_warning",
    "library",
    "not_counted",
    "note",
    "summary_text",
]
