"""filelock's locks, of one kind per folder on every node: ``flock`` (``UnixFileLock``, and a
shared ``flock``, which filelock lacks), else lock files (``SoftFileLease``, and shared ones
beside them) where ``flock`` fails or the mount table shows it locks one host only. The first
process to lock in a folder records the kind in ``<folder>/.lockkind``: kinds never exclude
each other, so the others use it or fail (``LockKindError``). docs/imagenet_and_slurm.md: how.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import glob
import io
import logging
import os
import re
import socket
import time
import uuid
from functools import partial
from pathlib import Path

from filelock import BaseFileLock, SoftFileLease, Timeout, UnixFileLock

log = logging.getLogger("loaderbench.platform.locking")
KINDS = ("flock", "lockfile")
KIND_ENV, STALE_ENV = "LOADERBENCH_LOCK", "LOADERBENCH_LOCK_STALE_S"
MARKER_NAME = ".lockkind"
UNSUPPORTED = frozenset({errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EINVAL, errno.ENOSYS})
HOST = socket.gethostname()
DESCRIPTIONS = {"flock": "flock", "lockfile": "lock files created exclusively (filelock leases)"}
SHARED_GLOB = ".shared-" + "[0-9a-f]" * 32  # a shared holder's lock file, beside the lock's
_said: set[tuple[Path, str]] = set()  # (folder, kind) named in the log already


class LockKindError(OSError):
    """No lock of the kind every process must use here: never replaced by another kind."""


def flock_local_only(fstype: str, options: frozenset[str]) -> str | None:
    """The mount option that makes ``flock`` lock this host only on such a mount, if any."""
    if fstype.startswith("nfs"):
        scope = "all" if "nolock" in options else "none"
        scope = next((o.split("=", 1)[1] for o in options if o.startswith("local_lock=")), scope)
        return f"local_lock={scope}" if scope in ("flock", "all") else None
    return "localflock" if fstype == "lustre" and "localflock" in options else None


def local_only_here(directory: Path) -> str | None:
    """Why ``flock`` locks this host only in ``directory`` (its mount's options), if it does."""
    real, best = os.path.realpath(directory), ("", "", frozenset[str]())
    with contextlib.suppress(OSError), open("/proc/self/mounts") as table:
        for line in table:  # the longest mount point holding it wins; a later one, a tie
            _, point, fstype, options = line.split()[:4]
            point = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m[1], 8)), point)
            inside = real == point or real.startswith(point.rstrip("/") + "/")
            if inside and len(point) >= len(best[0]):
                best = (point, fstype, frozenset(options.split(",")))
    option = flock_local_only(best[1], best[2])
    return f"flock locks one host only on {best[1]} mounted {option}" if option else None


def _probe(path: Path) -> tuple[str, str]:  # the kind for a new folder, and why
    if local := local_only_here(path.parent):
        return "lockfile", "because " + local
    try:
        if _take(probe := UnixFileLock(path, fallback_to_soft=False)):
            probe.release()
    except OSError as error:
        if error.errno not in UNSUPPORTED:  # ENOSYS: Lustre without -o flock; others: NFS, FUSE
            raise
        return "lockfile", f"because flock failed there with {errno.errorcode[error.errno]}"
    return "flock", "the first kind that works"


def read_marker(directory: Path) -> tuple[str, str] | None:
    """(kind, who chose it) as ``directory``'s marker records, or None where none is yet."""
    path, deadline = directory / MARKER_NAME, time.monotonic() + 2.0
    while True:
        try:
            text = path.read_text()
        except FileNotFoundError:
            return None
        lines = [*text.splitlines(), "", ""]
        if text.endswith("\n") and lines[0] in KINDS:
            return lines[0], lines[1]
        if text.endswith("\n") or time.monotonic() > deadline:
            wrong = f"lock kind marker {path} holds {text.strip()[:80]!r}, not one of {KINDS}"
            raise OSError(errno.EINVAL, f"{wrong}: remove it while no node holds a lock there")
        time.sleep(0.02)  # created exclusively, its line still being written


