"""Locks as files created exclusively (``O_CREAT | O_EXCL``, atomic on the server on NFSv3+,
Lustre, GPFS, CephFS): the last resort, where neither ``flock`` nor POSIX locks hold across nodes.

Beside the lock file ``X``: ``X.excl``, the exclusive holder's record, and one
``X.shared-<token>`` per shared hold, each naming its holder (host, boot, pid namespace, pid,
start time). Each holder writes its record before it looks for the other kind's, so two at once
cannot both miss each other. Nothing frees a dead holder's record, hence the stale rule: one on
this machine is stale once its process is gone; one elsewhere refreshes its records' mtime from
a thread, and is stale once a record stays unchanged for ``stale_s``
(``LOADERBENCH_LOCK_STALE_S``) or lags this host's clock by more than that and a margin. A stale
record is removed under ``<record>.break``, renamed first and checked to be the very record
judged stale, so no remover deletes one a newcomer has just made.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import functools
import json
import logging
import os
import re
import socket
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import psutil

log = logging.getLogger("loaderbench.platform.locking")

STALE_ENV = "LOADERBENCH_LOCK_STALE_S"
DEFAULT_STALE_S = 120.0
CLOCK_SKEW_S = 300.0
EXCLUSIVE_SUFFIX = ".excl"
SHARED_INFIX = ".shared-"


def stale_after_s() -> float:
    raw = os.environ.get(STALE_ENV, "")
    try:
        value = float(raw) if raw else DEFAULT_STALE_S
    except ValueError:
        value = -1.0
    if not value > 0:
        raise ValueError(f"{STALE_ENV}={raw!r}: expected a number of seconds above 0")
    return value


@functools.cache
def _machine() -> tuple[str, str, str]:
    """Host name, boot id and pid namespace: a pid means this process only where all three agree
    (a container on the same host, or the host rebooted, has other pids)."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        boot = ""
    try:
        pidns = os.readlink("/proc/self/ns/pid")
    except OSError:
        pidns = ""
    return socket.gethostname(), boot, pidns


@dataclasses.dataclass(frozen=True)
class Holder:
    host: str
    boot: str
    pidns: str
    pid: int
    started: float  # the process's start time: a pid reused later is another holder
    token: str

    @classmethod
    def me(cls, token: str) -> Holder:
        host, boot, pidns = _machine()
        return cls(host, boot, pidns, os.getpid(), psutil.Process().create_time(), token)

    @classmethod
    def parse(cls, raw: bytes) -> Holder | None:
        """None for a record not (yet, or ever) written whole."""
        try:
            data = json.loads(raw)
            return cls(**{field.name: data[field.name] for field in dataclasses.fields(cls)})
        except (ValueError, KeyError, TypeError):
            return None

    def __str__(self) -> str:
        return f"pid {self.pid} on {self.host}"

    def on_this_machine(self) -> bool:
        return (self.host, self.boot, self.pidns) == _machine()

    def alive(self) -> bool:
        try:
            process = psutil.Process(self.pid)
            if abs(process.create_time() - self.started) > 0.05:
                return False
            return process.status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False
        except psutil.AccessDenied:
            return True


