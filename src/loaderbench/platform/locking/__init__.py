"""Inter-process locks (filelock's, in ``kinds``): never one that silently does not exclude."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from loaderbench.platform.locking._kinds import Held, LockKindError, acquire


class FileLock:
    """An exclusive lock on a lock file, held inside ``with``; freed if the holder dies."""

    def __init__(self, path: str | os.PathLike[str], wait_message: str | None = None) -> None:
        self.path, self.wait_message = Path(path), wait_message
        self._held: Held | None = None

    def __enter__(self) -> FileLock:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._held = acquire(self.path, shared=False, blocking=False)
        if self._held is None:
            waiting = self.wait_message or f"Waiting for another process holding {self.path} ..."
            print(waiting, file=sys.stderr)
            begun = time.monotonic()
            self._held = acquire(self.path, shared=False, blocking=True)
            print(f"... lock acquired after {time.monotonic() - begun:.1f} s", file=sys.stderr)
        return self

    def __exit__(self, *exc_info: object) -> None:
        held, self._held = self._held, None
        assert held is not None
        held.release()


class SharedHold:
    """A shared lock held until ``release()`` (or the holder's death): "in use", against the
    ``try_exclusive`` of whoever wants the thing gone. Its lock file's mtime is the last use."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._held = acquire(self.path, shared=True, blocking=True)
        os.utime(self.path)

    def release(self) -> None:
        held, self._held = self._held, None
        if held is not None:
            held.release()


def try_exclusive(path: str | os.PathLike[str]) -> Held | None:
    """The exclusive lock of ``path`` (``release()`` it), or None when someone holds it."""
    return acquire(Path(path), shared=False, blocking=False)


__all__ = ["FileLock", "Held", "LockKindError", "SharedHold", "try_exclusive"]
