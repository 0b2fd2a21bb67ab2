"""One rung of ``loader.num_workers=auto``'s probe: a worker count's loader built, run past
its head start, measured over a window, closed; and that count's figures over the ranks.

The window opens only once the head start is consumed: batches made while the loop was busy
elsewhere and served from a full queue would count at the loop's speed, not the workers', and a
count with a deeper queue (more workers) would look faster than it is.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from loaderbench.loaders import Batch, Loader, LoaderSpec, build_loader
from loaderbench.measure.gil_probe import gil_frac
from loaderbench.measure.meters import LoopMeter
from loaderbench.measure.metrics import CPU_S_PER_1K_IMAGES, DATA_WAIT_FRAC, IMAGES_PER_S
from loaderbench.measure.process_tree import ProcessTreeMonitor
from loaderbench.measure.ranks import reduce_loop_metrics
from loaderbench.platform import distributed
from loaderbench.platform.runtime import synchronizer

# The first epoch the probe reads: far from any run's, so the run's own epochs (their order and
# crops come from (seed, epoch)) are never the probe's.
PROBE_EPOCH = 10**6
# Each count's window holds whole rounds of its workers, at least this many.
MIN_ROUNDS = 2


@dataclass(frozen=True)
class ProbeRow:
    """One worker count's figures, over its measured window (every rank's, under DDP)."""

    workers: int
    images_per_s: float
    data_wait_frac: float
    cpu_s_per_1k_images: float | None
    images: int  # measured
    batches: int  # measured
    seconds: float  # the whole rung: loader built, run past its head start, measured, closed
    windows: int = 1  # 2: measured again and pooled (``pooled``)
    # The GIL-held share of the window (``gil_probe``; None: not probed). Rank 0's under DDP.
    gil_frac: float | None = None

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @property
    def measured_s(self) -> float:
        return self.images / self.images_per_s if self.images_per_s > 0 else 0.0


def pooled(first: ProbeRow, second: ProbeRow) -> ProbeRow:
    """One count's two windows as one: images over the seconds both took, data wait weighted
    by those seconds, CPU by the images."""
    images = first.images + second.images
    seconds = first.measured_s + second.measured_s
    wait = (
        (first.data_wait_frac * first.measured_s + second.data_wait_frac * second.measured_s)
        / seconds
        if seconds
        else max(first.data_wait_frac, second.data_wait_frac)
    )
    cpu = [
        row.cpu_s_per_1k_images * row.images
        for row in (first, second)
        if row.cpu_s_per_1k_images is not None
    ]
    return ProbeRow(
        workers=first.workers,
        images_per_s=images / seconds if seconds else 0.0,
        data_wait_frac=wait,
        cpu_s_per_1k_images=sum(cpu) / images if cpu and images else None,
        images=images,
        batches=first.batches + second.batches,
        seconds=first.seconds + second.seconds,
        windows=first.windows + second.windows,
        gil_frac=_weighted_gil(first, second),
    )


def _weighted_gil(first: ProbeRow, second: ProbeRow) -> float | None:
    """Both windows' GIL share, weighted by their seconds."""
    rows = [row for row in (first, second) if row.gil_frac is not None]
    seconds = sum(row.measured_s for row in rows)
    if not rows or seconds <= 0:
        return rows[0].gil_frac if rows else None
    return sum(row.gil_frac * row.measured_s for row in rows) / seconds  # type: ignore[operator]


def with_workers(spec: LoaderSpec, workers: int) -> LoaderSpec:
    return dataclasses.replace(
        spec, settings=dataclasses.replace(spec.settings, num_workers=workers)
    )


def probe_batches(loader: Loader, done: Callable[[], bool]) -> Iterator[Batch]:
    """The loader's batches over probe epochs ``PROBE_EPOCH``, +1, ... (a small split runs
    out), until ``done()``, asked before each batch is pulled (so the window's last interval
    holds no batch it did not use). Iterators are left to ``loader.close()``: shutting a
    pool down here would land in the measured window."""
    epoch = PROBE_EPOCH
    while True:
        loader.set_epoch(epoch)
        batches, pulled = iter(loader), 0
        while not done():
            batch = next(batches, None)
            if batch is None:
                break
            pulled += 1
            yield batch
        else:
            return
        if not pulled:  # an epoch of nothing (every file unreadable): no rate to measure
            return
        epoch += 1


