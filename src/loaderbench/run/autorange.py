"""Passes over the data until the loop's steady window is a measurement: timeit's autorange.

A loop's rate counts only its steady window (``LoopMeter``), and on a small data set or with
large batches one pass may end before it opens. So a measurement that is the point of its run
(``model=none``, eval.py's throughput, the ceiling pass) repeats its passes as one continuous
loop until the window holds ``min_batches`` batches and ``min_s`` seconds, or ``max_s`` is
reached (``bench.epochs=auto``); ``bench.epochs=N`` runs N passes, and where they leave no window
the reason says what to set. The ranks of a data-parallel run agree on when to stop.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from loaderbench.config.loader import AUTO
from loaderbench.config.schema import BenchConfig
from loaderbench.measure.meters import LoopMeter
from loaderbench.platform import distributed

log = logging.getLogger(__name__)

# A pass: (epoch, next_epoch) -> one loop over the loader through the meter; ``next_epoch``
# says that another pass follows it (a loader may then read ahead into it).
RunPass = Callable[[int, bool], None]


def all_ranks_done(done: bool) -> bool:
    """True where every rank is done (one rank that needs another pass keeps them all)."""
    (needing,) = distributed.all_reduce([0.0 if done else 1.0], "max")
    return needing == 0.0


@dataclass(frozen=True)
class WindowRule:
    """When a loop's passes have measured enough: ``passes`` of them (an explicit count), or,
    where ``passes`` is None, a window of ``min_batches`` and ``min_s`` within ``max_s``."""

    min_batches: int
    min_s: float
    max_s: float
    passes: int | None = None

    @classmethod
    def of(cls, bench: BenchConfig, *, min_batches: int | None = None, explicit: bool = True):
        """``bench``'s rule; ``min_batches`` for another minimum (the ceiling pass's);
        ``explicit=False``: auto whatever ``bench.epochs`` says (the ceiling pass)."""
        passes = None if bench.epochs == AUTO or not explicit else int(bench.epochs)
        batches = bench.min_window_batches if min_batches is None else min_batches
        return cls(batches, bench.min_window_s, bench.max_measure_s, passes)

    def holds(self, batches: int, seconds: float) -> bool:
        return batches >= self.min_batches and seconds >= self.min_s

    def another_after(self, done: int, meter: LoopMeter, per_pass: int, elapsed: float) -> bool:
        """Whether a pass will surely follow the one about to start (``done`` passes ran, of
        ``per_pass`` batches each, in ``elapsed`` seconds): the loader may read ahead."""
        if self.passes is not None:
            return done + 1 < self.passes
        window = meter.summary()
        gain = max(0, per_pass - meter.batches_to_open)
        pass_s = elapsed / done if done else 0.0
        if elapsed + 2 * pass_s >= self.max_s:
            return False  # the bound may end the measurement after this pass
        if window["measured_batches"] + gain < self.min_batches:
            return True
        steady = window["measured_batches"]
        if not steady:
            return False
        return window["window_s"] * (steady + gain) / steady < self.min_s


@dataclass(frozen=True)
class Passes:
    """What a measurement's passes came to."""

    passes: int
    seconds: float  # the passes' wall time
    steady_batches: int
    window_s: float

    def metrics(self) -> dict[str, Any]:
        return {"passes": self.passes}


def run_passes(
    meter: LoopMeter,
    run_pass: RunPass,
    rule: WindowRule,
    per_pass: int,
    *,
    first_epoch: int = 0,
    agree: Callable[[bool], bool] = all_ranks_done,
    clock: Callable[[], float] = time.perf_counter,
) -> Passes:
    """Run passes of ``run_pass`` (``per_pass`` batches each) through ``meter`` by ``rule``;
    a measurement left without a window (or with a short one) says why on the meter."""
    meter.continuous = True
    start, done = clock(), 0
    while True:
        before, pass_start = meter.batches, clock()
        another = rule.another_after(done, meter, per_pass, pass_start - start)
        run_pass(first_epoch + done, another)
        done += 1
        last_pass_s = clock() - pass_start  # the first pass's start-up does not predict
        window = meter.summary()
        steady, seconds = window["measured_batches"], window["window_s"]
        if rule.passes is not None:
            finished = done >= rule.passes
        else:
            # Past the bound, or where the next pass would end past it and a window is there:
            # the measurement grows by at most one pass past ``max_s`` without a window.
            elapsed = clock() - start
            over = elapsed >= rule.max_s or (steady > 0 and elapsed + last_pass_s > rule.max_s)
            finished = meter.batches == before or over or rule.holds(steady, seconds)
        if agree(finished):
            break
    passes = Passes(done, clock() - start, steady, seconds)
    _explain(meter, rule, passes, per_pass)
    return passes


def _explain(meter: LoopMeter, rule: WindowRule, passes: Passes, per_pass: int) -> None:
    """The meter's reason where the passes left no window (what to set); a log line where
    auto's bound cut the window short of ``rule``."""
    if not meter.batches:
        return
    if passes.steady_batches == 0:
        opens = meter.batches + meter.batches_to_open
        if meter.batches_to_open == 0 and meter.no_window_reason:  # the loop's waits decided
            meter.no_window_reason = f"{meter.no_window_reason} ({passes.passes} passes)"
        elif rule.passes is not None:
            enough = math.ceil((opens + rule.min_batches) / max(1, per_pass))
            meter.no_window_reason = (
                f"no steady window in bench.epochs={rule.passes} passes of {per_pass} batches: "
                f"the window opens after {opens} batches (bench.warmup_batches and the loader's "
                f"head start); set bench.epochs=auto, or bench.epochs={enough} or more"
            )
        else:
            meter.no_window_reason = (
                f"no steady window within bench.max_measure_s={rule.max_s:g}: {passes.passes} "
                f"passes of {per_pass} batches in {passes.seconds:.1f} s, and the window opens "
                f"after {opens} batches; raise bench.max_measure_s"
            )
        return
    if rule.passes is None and not rule.holds(passes.steady_batches, passes.window_s):
        log.warning(
            "the steady window is short: %d batches in %.2f s (bench.min_window_batches=%d, "
            "min_window_s=%g) when bench.max_measure_s=%g ended %d passes",
            passes.steady_batches,
            passes.window_s,
            rule.min_batches,
            rule.min_s,
            rule.max_s,
            passes.passes,
        )
