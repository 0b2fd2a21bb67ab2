"""Old memmap caches: list them with their size and last use, and remove the unused ones.

Caches are never removed by a run (another run may be reading an older one), so a cache folder
grows with every dataset and setting tried. This lists them and, asked to, removes those not
used for a given time:

    python -m loaderbench.loaders.memmap.housekeeping [--cache-dir cache] [--unused-days 30]
    python -m loaderbench.loaders.memmap.housekeeping --unused-days 30 --remove
    make clean-cache UNUSED_DAYS=30          # lists, then removes

A run holds its caches "in use" (a shared lock on ``.<name>.inuse``, touched when taken, so its
mtime is the last use); a cache held by a running job is never removed, whatever its age. The
remains of interrupted builds (``.<name>.tmp-<pid>``) whose builder is gone go too.
"""

from __future__ import annotations

import argparse
import os
import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from loaderbench.data import resolve_path
from loaderbench.loaders.memmap.cache import in_use_file, is_complete
from loaderbench.locking import try_exclusive


@dataclass(frozen=True)
class CacheEntry:
    path: Path
    size_bytes: int
    last_used: float  # seconds since the epoch: the in-use file's mtime, else the folder's
    complete: bool

    def age_days(self, now: float) -> float:
        return (now - self.last_used) / 86_400


def folder_size(folder: Path) -> int:
    """Bytes allocated on disk (sparse files count what they hold)."""
    return sum(p.stat().st_blocks * 512 for p in folder.rglob("*") if p.is_file())


def list_caches(cache_dir: Path) -> list[CacheEntry]:
    """Every cache folder (complete, or the remains of a build) in ``cache_dir``."""
    if not cache_dir.is_dir():
        return []
    entries = []
    for folder in sorted(p for p in cache_dir.iterdir() if p.is_dir()):
        name = folder.name.lstrip(".").split(".tmp-")[0]
        marker = in_use_file(cache_dir, name)
        used = marker.stat().st_mtime if marker.exists() else folder.stat().st_mtime
        entries.append(CacheEntry(folder, folder_size(folder), used, is_complete(folder)))
    return entries


def remove_unused(cache_dir: Path, unused_s: float, now: float | None = None) -> list[CacheEntry]:
    """Remove the caches not used for ``unused_s`` seconds and held by no run; returns them.

    A cache is taken (the exclusive lock on its in-use file) before it is removed, so a run
    that starts to open it meanwhile waits, then builds it anew."""
    now = time.time() if now is None else now
    removed = []
    for entry in list_caches(cache_dir):
        if now - entry.last_used < unused_s:
            continue
        name = entry.path.name.lstrip(".").split(".tmp-")[0]
        fd = try_exclusive(in_use_file(cache_dir, name))
        if fd is None:  # a run holds it
            continue
        try:
            shutil.rmtree(entry.path)
        finally:
            os.close(fd)
        removed.append(entry)
    return removed


def format_table(entries: Sequence[CacheEntry], now: float) -> str:
    lines = [f"{'GB':>8}  {'unused (days)':>13}  cache"]
    for entry in entries:
        state = "" if entry.complete else "  (incomplete: an interrupted build)"
        lines.append(
            f"{entry.size_bytes / 1e9:8.3f}  {entry.age_days(now):13.1f}  {entry.path}{state}"
        )
    total = sum(entry.size_bytes for entry in entries) / 1e9
    lines.append(f"{total:8.3f}  GB in {len(entries)} caches")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache-dir", default="cache", help="loader.cache_dir (default: cache)")
    parser.add_argument("--unused-days", type=float, default=30.0)
    parser.add_argument("--remove", action="store_true", help="remove them (else: list only)")
    args = parser.parse_args(argv)
    cache_dir, now = resolve_path(args.cache_dir), time.time()
    print(format_table(list_caches(cache_dir), now))
    if args.remove:
        removed = remove_unused(cache_dir, args.unused_days * 86_400, now)
        freed = sum(entry.size_bytes for entry in removed) / 1e9
        print(f"removed {len(removed)} caches unused for {args.unused_days:g} days: {freed:.3f} GB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