@dataclass(frozen=True)
class Window:
    """How long each count is measured, after its head start (``measure_rung``)."""

    seconds: float
    min_batches: int
    deadline: float  # perf_counter time past which a window ends as soon as it may

    def batches_for(self, workers: int) -> int:
        return max(self.min_batches, MIN_ROUNDS * workers)


def measure_rung(
    spec: LoaderSpec,
    step: Callable[[Batch], None] | None,
    window: Window,
    monitor: ProcessTreeMonitor,
) -> ProbeRow:
    """Build ``spec``'s loader, run the loop on it past its head start, measure a window,
    close it.

    Not measured: the first ``workers + 1`` batches (worker start-up, the model's first
    steps), then ``loader.queue_depth()`` more (its head start), so every batch in the window
    was made while it was open. The window holds at least ``window.seconds`` and
    ``window.batches_for(workers)`` batches and ends on a whole round of the workers: workers
    started together deliver in bursts of ``workers`` batches, and a window cut inside a burst
    could be off by up to one.
    """
    started = time.perf_counter()
    workers = spec.num_workers
    need = window.batches_for(workers)
    sync = synchronizer(spec.device)
    loader = build_loader(spec)
    skip = workers + 1 + loader.queue_depth()
    # The meter drains the device where the window opens (after ``skip`` batches) and closes.
    meter = LoopMeter(warmup_batches=skip, window_sync=sync)
    cpu_start: float | None = None

    def done() -> bool:
        nonlocal cpu_start
        measured = meter.batches - skip
        if measured == 0 and cpu_start is None:
            cpu_start = monitor.snapshot()  # the window opens (the meter drained the device)
        if measured < need or measured % max(1, workers):
            return False
        elapsed = sum(meter.intervals[skip:])
        return elapsed >= window.seconds or time.perf_counter() >= window.deadline

    try:
        for batch in meter.iterate(probe_batches(loader, done)):
            if step is not None:
                step(batch)
        cpu_s = monitor.snapshot() - cpu_start if cpu_start is not None else 0.0
    finally:
        loader.close()
    return window_row(meter, skip, cpu_s, time.perf_counter() - started, workers)


def window_row(meter: LoopMeter, skip: int, cpu_s: float, seconds: float, workers: int) -> ProbeRow:
    """The figures of the meter's batches from ``skip`` on (none measured: rate 0, wait 1).
    Computed here from the meter's records, not by ``LoopMeter.summary``, whose own warm-up
    rules are the main loop's."""
    measured = max(meter.batches - skip, 0)
    images = sum(meter.sizes[skip : meter.batches]) if measured else 0
    loop_s = sum(meter.intervals[skip:]) if measured else 0.0
    waited = sum(meter.waits[skip : meter.batches]) if measured else 0.0
    held = sum(counts[0] for counts in meter.gil_counts[skip:])
    probes = sum(counts[1] for counts in meter.gil_counts[skip:])
    return ProbeRow(
        workers=workers,
        images_per_s=images / loop_s if loop_s > 0 else 0.0,
        data_wait_frac=min(1.0, waited / loop_s) if loop_s > 0 else 1.0,
        cpu_s_per_1k_images=1000 * cpu_s / images if images else None,
        images=images,
        batches=measured,
        seconds=seconds,
        gil_frac=gil_frac(held, probes),
    )


def over_ranks(row: ProbeRow) -> ProbeRow:
    """A count's figures over every rank, each combined as ``loaderbench.measure.metrics`` declares
    (images/s, images, batches and CPU summed: the job's); the data wait the choice reads is
    ``slowest_rank_data_wait_frac`` (the rank every other waits for), not the mean."""
    mine = {
        IMAGES_PER_S: row.images_per_s,
        "images": row.images,
        "batches": row.batches,
        "cpu_s": (row.cpu_s_per_1k_images or 0.0) * row.images / 1000,
        CPU_S_PER_1K_IMAGES: row.cpu_s_per_1k_images,
        DATA_WAIT_FRAC: row.data_wait_frac,
        "seconds": row.seconds,
    }
    job = reduce_loop_metrics(mine, distributed.world_size())
    return ProbeRow(
        row.workers,
        job[IMAGES_PER_S],
        job.get("slowest_rank_data_wait_frac", row.data_wait_frac),
        job[CPU_S_PER_1K_IMAGES],
        int(job["images"]),
        int(job["batches"]),
        job["seconds"],
        row.windows,
        row.gil_frac,
    )
