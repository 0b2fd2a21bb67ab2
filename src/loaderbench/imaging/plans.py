"""The crop plan: one plan per image (box, resize, crop, flip), executed by each decoder its
own way; the same for every decoder and equal to the torchvision reference.

* val: resize the short side to ``val_resize_size(size)`` (torchvision's ``Resize`` rounding;
  not SPDL's default letterbox), then crop the centre ``size`` x ``size``. Where the backend
  decodes regions, the centre crop is a region of the original, decoded alone and resized once
  (``val_region_plan``), up to half a source pixel off the reference's (docs/decoding.md, "The
  spdl decoders", says why that is kept); FFmpeg decodes whole and keeps the reference's plan.
* train: the random-resized box (``seeded_crops``, from the header's true size) decoded alone
  where the backend decodes regions (``split_region``), resized once and flipped: cheaper than
  memmap's fixed-size decode then batched crop, since the image is decoded in this stage anyway
  and only the box is resized, from full-resolution pixels, as torchvision's
  RandomResizedCrop does.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import NamedTuple

import torch

from loaderbench.imaging.decode import Box
from loaderbench.imaging.transforms import (
    resize_uint8,
    val_resize_size,
)


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


def split_region(plan: Plan) -> tuple[Box, Plan]:
    """The region of the image a plan reads (its box) and the plan for that region once
    decoded alone: region decoders decode only the box, the others cut it from the image."""
    _, _, h, w = plan.box
    return plan.box, replace(plan, box=(0, 0, h, w))


class PlanTable(NamedTuple):
    """A batch's plans for its regions once decoded alone (``split_region``), as tensors for
    a batched resize (``device_resize``): each region resized to ``resized`` (h, w), the
    output cut from ``offsets`` (top, left), mirrored where ``flips``."""

    resized: torch.Tensor  # int64 (n, 2)
    offsets: torch.Tensor  # int64 (n, 2)
    flips: torch.Tensor  # bool (n,)


def plan_table(plans: Sequence[Plan]) -> tuple[list[Box], PlanTable]:
    """Each plan's box (the region to decode) and the batch's plans for the decoded regions,
    in one pass over the plans and one tensor each."""
    rows = [(*p.resize, *(p.crop or (0, 0))[:2], p.flip) for p in plans]
    table = torch.tensor(rows, dtype=torch.int64).reshape(len(plans), 5)
    boxes = [p.box for p in plans]
    return boxes, PlanTable(table[:, 0:2], table[:, 2:4], table[:, 4].to(torch.bool))


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


__all__ = [
    "Plan",
    "PlanTable",
    "Span",
    "apply_plan",
    "plan_table",
    "source_span",
    "split_region",
    "train_plans",
    "val_plan",
    "val_region_plan",
]
