"""Honest meters: data time apart from compute time.

``LoopMeter`` times the loop's waits for batches apart from the rest of each step, in a window
that opens only once the loader's head start (what it decoded ahead while the loop was not
measuring) is consumed, or a deep queue would be credited with speed it does not have; on CUDA
it drains the device only where the window opens and closes, so steps still overlap the next
batch's work. The process tree's CPU and memory: ``loaderbench.measure.process_tree``. The whole
rule and why: docs/metrics.md, "The head start is not counted".
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from torch.utils.data import DataLoader

from loaderbench.measure._ahead import Ahead, AheadClose, ahead_probe, first_short
from loaderbench.measure._spread import window_spread
from loaderbench.measure.gil_probe import GilProbe, gil_frac
from loaderbench.measure.metrics import (
    CPU_S_PER_1K_IMAGES,
    DATA_WAIT_FRAC,
    IMAGES_PER_S,
    NULL_REASON,
    SPREAD,
)
from loaderbench.platform.stopping import raise_if_stop_requested

Sync = Callable[[], None]

# The loop found the queue empty when it waited at least this share of a typical batch
# interval (and at least the floor): taking a batch that was ready costs far less.
EMPTY_QUEUE_SHARE = 0.25
EMPTY_QUEUE_FLOOR_S = 2e-4
# A first loop whose queue was never found empty opened with up to ``queue_depth`` batches
# ready; its window counts only if it spans this many queue depths (at most 1/20 credited).
AHEAD_WINDOW_DEPTHS = 20


def _batch_size(batch: Any) -> int:
    first = batch[0] if isinstance(batch, tuple | list) else batch
    return int(first.shape[0])


def head_start(loader: object) -> tuple[int, int]:
    """(batches ``loader`` may decode ahead of the loop at most, batches its next iteration may
    find decoded already): a project loader's ``queue_depth()`` and ``queued_at_start()``; a
    bare DataLoader's workers x ``prefetch_factor`` (it starts every epoch empty); nothing for
    other iterables, which are taken to make each batch when asked."""
    depth = getattr(loader, "queue_depth", None)
    if callable(depth):
        ready = getattr(loader, "queued_at_start", None)
        return int(depth()), int(ready()) if callable(ready) else 0
    if isinstance(loader, DataLoader) and loader.num_workers > 0:
        return loader.num_workers * int(loader.prefetch_factor or 1), 0
    return 0, 0


@dataclass
class LoopMeter:
    warmup_batches: int = 3
    sync: Sync | None = None  # after every batch's arrival and step (bench.sync_cuda)
    window_sync: Sync | None = None  # where the measured window opens and closes
    clock: Callable[[], float] = time.perf_counter
    waits: list[float] = field(default_factory=list)
    intervals: list[float] = field(default_factory=list)
    sizes: list[int] = field(default_factory=list)
    # Per batch: inside the steady-state window (after the warm-up and the head start).
    measured: list[bool] = field(default_factory=list)
    # Per batch: seconds ``iter(loader)`` took before it (a loop's first batch only; else 0).
    setup_s: list[float] = field(default_factory=list)
    # Per batch: the loader's (ready, under way) batches after its step (``batches_ahead``).
    ahead: list[Ahead] = field(default_factory=list)
    ttfb_s: float | None = None
    warmup_left: int | None = None  # warm-up batches still to come (None: warmup_batches)
    # Per batch: the loop (the meter's pass over the loader, from 0) it came in.
    loop_of: list[int] = field(default_factory=list)
    loops: int = 0
    # Per batch: the GIL probe's (held, probes) over it (``gil_frac``); None: no probe.
    gil: GilProbe | None = field(default_factory=GilProbe)
    gil_counts: list[tuple[int, int]] = field(default_factory=list)
    # Why the last loop without a steady window has none (``images_per_s`` is then null).
    no_window_reason: str | None = None
    # Consecutive loops are one measurement (``run.autorange``'s passes): a later loop goes on
    # where the last one ended, the time between them on the clock, and the window opens
    # once, after the warm-up and the head start counted over the loops.
    continuous: bool = False
    # Batches still to pass before the window opens, carried into a continuing loop.
    _opens_left: int | None = None
    _loop_end: float | None = None  # the clock where the last loop ended

    def _continues(self) -> bool:
        return self.continuous and self._loop_end is not None

    def window_opens_at(self, loader: object) -> int:
        """The batch of the next loop over ``loader`` where its measured window opens (see
        "The head start" above): past the warm-up left and the queue it lets the loader fill,
        or past what the loader decoded before the loop began."""
        depth, ready = head_start(loader)
        left = self.warmup_batches if self.warmup_left is None else self.warmup_left
        return left + depth if left > 0 else ready

    def iterate(self, loader: Iterable[Any], max_batches: int | None = None) -> Iterator[Any]:
        """Yield the loader's batches, timing each (and probing the GIL); one call per epoch."""
        opens = self.window_opens_at(loader)
        first_batch = len(self.intervals)
        # The first loop, and a later one that finds batches made before it began (a loader
        # working across epochs), settle their window where the queue first ran dry.
        queue, ready = head_start(loader)
        depth = queue if self.warmup_left is None or ready > 0 else 0
        if self._continues():
            # Nothing was made off the clock since the last loop: a window open at its end
            # stays open; one still to open opens where it would have in one long loop.
            window_open = bool(self.measured) and self.measured[-1]
            opens = 0 if window_open else self._opens_left or 0
            depth = 0 if window_open else queue
        if self.gil is not None:
            self.gil.start()
        try:
            yield from self._timed(loader, max_batches, opens, first_batch, depth)
        finally:
            if self.gil is not None:
                self.gil.stop()

    def _timed(
        self, loader: Iterable[Any], max_batches: int | None, opens: int, first: int, depth: int
    ) -> Iterator[Any]:
        clock, sync, edge = self.clock, self.sync, self.window_sync
        probe, close = ahead_probe(loader), AheadClose(self, first + opens, depth > 0)
        epoch_start = clock()
        # A continuing loop's first batch carries the time since the last loop ended (its
        # set-up included): whatever the loader made meanwhile was made on the clock.
        lead_in = self._loop_end if self._continues() else None
        iterator = iter(loader)
        setup = clock() - epoch_start if lead_in is None else 0.0
        count = 0
        tail_start: float | None = None
        while max_batches is None or count < max_batches:
            raise_if_stop_requested()
            start = clock()
            try:
                batch = next(iterator)
            except StopIteration:
                tail_start = start
                break
            if sync is not None:
                sync()
            arrived = clock()
            if self.ttfb_s is None:
                self.ttfb_s = arrived - epoch_start
            count += 1
            # The lead-in is the loader's set-up and the loop's bookkeeping: no compute.
            began = lead_in if lead_in is not None and count == 1 else start
            self.waits.append(arrived - began)
            self.sizes.append(_batch_size(batch))
            yield batch
            if sync is not None:
                sync()
            self.ahead.append(probe())
            if edge is not None and count == opens:
                edge()  # the warm-up's queued work is not the steady state's
            self.intervals.append(clock() - began)
            self.measured.append(count > opens)
            self.setup_s.append(setup if count == 1 else 0.0)
            self.loop_of.append(self.loops)
            self.gil_counts.append(self.gil.take() if self.gil is not None else (0, 0))
            close.after_batch(edge)
        left = self.warmup_batches if self.warmup_left is None else self.warmup_left
        self.warmup_left = max(0, left - count)
        self._opens_left = max(0, opens - count)
        # The tail of an epoch (the device's queued steps, draining, worker shutdown) belongs
        # to the last batch.
        if self.intervals and count:
            tail_start = clock() if tail_start is None else tail_start
            if edge is not None:
                edge()
            self.intervals[-1] += clock() - tail_start
        self._loop_end = clock()  # what follows (and the next loop's set-up) is a lead-in
        self.loops += 1
        if depth > 0:
            self._open_where_the_queue_ran_dry(first + opens, depth)
        if count and not any(self.measured[first:]):
            at_open = first + opens - 1  # the loader's word where the window opened
            told = 0 <= at_open < len(self.ahead) and self.ahead[at_open] is not None
            self.no_window_reason = self._why_no_window(count, opens, depth, told)
        if isinstance(iterator, Iterator) and hasattr(iterator, "close"):
            iterator.close()  # a generator cut short by max_batches releases its resources now

    def _open_where_the_queue_ran_dry(self, opened: int, depth: int) -> None:
        """The first loop's window, settled once it has ended. Having consumed the head start
        does not prove the queue was empty when the window opened: the workers may have kept
        ahead of a loop that took their early batches at its own speed (a slow first step, a
        burst of many workers finishing together), and the loop's end drains the queue, so up
        to ``depth`` batches made before the window would count inside it. The window opens at
        the first batch the loop had to wait for (the queue was empty: what follows was made
        while the window was open). A loop that never waited (a loader ahead of the loop
        throughout) keeps its window only where it spans ``AHEAD_WINDOW_DEPTHS`` queue depths."""
        window = range(opened, len(self.intervals))
        if not window:
            return
        typical = statistics.median(self.intervals[i] for i in window)
        empty = max(EMPTY_QUEUE_FLOOR_S, EMPTY_QUEUE_SHARE * typical)
        dry = next((i for i in window if self.waits[i] >= empty), None)
        if dry is None and len(window) >= AHEAD_WINDOW_DEPTHS * depth:
            return
        if dry is None:  # ahead throughout: keep the part the loader can vouch for
            short = first_short(self.ahead, opened, window.stop)
            if short is not None:
                for i in range(short, window.stop):
                    self.measured[i] = False
                return
        for i in range(opened, window.stop if dry is None else dry):
            self.measured[i] = False

    def _why_no_window(self, count: int, opens: int, depth: int, told: bool) -> str:
        """Why a loop of ``count`` batches has no steady window (``images_per_s`` null);
        ``told``: the loader said how far ahead it was (``Loader.batches_ahead``)."""
        if count <= opens:
            return (
                f"no steady window: the loop had {count} batches, and its window opens after "
                f"{opens} (bench.warmup_batches and the loader's head start of {depth})"
            )
        if told:
            return (
                f"no steady window: past the head start the loop took {count - opens} batches "
                "without waiting, all of them made before the window opened (the loader's "
                "queue ran down: the epoch's tail, or a loader falling behind)"
            )
        return (
            f"no steady window: the loop never waited for the loader past the head start, "
            f"over {count - opens} batches, fewer than {AHEAD_WINDOW_DEPTHS} queue depths of "
            f"{depth}, and the loader could not tell that it made them inside the window "
            "(Loader.batches_ahead)"
        )

    @property
    def batches_to_open(self) -> int:
        """Batches a continuing loop still has to pass before the window opens (0: open,
        or settled by the loop's waits); before any loop, the warm-up's."""
        return self.warmup_batches if self._opens_left is None else self._opens_left

    @property
    def images(self) -> int:
        return sum(self.sizes)

    @property
    def batches(self) -> int:
        return len(self.intervals)

    def summary(self, since: int = 0) -> dict[str, float | int | None]:
        """The loop's numbers from its batch ``since`` on (an epoch's: ``since`` is
        ``batches`` at the epoch's start). The rates count the batches in the measured window
        (``measured``); where none is (a queue deeper than the loop, or fewer batches than the
        warm-up), ``images_per_s`` is None with ``images_per_s_null_reason``, and the
        end-to-end rate (every batch and the loops' set-up) stands beside it, apart."""
        n = len(self.intervals)
        chosen = [i for i in range(since, n) if self.measured[i]]
        steady = bool(chosen)
        loop_s = sum(self.intervals[since:n])
        all_s = loop_s + sum(self.setup_s[since:n])
        images = sum(self.sizes[since:n])
        steady_time = sum(self.intervals[i] for i in chosen)
        steady_images = sum(self.sizes[i] for i in chosen)
        held = sum(self.gil_counts[i][0] for i in chosen)
        probes = sum(self.gil_counts[i][1] for i in chosen)
        # No window: the wait over the whole loop (its set-up included), for what it says.
        wait_time = steady_time if steady else all_s
        waited = sum(self.waits[i] for i in (chosen if steady else range(since, n)))
        return {
            "images": images,
            "batches": n - since,
            IMAGES_PER_S: steady_images / steady_time if steady and steady_time > 0 else None,
            "images_per_s_end_to_end": images / all_s if all_s > 0 else None,
            NULL_REASON: None if steady or n == since else self.no_window_reason,
            "ttfb_s": self.ttfb_s,
            DATA_WAIT_FRAC: waited / wait_time if wait_time > 0 else None,
            "loop_s": loop_s,
            "measured_batches": len(chosen),
            "window_s": steady_time,
            "spread": window_spread(
                [self.sizes[i] for i in chosen],
                [self.intervals[i] for i in chosen],
                [self.loop_of[i] for i in chosen],
            ),
            "gil_frac": gil_frac(held, probes),
        }


