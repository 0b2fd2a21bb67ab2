"""Honest meters: data time apart from compute time, and the cost of the whole process tree.

``LoopMeter`` wraps the main loop's iteration over a loader. It records, per batch, how long the
loop was blocked waiting for the batch and the whole interval until the next one was asked for,
so that

* ``images_per_s`` counts only batches after ``warmup_batches`` (start-up is reported apart, as
  ``ttfb_s``);
* ``data_wait_frac`` is the share of that steady-state wall time spent blocked on the loader.

On CUDA the host runs ahead of the device, and the meter does not make it wait every step
(that would keep the next batch's copy and decode from overlapping the current step, and make
every loader look alike). It drains the device (``window_sync``) twice an epoch, where the
measured window opens (after the warm-up batches) and where it closes, so the steady-state
time is the device's as well as the host's; inside the window ``data_wait_frac`` is the share
of the host's time spent blocked on the loader. A loader that keeps up leaves the host
waiting on the device instead (at the loop's periodic loss reads, or when CUDA's launch queue
is full), and its wait is near 0; one that does not shows up as wait. ``sync`` (per step,
``bench.sync_cuda=true``) restores the old per-step breakdown at the cost of that overlap.

``ProcessTreeMonitor`` samples this process and all its descendants (DataLoader workers, SPDL
has none) for CPU time and resident memory (proportional set size, so pages shared between
forked workers count once); W&B's own service process is left out.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import psutil

from loaderbench.stopping import raise_if_stop_requested

Sync = Callable[[], None]


def _batch_size(batch: Any) -> int:
    first = batch[0] if isinstance(batch, tuple | list) else batch
    return int(first.shape[0])


@dataclass
class LoopMeter:
    warmup_batches: int = 3
    sync: Sync | None = None  # after every batch's arrival and step (bench.sync_cuda)
    window_sync: Sync | None = None  # where the measured window opens and closes
    clock: Callable[[], float] = time.perf_counter
    waits: list[float] = field(default_factory=list)
    intervals: list[float] = field(default_factory=list)
    sizes: list[int] = field(default_factory=list)
    ttfb_s: float | None = None

    def iterate(self, loader: Iterable[Any], max_batches: int | None = None) -> Iterator[Any]:
        """Yield the loader's batches, timing each; one call per epoch."""
        clock, sync, edge = self.clock, self.sync, self.window_sync
        epoch_start = clock()
        iterator = iter(loader)
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
            self.waits.append(arrived - start)
            self.sizes.append(_batch_size(batch))
            count += 1
            yield batch
            if sync is not None:
                sync()
            if edge is not None and len(self.intervals) + 1 == self.warmup_batches:
                edge()  # the warm-up's queued work is not the steady state's
            self.intervals.append(clock() - start)
        # The tail of an epoch (the device's queued steps, draining, worker shutdown) belongs
        # to the last batch.
        if self.intervals and count:
            tail_start = clock() if tail_start is None else tail_start
            if edge is not None:
                edge()
            self.intervals[-1] += clock() - tail_start
        if isinstance(iterator, Iterator) and hasattr(iterator, "close"):
            iterator.close()  # a generator cut short by max_batches releases its resources now

    @property
    def images(self) -> int:
        return sum(self.sizes)

    @property
    def batches(self) -> int:
        return len(self.intervals)

    def summary(self, since: int = 0) -> dict[str, float | int | None]:
        """The loop's numbers from its batch ``since`` on (an epoch's: ``since`` is
        ``batches`` at the epoch's start); the warm-up batches count in none of them."""
        n = len(self.intervals)
        # Too few batches for the warm-up: measure what there is, rather than nothing.
        skip = max(since, min(self.warmup_batches, max(n - 1, 0)))
        steady_time = sum(self.intervals[skip:])
        steady_images = sum(self.sizes[skip:n])
        steady_wait = sum(self.waits[skip:n])
        return {
            "images": sum(self.sizes[since:n]),
            "batches": n - since,
            "images_per_s": steady_images / steady_time if steady_time > 0 else None,
            "ttfb_s": self.ttfb_s,
            "data_wait_frac": steady_wait / steady_time if steady_time > 0 else None,
            "loop_s": sum(self.intervals[since:]),
            "measured_batches": max(n - skip, 0),
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
            return {"images_per_s": None, "data_wait_frac": None}
        return {"images_per_s": images / elapsed, "data_wait_frac": min(1.0, waited / elapsed)}


def _is_excluded(proc: psutil.Process) -> bool:
    try:
        name = proc.name()
        cmdline = " ".join(proc.cmdline()[:2])
    except (psutil.Error, OSError):
        return True
    return "wandb" in name or "wandb" in cmdline


def _resident_bytes(proc: psutil.Process) -> int:
    """Proportional set size where the OS reports it: forked workers share the parent's pages
    (and every process maps the same page cache for memmaps), and summing plain RSS would
    count those pages once per process."""
    try:
        return int(proc.memory_full_info().pss)
    except (AttributeError, psutil.AccessDenied):
        return int(proc.memory_info().rss)


class ProcessTreeMonitor:
    """CPU seconds and peak RSS of this process and its descendants, sampled in a thread.

    CPU time of a worker that exits between two samples is counted up to its last sample
    (``interval_s`` bounds the loss); ``snapshot()`` samples at once, so call it at the edges of
    the window you measure.
    """

    def __init__(self, interval_s: float = 0.25, memory_every: int = 4) -> None:
        self.interval_s = interval_s
        # Reading PSS (smaps) costs milliseconds for a process with large mappings: sample
        # memory every few CPU samples, and never at the edges of a measured window.
        self.memory_every = memory_every
        self._samples = 0
        self.root = psutil.Process(os.getpid())
        self._cpu: dict[int, float] = {}
        self._excluded: set[int] = set()
        self.peak_rss_bytes = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def sample(self, memory: bool = True) -> float:
        """Sample the tree now; returns its total CPU seconds so far."""
        with self._lock:
            rss = 0
            try:
                children = self.root.children(recursive=True)
            except psutil.Error:
                children = []
            for proc in [self.root, *children]:
                if proc.pid in self._excluded:
                    continue
                if proc is not self.root and _is_excluded(proc):
                    self._excluded.add(proc.pid)
                    continue
                try:
                    with proc.oneshot():
                        times = proc.cpu_times()
                        if memory:
                            rss += _resident_bytes(proc)
                except psutil.Error:
                    continue
                self._cpu[proc.pid] = times.user + times.system
            if memory:
                self.peak_rss_bytes = max(self.peak_rss_bytes, rss)
            return sum(self._cpu.values())

    def snapshot(self) -> float:
        """CPU seconds of the tree now (cheap: no memory reading)."""
        return self.sample(memory=False)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._samples += 1
            self.sample(memory=self._samples % self.memory_every == 0)

    def start(self) -> ProcessTreeMonitor:
        self.sample()
        self._thread = threading.Thread(target=self._run, name="process-tree-monitor", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.sample()

    def __enter__(self) -> ProcessTreeMonitor:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class CpuWindow:
    """Sums the tree's CPU seconds over several windows (for example, the train epochs only)."""

    def __init__(self, monitor: ProcessTreeMonitor) -> None:
        self.monitor = monitor
        self.cpu_s = 0.0
        self._start: float | None = None

    def __enter__(self) -> CpuWindow:
        self._start = self.monitor.snapshot()
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._start is not None
        self.cpu_s += self.monitor.snapshot() - self._start
        self._start = None


def loop_metrics(meter: LoopMeter, cpu_s: float, since: int = 0) -> dict[str, Any]:
    """A loop's throughput, start-up, data wait and CPU cost, as metrics.json names them
    (from its batch ``since`` on: an epoch's)."""
    summary = meter.summary(since)
    images = summary["images"]
    return {
        "images": images,
        "images_per_s": summary["images_per_s"],
        "ttfb_s": summary["ttfb_s"],
        "data_wait_frac": summary["data_wait_frac"],
        "loop_s": summary["loop_s"],
        "cpu_s": cpu_s,
        "cpu_s_per_1k_images": 1000 * cpu_s / images if images else None,
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
