"""A loader's head start is not throughput: the batches it decodes ahead of the loop while the
loop is not measuring (its start, the warm-up steps) do not count in ``images_per_s``; the
end-to-end rate is reported beside it (issue 29, A9)."""

from __future__ import annotations

import multiprocessing
import time
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from loaderbench.loaders import build_loader
from loaderbench.measure.meters import LoopMeter, head_start, loop_metrics
from tests.conftest import cpu_spec, folder_index

ITEM_S = 0.01  # one image's decode
BATCH = 2
BATCHES = 20  # an epoch
STEP_S = 0.005  # the model's step: faster than the loader (2 x 10 ms a batch)
STEADY = BATCH / (BATCH * ITEM_S)  # the loader's steady rate, images/s: what the loop can get


class OneCoreDataset(Dataset):
    """Images that take ``ITEM_S`` each to decode, one at a time over every worker (a lock the
    worker processes share): many workers on one core, as 32 workers are on 2 cores."""

    def __init__(self, lock: multiprocessing.synchronize.Lock) -> None:
        self.lock = lock

    def __len__(self) -> int:
        return BATCH * BATCHES

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        with self.lock:
            time.sleep(ITEM_S)
        return torch.zeros(3, 4, 4), index


@pytest.mark.filterwarnings("ignore:This DataLoader will create")
@pytest.mark.parametrize("epochs", [1, 2])
def test_a_deep_queue_over_a_slow_decode_is_not_measured_faster_than_its_steady_state(
    epochs: int,
) -> None:
    """8 workers x prefetch 4 = 32 batches asked for at once, more than the epoch's 20: the
    whole epoch is decoded while the loop waits for its first batch. A window opened after the
    3 warm-up batches would see the rest arrive at the model's speed (about 1.4x the loader's
    here); the loop cannot go faster than the loader's one core."""
    context = multiprocessing.get_context("fork")
    loader = DataLoader(
        OneCoreDataset(context.Lock()),
        batch_size=BATCH,
        num_workers=8,
        prefetch_factor=4,
        persistent_workers=True,
        multiprocessing_context=context,
    )
    assert head_start(loader) == (32, 0)
    meter = LoopMeter(warmup_batches=3)
    for _ in range(epochs):
        for _ in meter.iterate(loader):
            time.sleep(STEP_S)
    metrics = loop_metrics(meter, cpu_s=0.0)
    assert metrics["images"] == epochs * BATCH * BATCHES
    rate, end_to_end = metrics["images_per_s"], metrics["images_per_s_end_to_end"]
    # Not faster than the loader can decode (a loaded machine only makes it slower).
    assert end_to_end <= 1.1 * STEADY, (end_to_end, STEADY)
    # The first epoch has no batch to measure (steady_batches 0): no steady rate, and why;
    # the window is the second epoch, whose first batch's wait is the decode of the epoch.
    if epochs == 2:
        assert metrics["steady_batches"] == BATCHES
        assert 0.5 * STEADY <= rate <= 1.1 * STEADY, (rate, STEADY)
        assert end_to_end <= rate * 1.0001
    else:
        assert metrics["steady_batches"] == 0 and rate is None
        assert "no steady window" in metrics["images_per_s_null_reason"]


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class QueuedLoader:
    """Batches that arrive after ``waits`` seconds each, from a loader that says how deep its
    queue is (the project's loaders' interface)."""

    def __init__(self, clock: FakeClock, waits: list[float], depth: int, ready: int = 0) -> None:
        self.clock, self.waits, self.depth, self.ready = clock, waits, depth, ready

    def queue_depth(self) -> int:
        return self.depth

    def queued_at_start(self) -> int:
        return self.ready

    def __iter__(self):
        for wait in self.waits:
            self.clock.now += wait
            yield torch.zeros(4, 3, 2, 2), torch.zeros(4, dtype=torch.int64)


def test_the_window_opens_after_the_warm_up_and_the_head_start() -> None:
    clock = FakeClock()
    edges: list[int] = []
    meter = LoopMeter(2, clock=clock, window_sync=lambda: edges.append(meter.batches))
    # 4 batches queued: the first arrives after 8 s, the next 4 at once (decoded meanwhile),
    # then one a second: the loader's steady rate is 4 images/s, the step takes 0.5 s.
    waits = [8.0, 0.0, 0.0, 0.0, 0.0] + [0.5] * 6
    for _ in meter.iterate(QueuedLoader(clock, waits, depth=4)):
        clock.now += 0.5
    assert edges == [5, 11]  # opened after 2 + 4 batches; closed at the end
    assert meter.measured == [False] * 6 + [True] * 5
    first = loop_metrics(meter, cpu_s=0.0)
    assert first["images_per_s"] == pytest.approx(4.0) and first["steady_batches"] == 5
    assert first["images_per_s_end_to_end"] == pytest.approx(44 / (8 + 11 * 0.5 + 6 * 0.5))
    # A later epoch starts empty: measured from its first batch, its wait included...
    since = meter.batches
    for _ in meter.iterate(QueuedLoader(clock, [2.0, 0.5, 0.5], depth=4)):
        clock.now += 0.5
    assert meter.measured[since:] == [True] * 3
    assert loop_metrics(meter, 0.0, since)["images_per_s"] == pytest.approx(12 / 4.5)
    # ...unless the loader decoded it ahead (a persistent pipeline): those batches are skipped.
    since = meter.batches
    for _ in meter.iterate(QueuedLoader(clock, [0.0, 0.0, 0.5, 0.5], depth=4, ready=2)):
        clock.now += 0.5
    assert meter.measured[since:] == [False, False, True, True]


