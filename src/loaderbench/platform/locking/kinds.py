"""Which lock a file system gets: ``flock``, else a POSIX record lock, else a lock file.

A kind whose call fails as unsupported, or that the mount table shows to lock one host only (it
would "work" and exclude nothing across nodes), gives way to the next; one log line per process
and file system names the kind. Kinds never exclude each other, so the first process to lock in
a folder records its kind (``marker``) and every later one uses it or fails naming it; so does a
kind that worked here and then fails, and a ``LOADERBENCH_LOCK=flock|fcntl|lockfile`` that
disagrees with the marker. docs/imagenet_and_slurm.md ("Locks on cluster filesystems") has the
errors and mount options.
"""

from __future__ import annotations

import errno
import logging
import os
import re
import socket
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from loaderbench.platform.locking import marker

log = logging.getLogger("loaderbench.platform.locking")

KINDS = ("flock", "fcntl", "lockfile")
KIND_ENV = "LOADERBENCH_LOCK"
# What a file system without the call answers (the kernel's ENOTSUP is EOPNOTSUPP).
UNSUPPORTED = frozenset({errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EINVAL, errno.ENOSYS})
DESCRIPTIONS = {
    "flock": "flock",
    "fcntl": "POSIX record locks (fcntl)",
    "lockfile": "lock files created exclusively (host and pid inside, stale-holder rule)",
}


class Held(Protocol):
    def release(self) -> None: ...


# (path, shared, blocking, on_wait) -> the hold, or None when not blocking and taken.
Mechanism = Callable[[Path, bool, bool, Callable[[], None]], Held | None]

_worked: dict[int, set[str]] = {}  # st_dev -> the kinds that have worked there, this process
_said: set[tuple[int, str]] = set()  # (st_dev, kind) named in the log already
_unrecorded: set[Path] = set()  # folders whose marker this process may not write, said once
# A folder this process may lock in (its lock files are writable) but not write a marker to.
NOT_WRITABLE = frozenset({errno.EACCES, errno.EPERM, errno.EROFS})
_guard = threading.Lock()


class LockKindError(OSError):
    """No lock of the kind every process must use here: never replaced by another kind, which
    would not exclude the processes using this one."""


def forced_kind() -> str | None:
    value = os.environ.get(KIND_ENV, "").strip().lower()
    if not value:
        return None
    if value not in KINDS:
        raise ValueError(f"{KIND_ENV}={value!r}: expected one of {', '.join(KINDS)}")
    return value


def _unescape(field: str) -> str:
    """Mount table fields escape space, tab, newline and backslash as octal."""
    return re.sub(r"\\([0-7]{3})", lambda match: chr(int(match[1], 8)), field)


def mount_of(path: Path) -> tuple[str, str, frozenset[str]] | None:
    """(mount point, file system type, mount and super options) of the mount holding ``path``."""
    real = os.path.realpath(path)
    best: tuple[str, str, frozenset[str]] | None = None
    try:
        with open("/proc/self/mountinfo") as table:
            lines = table.readlines()
    except OSError:
        return None
    for line in lines:
        left, _, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if len(fields) < 6 or len(tail) < 3:
            continue
        point = _unescape(fields[4])
        inside = real == point or real.startswith(point.rstrip("/") + "/")
        # The longest mount point holding the path; a later line (mounted over) wins a tie.
        if inside and (best is None or len(point) >= len(best[0])):
            options = frozenset(fields[5].split(",")) | frozenset(tail[2].split(","))
            best = (point, tail[0], options)
    return best


def local_only(fstype: str, options: frozenset[str]) -> dict[str, str]:
    """The kinds that lock this host only on such a mount, each with the option saying so."""
    if fstype.startswith("nfs"):
        scope = "all" if "nolock" in options else "none"
        scope = next((o.split("=", 1)[1] for o in options if o.startswith("local_lock=")), scope)
        kinds = {"flock": ("flock", "all"), "fcntl": ("posix", "all")}
        return {kind: f"local_lock={scope}" for kind, scopes in kinds.items() if scope in scopes}
    if fstype == "lustre" and "localflock" in options:
        return {"flock": "localflock", "fcntl": "localflock"}
    return {}


def _note_worked(dev: int, directory: Path, kind: str, why: str, quiet: bool) -> None:
    """Remember that ``kind`` worked on this file system; the first time, one log line."""
    with _guard:
        _worked.setdefault(dev, set()).add(kind)
        first = (dev, kind) not in _said
        _said.add((dev, kind))
    if not first:
        return
    mount = mount_of(directory)
    where = f"{directory} ({mount[1]} at {mount[0]})" if mount else str(directory)
    if quiet:
        log.debug("locks in %s: %s, %s", where, DESCRIPTIONS[kind], why)
    else:
        log.warning("locks in %s: %s, %s", where, DESCRIPTIONS[kind], why)


def _untried_candidates(directory: Path, reasons: list[str]) -> list[str]:
    """The kinds to try, in order, on a file system not seen yet; those the mount table shows
    to lock one host only are left out (and why, added to ``reasons``)."""
    mount = mount_of(directory)
    if mount is None:
        return list(KINDS)
    _, fstype, options = mount
    skipped = local_only(fstype, options)
    reasons += [
        f"{kind} locks one host only on {fstype} mounted {option}"
        for kind, option in skipped.items()
    ]
    return [kind for kind in KINDS if kind not in skipped or kind == "lockfile"]


