"""A loader's own word that it kept ahead of the loop: where the model is the bottleneck.

A first loop that never waits for its loader cannot tell, from its own clock, the batches the
loader made inside the measured window from those it made before (its head start). A loader
that counts its batches ready and under way (``Loader.batches_ahead``) can: while, after each
step, it holds at least as many batches ready as it held ready or under way when the window
opened, every batch the loop took in between was made inside the window. So the window holds
up to there, and the loop's rate is the model's steady rate (docs/metrics.md, "The head start
is not counted").
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

Ahead = tuple[int, int] | None  # (batches ready, batches under way) ahead of the loop


def ahead_probe(loader: object) -> Callable[[], Ahead]:
    """How to ask ``loader`` how far ahead of the loop it is now: a project loader's
    ``batches_ahead()`` (None where it cannot tell); nothing to ask for other iterables."""
    probe = getattr(loader, "batches_ahead", None)
    return probe if callable(probe) else lambda: None


def first_short(ahead: list[Ahead], opened: int, end: int) -> int | None:
    """The first batch from ``opened`` on after whose step the loader had fewer batches ready
    than it had ready or under way where the window opened (``ahead[opened - 1]``): up to the
    batch before it, every batch the loop took was made inside the window. None where the
    loader cannot tell; ``end`` where it never fell short."""
    start = ahead[opened - 1] if opened > 0 else None
    if start is None:
        return None
    made_before = start[0] + start[1]
    for i in range(opened, end):
        now = ahead[i]
        if now is None:
            return None
        if now[0] < made_before:
            return i
    return end


class AheadClose:
    """On CUDA, a first loop whose loader keeps ahead may close its window before the loop
    ends (``first_short``): the device is drained there once, so the window's time holds its
    batches' device work, and the drain is charged to the window's last batch (conservative:
    the drain may hold the next step's work too, which lowers the rate by at most one step)."""

    def __init__(self, meter: Any, opened: int, first_loop: bool) -> None:
        self.meter, self.opened, self.active = meter, opened, first_loop

    def after_batch(self, edge: Callable[[], None] | None) -> None:
        meter = self.meter
        last = len(meter.intervals) - 1
        if edge is None or not self.active or last < self.opened:
            return
        start = meter.ahead[self.opened - 1] if self.opened > 0 else None
        now = meter.ahead[last]
        if start is None or now is None:
            self.active = False
            return
        if now[0] >= start[0] + start[1]:
            return
        self.active = False  # closes here: drain the window's queued device work
        drain_start = meter.clock()
        edge()
        drained = meter.clock() - drain_start
        if last > self.opened:
            meter.intervals[last - 1] += drained
        else:
            meter.intervals[last] += drained
