"""The memmap loader's reading threads: one pool for the run, a bounded number of batches in
flight, handed over in order, and reading ahead into the next epoch.

Once an epoch's batches are all submitted, the threads go on with the next epoch's first batches
(its order is known: the shared seeded permutation), rather than sit idle while the caller ends
one epoch and starts the next. The next iteration takes them if it is that epoch from its start
and its batches are the ones read, and drops them otherwise (a resumed or re-ordered epoch): a
read ahead is never served for another batch.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Generic, TypeVar

import torch

from loaderbench.platform.threads import serial_torch_in_this_thread

T = TypeVar("T")
Job = tuple[torch.Tensor, "Future[T]"]


@dataclass
class _Ahead(Generic[T]):
    """The next epoch's batches, and the first of them already submitted."""

    epoch: int
    batches: list[torch.Tensor]
    submitted: deque[Job] = field(default_factory=deque)


class ReadingThreads(Generic[T]):
    """``workers`` threads that run ``read(epoch, indices)``, at most ``depth`` batches ahead of
    the caller; ``order(epoch)`` gives an epoch's batches from its start (for reading ahead)."""

    def __init__(
        self,
        workers: int,
        depth: int,
        read: Callable[[int, torch.Tensor], T],
        order: Callable[[int], list[torch.Tensor]],
    ) -> None:
        self.depth = depth
        self._read, self._order = read, order
        # One core per reading thread: the threads are the parallelism, and a resize that also
        # forks torch's intra-op team waits on descheduled teammates when the cores are busy.
        self._pool = ThreadPoolExecutor(
            max_workers=workers,
            thread_name_prefix="memmap-loader",
            initializer=serial_torch_in_this_thread,
        )
        self._ahead: _Ahead[T] | None = None
        self._pending: deque[Job] = deque()  # the iteration under way's batches in flight

    def iterate(
        self, epoch: int, batches: list[torch.Tensor], from_start: bool, read_ahead: bool
    ) -> Iterator[tuple[torch.Tensor, T]]:
        """``(indices, read(epoch, indices))`` for each of ``batches``, in order; ``from_start``:
        they are the epoch's from its first; ``read_ahead``: go on into ``epoch + 1``."""
        pending: deque[Job] = self._adopt(epoch, batches) if from_start else deque()
        self._pending = pending
        self._drop_ahead()
        jobs = iter(batches[len(pending) :])

        def submit() -> None:
            job = next(jobs, None)
            if job is not None:
                pending.append((job, self._pool.submit(self._read, epoch, job)))
            elif read_ahead:
                self._read_ahead(epoch + 1, in_flight=len(pending))

        try:
            for _ in range(self.depth - len(pending)):
                submit()
            while pending:
                indices, future = pending.popleft()
                result = future.result()
                submit()
                yield indices, result
        finally:
            # Reached on exhaustion, on close() and when the iterator is garbage-collected: the
            # batches not started are dropped, the ones being read finish (they write into
            # pooled buffers) before the iterator is gone.
            wait([future for _, future in pending if not future.cancel()])

    def in_flight(self) -> tuple[int, int]:
        """(batches read and waiting for the caller, batches being read) of the iteration
        under way: what the loop's meter asks after each step (``Loader.batches_ahead``)."""
        pending = list(self._pending)
        done = sum(future.done() for _, future in pending)
        return done, len(pending) - done

    def _adopt(self, epoch: int, batches: list[torch.Tensor]) -> deque[Job]:
        """The batches read ahead for this epoch, where they are its first batches."""
        ahead, adopted = self._ahead, deque()
        if ahead is None or ahead.epoch != epoch:
            return adopted
        while ahead.submitted:
            indices = ahead.submitted[0][0]
            k = len(adopted)
            if k >= len(batches) or not torch.equal(indices, batches[k]):
                break
            adopted.append(ahead.submitted.popleft())
        return adopted

    def _read_ahead(self, epoch: int, in_flight: int) -> None:
        """Submit more of ``epoch``'s first batches, while fewer than ``depth`` batches are in
        flight (``in_flight`` of this epoch's, and those read ahead)."""
        if self._ahead is None or self._ahead.epoch != epoch:
            self._drop_ahead()
            self._ahead = _Ahead(epoch, self._order(epoch))
        ahead = self._ahead
        done = len(ahead.submitted)
        room = self.depth - in_flight - done
        for indices in ahead.batches[done : done + max(0, room)]:
            ahead.submitted.append((indices, self._pool.submit(self._read, epoch, indices)))

    def order_read_ahead(self, epoch: int) -> list[torch.Tensor] | None:
        """``epoch``'s batches, where this pool has read ahead into it (computed once)."""
        ahead = self._ahead
        return ahead.batches if ahead is not None and ahead.epoch == epoch else None

    def ahead_of(self, epoch: int) -> int:
        """How many of ``epoch``'s first batches are read ahead (done or under way)."""
        ahead = self._ahead
        return len(ahead.submitted) if ahead is not None and ahead.epoch == epoch else 0

    def _drop_ahead(self) -> None:
        ahead, self._ahead = self._ahead, None
        if ahead is not None:
            wait([future for _, future in ahead.submitted if not future.cancel()])

    def close(self) -> None:
        self._drop_ahead()
        self._pool.shutdown(wait=True, cancel_futures=True)
