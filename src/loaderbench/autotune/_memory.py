"""The probe's peak memory, kept apart from the run's (``autotune_peak_rss_mb`` beside
``peak_rss_mb``)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from loaderbench.measure.process_tree import ProcessTreeMonitor


@contextlib.contextmanager
def memory_apart(monitor: ProcessTreeMonitor) -> Iterator[list[float]]:
    """The process tree's peak memory inside (the probe's: every rung's workers and buffers)
    kept out of ``monitor``'s peak, which stays the tree's peak outside (metrics.json's
    ``peak_rss_mb``: set-up, cache builds and the run); yields a list that holds the inside's
    peak, in bytes, once it ends. Both are the monitor's samples (memory every second or so),
    so a peak shorter than a sample's interval can be missed, inside as outside; the last
    rung's workers have exited before the window closes (``Loader.close`` joins them)."""
    monitor.sample()  # waits out a sample in flight: every sample so far counts outside
    # Under the monitor's own lock: its thread's next sample lands wholly on one side.
    with monitor._lock:
        outside, monitor.peak_rss_bytes = monitor.peak_rss_bytes, 0
    inside: list[float] = []
    try:
        yield inside
    finally:
        monitor.sample()
        with monitor._lock:
            inside.append(float(monitor.peak_rss_bytes))
            monitor.peak_rss_bytes = outside
        monitor.sample()  # the tree as the run starts
