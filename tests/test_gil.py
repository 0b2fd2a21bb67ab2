"""The GIL measures: the in-process probe (``gil_frac``) against threads whose GIL share is
known, py-spy's samples grouped by thread, and the ladder stopping where the GIL binds."""

from __future__ import annotations

import threading
import time
from collections import Counter

from loaderbench.autotune._policy import GIL_BOUND, keep_climbing
from loaderbench.autotune._rung import ProbeRow, pooled
from loaderbench.measure.gil_probe import GilProbe, gil_frac
from tools.bench.gil_profile import GilRun, group_samples, ms_per_1k


def probed(work: threading.Thread | None, seconds: float = 1.5) -> float:
    probe = GilProbe()
    probe.start()
    if work is not None:
        work.start()
    time.sleep(seconds)
    probe.stop()
    if work is not None:
        # Never left running: a fork in a later test of this process (a DataLoader's workers)
        # while its matrix product is under way deadlocks in OpenBLAS's fork handler, in native
        # code no timeout's handler reaches (the CI run that never finished).
        work.join()
    held, probes = probe.take()
    assert probes > 100  # ~500 a second
    share = gil_frac(held, probes)
    assert share is not None
    return share


def test_the_probe_reads_a_free_gil_as_free_and_a_spinning_thread_as_holding_it() -> None:
    assert probed(None) < 0.15  # the main thread sleeps: nobody holds the GIL
    stop = time.perf_counter() + 1.5

    def spin() -> None:  # pure Python: holds the GIL but at the 5 ms switches
        while time.perf_counter() < stop:
            pass

    assert probed(threading.Thread(target=spin)) > 0.5


def test_a_thread_in_native_code_without_the_gil_is_not_counted() -> None:
    import numpy as np

    big = np.random.default_rng(0).random((1500, 1500))
    stop = time.perf_counter() + 1.5

    def native() -> None:  # matrix products release the GIL
        while time.perf_counter() < stop:
            big @ big

    assert probed(threading.Thread(target=native)) < 0.3


def test_py_spy_samples_are_grouped_loader_loop_and_other() -> None:
    lines = [
        "thread (1): loaderbench_spdl_decode_0;run (threading.py:1);decode (x.py:2) 7",
        "thread (2): spdl_event_loop_thread;run (threading.py:1) 3",
        "thread (3): MainThread;main (train.py:1);consume (src/loaderbench/training/loops.py:9) 4",
        "thread (3): MainThread;main (train.py:1);import (x.py:1) 100",  # start-up: not counted
        "thread (4): process-tree-monitor;sample (m.py:1) 2",
        "not a sample",
    ]
    assert group_samples(lines) == Counter(loader=10, main=4, other=2)


def test_the_steady_figure_is_the_difference_of_two_runs() -> None:
    short = GilRun(Counter(loader=100, main=50, other=10), images=1000, images_per_s=None)
    long = GilRun(Counter(loader=300, main=70, other=10), images=3000, images_per_s=None)
    result = ms_per_1k(short, long, rate=250)
    # 200 samples at 250 Hz = 0.8 s over 2000 images: 400 ms per 1,000 images.
    assert result == {"loader": 400.0, "main": 40.0, "other": 0.0}


def row(workers: int, rate: float, gil: float | None) -> ProbeRow:
    return ProbeRow(workers, rate, 0.5, 1.0, 100, 10, 1.0, gil_frac=gil)


def test_the_ladder_stops_at_a_count_whose_process_the_gil_binds() -> None:
    assert keep_climbing([row(1, 100.0, 0.2), row(2, 190.0, 0.3)], 0.05, 0.05)
    assert not keep_climbing([row(1, 100.0, 0.2), row(2, 190.0, GIL_BOUND)], 0.05, 0.05)
    assert keep_climbing([row(1, 100.0, None), row(2, 190.0, None)], 0.05, 0.05)
    both = pooled(row(2, 100.0, 0.2), row(2, 100.0, 0.4))
    assert abs((both.gil_frac or 0) - 0.3) < 1e-9
