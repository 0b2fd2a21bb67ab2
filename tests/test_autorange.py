"""Every job a rate (issue 43): passes over the data, as one continuous loop, until the steady
window is a measurement (``bench.epochs=auto``); an explicit count honoured, and where it gives
no window, the reason says what to set. On a clock of our own, so every figure is exact."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest
import torch

from loaderbench.measure._spread import window_spread
from loaderbench.measure.meters import LoopMeter, loop_metrics
from loaderbench.run._validation import ConfigError, validate_config
from loaderbench.run.autorange import WindowRule, run_passes
from tests.helpers import compose_cfg

BATCH_S = 0.1  # the loader's time a batch, on the fake clock
GAP_S = 0.5  # what happens between two passes


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class ShortPasses:
    """A loader of ``batches`` a pass that takes ``BATCH_S`` a batch and may decode
    ``depth`` batches ahead: a pass is shorter than its warm-up and head start."""

    def __init__(self, clock: Clock, batches: int = 3, depth: int = 4) -> None:
        self.clock, self.batches, self.depth = clock, batches, depth
        self.epochs: list[tuple[int, bool]] = []

    def queue_depth(self) -> int:
        return self.depth

    def set_epoch(self, epoch: int, next_epoch: bool = False) -> None:
        self.epochs.append((epoch, next_epoch))

    def __len__(self) -> int:
        return self.batches

    def __iter__(self) -> Iterator[torch.Tensor]:
        for _ in range(self.batches):
            self.clock.now += BATCH_S
            yield torch.zeros(2, 3, 4, 4)


def measure(rule: WindowRule, clock: Clock, loader: ShortPasses, gap_s: float = 0.0):
    meter = LoopMeter(warmup_batches=3, clock=clock, gil=None)

    def one_pass(epoch: int, next_epoch: bool) -> None:
        clock.now += gap_s  # between passes: the loader's set-up and the loop's bookkeeping
        loader.set_epoch(epoch, next_epoch)
        for _ in meter.iterate(loader):
            pass

    return meter, run_passes(meter, one_pass, rule, len(loader), clock=clock)


def test_auto_repeats_short_passes_until_the_window_holds_its_batches() -> None:
    """Passes of 3 batches, and a window that opens after 7 (3 warm-up, a head start of 4):
    no pass alone has a window. As one loop, it opens at the 8th batch; 10 steady batches
    take 6 passes (18 batches, 11 of them steady), and the loader is told each time that
    another pass follows, but for the last."""
    clock = Clock()
    loader = ShortPasses(clock)
    meter, passes = measure(WindowRule(10, 0.0, 60.0), clock, loader)
    metrics = loop_metrics(meter, cpu_s=0.0)
    assert passes.passes == 6 and metrics["steady_batches"] == 11
    assert metrics["images"] == 36 and metrics["images_per_s"] == pytest.approx(2 / BATCH_S)
    assert metrics["steady_window_s"] == pytest.approx(11 * BATCH_S)
    assert metrics["images_per_s_null_reason"] is None
    assert [e for e, _ in loader.epochs] == list(range(6))
    assert [ahead for _, ahead in loader.epochs] == [True] * 5 + [False]


def test_the_time_between_passes_is_on_the_clock() -> None:
    """Whatever the loader makes between two passes is made on the clock: the gap is the
    next pass's first batch's time (and its wait), so a window over passes is never faster
    than the passes with their gaps."""
    clock = Clock()
    meter, passes = measure(WindowRule(10, 0.0, 60.0), clock, ShortPasses(clock), gap_s=GAP_S)
    metrics = loop_metrics(meter, cpu_s=0.0)
    # 11 steady batches from the 8th (pass 3's second); 3 of them a pass's first (passes 4 to
    # 6), each carrying a gap.
    window_s = 11 * BATCH_S + 3 * GAP_S
    assert metrics["steady_window_s"] == pytest.approx(window_s)
    assert metrics["images_per_s"] == pytest.approx(22 / window_s)
    assert metrics["data_wait_frac"] == pytest.approx(1.0)
    assert passes.seconds == pytest.approx(18 * BATCH_S + 6 * GAP_S)


def test_auto_also_waits_for_the_window_to_hold_its_seconds() -> None:
    clock = Clock()
    meter, passes = measure(WindowRule(1, 2.0, 60.0), clock, ShortPasses(clock))
    # 2 s of steady batches at 0.1 s: 20 past the 7 of the opening, 27 in 9 passes.
    assert passes.passes == 9 and meter.summary()["measured_batches"] == 20


def test_an_explicit_count_is_honoured_and_its_reason_says_what_to_set() -> None:
    clock = Clock()
    meter, passes = measure(WindowRule(10, 0.0, 60.0, passes=2), clock, ShortPasses(clock))
    metrics = loop_metrics(meter, cpu_s=0.0)
    assert passes.passes == 2 and metrics["images_per_s"] is None
    reason = metrics["images_per_s_null_reason"]
    assert "bench.epochs=2 passes of 3 batches" in reason and "opens after 7 batches" in reason
    assert "bench.epochs=auto, or bench.epochs=6 or more" in reason


def test_auto_ends_at_its_bound_and_says_so(caplog: pytest.LogCaptureFixture) -> None:
    """A bound of 0.5 s ends the passes after the second (0.6 s): no window, and the reason
    names the bound; a bound of 1.0 s leaves a short window, used, with a warning, and no pass
    is begun that would end past the bound once there is a window."""
    clock = Clock()
    meter, passes = measure(WindowRule(10, 0.0, 0.5), clock, ShortPasses(clock))
    reason = loop_metrics(meter, cpu_s=0.0)["images_per_s_null_reason"]
    assert passes.passes == 2 and "within bench.max_measure_s=0.5" in reason
    assert "raise bench.max_measure_s" in reason
    clock = Clock()
    with caplog.at_level(logging.WARNING, logger="loaderbench.run.autorange"):
        meter, passes = measure(WindowRule(10, 0.0, 1.0), clock, ShortPasses(clock))
    # After 3 passes (0.9 s, a window of 2 batches) a fourth would end past the bound.
    assert passes.passes == 3 and meter.summary()["measured_batches"] == 2
    assert "the steady window is short: 2 batches" in caplog.text


def test_an_empty_split_ends_the_passes() -> None:
    clock = Clock()
    meter, passes = measure(WindowRule(10, 0.0, 60.0), clock, ShortPasses(clock, batches=0))
    assert passes.passes == 1 and meter.batches == 0


def test_the_spread_is_how_far_the_windows_parts_disagree() -> None:
    steady = window_spread([8] * 10, [0.1] * 10, [0] * 10)
    assert steady == pytest.approx(0.0)
    # One part of five twice as slow: parts at 80 and 40 images/s, the whole at 80 / 1.2 s.
    intervals = [0.1] * 8 + [0.2, 0.2]
    assert window_spread([8] * 10, intervals, [0] * 10) == pytest.approx(20 / (80 / 1.2))
    assert window_spread([8] * 5, [0.1] * 5, [0] * 5) is None  # fewer than 3 parts of 2
    # Over passes, a part is whole passes, less the pass the window opened in part-way.
    sizes, times = [8] * 13, [5.0] + [0.1] * 12
    passes = [0, 1, 1, 1, 2, 2, 2, 3, 3, 3, 4, 4, 4]  # pass 0: the window opens at its end
    assert window_spread(sizes, times, passes) == pytest.approx(0.0)


@pytest.mark.parametrize("value", [0, -1, "many", 1.5])
def test_bench_epochs_is_a_count_or_auto(value: object) -> None:
    cfg = compose_cfg("eval", ["model=none", f"bench.epochs={value}"])
    with pytest.raises(ConfigError, match=r"bench\.epochs must be an integer >= 1 or 'auto'"):
        validate_config(cfg)
    assert validate_config(compose_cfg("eval", ["model=none"])).bench.epochs == "auto"