Args = tuple[bool, bool, Callable[[], None]]  # shared, blocking, on_wait


def _probe(
    path: Path, dev: int, forced: str | None, args: Args, mechanisms: dict[str, Mechanism]
) -> tuple[str, Held | None, str]:
    """The first kind that works on ``path`` (the forced one, else in order), its hold, and
    why that kind (for the log line)."""
    reasons: list[str] = []
    candidates = [forced] if forced is not None else _untried_candidates(path.parent, reasons)
    with _guard:
        worked = set(_worked.get(dev, ()))
    for kind in candidates:
        try:
            held = mechanisms[kind](path, *args)
        except OSError as error:
            if forced is not None or kind == "lockfile" or error.errno not in UNSUPPORTED:
                raise
            code = errno.errorcode[error.errno]
            if kind in worked:  # a passing failure: others hold this kind, another excludes none
                raise LockKindError(
                    error.errno,
                    f"{path}: {kind} has worked on this file system in this process and now "
                    f"fails with {code}; not falling back to another kind, which would not "
                    f"exclude processes holding {kind} (NFS answers ENOLCK while its lock "
                    "daemon does not reply: run again once it does)",
                ) from error
            reasons.append(f"{kind} failed there with {code}")
            continue
        if forced is not None:
            local = skipped_here(path.parent, kind)
            why = f"as {KIND_ENV} asks" + (f" ({kind} locks one host only here)" if local else "")
        else:
            why = "because " + "; ".join(reasons) if reasons else "the first kind that works"
        return kind, held, why
    raise AssertionError("unreachable: the lock file kind never reports unsupported")


def _take_recorded(
    path: Path,
    dev: int,
    recorded: marker.Recorded,
    forced: str | None,
    args: Args,
    mechanisms: dict[str, Mechanism],
) -> Held | None:
    """The lock of the kind ``recorded`` for its folder, or an error: never another kind."""
    kind, host = recorded.kind, socket.gethostname()
    by = f" (chosen by {recorded.chosen_by})" if recorded.chosen_by else ""
    where = f"{recorded.path} records {kind}{by}"
    if forced is not None and forced != kind:
        raise LockKindError(
            errno.EINVAL,
            f"{KIND_ENV}={forced} for {path}, but {where} for every lock in {path.parent}: "
            f"kinds never exclude each other. Give every process of the job the same "
            f"{KIND_ENV} (or none)",
        )
    if forced is None and kind != "lockfile" and skipped_here(path.parent, kind):
        raise LockKindError(
            errno.ENOLCK,
            f"{path}: {where}, but this host ({host}) mounts it so that {kind} locks this host "
            "only: mount it as the nodes that chose the kind do",
        )
    try:
        held = mechanisms[kind](path, *args)
    except OSError as error:
        if error.errno not in UNSUPPORTED:
            raise
        raise LockKindError(
            error.errno,
            f"{path}: {where}, and {kind} fails on this host ({host}) with "
            f"{errno.errorcode[error.errno]}; not using another kind, which would not exclude "
            f"the processes using {kind}. Mount it on {host} as the other nodes do (or remove "
            "the marker once no process on any node holds a lock there)",
        ) from error
    why = f"as {KIND_ENV} asks" if forced is not None else f"as {where}"
    _note_worked(dev, path.parent, kind, why, quiet=kind == "flock" and forced is None)
    return held


def _record(directory: Path, kind: str, held: Held) -> marker.Recorded | None:
    """The kind recorded for ``directory`` now that ``kind`` worked there (another process's
    where it recorded first); None where this process may not write the marker, said in a
    warning (once a folder), its hold kept without a marker."""
    try:
        return marker.record(directory, kind, KINDS)
    except OSError as error:
        if error.errno not in NOT_WRITABLE:
            held.release()
            raise
        unwritable = error
    except BaseException:
        held.release()
        raise
    with _guard:
        first = directory not in _unrecorded
        _unrecorded.add(directory)
    if first:
        log.warning(
            "locks in %s: %s, not recorded in %s (%s): processes on nodes where %s fails may "
            "take another kind, which would not exclude this one; let a process that may "
            "write there take the first lock in it",
            directory,
            kind,
            marker.marker_of(directory),
            unwritable.strerror,
            kind,
        )
    return None


def acquire(
    path: Path,
    shared: bool,
    blocking: bool,
    on_wait: Callable[[], None],
    mechanisms: dict[str, Mechanism],
) -> Held | None:
    """Take ``path``'s lock with the kind its folder records, or where none is recorded yet, the
    first kind that works here, then recorded (see the module's note)."""
    directory, args = path.parent, (shared, blocking, on_wait)
    forced = forced_kind()
    dev = os.stat(directory).st_dev
    recorded = marker.read(directory, KINDS)
    if recorded is None:
        kind, held, why = _probe(path, dev, forced, args, mechanisms)
        if held is None:
            return None  # taken, and not waiting: its holder records the kind
        recorded = _record(directory, kind, held)
        if recorded is None or recorded.kind == kind:
            _note_worked(dev, directory, kind, why, quiet=kind == "flock" and forced is None)
            return held
        held.release()  # another process recorded another kind meanwhile: follow it
    return _take_recorded(path, dev, recorded, forced, args, mechanisms)


def skipped_here(directory: Path, kind: str) -> bool:
    mount = mount_of(directory)
    return mount is not None and kind in local_only(mount[1], mount[2])
