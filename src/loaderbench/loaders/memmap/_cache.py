"""The memmap loader's cache folders: found by key, built once (under a lock, atomically), and
opened only while intact. A cache is one split kept by one store (``STORES``), built by
``build``; docs/loaders.md ("The cache") shows a folder's layout.

* ``<key>`` hashes everything the bytes depend on: the files with their sizes and mtimes, the
  split, the store's policy and size, the versions of the libraries that make the stored bytes
  (``pixel_library_versions``) and ``FORMAT_VERSION``. A change makes a new folder, never
  stale images; old folders stay, for ``housekeeping``.
* A build reserves its blocks first (``posix_fallocate``): a full disk fails at once naming the
  folder, never as a SIGBUS in a worker halfway.
* Every open checks the recorded file sizes and a hash of the labels, sizes and a sample of
  rows: a cache truncated or edited since is rebuilt, with a warning, never read.
* A read-only ``cache_dir`` serves the caches it holds; one it lacks is an error naming it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import PIL
import torch

from loaderbench.data.splits import SPLITS, Split
from loaderbench.imaging.files import max_pixels
from loaderbench.loaders.memmap._store_jpeg import JpegCache, JpegStore
from loaderbench.loaders.memmap.build import (
    BuildJob,
    CacheChanged,
    CacheError,
    Store,
    StorePolicy,
    fsync_path,
    fsync_tree,
)
from loaderbench.loaders.memmap.store_raw import ImageCache, RawStore
from loaderbench.measure.metrics import DECODED_BY
from loaderbench.platform.atomic import atomic_write_text
from loaderbench.platform.locking import FileLock, LockKindError, SharedHold
from loaderbench.platform.stopping import critical_section

log = logging.getLogger(__name__)

FORMAT_VERSION = 2  # 2: integrity record (file sizes, sample hash)
META_FILE = "cache.json"
COMPLETE_FILE = "COMPLETE"

# The stores by ``loader.store`` name (``StorePolicy.codec``).
STORES: dict[str, Store] = {store.name: store for store in (RawStore(), JpegStore())}


def pixel_library_versions() -> dict[str, str]:
    """The versions of the libraries whose code makes a cache's bytes: an upgrade of any of
    them may change a pixel (a resize kernel's rounding, an encoder's tables), so it gets a
    new cache rather than pixels the other loaders no longer produce."""
    import torchvision  # here: its import is heavy, and only a cache's key needs it

    return {
        "pillow": PIL.__version__,  # decodes every image, resizes the val crops
        "torch": str(torch.__version__),  # resizes the train images (F.interpolate)
        "torchvision": str(torchvision.__version__),  # val transform, the jpeg store's encoder
    }


def cache_source(
    split: Split, policy: StorePolicy, versions: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """Everything a cache's bytes depend on; its hash is the cache's key. ``versions``:
    the libraries' (default: ``pixel_library_versions()``, those of this process)."""
    return {
        "format_version": FORMAT_VERSION,
        "split": split.name,
        "files": split.fingerprint(),  # paths, labels, sizes, mtimes
        "num_images": len(split),
        **(pixel_library_versions() if versions is None else dict(versions)),
        "max_image_pixels": max_pixels(),  # which images are skipped
        **policy.describe(),
    }


def cache_name(split: Split, policy: StorePolicy, source: dict[str, Any] | None = None) -> str:
    """The folder name: a readable prefix, then the key."""
    source = cache_source(split, policy) if source is None else source
    key = hashlib.sha256(json.dumps(source, sort_keys=True).encode()).hexdigest()[:16]
    codec = "" if policy.codec == "raw" else f"-{policy.codec}{policy.quality}"
    return f"{split.name}-{policy.kind}{policy.stored_size}{codec}-{key}"


# Every name ``cache_name`` makes, and a build's folder's (``.<name>.tmp-<pid>``): what
# housekeeping may remove (a user's folder beside the caches is none of them).
_CODECS = "|".join(name for name in STORES if name != "raw")
CACHE_NAME = re.compile(
    rf"(?:{'|'.join(SPLITS)})-(?:crop|fit)\d+(?:-(?:{_CODECS})\d+)?-[0-9a-f]{{16}}", re.ASCII
)
BUILD_FOLDER = re.compile(rf"\.(?P<name>{CACHE_NAME.pattern})\.tmp-\d+", re.ASCII)


def build_folder(cache_dir: Path, name: str) -> Path:
    """Where this process builds cache ``name`` (renamed to ``cache_dir / name`` when done)."""
    return cache_dir / f".{name}.tmp-{os.getpid()}"


def build_lock_file(cache_dir: Path, name: str) -> Path:
    """Held while cache ``name`` is built: one builder at a time."""
    return cache_dir / f".{name}.lock"


# ---------------------------------------------------------------------------------------------
# Building into a folder, and its integrity record.


