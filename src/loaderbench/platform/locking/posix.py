"""POSIX record locks (``fcntl.lockf``): what NFS and Lustre lock across nodes where ``flock``
fails or locks one host only.

POSIX locks belong to the process: a second lock on the same file converts the first, and
closing ANY descriptor of the file drops them all. So each lock file has one descriptor per
process, its holds counted here (threads exclude each other through this table, as with
``flock``), closed only when the last hold goes. A forked child holds none of its parent's
locks and starts with an empty table.
"""

from __future__ import annotations

import errno
import fcntl
import os
import threading
from collections.abc import Callable
from pathlib import Path

BUSY_ERRNOS = (errno.EACCES, errno.EAGAIN)  # what lockf says, not waiting, when it is taken


class _LockFile:
    """This process's holds on one lock file and the one descriptor they share."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.changed = threading.Condition()
        self.fd: int | None = None
        self.shared = 0  # shared holds of this process
        self.exclusive = False
        # A thread is in lockf on ``fd`` (perhaps waiting for another process): others wait.
        self.locking = False

    def _blocked(self, shared: bool) -> bool:
        return self.locking or self.exclusive or (not shared and self.shared > 0)

    def acquire(self, shared: bool, blocking: bool, on_wait: Callable[[], None]) -> bool:
        waited = False
        with self.changed:
            while self._blocked(shared):
                if not blocking:
                    return False
                if not waited:
                    on_wait()
                    waited = True
                self.changed.wait()
            if shared and self.shared:  # the process holds it shared already: one holder more
                self.shared += 1
                return True
            self.locking = True
            try:
                if self.fd is None:
                    self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
            except BaseException:
                self.locking = False
                self.changed.notify_all()
                raise
            fd = self.fd
        taken = False
        try:  # outside the condition: other threads may release meanwhile
            taken = _lock(fd, shared, blocking, None if waited else on_wait)
        finally:
            with self.changed:
                self.locking = False
                if taken and shared:
                    self.shared += 1
                elif taken:
                    self.exclusive = True
                else:
                    self._close_if_unheld()
                self.changed.notify_all()
        return taken

    def release(self, shared: bool) -> None:
        with self.changed:
            if shared:
                self.shared -= 1
            else:
                self.exclusive = False
            self._close_if_unheld()
            self.changed.notify_all()

    def _close_if_unheld(self) -> None:
        if self.shared or self.exclusive or self.fd is None:
            return
        fd, self.fd = self.fd, None
        try:
            fcntl.lockf(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)


def _lock(fd: int, shared: bool, blocking: bool, on_wait: Callable[[], None] | None) -> bool:
    operation = fcntl.LOCK_SH if shared else fcntl.LOCK_EX
    try:
        fcntl.lockf(fd, operation | fcntl.LOCK_NB)  # the whole file: start 0, length 0
        return True
    except OSError as error:
        if error.errno not in BUSY_ERRNOS:
            raise  # unsupported here (ENOLCK, ENOSYS, ...): the caller falls back
    if not blocking:
        return False
    if on_wait is not None:
        on_wait()
    fcntl.lockf(fd, operation)
    return True


_files: dict[str, _LockFile] = {}
_files_guard = threading.Lock()


def _forget_after_fork() -> None:
    global _files_guard
    _files_guard = threading.Lock()
    _files.clear()


os.register_at_fork(after_in_child=_forget_after_fork)


class PosixHold:
    def __init__(self, lock_file: _LockFile, shared: bool) -> None:
        self._lock_file: _LockFile | None = lock_file
        self._shared = shared

    def release(self) -> None:
        lock_file, self._lock_file = self._lock_file, None
        if lock_file is not None:
            lock_file.release(self._shared)


def acquire_posix(
    path: Path, shared: bool, blocking: bool, on_wait: Callable[[], None]
) -> PosixHold | None:
    """A POSIX lock on ``path`` (shared or exclusive), or None when not ``blocking`` and taken."""
    key = os.path.realpath(path)
    with _files_guard:
        lock_file = _files.setdefault(key, _LockFile(key))
    if not lock_file.acquire(shared, blocking, on_wait):
        return None
    return PosixHold(lock_file, shared)
