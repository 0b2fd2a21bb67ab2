"""The dataset index on disk: one scan of a data set, loaded by every rank and later run.

Walking and stat-ing ImageNet's tree costs seconds on a local disk and minutes on a cluster's
network file system, times the ranks of a job; so the first process scans, under a lock, and
writes ``dataset-<key>.npz`` into ``dataset.index_dir`` (classes, relative paths in one byte
buffer, labels, sizes, mtimes), which the other ranks and later runs load. It is used only while
its folders keep their recorded mtimes and, by default (``dataset.index_check=files``), every
file its size and mtime, checked by threads: a file rewritten in place is named and its new
stats saved, which changes the memmap caches' and the ``auto`` choice's keys.
docs/imagenet_and_slurm.md ("The tree is scanned once") has ``folders`` and ``rescan``.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import numpy as np
import psutil

from loaderbench.data.splits import DatasetIndex, PathTable, Scanned, Split, stat_files
from loaderbench.platform.atomic import atomic_write
from loaderbench.platform.locking import FileLock

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


def load_index(path: Path, root: Path) -> tuple[DatasetIndex, dict[str, int]] | None:
    """The saved index and what it watches, if it is there, of this version and root, and its
    folders current."""
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

    index = DatasetIndex(root, tuple(meta["classes"]), split("train"), split("val"))
    return index, meta["watched"]


def restat(index: DatasetIndex) -> tuple[DatasetIndex, list[str]]:
    """The index with every file's size and mtime as they are now, and the files whose stats
    it had wrong (rewritten in place: their folders kept their mtimes)."""
    changed: list[str] = []
    splits = {}
    for split in (index.train, index.val):
        assert split.stats is not None
        sizes, mtimes = stat_files(split.paths)
        moved = np.flatnonzero((sizes != split.stats[0]) | (mtimes != split.stats[1]))
        changed += [split.paths[i] for i in moved]
        splits[split.name] = replace(split, stats=(sizes, mtimes)) if len(moved) else split
    restated = replace(index, train=splits["train"], val=splits["val"], files_changed=len(changed))
    return restated, changed


def job_ranks() -> int:
    """The processes of this job that load the index (torchrun's and SLURM's world size)."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def checked_files(path: Path, index: DatasetIndex, watched: dict[str, int]) -> DatasetIndex:
    """``index`` checked file by file; saved again with the new stats when some changed, else
    (in a job of several ranks) touched, so that its other ranks take it as checked."""
    begun = time.perf_counter()
    index, changed = restat(index)
    files = len(index.train) + len(index.val)
    seconds = time.perf_counter() - begun
    if changed:
        save_index(path, index, watched)
        log.warning(
            "dataset: %d of %d files changed since the dataset index (rewritten in place): %s%s; "
            "read anew (memmap rebuilds its cache, num_workers=auto probes again)",
            len(changed),
            files,
            ", ".join(changed[:5]),
            ", ..." if len(changed) > 5 else "",
        )
    elif job_ranks() > 1:
        os.utime(path)
    log.info(
        "dataset index checked: %d files' sizes and mtimes and %d folders' mtimes in %.2f s "
        "(dataset.index_check=files); %d changed",
        files,
        len(watched),
        seconds,
        len(changed),
    )
    return replace(index, checked="files")


def process_start_time() -> float:
    """When this process started, in ``time.time()``'s seconds, to a clock tick (10 ms).
    psutil's ``create_time`` adds the start's ticks to the boot time in whole seconds
    (``/proc/stat``'s ``btime``), so it may fall up to a second early, and an index another
    process wrote just before this one started would pass for this job's."""
    try:
        with open("/proc/self/stat", "rb") as stat:
            fields = stat.read().rsplit(b")", 1)[1].split()
        ticks = int(fields[19])  # starttime, the 22nd field; the first two precede ")"
    except (OSError, IndexError, ValueError):
        return psutil.Process().create_time()
    boot = time.time() - time.clock_gettime(time.CLOCK_BOOTTIME)
    return boot + ticks / os.sysconf("SC_CLK_TCK")


def indexed(
    root: Path,
    lists: dict[str, Path],
    index_dir: Path,
    scan: Callable[[], Scanned],
    rescan: bool = False,
    check: str = "files",
) -> DatasetIndex:
    """The data set's index: loaded when current (``check``: checked file by file, or by its
    folders only), else scanned (by one process at a time)."""
    path = index_file(index_dir, root, lists)
    started = process_start_time()
    lock = FileLock(path.with_suffix(".lock"), f"Waiting for another process scanning {root} ...")
    with lock:
        # Written or checked since this process started: by a rank of this job.
        fresh = path.exists() and path.stat().st_mtime > started
        if not rescan or fresh:
            loaded = load_index(path, root)
            if loaded is not None:
                index, watched = loaded
                log.info("dataset index %s loaded", path)
                if check == "folders":
                    log.info(
                        "dataset index checked: %d folders' mtimes only (dataset.index_check="
                        "folders): a file rewritten in place is not seen",
                        len(watched),
                    )
                    return replace(index, checked="folders")
                if fresh and job_ranks() > 1:
                    return replace(index, checked="files")  # this job's first rank checked it
                return checked_files(path, index, watched)
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