def test_a_later_loop_that_found_batches_read_ahead_opens_where_the_queue_runs_dry() -> None:
    """A loader reading ahead into the next epoch (memmap's reading threads): 4 batches ready
    at the loop's start, and while the loop takes them the loader refills its queue, so 3 more
    are ready too; counting them would credit batches made before the window. The window
    opens at the first batch the loop waits for."""
    clock = FakeClock()
    meter = LoopMeter(1, clock=clock)
    for _ in meter.iterate(QueuedLoader(clock, [3.0] + [1.0] * 6, depth=4)):
        clock.now += 0.01
    since = meter.batches
    waits = [0.0] * 7 + [1.0] * 5
    for _ in meter.iterate(QueuedLoader(clock, waits, depth=4, ready=4)):
        clock.now += 0.01
    assert meter.measured[since:] == [False] * 7 + [True] * 5
    assert loop_metrics(meter, 0.0, since)["images_per_s"] == pytest.approx(4 / 1.01)


def test_a_queue_deeper_than_the_run_reports_the_end_to_end_rate() -> None:
    clock = FakeClock()
    meter = LoopMeter(warmup_batches=1, clock=clock)
    for _ in meter.iterate(QueuedLoader(clock, [6.0] + [0.0] * 5, depth=8)):
        clock.now += 0.5  # 6 batches of 4 decoded during the first wait
    metrics = loop_metrics(meter, cpu_s=0.0)
    assert metrics["steady_batches"] == 0
    assert metrics["images_per_s"] is None  # never the end-to-end figure in its place
    assert "window opens after 9" in metrics["images_per_s_null_reason"]
    assert metrics["images_per_s_end_to_end"] == pytest.approx(24 / 9.0)


def test_batches_made_before_the_window_and_served_after_it_are_not_counted() -> None:
    """An epoch a few batches longer than warm-up + head start, wholly decoded while the loop
    waited for its first batch (10 batches of 4, a queue of 4, a step of 0.1 s): past the head
    start the loop still finds every batch ready, because the loader refilled the queue while
    the loop took its early batches. Counting them would report the model's 40 images/s;
    no batch of this loop was made inside a window, so the rate is the end-to-end one."""
    clock = FakeClock()
    meter = LoopMeter(2, clock=clock)
    for _ in meter.iterate(QueuedLoader(clock, [8.0] + [0.0] * 9, depth=4)):
        clock.now += 0.1
    metrics = loop_metrics(meter, cpu_s=0.0)
    assert metrics["steady_batches"] == 0 and metrics["images_per_s"] is None
    assert "never waited" in metrics["images_per_s_null_reason"]
    assert metrics["images_per_s_end_to_end"] == pytest.approx(40 / 9.0)


def test_the_window_opens_where_the_loop_first_waits_past_the_head_start() -> None:
    """Past the head start the loop takes 3 batches still ready (made before the window), then
    waits 1 s for each: the loader's rate, 4 images/s, from the first batch it waited for."""
    clock = FakeClock()
    meter = LoopMeter(1, clock=clock)
    waits = [5.0] + [0.0] * 6 + [1.0] * 8
    for _ in meter.iterate(QueuedLoader(clock, waits, depth=3)):
        clock.now += 0.01
    assert meter.measured == [False] * 7 + [True] * 8
    assert loop_metrics(meter, cpu_s=0.0)["images_per_s"] == pytest.approx(4 / 1.01)


def test_a_loader_ahead_of_a_long_loop_keeps_its_window() -> None:
    """A loader faster than the loop never lets it wait: over a window of many queue depths
    the loop's own rate is the steady state (at most one queue depth made before it)."""
    clock = FakeClock()
    meter = LoopMeter(2, clock=clock)
    for _ in meter.iterate(QueuedLoader(clock, [1.0] + [0.0] * 99, depth=4)):
        clock.now += 0.1
    assert meter.measured == [False] * 6 + [True] * 94
    assert loop_metrics(meter, cpu_s=0.0)["images_per_s"] == pytest.approx(40.0)


