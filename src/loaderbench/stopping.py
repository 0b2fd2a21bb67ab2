"""Ctrl-C and SIGTERM as a stop request that cannot be lost.

The handler raises ``KeyboardInterrupt`` where the main thread happens to be, so the run unwinds
through its ``finally`` blocks (workers and threads stopped, partial metrics written). But
Python swallows an exception raised inside some callbacks (an at-fork hook while a worker
process starts, a ``__del__``, a weakref callback) with only "Exception ignored in ...", and the
run would carry on as if nothing happened. So the handler also records the request, and the
loops check it at every batch (``LoopMeter.iterate``) and cache-build chunk, and the run checks
it before calling itself done.

A few short steps must not be cut in half: an atomic write (temporary file created, written,
fsynced, renamed over the target, or removed on error; ``locking.atomic_write``) and a memmap
cache's commit (its metadata and ``COMPLETE`` marker written, the folder renamed into place and
the directory fsynced). They run inside ``critical_section()``, where the handler only records
the request; leaving the outermost section raises the ``KeyboardInterrupt`` then, so a stop
never leaves a ``.tmp`` file or a half-committed cache behind. It is not raised there while an
exception is already propagating or being handled (an ``except`` or ``finally`` cleanup, such
as writing the partial metrics of an interrupted run, runs to its end); the request stays
recorded for the next check. Long work (a cache build, an epoch) stays outside, interruptible.
"""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)

_requested: int | None = None
_depth = 0  # how many critical sections the main thread is inside


def stop_requested() -> int | None:
    """The signal number of a pending stop request, if any."""
    return _requested


def raise_if_stop_requested() -> None:
    if _requested is not None:
        raise KeyboardInterrupt(f"stopped by signal {signal.Signals(_requested).name}")


@contextmanager
def critical_section() -> Iterator[None]:
    """Defer a stop signal to the end of the block (re-entrant).

    Inside, the handler of ``stop_signals_as_interrupt`` records the request without raising;
    leaving the outermost section then raises ``KeyboardInterrupt``, unless an exception is
    propagating out of the block or being handled around it. Outside the main thread it does
    nothing: signals are delivered to the main thread only.
    """
    global _depth
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _depth += 1
    try:
        yield
    finally:
        _depth -= 1
    # Reached only when the block ended normally (an exception re-raises at the yield).
    if _depth == 0 and sys.exc_info()[1] is None:
        raise_if_stop_requested()


@contextmanager
def stop_signals_as_interrupt() -> Iterator[None]:
    """SIGINT and SIGTERM (a scheduler's stop, ``kill``) unwind like Ctrl-C, and stay noticed."""
    global _requested
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum: int, frame: object) -> None:
        global _requested
        _requested = signum
        if _depth:  # inside critical_section(): raised when it ends
            return
        raise KeyboardInterrupt(f"stopped by signal {signal.Signals(signum).name}")

    previous = {sig: signal.signal(sig, interrupt) for sig in STOP_SIGNALS}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        _requested = None
