"""Old memmap caches: list them with their size and last use, and remove the unused ones.

``make clean-cache UNUSED_DAYS=30``, or ``python -m loaderbench.loaders.memmap.housekeeping
[--cache-dir cache] [--unused-days 30] [--remove]``.

A run never removes a cache (another may be reading it), so this does, cautiously: a cache a
running job holds "in use" (a shared lock on ``.<name>.inuse``, whose mtime is the last use) is
never removed, and only what the loader provably made goes (a folder whose ``cache.json``
records the name ``cache_name`` gives it, or an interrupted build's ``.<name>.tmp-<pid>`` whose
builder is gone). Anything else is listed as "not a cache, left alone"; no symbolic link is
followed.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import stat
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from loaderbench.data.discovery import resolve_path
from loaderbench.loaders.memmap._cache import (
    BUILD_FOLDER,
    CACHE_NAME,
    META_FILE,
    build_lock_file,
    in_use_file,
    is_complete,
)
from loaderbench.platform.locking import try_exclusive


@dataclass(frozen=True)
class CacheEntry:
    path: Path
    size_bytes: int
    last_used: float  # seconds since the epoch: the in-use file's mtime, else the folder's
    complete: bool
    name: str = ""  # the cache's name (a build's remains: the cache it was building)

    def age_days(self, now: float) -> float:
        return (now - self.last_used) / 86_400


@dataclass(frozen=True)
class LeftAlone:
    """Something in the cache folder the memmap loader did not provably make: never removed."""

    path: Path
    reason: str


def folder_size(folder: Path) -> int:
    """Bytes allocated on disk (sparse files count what they hold); links are not followed."""
    total = 0
    for dirpath, _, filenames in os.walk(folder):  # followlinks=False: a link is not entered
        for name in filenames:
            st = os.lstat(os.path.join(dirpath, name))
            if stat.S_ISREG(st.st_mode):
                total += st.st_blocks * 512
    return total


def _regular_file(path: Path) -> bool:
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False


def _metadata_names(folder: Path) -> str | None:
    """The name the folder's own ``cache.json`` (a regular file, not a link) gives it."""
    meta = folder / META_FILE
    if not _regular_file(meta):
        return None
    try:
        name = json.loads(meta.read_text()).get("name")
    except (OSError, ValueError, AttributeError):  # unreadable, not JSON, not an object
        return None
    return name if isinstance(name, str) else None


def identify(cache_dir: Path, folder: Path) -> str | LeftAlone:
    """The name of the cache ``folder`` (a real folder in ``cache_dir``) is or was building,
    or why it is not provably the memmap loader's."""
    if CACHE_NAME.fullmatch(folder.name):
        if _metadata_names(folder) == folder.name:
            return folder.name
        return LeftAlone(folder, f"named like a cache, but no {META_FILE} of its own names it")
    if building := BUILD_FOLDER.fullmatch(folder.name):
        name = building["name"]
        if _regular_file(build_lock_file(cache_dir, name)):
            return name
        return LeftAlone(folder, "named like a cache build, but no build lock of its cache")
    return LeftAlone(folder, "not a name the memmap loader gives its caches")


def _entry(cache_dir: Path, folder: Path, name: str) -> CacheEntry:
    marker = in_use_file(cache_dir, name)
    used = (marker if _regular_file(marker) else folder).lstat().st_mtime
    complete = folder.name == name and is_complete(folder)
    return CacheEntry(folder, folder_size(folder), used, complete, name)


def survey(cache_dir: Path) -> tuple[list[CacheEntry], list[LeftAlone]]:
    """The memmap caches in ``cache_dir`` (complete, or the remains of a build), and the
    folders and links there that are not: those are never removed. Plain files (the caches'
    lock files, the dataset index, remembered worker counts) are neither listed nor touched."""
    if not cache_dir.is_dir():
        return [], []
    caches: list[CacheEntry] = []
    left_alone: list[LeftAlone] = []
    with os.scandir(cache_dir) as scanned:
        found = sorted(scanned, key=lambda entry: entry.name)
    for item in found:
        path = cache_dir / item.name
        if item.is_symlink():
            left_alone.append(LeftAlone(path, "a symbolic link: never followed"))
        elif item.is_dir(follow_symlinks=False):
            name = identify(cache_dir, path)
            if isinstance(name, LeftAlone):
                left_alone.append(name)
            else:
                caches.append(_entry(cache_dir, path, name))
    return caches, left_alone


def list_caches(cache_dir: Path) -> list[CacheEntry]:
    """Every memmap cache folder (complete, or the remains of a build) in ``cache_dir``."""
    return survey(cache_dir)[0]


def remove_unused(cache_dir: Path, unused_s: float, now: float | None = None) -> list[CacheEntry]:
    """Remove the caches not used for ``unused_s`` seconds and held by no run; returns them.

    A cache is taken (the exclusive lock on its in-use file) before it is removed, so a run
    that starts to open it meanwhile waits, then builds it anew; a build's remains also take
    its build lock (held while a builder runs)."""
    now = time.time() if now is None else now
    removed = []
    for entry in list_caches(cache_dir):
        if now - entry.last_used < unused_s:
            continue
        locks = [in_use_file(cache_dir, entry.name)]
        if entry.path.name != entry.name:  # a build's folder: its builder must be gone
            locks.append(build_lock_file(cache_dir, entry.name))
        held = [hold for lock in locks if (hold := try_exclusive(lock)) is not None]
        try:
            if len(held) < len(locks):  # a run holds it
                continue
            shutil.rmtree(entry.path)  # refuses a link; unlinks links inside, never follows
            removed.append(entry)
        except OSError as error:  # one that cannot go (permissions): say so, go on
            print(f"cannot remove {entry.path}: {error}", file=sys.stderr)
        finally:
            for hold in held:
                hold.release()
    return removed


def format_table(
    entries: Sequence[CacheEntry], now: float, left_alone: Sequence[LeftAlone] = ()
) -> str:
    lines = [f"{'GB':>8}  {'unused (days)':>13}  cache"]
    for entry in entries:
        state = "" if entry.complete else "  (incomplete: an interrupted build, or one under way)"
        lines.append(
            f"{entry.size_bytes / 1e9:8.3f}  {entry.age_days(now):13.1f}  {entry.path}{state}"
        )
    total = sum(entry.size_bytes for entry in entries) / 1e9
    lines.append(f"{total:8.3f}  GB in {len(entries)} caches")
    lines += [f"not a cache, left alone: {item.path} ({item.reason})" for item in left_alone]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache-dir", default="cache", help="loader.cache_dir (default: cache)")
    parser.add_argument("--unused-days", type=float, default=30.0)
    parser.add_argument("--remove", action="store_true", help="remove them (else: list only)")
    args = parser.parse_args(argv)
    cache_dir, now = resolve_path(args.cache_dir), time.time()
    caches, left_alone = survey(cache_dir)
    print(format_table(caches, now, left_alone))
    if args.remove:
        removed = remove_unused(cache_dir, args.unused_days * 86_400, now)
        freed = sum(entry.size_bytes for entry in removed) / 1e9
        print(f"removed {len(removed)} caches unused for {args.unused_days:g} days: {freed:.3f} GB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