def _create(record: Path, holder: Holder) -> bool:
    """Create ``record`` naming ``holder``; False when it exists."""
    try:
        fd = os.open(record, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
    except FileExistsError:
        return False
    try:
        os.write(fd, json.dumps(dataclasses.asdict(holder)).encode())
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        os.unlink(record)
        raise
    os.close(fd)
    return True


class Seen(NamedTuple):
    """A record as it was judged: its stat and its content (the holder's unique token)."""

    stat: os.stat_result
    content: bytes


def _same_file(a: os.stat_result, b: os.stat_result) -> bool:
    return (a.st_dev, a.st_ino, a.st_mtime_ns) == (b.st_dev, b.st_ino, b.st_mtime_ns)


class Judge:
    """Says whether a record's holder is live, gone or stale; remembers, for holders elsewhere,
    since when each record has been seen unchanged."""

    def __init__(self) -> None:
        self.stale_s = stale_after_s()
        self._unchanged_since: dict[Path, tuple[tuple[int, int, int], float]] = {}

    def look(self, record: Path) -> tuple[str, Seen | None, str]:
        """("gone" | "live" | "stale", the record as seen, why stale)."""
        try:
            with open(record, "rb") as opened:  # opening revalidates NFS's cached attributes
                stat = os.fstat(opened.fileno())
                seen = Seen(stat, opened.read(4096))
        except FileNotFoundError:
            return "gone", None, ""
        holder = Holder.parse(seen.content)
        if holder is not None and holder.on_this_machine():
            return ("live", seen, "") if holder.alive() else ("stale", seen, f"{holder} is gone")
        signature = (stat.st_ino, stat.st_mtime_ns, stat.st_size)
        now = time.monotonic()
        first = self._unchanged_since.get(record)
        if first is None or first[0] != signature:
            first = self._unchanged_since[record] = (signature, now)
        who = str(holder) if holder else "a holder that never wrote its name"
        if now - first[1] >= self.stale_s:
            return "stale", seen, f"{who}: unchanged for {self.stale_s:.0f} s (no heartbeat)"
        behind = time.time() - stat.st_mtime
        if behind > self.stale_s + CLOCK_SKEW_S:
            return "stale", seen, f"{who}: no heartbeat for {behind:.0f} s"
        return "live", seen, ""

    def holds(self, record: Path, me: Holder) -> bool:
        """Whether ``record`` is held; a stale one is removed (and so is not)."""
        state, seen, why = self.look(record)
        if state == "stale":
            assert seen is not None
            _remove_stale(record, seen, why, me, self)
        return state == "live"


def _remove_stale(record: Path, seen: Seen, why: str, me: Holder, judge: Judge) -> None:
    breaker = record.with_name(record.name + ".break")
    if not _create(breaker, me):  # another process is removing it; or died doing so
        state, breaker_seen, breaker_why = judge.look(breaker)
        if state == "stale":
            assert breaker_seen is not None
            if _remove_if_unchanged(breaker, breaker_seen):
                log.warning("lock record %s removed: %s", breaker, breaker_why)
        return
    try:
        if _remove_if_unchanged(record, seen):
            log.warning("lock record %s removed as stale, the lock taken over: %s", record, why)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(breaker)


def _remove_if_unchanged(path: Path, seen: Seen) -> bool:
    """Remove ``path`` if it is still the record ``seen`` (not refreshed, not replaced since it
    was judged); whether it was.

    It is first renamed to a name of this process's own, so that what is checked is what is
    removed: checking ``path`` and then removing it would remove a newcomer's record made in
    between (its holder, wrongly judged stale, having released meanwhile). A record that turns
    out to be another is put back, unless yet another was made meanwhile: its holder then no
    longer excludes the newer one, said in a warning."""
    tomb = path.with_name(f"{path.name}.gone-{uuid.uuid4().hex}")
    try:
        os.rename(path, tomb)
    except FileNotFoundError:
        return False
    try:
        with open(tomb, "rb") as opened:
            same = _same_file(os.fstat(opened.fileno()), seen.stat)
            same = same and opened.read(4096) == seen.content
        if same:
            return True
        try:
            os.link(tomb, path)  # never replaces a record made since the rename
        except FileExistsError:
            holder = Holder.parse(tomb.read_bytes())
            log.warning(
                "lock record %s of %s was replaced while being checked for staleness: its "
                "holder no longer excludes the new one",
                path,
                holder or "a holder that never wrote its name",
            )
        return False
    finally:
        os.unlink(tomb)


class _Heartbeat:
    """Refreshes the mtime of this process's records, so holders elsewhere see them live."""

    def __init__(self) -> None:
        self.records: dict[Path, str] = {}  # held record -> its token
        self.guard = threading.Lock()
        self.thread: threading.Thread | None = None

    def add(self, record: Path, token: str) -> None:
        with self.guard:
            self.records[record] = token
            if self.thread is None:
                self.thread = threading.Thread(
                    target=self._beat, name="lock-heartbeat", daemon=True
                )
                self.thread.start()

    def discard(self, record: Path) -> None:
        with self.guard:
            self.records.pop(record, None)

    def release_all(self) -> None:
        """At exit: the holds never released (a process ending normally removes its records,
        rather than leaving them for others to judge stale)."""
        with self.guard:
            held = list(self.records.items())
        for record, token in held:
            LockFileHold(record, token).release()

    def _beat(self) -> None:
        while True:
            time.sleep(min(10.0, stale_after_s() / 4))
            with self.guard:
                if not self.records:
                    self.thread = None
                    return
                records = list(self.records)
            for record in records:
                try:
                    os.utime(record)
                except FileNotFoundError:
                    with self.guard:
                        if self.records.pop(record, None) is None:
                            continue  # released meanwhile: removed by this process
                    log.warning(
                        "lock record %s was removed by a process that found it stale: this "
                        "process no longer excludes others (paused longer than %s=%.0f s?)",
                        record,
                        STALE_ENV,
                        stale_after_s(),
                    )


_heartbeat = _Heartbeat()


def _new_heartbeat_after_fork() -> None:
    global _heartbeat
    _heartbeat = _Heartbeat()  # the parent's records are the parent's to refresh


os.register_at_fork(after_in_child=_new_heartbeat_after_fork)
atexit.register(lambda: _heartbeat.release_all())


class LockFileHold:
    def __init__(self, record: Path, token: str) -> None:
        self._record: Path | None = record
        self._token = token

    def release(self) -> None:
        record, self._record = self._record, None
        if record is None:
            return
        _heartbeat.discard(record)
        try:
            holder = Holder.parse(record.read_bytes())
        except FileNotFoundError:
            holder = None
        if holder is None or holder.token != self._token:
            log.warning("lock record %s was taken over while this process held it", record)
            return
        os.unlink(record)


class _Pauses:
    """Growing sleeps between tries; ``on_wait`` called before the first."""

    def __init__(self, on_wait: Callable[[], None]) -> None:
        self.on_wait: Callable[[], None] | None = on_wait
        self.delay = 0.02

    def pause(self) -> None:
        if self.on_wait is not None:
            self.on_wait()
            self.on_wait = None
        time.sleep(self.delay)
        self.delay = min(self.delay * 1.5, 1.0)


def shared_records(path: Path) -> list[Path]:
    """The shared holders' records of ``path``. On NFS the listing may come from the client's
    cache (up to ``acdirmax``): docs/imagenet_and_slurm.md says how to mount such a folder."""
    pattern = re.compile(re.escape(path.name + SHARED_INFIX) + "[0-9a-f]{32}")
    return [path.parent / name for name in os.listdir(path.parent) if pattern.fullmatch(name)]


def acquire_lockfile(
    path: Path, shared: bool, blocking: bool, on_wait: Callable[[], None]
) -> LockFileHold | None:
    """Hold ``path`` (shared or exclusive) through records beside it; None when not
    ``blocking`` and someone holds it."""
    os.close(os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666))  # as flock leaves it
    token = uuid.uuid4().hex
    me, judge, pauses = Holder.me(token), Judge(), _Pauses(on_wait)
    exclusive = path.with_name(path.name + EXCLUSIVE_SUFFIX)
    if shared:
        record = path.with_name(path.name + SHARED_INFIX + token)
        try:
            while True:
                _create(record, me)
                if not judge.holds(exclusive, me):
                    break
                os.unlink(record)  # an exclusive holder is in: step back, let it finish
                if not blocking:
                    return None
                pauses.pause()
        except BaseException:
            record.unlink(missing_ok=True)
            raise
        _heartbeat.add(record, token)
        return LockFileHold(record, token)
    while not _create(exclusive, me):
        if judge.holds(exclusive, me):
            if not blocking:
                return None
            pauses.pause()
    _heartbeat.add(exclusive, token)
    hold = LockFileHold(exclusive, token)
    try:  # the exclusive record keeps new shared holders out; wait for those already in
        while [record for record in shared_records(path) if judge.holds(record, me)]:
            if not blocking:
                hold.release()
                return None
            pauses.pause()
    except BaseException:
        hold.release()
        raise
    return hold
