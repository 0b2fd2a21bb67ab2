"""Ctrl-C and SIGTERM as a stop request that cannot be lost.

The handler raises ``KeyboardInterrupt`` where the main thread happens to be, so the run unwinds
through its ``finally`` blocks (workers and threads stopped, partial metrics written). But
Python swallows an exception raised inside some callbacks (an at-fork hook while a worker
process starts, a ``__del__``, a weakref callback) with only "Exception ignored in ...", and the
run would carry on as if nothing happened. So the handler also records the request, and the
loops check it at every batch (``LoopMeter.iterate``) and cache-build chunk, and the run checks
it before calling itself done.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)

_requested: int | None = None


def stop_requested() -> int | None:
    """The signal number of a pending stop request, if any."""
    return _requested


def raise_if_stop_requested() -> None:
    if _requested is not None:
        raise KeyboardInterrupt(f"stopped by signal {signal.Signals(_requested).name}")


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
        raise KeyboardInterrupt(f"stopped by signal {signal.Signals(signum).name}")

    previous = {sig: signal.signal(sig, interrupt) for sig in STOP_SIGNALS}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        _requested = None
