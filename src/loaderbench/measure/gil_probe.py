"""The GIL-held share of wall time, estimated in-process: metrics.json's ``gil_frac``.

A probe thread sleeps until Poisson instants and measures how late it got back into Python:
``time.sleep`` releases the GIL, so where another thread holds it at the instant of waking the
probe waits. By PASTA (Poisson arrivals see time averages) the share of probes that wait longer
than ``threshold_s`` estimates the share of time the GIL is held; lateness for want of a CPU is
subtracted (the kernel's run-queue time, ``/proc/thread-self/schedstat``). Cheap and inside the
process, so every run has it; ``make profile ARGS='--gil ...'`` (py-spy) is the finer measure.
docs/gil.md has its limits and its checks against known shares and py-spy.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import random
import sys
import threading
import time
from collections.abc import Callable

MEAN_INTERVAL_S = 0.002
# Above a sleep's usual overshoot once the timer slack is 1 us (tens of microseconds).
THRESHOLD_S = 0.0002
PR_SET_TIMERSLACK = 29  # Linux prctl: the thread's timer slack, in ns (default 50 us)


def _tight_timer() -> None:
    """This thread's sleeps end on time (Linux: 1 us timer slack instead of 50 us)."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None).prctl(PR_SET_TIMERSLACK, 1000, 0, 0, 0)


class GilProbe:
    """A daemon thread probing the GIL at Poisson instants while started; ``take`` returns
    and resets the counts (held probes, probes)."""

    def __init__(
        self,
        mean_interval_s: float = MEAN_INTERVAL_S,
        threshold_s: float = THRESHOLD_S,
        seed: int = 0,
    ) -> None:
        self.mean_interval_s = mean_interval_s
        self.threshold_s = threshold_s
        self._random = random.Random(seed)
        self._lock = threading.Lock()
        self._held = 0
        self._probes = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._thread is not None:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="loaderbench-gil-probe")
        self._thread.daemon = True
        self._thread.start()

    def stop(self) -> None:
        thread, self._thread = self._thread, None
        if thread is not None:
            self._stop.set()
            thread.join()

    def take(self) -> tuple[int, int]:
        """(held, probes) since the last call."""
        with self._lock:
            counts = (self._held, self._probes)
            self._held = self._probes = 0
        return counts

    def _run(self) -> None:
        _tight_timer()
        clock, sleep, draw = time.perf_counter, time.sleep, self._random.expovariate
        rate, threshold = 1.0 / self.mean_interval_s, self.threshold_s
        queued = _run_queue_clock()
        due = clock() + draw(rate)
        while not self._stop.is_set():
            wait = due - clock()
            queued_before = queued()
            if wait > 0:
                sleep(wait)
            woke = clock()
            # Late for want of a CPU (runnable, not running: a loaded machine) is not the GIL.
            gil_wait = (woke - due) - (queued() - queued_before)
            # The instants are a Poisson process on the clock, not one after each probe: those
            # that fell while this thread waited share its verdict, so a long hold is not
            # under-sampled for the probe being stuck in it.
            instants = 0
            while due <= woke:
                instants += 1
                due += draw(rate)
            held = instants if gil_wait > threshold else 0
            with self._lock:
                self._probes += instants
                self._held += held


def _run_queue_clock() -> Callable[[], float]:
    """Seconds the calling thread has spent runnable but not running (Linux schedstat); a
    clock that stands still where the kernel does not say."""
    try:
        fd = os.open("/proc/thread-self/schedstat", os.O_RDONLY)
        int(os.pread(fd, 128, 0).split()[1])
    except (OSError, ValueError, IndexError):
        return lambda: 0.0
    return lambda: int(os.pread(fd, 128, 0).split()[1]) * 1e-9


def gil_frac(held: int, probes: int) -> float | None:
    """The held share of the probes (None: no probe)."""
    return held / probes if probes else None


__all__ = ["MEAN_INTERVAL_S", "THRESHOLD_S", "GilProbe", "gil_frac"]
