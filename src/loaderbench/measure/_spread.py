"""The spread of a steady window's rate: how far its parts disagree, as a share of the rate.

A window's rate is one number; how much to trust it is another. The window is cut into up to
``PARTS`` parts in order, and the spread is half the range of the parts' rates over the whole
window's rate. Where the window spans more than ``MIN_PARTS`` passes over the data (a small data
set, measured again and again) a part is made of whole passes (less the pass the window opened
in, part-way), so each holds its epoch's ends as the whole window does; otherwise of about as
many batches each. Two rates whose spreads overlap are one rate on this machine (a sweep's
worker count "within the spread" of the best: ``loaderbench.run.sweeps``).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

PARTS = 5
MIN_PARTS = 3  # fewer parts say nothing of the spread (None)
MIN_BATCHES_A_PART = 2


def window_spread(
    sizes: Sequence[int], intervals: Sequence[float], passes: Sequence[int]
) -> float | None:
    """Half the range of the rates of the window's parts over its rate (``sizes``,
    ``intervals`` and ``passes``, the pass each batch belongs to: the window's batches, in
    order); None for a window too short to cut."""
    units = _units(sizes, intervals, passes)
    if len(units) < MIN_PARTS:
        return None
    parts = min(PARTS, len(units))
    bounds = [round(i * len(units) / parts) for i in range(parts + 1)]
    rates = []
    for start, stop in itertools.pairwise(bounds):
        images = sum(u[0] for u in units[start:stop])
        seconds = sum(u[1] for u in units[start:stop])
        if seconds <= 0:
            return None
        rates.append(images / seconds)
    total_s = sum(u[1] for u in units)
    rate = sum(u[0] for u in units) / total_s
    return (max(rates) - min(rates)) / 2 / rate


def _units(
    sizes: Sequence[int], intervals: Sequence[float], passes: Sequence[int]
) -> list[tuple[int, float]]:
    """(images, seconds) of each whole pass in the window where it spans more than
    ``MIN_PARTS`` passes; else of each run of ``MIN_BATCHES_A_PART`` batches."""
    if len(set(passes)) > MIN_PARTS:
        by_pass: dict[int, list[float]] = {}
        for size, seconds, index in zip(sizes, intervals, passes, strict=True):
            unit = by_pass.setdefault(index, [0, 0.0, 0])
            unit[0] += size
            unit[1] += seconds
            unit[2] += 1
        units = list(by_pass.values())
        if units[0][2] < max(u[2] for u in units):  # the pass the window opened in: a part
            units = units[1:]
        return [(int(images), seconds) for images, seconds, _ in units]
    step = MIN_BATCHES_A_PART
    return [
        (sum(sizes[i : i + step]), sum(intervals[i : i + step]))
        for i in range(0, len(sizes) - step + 1, step)
    ]
