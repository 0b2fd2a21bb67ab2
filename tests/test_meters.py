"""The meters: throughput after warm-up, data-wait share, and the process tree's cost."""

from __future__ import annotations

import subprocess
import sys
import time

import psutil
import pytest
import torch

from loaderbench.measure.meters import Average, LoopMeter, loop_metrics
from loaderbench.measure.process_tree import CpuWindow, ProcessTreeMonitor


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def timed_loader(clock: FakeClock, waits: list[float], batch: int = 4):
    for wait in waits:
        clock.now += wait
        yield torch.zeros(batch, 3, 2, 2), torch.zeros(batch, dtype=torch.int64)


def test_loop_meter_separates_wait_from_compute() -> None:
    clock = FakeClock()
    meter = LoopMeter(warmup_batches=2, clock=clock)
    waits = [5.0, 1.0, 0.5, 0.5, 0.5, 0.5]  # the first batches pay for start-up
    for _ in meter.iterate(timed_loader(clock, waits)):
        clock.now += 1.5  # the "step"
    summary = meter.summary()
    assert summary["images"] == 24
    assert summary["ttfb_s"] == pytest.approx(5.0)
    # Steady state: 4 batches of 4 images, each 0.5 s wait + 1.5 s step.
    assert summary["images_per_s"] == pytest.approx(16 / 8.0)
    assert summary["data_wait_frac"] == pytest.approx(0.25)
    assert summary["measured_batches"] == 4


def test_loop_meter_accumulates_epochs_and_counts_ttfb_once() -> None:
    clock = FakeClock()
    meter = LoopMeter(warmup_batches=1, clock=clock)
    for _ in range(2):
        for _ in meter.iterate(timed_loader(clock, [2.0, 1.0, 1.0])):
            clock.now += 1.0
    summary = meter.summary()
    assert summary["images"] == 24 and summary["batches"] == 6
    assert summary["ttfb_s"] == pytest.approx(2.0)
    # Batches 2..6: waits 1,2(new epoch),1,... = 1+2+1 + 1 each step
    assert summary["images_per_s"] == pytest.approx(20 / (1 + 1 + 1 + 1 + 2 + 1 + 1 + 1 + 1 + 1))


def test_an_epoch_s_numbers_are_its_own_not_the_run_s_so_far() -> None:
    """What the per-epoch rows show: a slow second epoch reads slow, not as a running mean."""
    clock = FakeClock()
    meter = LoopMeter(warmup_batches=1, clock=clock)
    epochs = []
    for step_s in (1.0, 3.0):  # the second epoch's steps take three times as long
        since = meter.batches
        for _ in meter.iterate(timed_loader(clock, [1.0] * 4)):
            clock.now += step_s
        epochs.append(loop_metrics(meter, cpu_s=0.0, since=since))
    first, second = epochs
    assert first["images"] == second["images"] == 16
    # Epoch 1 after its warm-up batch: 3 batches of 4 in 3 x (1 s wait + 1 s step).
    assert first["images_per_s"] == pytest.approx(12 / 6.0)
    assert first["data_wait_frac"] == pytest.approx(0.5)
    # Epoch 2 alone: 4 batches of 4 in 4 x (1 s + 3 s); the run so far would read 28 / 22.
    assert second["images_per_s"] == pytest.approx(16 / 16.0)
    assert second["data_wait_frac"] == pytest.approx(0.25)
    assert loop_metrics(meter, cpu_s=0.0)["images_per_s"] == pytest.approx(28 / 22.0)


def test_loop_meter_max_batches_and_few_batches() -> None:
    clock = FakeClock()
    meter = LoopMeter(warmup_batches=10, clock=clock)
    for _ in meter.iterate(timed_loader(clock, [1.0] * 5), max_batches=2):
        clock.now += 1.0
    summary = meter.summary()
    assert summary["batches"] == 2
    # Fewer batches than the warm-up: no steady rate (and why), the end-to-end one beside it.
    assert summary["images_per_s"] is None and summary["measured_batches"] == 0
    assert "2 batches, and its window opens after 10" in summary["images_per_s_null_reason"]
    assert summary["images_per_s_end_to_end"] == pytest.approx(4 / 2.0)


