"""Inter-process locks and atomic writes for things that must never be half-written.

The locks work where clusters keep data: ``flock`` where the file system supports it across
nodes, else a POSIX record lock (``posix``), else lock files created exclusively with a
stale-holder rule (``lockfile``); ``kinds`` picks one per file system, logs which, and honours
``LOADERBENCH_LOCK=flock|fcntl|lockfile``. None of them is ever a lock that silently does not
exclude: a kind that fails, or that the mount table shows to lock one host only, is passed over
while a folder's first lock is taken; the kind then taken is recorded in the folder
(``.lockkind``) and every process uses it there or fails with ``LockKindError``.
"""

from __future__ import annotations

import fcntl
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType

from loaderbench.platform.locking import kinds
from loaderbench.platform.locking.kinds import Held, LockKindError
from loaderbench.platform.locking.lockfile import acquire_lockfile
from loaderbench.platform.locking.posix import acquire_posix
from loaderbench.platform.stopping import critical_section

__all__ = [
    "FileLock",
    "Held",
    "LockKindError",
    "SharedHold",
    "atomic_write",
    "atomic_write_text",
    "try_exclusive",
]


class FlockHold:
    def __init__(self, fd: int) -> None:
        self._fd: int | None = fd

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_UN)
            finally:
                os.close(fd)


def acquire_flock(
    path: Path, shared: bool, blocking: bool, on_wait: Callable[[], None]
) -> FlockHold | None:
    """A ``flock`` on ``path``; the OS releases it if the holder dies."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
    operation = fcntl.LOCK_SH if shared else fcntl.LOCK_EX
    try:
        try:
            fcntl.flock(fd, operation | fcntl.LOCK_NB)
        except BlockingIOError:
            if not blocking:
                os.close(fd)
                return None
            on_wait()
            fcntl.flock(fd, operation)
    except BaseException:
        os.close(fd)
        raise
    return FlockHold(fd)


MECHANISMS: dict[str, kinds.Mechanism] = {
    "flock": acquire_flock,
    "fcntl": acquire_posix,
    "lockfile": acquire_lockfile,
}


def _acquire(
    path: Path, shared: bool, blocking: bool, on_wait: Callable[[], None] = lambda: None
) -> Held | None:
    return kinds.acquire(path, shared, blocking, on_wait, MECHANISMS)


class FileLock:
    """An exclusive lock on a lock file, held inside ``with``; freed if the holder dies (by the
    OS, or by the lock file kind's stale-holder rule)."""

    def __init__(self, path: str | os.PathLike[str], wait_message: str | None = None) -> None:
        self.path = Path(path)
        self.wait_message = wait_message
        self._held: Held | None = None
        self._waiting_since: float | None = None

    def _say_waiting(self) -> None:
        print(
            self.wait_message or f"Waiting for another process holding {self.path} ...",
            file=sys.stderr,
        )
        self._waiting_since = time.monotonic()

    def __enter__(self) -> FileLock:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._waiting_since = None
        self._held = _acquire(self.path, shared=False, blocking=True, on_wait=self._say_waiting)
        if self._waiting_since is not None:
            waited = time.monotonic() - self._waiting_since
            print(f"... lock acquired after {waited:.1f} s", file=sys.stderr)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        assert self._held is not None
        self._held.release()
        self._held = None


class SharedHold:
    """A shared lock held until ``release()`` (or the holder's death): "in use".

    Many holders at once; whoever wants the thing gone takes the exclusive lock without
    waiting (``try_exclusive``) and leaves it alone when that fails. Taking the hold also
    touches the lock file, so its mtime says when the thing was last used.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._held: Held | None = _acquire(self.path, shared=True, blocking=True)
        os.utime(self.path)

    def release(self) -> None:
        held, self._held = self._held, None
        if held is not None:
            held.release()


def try_exclusive(path: str | os.PathLike[str]) -> Held | None:
    """The exclusive lock of ``path`` (``release()`` it), or None when someone holds it
    (shared or exclusive)."""
    return _acquire(Path(path), shared=False, blocking=False)


def atomic_write(path: str | os.PathLike[str], write: Callable[[Path], None]) -> None:
    """Call ``write(tmp_path)``, fsync, then rename over ``path``: readers see all or nothing.

    A stop signal (SIGINT, SIGTERM) arriving meanwhile is deferred until the file is in place
    (or the temporary file removed, on error): ``stopping.critical_section``.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with critical_section():
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        os.close(fd)
        tmp_path = Path(tmp)
        try:
            write(tmp_path)
            with open(tmp_path, "rb") as f:
                os.fsync(f.fileno())
            os.replace(tmp_path, path)
        except BaseException:
            tmp_path.unlink(missing_ok=True)
            raise


def atomic_write_text(path: str | os.PathLike[str], text: str) -> None:
    atomic_write(path, lambda tmp: tmp.write_text(text))
