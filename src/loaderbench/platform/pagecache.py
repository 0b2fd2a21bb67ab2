"""Evicting files from the page cache, so a run can measure a cold first epoch."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable
from pathlib import Path

log = logging.getLogger(__name__)


def evict(paths: Iterable[str | os.PathLike[str]]) -> tuple[int, int]:
    """``posix_fadvise(DONTNEED)`` every file: (files evicted, bytes). Needs no privileges,
    but pages that another process has mapped or dirtied may stay."""
    files = total = 0
    for path in paths:
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            continue
        try:
            total += os.fstat(fd).st_size
            os.fdatasync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            files += 1
        except OSError as error:
            log.debug("cannot evict %s: %s", path, error)
        finally:
            os.close(fd)
    return files, total


def files_under(folder: str | os.PathLike[str]) -> list[str]:
    root = Path(folder)
    if not root.is_dir():
        return []
    return [str(p) for p in root.rglob("*") if p.is_file()]


def resident_fraction(path: str | os.PathLike[str]) -> float:
    """Share of a file's pages in the page cache (``mincore`` on a fresh read-only mapping)."""
    import ctypes
    import mmap

    size = os.path.getsize(path)
    if size == 0:
        return 1.0
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [
        ctypes.c_void_p,
        ctypes.c_size_t,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_long,
    ]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    pages = (size + mmap.PAGESIZE - 1) // mmap.PAGESIZE
    vec = (ctypes.c_ubyte * pages)()
    fd = os.open(path, os.O_RDONLY)
    try:
        address = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        if address in (None, ctypes.c_void_p(-1).value):
            return float("nan")
        try:
            if libc.mincore(address, size, vec) != 0:
                return float("nan")
        finally:
            libc.munmap(address, size)
    finally:
        os.close(fd)
    return sum(v & 1 for v in vec) / pages
