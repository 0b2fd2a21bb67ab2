"""Inter-process locks and atomic writes for things that must never be half-written."""

from __future__ import annotations

import fcntl
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import IO

from loaderbench.stopping import critical_section


class FileLock:
    """An exclusive ``flock`` on a lock file; the OS releases it if the holder dies."""

    def __init__(self, path: str | os.PathLike[str], wait_message: str | None = None) -> None:
        self.path = Path(path)
        self.wait_message = wait_message
        self._file: IO[bytes] | None = None

    def __enter__(self) -> FileLock:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(self.path, "ab")
        try:
            fcntl.flock(self._file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(
                self.wait_message or f"Waiting for another process holding {self.path} ...",
                file=sys.stderr,
            )
            start = time.monotonic()
            fcntl.flock(self._file, fcntl.LOCK_EX)
            print(f"... lock acquired after {time.monotonic() - start:.1f} s", file=sys.stderr)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        assert self._file is not None
        fcntl.flock(self._file, fcntl.LOCK_UN)
        self._file.close()
        self._file = None


class SharedHold:
    """A shared ``flock`` held until ``release()`` (or the holder's death): "in use".

    Many holders at once; whoever wants the thing gone takes the exclusive lock without
    waiting (``try_exclusive``) and leaves it alone when that fails. Taking the hold also
    touches the lock file, so its mtime says when the thing was last used.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._fd: int | None = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)
        fcntl.flock(self._fd, fcntl.LOCK_SH)
        os.utime(self._fd)

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)  # closing releases the lock


def try_exclusive(path: str | os.PathLike[str]) -> int | None:
    """The exclusive ``flock`` of ``path`` as an open fd (close it to release), or None when
    someone holds it (shared or exclusive)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


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