def kind_for(path: Path) -> tuple[str, str]:
    """The kind every process takes on ``path``, and its marker's words (for errors)."""
    directory, forced = path.parent, os.environ.get(KIND_ENV, "").strip().lower() or None
    if forced not in (None, *KINDS):
        raise ValueError(f"{KIND_ENV}={forced!r}: expected one of {', '.join(KINDS)}")
    probed = None
    if (recorded := read_marker(directory)) is None:
        probed = (forced, f"as {KIND_ENV} asks") if forced else _probe(path)
        # Created exclusively: another process may have recorded first (then it wins).
        with contextlib.suppress(FileExistsError), open(directory / MARKER_NAME, "x") as marker:
            marker.write(f"{probed[0]}\nchosen by pid {os.getpid()} on {HOST}\n")
            marker.flush()
            os.fsync(marker.fileno())
        recorded = read_marker(directory)
    assert recorded is not None
    kind, where = recorded[0], f"{directory / MARKER_NAME} records {recorded[0]} ({recorded[1]})"
    if forced is not None and forced != kind:
        never = f"kinds never exclude each other: give every process the same {KIND_ENV}"
        raise LockKindError(errno.EINVAL, f"{KIND_ENV}={forced} for {path}, but {where}: {never}")
    if kind == "flock" and (local := local_only_here(directory)):
        raise LockKindError(errno.ENOLCK, f"{path}: {where}, but on {HOST} {local}: mount it alike")
    if (directory, kind) not in _said:
        _said.add((directory, kind))
        why = probed[1] if probed and probed[0] == kind else f"as {where}"
        say = log.warning if kind == "lockfile" else log.debug
        say("locks in %s: %s, %s", directory, DESCRIPTIONS[kind], why)
    return kind, where


def stale_after_s() -> float:
    raw = os.environ.get(STALE_ENV) or "120"
    if not re.fullmatch(r"\d+(\.\d*)?", raw.strip()) or not float(raw) > 0:
        raise ValueError(f"{STALE_ENV}={raw!r}: expected a number of seconds above 0")
    return float(raw)


def lease(marker: Path) -> SoftFileLease:
    """A lock file naming its holder, refreshed by a thread (filelock's stale-holder rule)."""
    stale, beat = stale_after_s(), min(10.0, stale_after_s() / 4)
    lost = partial(log.warning, "lock record %s lost: %s", marker)  # with filelock's why
    return SoftFileLease(marker, lease_duration=stale, heartbeat_interval=beat, on_compromise=lost)


class SharedFlock(io.FileIO):
    """A shared ``flock`` on an open file (filelock has none): closing the file lets go."""

    release = io.FileIO.close


Held = BaseFileLock | SharedFlock  # what ``acquire`` gives: ``release()`` it


def _take(lock: BaseFileLock) -> bool:
    with contextlib.suppress(Timeout):
        lock.acquire(blocking=False)
    return lock.is_locked


def _flock(path: Path, shared: bool, blocking: bool) -> Held | None:
    if not shared:
        if not _take(lock := UnixFileLock(path, fallback_to_soft=False)) and blocking:
            lock.acquire()
        return lock if lock.is_locked else None
    held = SharedFlock(path, "r")
    try:
        fcntl.flock(held, fcntl.LOCK_SH)  # shared holds always wait
    except BaseException:
        held.close()
        raise
    return held


def _free(path: Path, judges: dict[Path, SoftFileLease]) -> bool:
    """Whether no one holds the lock file ``path``: gone, free or stale (taken over), or a
    shared one without heartbeat for ``stale_s`` + 300 s (removed: its name is its holder's)."""
    try:
        behind = time.time() - path.stat().st_mtime
    except FileNotFoundError:
        return True
    if ".shared-" in path.name and behind > stale_after_s() + 300:
        log.warning("lock record %s removed: no heartbeat for %.0f s", path, behind)
        path.unlink(missing_ok=True)
        return True
    if path not in judges:  # kept: it watches the record's age from one look to the next
        judges[path] = lease(path)
    if not _take(judge := judges[path]):
        return False
    judge.release()
    return True


def _leases(path: Path, shared: bool, blocking: bool) -> SoftFileLease | None:
    """Hold ``path`` through lock files (the module's note); None when not ``blocking``, held."""
    exclusive, pause = path.with_name(path.name + ".excl"), 0.015
    judges, pattern = {exclusive: lease(exclusive)}, glob.escape(path.name) + SHARED_GLOB
    while True:
        token = f"{path.name}.shared-{uuid.uuid4().hex}"  # a name no one else takes
        mine = lease(path.with_name(token)) if shared else judges[exclusive]
        if _take(mine):
            try:
                others = [exclusive] if shared else path.parent.glob(pattern)
                if all(_free(other, judges) for other in others):
                    return mine
            except BaseException:
                mine.release()
                raise
            mine.release()  # someone else is in: step back
        if not blocking:
            return None
        time.sleep(pause := min(pause * 1.5, 1.0))


def acquire(path: Path, shared: bool, blocking: bool) -> Held | None:
    """``path``'s lock of its folder's kind; None when not ``blocking`` and someone holds it."""
    kind, where = kind_for(path)
    os.close(os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666))  # kept: its mtime
    if kind == "lockfile":
        return _leases(path, shared, blocking)
    try:
        return _flock(path, shared, blocking)
    except OSError as error:
        if error.errno not in UNSUPPORTED:
            raise
        fails = f"flock fails on this host ({HOST}) with {errno.errorcode[error.errno]}"
        why = "not taking another kind, which would not exclude the processes using flock"
        cure = f"mount it on {HOST} as the other nodes do"
        raise LockKindError(error.errno, f"{path}: {where}, and {fails}; {why}: {cure}") from error
