"""Which lock a file system gets: ``flock``, else a POSIX record lock, else a lock file.

``flock`` is tried first; where the call fails as unsupported (Lustre mounted without
``-o flock`` says ENOSYS, some NFS and FUSE set-ups ENOLCK, EOPNOTSUPP or EINVAL) the next kind
is tried on the same file. A kind the mount table shows to lock one host only is skipped before
it is tried, since it would "work" and exclude nothing across nodes: ``flock`` on NFS mounted
``local_lock=flock|all`` (or ``nolock``), POSIX locks there with ``local_lock=posix|all``, both
on Lustre mounted ``-o localflock``. The choice is made once per process and file system, and
one log line names it (a warning: the file system lacks what the lock would ordinarily use).
``LOADERBENCH_LOCK=flock|fcntl|lockfile`` forces a kind; every process sharing the locks must
then be given the same one, since different kinds never exclude each other.
"""

from __future__ import annotations

import errno
import logging
import os
import re
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

log = logging.getLogger("loaderbench.locking")

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

_chosen: dict[int, str] = {}  # st_dev -> the kind that worked there
_guard = threading.Lock()


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


def _say_chosen(directory: Path, kind: str, reasons: list[str], forced: bool) -> None:
    mount = mount_of(directory)
    where = f"{directory} ({mount[1]} at {mount[0]})" if mount else str(directory)
    why = "; ".join(reasons)
    if forced:
        log.warning(
            "locks in %s: %s, as %s asks%s",
            where,
            DESCRIPTIONS[kind],
            KIND_ENV,
            f" ({why})" if why else "",
        )
    elif kind == "flock":
        log.debug("locks in %s: flock", where)
    else:
        log.warning("locks in %s: %s, because %s", where, DESCRIPTIONS[kind], why)


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


def acquire(
    path: Path,
    shared: bool,
    blocking: bool,
    on_wait: Callable[[], None],
    mechanisms: dict[str, Mechanism],
) -> Held | None:
    """Take ``path``'s lock with the kind its file system supports (see the module's note)."""
    directory = path.parent
    forced = forced_kind()
    dev = os.stat(directory).st_dev
    with _guard:
        known = _chosen.get(dev)
    reasons: list[str] = []
    if forced is not None:
        candidates = [forced]
    elif known is not None:
        candidates = list(KINDS[KINDS.index(known) :])
    else:
        candidates = _untried_candidates(directory, reasons)
    for kind in candidates:
        try:
            held = mechanisms[kind](path, shared, blocking, on_wait)
        except OSError as error:
            if forced is not None or kind == "lockfile" or error.errno not in UNSUPPORTED:
                raise
            reasons.append(f"{kind} failed there with {errno.errorcode[error.errno]}")
            continue
        with _guard:
            first = _chosen.get(dev) != kind
            _chosen[dev] = kind
        if first:
            if forced is not None and skipped_here(directory, kind):
                reasons.append(f"{kind} locks one host only on this mount")
            _say_chosen(directory, kind, reasons, forced is not None)
        return held
    raise AssertionError("unreachable: the lock file kind never reports unsupported")


def skipped_here(directory: Path, kind: str) -> bool:
    mount = mount_of(directory)
    return mount is not None and kind in local_only(mount[1], mount[2])
