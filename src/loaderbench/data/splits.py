"""A data set in memory: its splits' file tables, labels and file stats.

What discovery (``loaderbench.data.discovery``) makes and the index on disk
(``loaderbench.data._index``) saves and loads; it depends on neither of them.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

SPLITS = ("train", "val")


class PathTable(Sequence[str]):
    """File paths in one byte buffer plus offsets, under a common prefix.

    A tuple of 1.28M Python strings is a million objects whose reference counts every reader
    touches, so forked DataLoader workers copy their pages one by one as an epoch goes (pytorch
    issue 13246) and each worker's memory grows; two numpy arrays are read without writing.
    """

    def __init__(self, prefix: str, blob: np.ndarray, offsets: np.ndarray) -> None:
        self.prefix = prefix
        self.blob = blob  # uint8: the paths after the prefix, back to back, UTF-8
        self.offsets = offsets  # int64 (n + 1,): path i is blob[offsets[i]:offsets[i + 1]]

    @classmethod
    def from_paths(cls, paths: Sequence[str], root: str) -> PathTable:
        """``paths`` stored relative to ``root``."""
        prefix = root.rstrip("/") + "/"
        encoded = [
            (p[len(prefix) :] if p.startswith(prefix) else os.path.relpath(p, root)).encode()
            for p in paths
        ]
        offsets = np.zeros(len(encoded) + 1, dtype=np.int64)
        np.cumsum([len(e) for e in encoded], out=offsets[1:])
        blob = np.frombuffer(b"".join(encoded), dtype=np.uint8)
        return cls(prefix, blob, offsets)

    def as_list(self) -> list[str]:
        """Every path, decoded in one go (a loop over ``self[i]`` costs a slice and a decode
        each: most of a per-file check's time)."""
        if len(self) == 0:
            return []
        names = np.insert(self.blob, self.offsets[1:-1], 0).tobytes().decode().split("\0")
        return [self.prefix + name for name in names]

    def relative(self, index: int) -> str:
        return self.blob[self.offsets[index] : self.offsets[index + 1]].tobytes().decode()

    def __getitem__(self, index):  # type: ignore[override]
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError(index)
        return self.prefix + self.relative(index)

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence):
            return NotImplemented
        return len(self) == len(other) and all(a == b for a, b in zip(self, other, strict=True))

    __hash__ = None  # type: ignore[assignment]


# Files a thread stats at a time, and the most threads: os.stat releases the GIL, so on a
# network file system (a round trip a file) the threads overlap their waits. No more threads
# than the process has CPUs, though: on a local disk a stat is CPU work, and more threads only
# queue for the GIL (260k files on 2 cores: 0.9 s on 1 or 2 threads, 1.8-2.5 s on 16;
# docs/measurements.md, "Checking the dataset index").
STAT_CHUNK = 4096
STAT_THREADS = 16


def stat_threads() -> int:
    """The threads that stat the files: the process's CPUs, at most ``STAT_THREADS``."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        cpus = os.cpu_count() or 1
    return max(1, min(STAT_THREADS, cpus))


def stat_files(paths: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """Sizes and modification times (ns) of ``paths``, stat-ed by a pool of threads; -1 for a
    file gone since discovery (the loaders skip it, naming it)."""
    names = paths.as_list() if isinstance(paths, PathTable) else list(paths)

    def stat_chunk(start: int) -> list[tuple[int, int]]:
        stats = []
        for name in names[start : start + STAT_CHUNK]:
            try:
                st = os.stat(name)
            except OSError:
                stats.append((-1, -1))
                continue
            stats.append((st.st_size, st.st_mtime_ns))
        return stats

    starts = range(0, len(names), STAT_CHUNK)
    if len(starts) <= 1:
        chunks = [stat_chunk(start) for start in starts]
    else:
        with ThreadPoolExecutor(min(stat_threads(), len(starts))) as pool:
            chunks = list(pool.map(stat_chunk, starts))
    table = np.array([st for chunk in chunks for st in chunk], dtype=np.int64).reshape(-1, 2)
    return np.ascontiguousarray(table[:, 0]), np.ascontiguousarray(table[:, 1])


@dataclass(frozen=True, eq=False)
class Split:
    """One split: image paths and their integer labels, in a fixed order."""

    name: str
    paths: Sequence[str]  # a PathTable when discovered
    labels: Sequence[int]
    # The dataset's root: what the fingerprint's paths are relative to ("": absolute paths).
    root: str = ""
    # The files' sizes and mtimes when the index was made (None: stat them when needed).
    stats: tuple[np.ndarray, np.ndarray] | None = None

    def __len__(self) -> int:
        return len(self.paths)

    def subset(self, keep: Sequence[int]) -> Split:
        paths = [self.paths[i] for i in keep]
        stats = None if self.stats is None else (self.stats[0][keep], self.stats[1][keep])
        return Split(
            self.name,
            PathTable.from_paths(paths, self.root) if self.root else tuple(paths),
            np.asarray(self.labels, dtype=np.int64)[keep],
            self.root,
            stats,
        )

    def _relative_names(self) -> bytes:
        """The paths relative to ``root``, NUL-separated: from the path table's buffer as it
        is (one vectorised insert, no million strings) when it holds exactly that."""
        paths = self.paths
        if (
            isinstance(paths, PathTable)
            and self.root
            and paths.prefix == self.root.rstrip("/") + "/"
        ):
            return np.insert(paths.blob, paths.offsets[1:-1], 0).tobytes()
        names = (os.path.relpath(p, self.root) if self.root else p for p in paths)
        return "\0".join(names).encode()

    def fingerprint(self) -> str:
        """Changes when any file is added, removed, renamed, resized or touched; not when the
        whole data set is copied elsewhere keeping its times (``cp -a``, ``rsync -a``): paths
        count relative to ``root``, so a copy on node-local scratch reuses its caches. Sizes
        and times come from the dataset index (no file is stat-ed) when there is one."""
        sizes, mtimes = self.stats if self.stats is not None else stat_files(self.paths)
        digest = hashlib.sha256()
        digest.update(self._relative_names())
        digest.update(np.asarray(self.labels, dtype=np.int64).tobytes())
        digest.update(sizes.astype(np.int64).tobytes() + mtimes.astype(np.int64).tobytes())
        return digest.hexdigest()[:16]


@dataclass(frozen=True)
class DatasetIndex:
    root: Path
    classes: tuple[str, ...]
    train: Split
    val: Split
    # How the saved index was found current: "files" (every file's size and mtime), "folders"
    # (their mtimes only), "scan" (no saved index: scanned in this run). Metric dataset_index_check.
    checked: str = "scan"
    files_changed: int = 0  # files whose size or mtime the index had wrong (rewritten in place)

    @property
    def num_classes(self) -> int:
        return len(self.classes)

    def split(self, name: str) -> Split:
        if name not in SPLITS:
            raise KeyError(f"unknown split {name!r}; choose one of {SPLITS}")
        return self.train if name == "train" else self.val


Scanned = tuple[DatasetIndex, dict[str, int]]  # a scan's index, and the paths that date it