class IntervalRates:
    """Throughput and data wait of a loop since the last log point (``take``), from its
    meter's records: what a step curve plots. Reads no device value and waits for nothing."""

    def __init__(self, meter: LoopMeter) -> None:
        self.meter = meter
        self._mark()

    def _mark(self) -> None:
        self._time = self.meter.clock()
        self._batches = len(self.meter.sizes)

    def take(self) -> dict[str, float | None]:
        """``images_per_s`` and ``data_wait_frac`` over the batches since the last call."""
        meter, now = self.meter, self.meter.clock()
        elapsed = now - self._time
        images = sum(meter.sizes[self._batches :])
        waited = sum(meter.waits[self._batches :])
        self._mark()
        if elapsed <= 0:
            return {IMAGES_PER_S: None, DATA_WAIT_FRAC: None}
        return {IMAGES_PER_S: images / elapsed, DATA_WAIT_FRAC: min(1.0, waited / elapsed)}


def loop_metrics(meter: LoopMeter, cpu_s: float, since: int = 0) -> dict[str, Any]:
    """A loop's throughput, start-up, data wait and CPU cost, as metrics.json names them
    (from its batch ``since`` on: an epoch's)."""
    summary = meter.summary(since)
    images = summary["images"]
    return {
        "images": images,
        IMAGES_PER_S: summary[IMAGES_PER_S],
        "images_per_s_end_to_end": summary["images_per_s_end_to_end"],
        NULL_REASON: summary[NULL_REASON],
        # Batches images_per_s counts; 0: no steady window, images_per_s is null.
        "steady_batches": summary["measured_batches"],
        "steady_window_s": summary["window_s"],
        SPREAD: summary["spread"],
        "ttfb_s": summary["ttfb_s"],
        DATA_WAIT_FRAC: summary[DATA_WAIT_FRAC],
        "gil_frac": summary["gil_frac"],
        "loop_s": summary["loop_s"],
        "cpu_s": cpu_s,
        CPU_S_PER_1K_IMAGES: 1000 * cpu_s / images if images else None,
    }


class Average:
    """A running mean (weighted by count)."""

    def __init__(self) -> None:
        self.total = 0.0
        self.count = 0

    def update(self, value: float, n: int = 1) -> None:
        self.total += value * n
        self.count += n

    @property
    def mean(self) -> float:
        return self.total / self.count if self.count else float("nan")
