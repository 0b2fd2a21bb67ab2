"""The dataset index on disk: one scan of a data set, loaded by every rank and later run.

Walking ImageNet's tree (1.28M files) and stat-ing every file costs seconds on a local disk
and minutes on the network file systems clusters keep it on, times the ranks of a job. So the
first process to get here scans, under a lock, and writes ``dataset-<key>.npz`` into
``dataset.index_dir`` (next to the memmap caches): classes, paths relative to the root (one
byte buffer), labels, sizes and modification times; the other ranks wait for it and load it,
and so do later runs. An index is used only while it is current: the folders walked (or the
file lists read, and the folders holding their images) still have the mtimes recorded, so
adding, removing, renaming or replacing a file (rsync, mv: a new file renamed over the old)
rescans by itself, for both layouts alike. A file rewritten in place changes no folder:
``dataset.rescan=true`` scans anew (once per job: an index written since this process started
is taken as that rescan).
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import psutil

from loaderbench.locking import FileLock, atomic_write
from loaderbench.splits import DatasetIndex, PathTable, Scanned, Split

log = logging.getLogger(__name__)

INDEX_VERSION = 2  # 2: file lists watch the folders of their images too
# A watched path that was not there when scanned: current while it still is not.
MISSING_MTIME = -1
SPLIT_ARRAYS = ("blob", "offsets", "labels", "sizes", "mtimes")


def index_file(index_dir: Path, root: Path, lists: dict[str, Path]) -> Path:
    """One index per data set (its root and, for file lists, the lists)."""
    what = json.dumps([str(root), {k: str(v) for k, v in sorted(lists.items())}])
    return index_dir / f"dataset-{hashlib.sha256(what.encode()).hexdigest()[:16]}.npz"


def _split_arrays(split: Split) -> dict[str, np.ndarray]:
    paths = split.paths
    assert isinstance(paths, PathTable) and split.stats is not None
    arrays = [paths.blob, paths.offsets, np.asarray(split.labels), *split.stats]
    return {f"{split.name}_{key}": value for key, value in zip(SPLIT_ARRAYS, arrays, strict=True)}


def save_index(path: Path, index: DatasetIndex, watched: dict[str, int]) -> None:
    meta = {"version": INDEX_VERSION, "root": str(index.root), "classes": list(index.classes)}
    meta["watched"] = watched
    arrays = {**_split_arrays(index.train), **_split_arrays(index.val)}
    buffer = io.BytesIO()
    np.savez(buffer, meta=np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8), **arrays)
    atomic_write(path, lambda tmp: tmp.write_bytes(buffer.getvalue()))


def is_current(watched: dict[str, int]) -> bool:
    """Every folder (or file list) the scan read still has the mtime it had (and one that
    was not there still is not)."""
    for path, mtime in watched.items():
        try:
            now = os.stat(path).st_mtime_ns
        except OSError:
            now = MISSING_MTIME
        if now != mtime:
            return False
    return True


def load_index(path: Path, root: Path) -> DatasetIndex | None:
    """The saved index, if it is there, of this version and root, and current."""
    try:
        with np.load(path) as saved:
            arrays = {key: saved[key] for key in saved.files}
    except (OSError, ValueError) as error:
        if path.exists():
            log.warning("dataset index %s cannot be read (%s); scanning again", path, error)
        return None
    meta = json.loads(arrays.pop("meta").tobytes())
    if meta.get("version") != INDEX_VERSION or meta.get("root") != str(root):
        return None
    if not is_current(meta["watched"]):
        log.info("dataset index %s is stale (files added, removed or replaced); scanning", path)
        return None
    prefix = str(root).rstrip("/") + "/"

    def split(name: str) -> Split:
        blob, offsets, labels, sizes, mtimes = (arrays[f"{name}_{k}"] for k in SPLIT_ARRAYS)
        return Split(name, PathTable(prefix, blob, offsets), labels, str(root), (sizes, mtimes))

    return DatasetIndex(root, tuple(meta["classes"]), split("train"), split("val"))


def indexed(
    root: Path,
    lists: dict[str, Path],
    index_dir: Path,
    scan: Callable[[], Scanned],
    rescan: bool = False,
) -> DatasetIndex:
    """The data set's index: loaded when current, else scanned (by one process at a time)."""
    path = index_file(index_dir, root, lists)
    started = psutil.Process().create_time()
    lock = FileLock(path.with_suffix(".lock"), f"Waiting for another process scanning {root} ...")
    with lock:
        fresh = path.exists() and path.stat().st_mtime > started  # a rank of this job rescanned
        if not rescan or fresh:
            loaded = load_index(path, root)
            if loaded is not None:
                log.info("dataset index %s loaded", path)
                return loaded
        begun = time.perf_counter()
        index, watched = scan()
        save_index(path, index, watched)
        log.info(
            "scanned %s in %.1f s (%d + %d files); index written to %s",
            root,
            time.perf_counter() - begun,
            len(index.train),
            len(index.val),
            path,
        )
    return index