def test_loop_meter_calls_sync() -> None:
    calls = []
    meter = LoopMeter(warmup_batches=0, sync=lambda: calls.append(1))
    for _ in meter.iterate([(torch.zeros(1), torch.zeros(1))] * 3):
        pass
    assert len(calls) == 6  # once when a batch arrives, once after each step


def test_loop_meter_drains_the_device_only_at_the_window_edges() -> None:
    """Without bench.sync_cuda the meter waits for the device twice an epoch: where the
    measured window opens (after the warm-up) and where it closes; the tail counts."""
    clock = FakeClock()
    edges: list[int] = []

    def drain() -> None:
        edges.append(len(meter.intervals))
        clock.now += 5.0  # the device's queued steps

    meter = LoopMeter(warmup_batches=2, clock=clock, window_sync=drain)
    for _ in meter.iterate(timed_loader(clock, [0.0] * 10)):
        clock.now += 1.0
    assert edges == [1, 10]  # after the 2nd batch's step; after the last
    assert meter.intervals[1] == pytest.approx(6.0) and meter.intervals[-1] == pytest.approx(6.0)
    assert meter.summary()["images_per_s"] == pytest.approx(8 * 4 / (8 + 5.0))
    for _ in meter.iterate(timed_loader(clock, [0.0] * 3), max_batches=2):  # a second epoch
        clock.now += 1.0
    assert edges == [1, 10, 12]


@pytest.mark.slow
def test_process_tree_counts_children_cpu_and_memory() -> None:
    child_code = (
        "import sys, time\nb = bytearray(300 * 2**20)\nfor i in range(0, len(b), 4096): b[i] = 1\n"
        "print('ready', flush=True)\nsys.stdin.readline()\n"
        "t = time.process_time()\nwhile time.process_time() - t < 1.0: pass\n"
    )
    with ProcessTreeMonitor(interval_s=0.05) as monitor:
        window = CpuWindow(monitor)
        with window:
            child = subprocess.Popen(
                [sys.executable, "-c", child_code],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
            assert child.stdout.readline().strip() == "ready"
            # Sampled while the child holds its 300 MB: the tree is this process and the child.
            monitor.sample()
            own = psutil.Process().memory_full_info().pss
            child.communicate("go\n")
    assert window.cpu_s >= 0.8, window.cpu_s
    assert monitor.peak_rss_bytes - own >= 280 * 2**20
    assert monitor.peak_rss_bytes < own + 600 * 2**20  # the child's pages once, not per sample


@pytest.mark.slow
def test_process_tree_finds_grandchildren_as_psutils_scan_does() -> None:
    """The tree is read from each process's children files; a grandchild (a DataLoader worker
    of a worker, a decoder's helper) is in it, as in psutil's scan of every process."""
    grandchild = "import time; time.sleep(30)"
    child_code = (
        "import subprocess, sys\n"
        f"p = subprocess.Popen([sys.executable, '-c', {grandchild!r}])\n"
        "print(p.pid, flush=True)\nsys.stdin.readline()\np.kill()\n"
    )
    child = subprocess.Popen(
        [sys.executable, "-c", child_code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        grandchild_pid = int(child.stdout.readline())
        monitor = ProcessTreeMonitor()
        ours = {proc.pid for proc in monitor._descendants()}
        theirs = {proc.pid for proc in psutil.Process().children(recursive=True)}
        # This process may have other children (a test worker's session fixtures): the two
        # started here are in both views of the tree.
        assert {child.pid, grandchild_pid} <= ours & theirs
    finally:
        child.communicate("go\n", timeout=30)


def test_cpu_window_excludes_time_outside() -> None:
    with ProcessTreeMonitor(interval_s=0.05) as monitor:
        window = CpuWindow(monitor)
        t = time.process_time()
        while time.process_time() - t < 0.5:
            pass
        with window:
            time.sleep(0.2)
    assert window.cpu_s < 0.3


def test_average() -> None:
    avg = Average()
    avg.update(1.0, 1)
    avg.update(4.0, 3)
    assert avg.mean == pytest.approx(13 / 4)
