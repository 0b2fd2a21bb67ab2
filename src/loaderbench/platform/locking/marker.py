"""The lock kind of a folder, recorded once in ``<folder>/.lockkind`` so every process agrees.

Kinds never exclude each other, and nodes may choose differently (other mount options, NFS's
ENOLCK while its lock daemon is silent): the first process to lock in the folder records the
kind that worked, and the others use it or fail, naming the marker. It is written whole under a
temporary name and linked into place (one writer wins, no reader sees half of it), or, without
hard links, created exclusively and written in place. The project never removes it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import os
import socket
import time
import uuid
from pathlib import Path

MARKER_NAME = ".lockkind"
# How long a reader waits for a marker created in place (no hard links) to be written whole.
WRITE_PATIENCE_S = 2.0
NO_HARD_LINKS = frozenset(
    {errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP, errno.ENOSYS, errno.EMLINK}
)


@dataclasses.dataclass(frozen=True)
class Recorded:
    kind: str
    path: Path  # the marker
    chosen_by: str  # "pid 12 on node3", as its writer put it; "" where the line is missing


def marker_of(directory: Path) -> Path:
    return directory / MARKER_NAME


def _parse(text: str, kinds: tuple[str, ...]) -> tuple[str, str] | None:
    """(kind, chosen by) from a marker written whole; None while it is being written;
    ValueError for one whose first line is not a kind."""
    if not text.endswith("\n"):
        return None
    lines = text.splitlines()
    kind = lines[0].strip() if lines else ""
    if kind not in kinds:
        raise ValueError(kind)
    chosen_by = lines[1].removeprefix("chosen by ").strip() if len(lines) > 1 else ""
    return kind, chosen_by


def read(directory: Path, kinds: tuple[str, ...]) -> Recorded | None:
    """The kind recorded for ``directory``'s locks, or None where none is yet."""
    path = marker_of(directory)
    deadline = time.monotonic() + WRITE_PATIENCE_S
    while True:
        try:
            text = path.read_text()
        except FileNotFoundError:
            return None
        try:
            parsed = _parse(text, kinds)
        except ValueError:
            parsed = None
            wrong = True  # whole, and not a kind: no use waiting
        else:
            wrong = False
        if parsed is not None:
            return Recorded(parsed[0], path, parsed[1])
        if wrong or time.monotonic() > deadline:
            raise OSError(
                errno.EINVAL,
                f"lock kind marker {path} holds {text.strip()[:80]!r}, not one of "
                f"{', '.join(kinds)}: remove it only when no process on any node holds a lock "
                f"in {directory}",
            )
        time.sleep(0.02)


def _write_new(path: Path, text: str) -> None:
    """Create ``path`` holding ``text``; FileExistsError where it exists."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
    try:
        os.write(fd, text.encode())
        os.fsync(fd)
    finally:
        os.close(fd)


def record(directory: Path, kind: str, kinds: tuple[str, ...]) -> Recorded:
    """Record ``kind`` for ``directory``'s locks unless a kind is recorded already; the kind
    recorded either way (another process's, where it was first)."""
    path = marker_of(directory)
    text = f"{kind}\nchosen by pid {os.getpid()} on {socket.gethostname()}\n"
    staged = directory / f"{MARKER_NAME}.staged-{uuid.uuid4().hex}"
    _write_new(staged, text)
    try:
        os.link(staged, path)
    except FileExistsError:
        pass  # another process recorded first (or NFS retried our link): read what is there
    except OSError as error:
        if error.errno not in NO_HARD_LINKS:
            raise
        with contextlib.suppress(FileExistsError):  # another process recorded first
            _write_new(path, text)
    finally:
        staged.unlink(missing_ok=True)
    recorded = read(directory, kinds)
    assert recorded is not None, f"{path} vanished after it was recorded"
    return recorded
