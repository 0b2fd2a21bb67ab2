"""Ctrl-C and SIGTERM as a stop request that cannot be lost.

The handler raises ``KeyboardInterrupt`` where the main thread is, so the run unwinds through
its ``finally`` blocks; since Python swallows an exception raised in some callbacks (an at-fork
hook, a ``__del__``), it also records the request, which the loops check at every batch and
build chunk. Short steps that must not be cut in half (an atomic write, a cache's commit) run in
``critical_section()``: the handler only records the request there, and leaving the outermost
section raises it, unless an exception is already being handled (the request then waits for the
next check). Long work (a build, an epoch) stays interruptible.
"""

from __future__ import annotations

import os
import signal
import subprocess
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


# ---------------------------------------------------------------------------------------------
# Preemption and time limits: SLURM's warning (``--signal=USR2@N``, or ``scancel --signal=USR2``
# for a preemption) asks the job to save its work and come back later. The signal reaches every
# process of the job step, DataLoader workers and cache-build processes included (they are
# forks, and a fork inherits the handler): it is noted in the run's main process only, the
# training loop stops at a step boundary, the run writes a checkpoint, and ``requeue`` hands
# over to the handler that was there before (submitit's: requeue the job, then exit).

PREEMPT_SIGNAL = signal.SIGUSR2

_preempted = False
_handler_before: object = None


class Preempted(Exception):
    """The run stopped at a step boundary for a time limit or a preemption, its state saved."""


def preemption_requested() -> bool:
    return _preempted


@contextmanager
def preemption_noted() -> Iterator[None]:
    """Note USR2 in this (main) process instead of acting on it at once; forked children
    ignore it. Inside a submitit job the handler it replaces is kept for ``requeue``."""
    global _preempted, _handler_before
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    main_pid = os.getpid()

    def note(signum: int, frame: object) -> None:
        global _preempted
        if os.getpid() == main_pid:
            _preempted = True

    _handler_before = signal.signal(PREEMPT_SIGNAL, note)
    try:
        yield
    finally:
        signal.signal(PREEMPT_SIGNAL, _handler_before)  # type: ignore[arg-type]
        _preempted = False


def requeue() -> bool:
    """After a preempted run has saved its state: let the job's scheduler requeue it (the
    handler USR2 had before, submitit's, requeues the SLURM job and exits). False where
    nobody can (a run outside SLURM): the caller ends with the saved state."""
    handler = _handler_before
    if not callable(handler):
        return False
    try:
        handler(PREEMPT_SIGNAL, None)
    except subprocess.CalledProcessError as error:
        # ``scontrol requeue`` is a process of the job it requeues: SLURM stops the job (SIGTERM
        # to every process of the step) as it requeues it, maybe before scontrol has exited.
        # Killed by that SIGTERM, it has done its work (or the job was cancelled meanwhile):
        # ending here as submitit does after a requeue (no result written) lets the requeued
        # job finish the run instead of reporting a failure. Any other end still raises.
        if error.returncode != -signal.SIGTERM:
            raise
        sys.exit(-1)
    return True
