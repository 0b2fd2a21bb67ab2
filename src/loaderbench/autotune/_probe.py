"""The probe: every split prepared once, then the ladder climbed with one rung per count
(``rung.measure_rung``), every rank at once, each count's figures over the ranks."""

from __future__ import annotations

import contextlib
import logging
import time
from typing import Any

from loaderbench.autotune._model_step import random_states_untouched
from loaderbench.autotune._policy import climb, worker_ladder
from loaderbench.autotune._rung import ProbeRow, Window, measure_rung, over_ranks, with_workers
from loaderbench.autotune._workload import Workload
from loaderbench.config.loader import AutotuneSettings
from loaderbench.loaders import prepare_loader
from loaderbench.measure.process_tree import ProcessTreeMonitor
from loaderbench.platform import distributed
from loaderbench.platform.runtime import set_intra_op_threads

log = logging.getLogger(__name__)


def prepare_splits(workload: Workload, workers: int) -> dict[str, dict[str, Any]]:
    """Every split the run opens prepared once, with ``workers`` (every CPU allowed): memmap's
    cache is built now, not by the first count tried (one process) nor in a measured window.
    Returns what each preparation did, by split."""
    done = {}
    for spec in (workload.spec, *workload.also_opens):
        if numbers := prepare_loader(with_workers(spec, workers)):
            done[spec.split.name] = numbers
    return done


def probe(
    workload: Workload,
    options: AutotuneSettings,
    cpus: int,
    monitor: ProcessTreeMonitor,
    threads: int | None = None,
) -> list[ProbeRow]:
    """Every rung tried (every rank at once), in order, with every rank's figures; torch's
    intra-op threads set for each count as the run would set them (``runtime.threads``:
    ``threads``). ``cpus``: the same on every rank (``settle.job_cpus``), whose climbs and
    collectives follow one ladder. Every rank holds the same rows (``over_ranks``), so every
    rank climbs, stops and confirms alike (``policy.climb``)."""
    started = time.perf_counter()
    window = Window(options.window_s, options.min_batches, started + options.max_probe_s)
    step = workload.step

    def measure(workers: int) -> tuple[ProbeRow, bool]:
        """The count's row (every rank's), and whether the probe still has time."""
        set_intra_op_threads(threads, workers)
        spec = with_workers(workload.spec, workers)
        row = over_ranks(measure_rung(spec, step, window, monitor))
        (spent,) = distributed.all_reduce([time.perf_counter() - started], op="max")
        return row, spent < options.max_probe_s

    untouched = step.untouched() if step else contextlib.nullcontext()
    with random_states_untouched(workload.spec.device), untouched:
        return climb(worker_ladder(cpus), measure, options, on_row=log_rung)


def log_rung(row: ProbeRow) -> None:
    log.info(
        "num_workers=auto: %d workers: %.1f images/s, data wait %.1f%%, %s CPU s / 1k images "
        "(%d batches measured%s, %.1f s)",
        row.workers,
        row.images_per_s,
        100 * row.data_wait_frac,
        "-" if row.cpu_s_per_1k_images is None else f"{row.cpu_s_per_1k_images:.2f}",
        row.batches,
        "" if row.windows == 1 else f" in {row.windows} windows",
        row.seconds,
    )
