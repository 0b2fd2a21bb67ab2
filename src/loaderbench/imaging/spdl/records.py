"""What flows through the spdl pipeline: a sample of the epoch, a file opened (its size known,
not necessarily decoded), a file no decoder could read, and the batches the decode stages hand
on."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import torch

from loaderbench.imaging.plans import Plan


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
    # The images of this batch by the library that decoded them
    # (``loaderbench.imaging.decoded_by``).
    decoded_by: dict[str, int] | None = None
    # The dataset indices of the batch's rows, the failures' among them (``row_indices``).
    indices: torch.Tensor | None = None


class ReadBatch(NamedTuple):
    """nvjpeg's batch between its two stages: the JPEGs still encoded, the other files
    already decoded and planned on the CPU (into pinned memory)."""

    jpegs: list[tuple[Opened, Plan]]
    staged: torch.Tensor  # uint8 (k, 3, size, size): the non-JPEG files, finished
    staged_labels: list[int]
    failures: list[Failure]
    decoded_by: dict[str, int] | None = None  # the staged files', by library
    indices: torch.Tensor | None = None  # as ``DecodedBatch.indices``


def row_indices(samples: Sequence[Sample], batch: DecodedBatch | ReadBatch) -> torch.Tensor:
    """The dataset indices of ``batch``'s rows as its decoder fills them, the files that
    failed so far left in (the consumer takes out every failure, some known only later): in
    the samples' order, but nvjpeg's batch puts its JPEGs first and the staged files after."""
    order = [sample.index for sample in samples]
    if isinstance(batch, ReadBatch):
        jpegs = [opened.sample.index for opened, _ in batch.jpegs]
        first = set(jpegs)
        order = jpegs + [index for index in order if index not in first]
    return torch.tensor(order, dtype=torch.int64)


def delivered(indices: torch.Tensor, failures: Sequence[Failure]) -> torch.Tensor:
    """``indices`` less the files that failed: the rows of the batch handed over."""
    if not failures:
        return indices
    failed = torch.tensor([failure.index for failure in failures], dtype=torch.int64)
    return indices[~torch.isin(indices, failed)]


def is_encoded(opened: Opened) -> bool:
    """Whether the opened file is still JPEG bytes (not an image its opening decoded)."""
    return isinstance(opened.payload, torch.Tensor) and opened.payload.dim() == 1


__all__ = [
    "DecodedBatch",
    "Failure",
    "Opened",
    "ReadBatch",
    "Sample",
    "delivered",
    "is_encoded",
    "row_indices",
]