def build_cache(job: BuildJob, name: str) -> dict[str, Any]:
    """Decode every image of ``job.split`` into the new cache folder ``job.dest``; returns its
    metadata. The caller renames the folder into place; until then nothing else looks at it."""
    n, dest = len(job.split), job.dest
    if n == 0:
        raise CacheError(f"split {job.split.name!r} has no images; nothing to cache in {dest}")
    started = time.perf_counter()
    store = STORES[job.policy.codec]
    cache, decoded = store.build(job)
    cache.heights.copy_(decoded.heights)
    cache.widths.copy_(decoded.widths)
    integrity = {"sample": store.sample_digest(cache)}
    del cache
    fsync_tree(dest)
    integrity["files"] = file_sizes(dest)
    return {
        "format_version": FORMAT_VERSION,
        "name": name,
        "split": job.split.name,
        "num_images": n,
        "skipped": decoded.skipped,
        DECODED_BY: decoded.decoded_by,  # metrics.json's loader_<split>_decoded_by (raw)
        "build_workers": job.num_workers,
        "build_s": time.perf_counter() - started,
        "build_images_per_s": n / decoded.decode_s,  # start-up included, fsync not
        "build_steady_images_per_s": decoded.steady_images_per_s,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "integrity": integrity,
    }


def file_sizes(folder: Path) -> dict[str, int]:
    """Size of every file of a cache, by path relative to it (the metadata files aside)."""
    sizes = {}
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        relative = str(path.relative_to(folder))
        if relative not in (META_FILE, COMPLETE_FILE):
            sizes[relative] = path.stat().st_size
    return sizes


def check_file_sizes(folder: Path, meta: dict[str, Any]) -> None:
    """``CacheChanged`` if a file of the cache was truncated, extended or removed."""
    for relative, size in ((meta.get("integrity") or {}).get("files") or {}).items():
        path = folder / relative
        actual = path.stat().st_size if path.is_file() else None
        if actual != size:
            raise CacheChanged(
                f"memmap cache {folder} was changed after it was built: {relative} is "
                f"{'missing' if actual is None else f'{actual:,} bytes'}, expected {size:,}"
            )


def check_sample(folder: Path, store: Store, data: Any, meta: dict[str, Any]) -> None:
    """``CacheChanged`` if the sampled rows (or labels, sizes) were edited since the build."""
    expected = (meta.get("integrity") or {}).get("sample")
    if expected is not None and store.sample_digest(data) != expected:
        raise CacheChanged(
            f"memmap cache {folder} was changed after it was built: its labels, sizes or "
            f"sampled image rows no longer match their checksum"
        )


# ---------------------------------------------------------------------------------------------
# Opening, and building when missing.


@dataclass
class OpenedCache:
    path: Path
    data: ImageCache | JpegCache
    meta: dict[str, Any]
    built: bool  # this process built it
    # "In use" while the run reads it: ``housekeeping`` never removes a held cache.
    hold: SharedHold | None = None

    @property
    def skipped(self) -> list[dict[str, Any]]:
        return self.meta["skipped"]

    def release(self) -> None:
        if self.hold is not None:
            self.hold.release()


def in_use_file(cache_dir: Path, name: str) -> Path:
    """Held shared by every run reading cache ``name``; its mtime is the cache's last use."""
    return cache_dir / f".{name}.inuse"


def hold_in_use(cache_dir: Path, name: str) -> SharedHold | None:
    """Mark cache ``name`` in use (None where ``cache_dir`` is read-only: nobody cleans it)."""
    try:
        cache_dir.mkdir(parents=True, exist_ok=True)
        return SharedHold(in_use_file(cache_dir, name))
    except LockKindError:
        raise  # not the read-only case: no hold would leave the cache to housekeeping
    except OSError:
        return None


def is_complete(folder: Path) -> bool:
    return (folder / COMPLETE_FILE).is_file()


def open_cache(folder: Path, policy: StorePolicy, built: bool = False) -> OpenedCache:
    """Map a complete cache folder; refuse anything incomplete or of another format."""
    if not is_complete(folder):
        raise CacheError(f"memmap cache {folder} is incomplete (no {COMPLETE_FILE} marker)")
    try:
        meta = json.loads((folder / META_FILE).read_text())
    except (OSError, ValueError) as error:
        raise CacheError(f"memmap cache {folder}: cannot read {META_FILE}: {error}") from error
    if meta.get("format_version") != FORMAT_VERSION or meta.get("name") != folder.name:
        raise CacheError(
            f"memmap cache {folder} has format {meta.get('format_version')!r} and name "
            f"{meta.get('name')!r}; expected {FORMAT_VERSION} and {folder.name!r}"
        )
    check_file_sizes(folder, meta)  # before mapping: a short file would map, then SIGBUS
    store = STORES[policy.codec]
    try:
        data = store.load(folder)
    except Exception as error:
        raise CacheChanged(f"memmap cache {folder} cannot be mapped: {error}") from error
    check_sample(folder, store, data, meta)
    problem = store.shape_problem(data, policy, meta["num_images"])
    if problem:
        raise CacheError(f"memmap cache {folder}: {problem}")
    return OpenedCache(folder, data, meta, built)