@pytest.mark.filterwarnings("ignore:This DataLoader will create")
def test_the_loaders_say_how_deep_their_queue_is(tiny_root: Path, tmp_path: Path) -> None:
    split = folder_index(tiny_root).train
    cases = [
        ("torchvision", {"num_workers": 32, "prefetch": 4}, 32),  # 32 x prefetch_factor 1
        ("torchvision", {"num_workers": 2, "prefetch": 5}, 6),  # 2 x prefetch_factor 3
        ("torchvision", {"num_workers": 0}, 0),
        ("memmap", {"num_workers": 2, "prefetch": 6, "cache_dir": str(tmp_path)}, 6),
        ("memmap", {"num_workers": 0, "cache_dir": str(tmp_path)}, 0),
        ("spdl", {"num_workers": 3, "prefetch": 8}, 3 + 2 + 5 + 2),  # decode, sink, queues
    ]
    for name, settings, depth in cases:
        with build_loader(cpu_spec(split, True, name, **settings)) as loader:
            assert (loader.queue_depth(), loader.queued_at_start()) == (depth, 0), name


class ReportingLoader(QueuedLoader):
    """A queued loader that says how many batches it holds ready (``batches_ahead``), as
    memmap's reading threads do: ``ready[i]`` after the loop's ``i``-th step."""

    def __init__(self, clock: FakeClock, waits: list[float], depth: int, ready: list[int]):
        super().__init__(clock, waits, depth)
        self.ready_after, self.taken = ready, 0

    def batches_ahead(self) -> tuple[int, int]:
        return self.ready_after[self.taken - 1], 0

    def __iter__(self):
        for batch in super().__iter__():
            self.taken += 1
            yield batch


def test_a_loader_that_keeps_ahead_of_a_short_loop_reports_the_loops_steady_rate() -> None:
    """The model is the bottleneck (issue 36): the loop never waits, over far fewer than 20
    queue depths. The loader vouches that its queue stayed full (4 ready after every step)
    until the epoch's tail, where it has nothing left to make: up to there every batch the
    loop took was made inside the window, so the window holds, at the loop's own rate."""
    clock = FakeClock()
    meter = LoopMeter(2, clock=clock)
    batches = 16
    ready = [4] * (batches - 4) + [3, 2, 1, 0]
    for _ in meter.iterate(ReportingLoader(clock, [1.0] + [0.0] * (batches - 1), 4, ready)):
        clock.now += 0.1
    # Opened after 2 + 4 batches; closed where the queue fell short of the 4 it held.
    assert meter.measured == [False] * 6 + [True] * 6 + [False] * 4
    metrics = loop_metrics(meter, cpu_s=0.0)
    assert metrics["steady_batches"] == 6 and metrics["images_per_s"] == pytest.approx(40.0)
    assert metrics["images_per_s_null_reason"] is None


def test_a_loader_falling_behind_without_the_loop_waiting_yet_is_not_credited() -> None:
    """A loader slower than the model but with its queue full at the window's start: the loop
    does not wait yet, but its ready batches drop at the window's first step: nothing is
    credited, and with no window the rate is null (a loader that cannot tell: the same)."""
    clock = FakeClock()
    meter = LoopMeter(1, clock=clock)
    ready = [4] * 5 + [3, 2, 1]
    for _ in meter.iterate(ReportingLoader(clock, [1.0] + [0.0] * 7, 4, ready)):
        clock.now += 0.1
    assert meter.measured == [False] * 5 + [False] * 3
    metrics = loop_metrics(meter, cpu_s=0.0)
    assert metrics["steady_batches"] == 0 and metrics["images_per_s"] is None


def test_on_cuda_a_window_closed_early_holds_the_devices_queued_work() -> None:
    """Where the loader's queue first falls short the meter drains the device once, and the
    drain counts inside the window (charged to its last batch)."""
    clock = FakeClock()
    edges: list[int] = []

    def drain() -> None:
        edges.append(len(meter.intervals))
        clock.now += 0.3

    meter = LoopMeter(2, clock=clock, window_sync=drain)
    ready = [4] * 12 + [3, 2, 1, 0]
    for _ in meter.iterate(ReportingLoader(clock, [1.0] + [0.0] * 15, 4, ready)):
        clock.now += 0.1
    assert edges == [5, 13, 16]  # opened; where the queue fell short; the loop's end
    assert meter.measured == [False] * 6 + [True] * 6 + [False] * 4
    assert loop_metrics(meter, cpu_s=0.0)["images_per_s"] == pytest.approx(24 / 0.9)


def test_spdl_says_which_batches_it_made_ahead_of_a_slow_loop(tiny_root: Path) -> None:
    """A real spdl pipeline ahead of a loop slower than it (the model the bottleneck): it
    vouches for its batches (``batches_ahead``), so a loop that never waits, over far fewer
    than 20 queue depths, still has a steady window, at the loop's own rate."""
    split = folder_index(tiny_root).train
    spec = cpu_spec(split, True, "spdl", num_workers=2, batch_size=2, prefetch=2)
    meter = LoopMeter(1)
    with build_loader(spec) as loader:
        assert loader.batches_ahead() is None  # no pipeline yet
        for _ in meter.iterate(loader):
            ready, under_way = loader.batches_ahead()
            assert ready >= 0 and under_way >= 0
            time.sleep(0.15)  # the step: far slower than decoding two tiny images
    metrics = loop_metrics(meter, cpu_s=0.0)
    assert metrics["steady_batches"] > 0, metrics["images_per_s_null_reason"]
    assert metrics["images_per_s"] == pytest.approx(2 / 0.15, rel=0.15)