def _remove_stale(cache_dir: Path, name: str) -> None:
    """Remains of killed builds of ``name`` (only called while holding its lock)."""
    for stale in cache_dir.glob(f".{name}.tmp-*"):
        log.warning("removing the remains of an interrupted cache build: %s", stale)
        shutil.rmtree(stale, ignore_errors=True)
    final = cache_dir / name
    if final.exists() and not is_complete(final):
        log.warning("removing incomplete cache folder %s", final)
        shutil.rmtree(final, ignore_errors=True)


def _check_space(cache_dir: Path, final: Path, split: Split, policy: StorePolicy) -> None:
    """Fail now, naming the folder, rather than with a SIGBUS in a worker when the disk fills
    under the (sparse) memory-mapped files; name the stores that would take less."""
    per_image = STORES[policy.codec].bytes_per_image(policy)
    needed, free = len(split) * per_image, shutil.disk_usage(cache_dir).free
    log.info(
        "memmap cache %s will take %.2f GB; %s has %.2f GB free",
        final,
        needed / 1e9,
        cache_dir,
        free / 1e9,
    )
    if needed > free:
        smaller = "".join(
            f", or loader.store={store.name} (about {len(split) * less / 1e9:.1f} GB)"
            for store in STORES.values()
            if (less := store.bytes_per_image(policy)) < per_image
        )
        raise CacheError(
            f"memmap cache {final} needs {needed / 1e9:.1f} GB but {cache_dir} has "
            f"{free / 1e9:.1f} GB free; set loader.cache_dir to a larger disk{smaller}"
        )


def _open_unchanged(final: Path, policy: StorePolicy, warn: bool = True) -> OpenedCache | None:
    """The complete cache at ``final``, or None if its files changed since its build."""
    try:
        return open_cache(final, policy)
    except CacheChanged as error:
        if warn:
            log.warning("%s; rebuilding it", error)
        return None


def _require_writable(cache_dir: Path, final: Path) -> None:
    """A cache must be built: fail now, naming the key, if its folder cannot take it."""
    try:
        cache_dir.mkdir(parents=True, exist_ok=True)
        writable = os.access(cache_dir, os.W_OK)
        reason = "" if writable else "no write access"
    except OSError as error:
        writable, reason = False, error.strerror or str(error)
    if not writable:
        raise CacheError(
            f"memmap cache {final} must be built, but loader.cache_dir={cache_dir} is not "
            f"writable ({reason}); point loader.cache_dir at a writable folder"
        )


def ensure_cache(
    split: Split,
    policy: StorePolicy,
    cache_dir: Path,
    num_workers: int,
    skip_errors: bool,
    progress: bool = True,
) -> OpenedCache:
    """The split's cache, built first (once, under a lock, atomically) when it does not exist."""
    source = cache_source(split, policy)
    name = cache_name(split, policy, source)
    # In use from before it is opened (or built) on: a clean-up cannot remove it under us.
    hold = hold_in_use(cache_dir, name)
    try:
        opened = _ensure(split, policy, cache_dir, name, source, num_workers, skip_errors, progress)
    except BaseException:
        if hold is not None:
            hold.release()
        raise
    opened.hold = hold
    return opened


def _ensure(
    split: Split,
    policy: StorePolicy,
    cache_dir: Path,
    name: str,
    source: dict[str, Any],
    num_workers: int,
    skip_errors: bool,
    progress: bool,
) -> OpenedCache:
    final = cache_dir / name
    # Checked again under the lock (and the change logged there), before rebuilding.
    if is_complete(final) and (opened := _open_unchanged(final, policy, warn=False)) is not None:
        return opened
    _require_writable(cache_dir, final)
    lock = FileLock(
        build_lock_file(cache_dir, name),
        wait_message=f"Waiting for another run building memmap cache {final} ...",
    )
    with lock:
        if is_complete(final):  # built by the run we waited for, or changed since
            if (opened := _open_unchanged(final, policy)) is not None:
                return opened
            shutil.rmtree(final)
        _remove_stale(cache_dir, name)
        # Stated before the build, and refused at once when it cannot fit.
        _check_space(cache_dir, final, split, policy)
        tmp = build_folder(cache_dir, name)
        log.info("building memmap cache %s (%d images, %d workers)", final, len(split), num_workers)
        try:
            job = BuildJob(split, policy, tmp, num_workers, skip_errors, progress)
            meta = build_cache(job, name)
            meta["source"] = source
            # The commit: a stop signal now waits for its end (then the cache is complete).
            with critical_section():
                atomic_write_text(tmp / META_FILE, json.dumps(meta, indent=1) + "\n")
                atomic_write_text(tmp / COMPLETE_FILE, f"{name}\n")
                os.rename(tmp, final)
                fsync_path(cache_dir)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        log.info(
            "built memmap cache %s: %d images in %.1f s (%.0f images/s), %d skipped",
            final,
            meta["num_images"],
            meta["build_s"],
            meta["build_images_per_s"],
            len(meta["skipped"]),
        )
    return open_cache(final, policy, built=True)
