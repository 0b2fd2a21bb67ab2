"""The memmap loader's cache: every image of a split decoded and resized once, into uint8 files.

A cache is a tensordict ``TensorClass`` (``ImageCache``) whose fields are memory-mapped files
in a folder of its own, reopened with ``ImageCache.load_memmap``; reading a batch is then one
gather from the page cache instead of opening, decoding and resizing files. Layout::

    cache_dir/
        <split>-<policy><stored size>-<key>/   a complete cache; never written once here
            meta.json, _tensordict/*.memmap    the ImageCache (tensordict's memmap format)
            cache.json                         what it was built from, skipped files, timings
            COMPLETE                           written last, just before the rename
        .<name>.lock                           held while building: one builder at a time
        .<name>.tmp-<pid>/                     a build in progress, or the remains of a killed one

``<key>`` hashes everything the bytes depend on: the file list with sizes and mtimes
(``Split.fingerprint``), the split, the store policy and size, Pillow's version (it decodes and
resizes) and ``FORMAT_VERSION``. A changed dataset or setting therefore gets a new folder and
never reads stale images. Old folders are left in place (another run may be reading them).

Safety: a build reserves all its blocks first (``posix_fallocate``), so a full disk fails at
once with ENOSPC naming the folder, never with a SIGBUS in a worker halfway; every open compares
the file sizes recorded at build time and a hash of the labels, sizes and 64 evenly spaced image
rows (milliseconds), so a cache truncated or edited since is rebuilt, with a warning saying
which file changed, never read. A read-only ``cache_dir`` serves the caches it holds; one it
lacks is an error naming ``loader.cache_dir``.

Store policies:

* val (``crop``): exactly ``pil_val_transform(image_size)`` (Resize + CenterCrop, the same PIL
  code), stored (N, 3, S, S), so a val batch needs no work at all after the gather;
* train (``fit``): the whole image, aspect ratio kept, shrunk (never enlarged) so that its long
  side fits an L x L canvas, L = round(image_size * train_store_ratio), stored channels-last
  (N, L, L, 3) at the top left, with its true height and width in ``heights``/``widths``. The
  random-resized crop is sampled later, per epoch, inside that true region: the same box
  distribution as torchvision's RandomResizedCrop on the original file (not a crop of an image
  squashed to a square). Channels-last because the CPU's uint8 resize kernel is fastest on it.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import math
import os
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import PIL
import torch
import torch.nn.functional as F
from tensordict import MemoryMappedTensor, TensorClass
from torch.utils.data import DataLoader, Dataset
from tqdm import tqdm

from loaderbench.data import Split
from loaderbench.images import load_rgb, max_pixels, open_checked, to_rgb
from loaderbench.loaders.memmap.settings import Settings
from loaderbench.locking import FileLock, SharedHold, atomic_write_text
from loaderbench.stopping import critical_section, raise_if_stop_requested
from loaderbench.transforms import pil_val_transform

log = logging.getLogger(__name__)

FORMAT_VERSION = 2  # 2: integrity record (file sizes, sample hash)
META_FILE = "cache.json"
COMPLETE_FILE = "COMPLETE"
# Images a build worker decodes per task: small enough for a lively progress bar.
BUILD_CHUNK = 16


class CacheError(RuntimeError):
    """A cache folder that cannot be used; the message names the folder."""


class CacheChanged(CacheError):
    """A complete cache whose files no longer match what was built: rebuilt, never read."""


class ImageCache(TensorClass):
    """One split, decoded: the memory-mapped fields of a cache folder."""

    images: torch.Tensor  # uint8; val: (N, 3, S, S); train: (N, L, L, 3), image at the top left
    labels: torch.Tensor  # int64 (N,)
    heights: torch.Tensor  # int32 (N,): the stored image's true height (0: skipped file)
    widths: torch.Tensor  # int32 (N,): the stored image's true width (0: skipped file)


class JpegCache(TensorClass):
    """One split, re-encoded (``loader.store=jpeg``): every image's JPEG bytes back to back in
    one flat memory-mapped byte tensor, found by offset and length; no batch dimension, since
    the bytes and the per-image fields differ in length."""

    data: torch.Tensor  # uint8 (total bytes,)
    offsets: torch.Tensor  # int64 (N,): where image i's bytes start in data
    lengths: torch.Tensor  # int32 (N,): how many (0: skipped file)
    labels: torch.Tensor  # int64 (N,)
    heights: torch.Tensor  # int32 (N,): the stored image's height (0: skipped file)
    widths: torch.Tensor  # int32 (N,)


DEFAULT_QUALITY = Settings.store_quality  # the one default, in the settings

# What JPEG at quality 90-95 keeps of raw pixels, for the space check before a build; measured
# on the synthetic set: 6-14%; photos keep more.
JPEG_BYTES_ESTIMATE = 0.25


@dataclass(frozen=True)
class StorePolicy:
    """How one split's images are stored: what the cache key and the decoders depend on."""

    kind: str  # "crop" (val) or "fit" (train)
    image_size: int  # the model's input size
    stored_size: int  # crop: image_size; fit: the canvas side L (the stored long side)
    codec: str = "raw"  # raw: decoded pixels; jpeg: re-encoded JPEG bytes
    quality: int = DEFAULT_QUALITY  # jpeg only

    @classmethod
    def for_split(
        cls,
        train: bool,
        image_size: int,
        train_store_ratio: float,
        min_side: int = 0,
        codec: str = "raw",
        quality: int = DEFAULT_QUALITY,
        max_side: int | None = None,
    ) -> StorePolicy:
        if not train:
            return cls("crop", image_size, image_size, codec, quality)
        side = max_side or max(round(image_size * train_store_ratio), min_side)
        return cls("fit", image_size, side, codec, quality)

    @property
    def channels_last(self) -> bool:
        return self.kind == "fit"

    def image_shape(self) -> tuple[int, int, int]:
        s = self.stored_size
        return (s, s, 3) if self.channels_last else (3, s, s)

    def bytes_per_image(self) -> int:
        """Raw: the row's bytes; jpeg: an estimate (the bytes are known after the build)."""
        raw = math.prod(self.image_shape())
        return raw if self.codec == "raw" else math.ceil(raw * JPEG_BYTES_ESTIMATE)

    def describe(self) -> dict[str, Any]:
        described = {
            "kind": self.kind,
            "image_size": self.image_size,
            "stored_size": self.stored_size,
            "layout": "NHWC" if self.channels_last else "NCHW",
        }
        if self.codec != "raw":  # raw caches keep the keys they had
            described.update(codec=self.codec, quality=self.quality)
        return described


def cache_source(split: Split, policy: StorePolicy) -> dict[str, Any]:
    """Everything a cache's bytes depend on; its hash is the cache's key."""
    return {
        "format_version": FORMAT_VERSION,
        "split": split.name,
        "files": split.fingerprint(),  # paths, labels, sizes, mtimes
        "num_images": len(split),
        "pillow": PIL.__version__,
        "max_image_pixels": max_pixels(),  # which images are skipped
        **policy.describe(),
    }


def cache_name(split: Split, policy: StorePolicy, source: dict[str, Any] | None = None) -> str:
    """The folder name: a readable prefix, then the key."""
    source = cache_source(split, policy) if source is None else source
    key = hashlib.sha256(json.dumps(source, sort_keys=True).encode()).hexdigest()[:16]
    codec = "" if policy.codec == "raw" else f"-{policy.codec}{policy.quality}"
    return f"{split.name}-{policy.kind}{policy.stored_size}{codec}-{key}"


# ---------------------------------------------------------------------------------------------
# Decoding one image into its row.


@functools.lru_cache(maxsize=8)
def _val_transform(size: int) -> Any:
    return pil_val_transform(size)


def decode_crop(path: str, size: int) -> torch.Tensor:
    """The val image, uint8 (3, S, S): the reference pipeline itself, so bit-identical to it."""
    return _val_transform(size)(load_rgb(path))


def fit_size(width: int, height: int, long_side: int) -> tuple[int, int]:
    """(w, h) after shrinking, never enlarging, so that the long side is at most ``long_side``."""
    scale = min(1.0, long_side / max(width, height))
    return max(1, round(width * scale)), max(1, round(height * scale))


def decode_fit(path: str, long_side: int) -> torch.Tensor:
    """The train image, uint8 (h, w, 3), aspect kept, long side shrunk to at most ``long_side``.

    JPEGs are decoded at the smallest of 1/1, 1/2, 1/4, 1/8 scale that is still at least the
    target size (``Image.draft``: the DCT does the power-of-two part of the shrink), then resized
    with an antialiased bilinear filter: torch's uint8 kernel, which computes PIL's BILINEAR
    resize (to within a grey level) in half the time; with it the build keeps pace with the
    torchvision loader's decoding.
    """
    with open(path, "rb") as f:
        image = open_checked(f, path)
        target = fit_size(*image.size, long_side)
        if target != image.size:
            image.draft("RGB", target)
        image.load()
    pixels = torch.from_numpy(np.array(to_rgb(image)))  # np.array: writable
    if (pixels.shape[1], pixels.shape[0]) == target:
        return pixels
    nchw = pixels.permute(2, 0, 1)[None]  # channels-last view: the kernel's fast layout
    resized = F.interpolate(nchw, size=(target[1], target[0]), mode="bilinear", antialias=True)
    return resized[0].permute(1, 2, 0)


def write_fit(row: torch.Tensor, pixels: torch.Tensor) -> None:
    """Put an (h, w, 3) image at the top left of an (L, L, 3) row, plus one replicated pixel
    right of and below it: a bilinear sampler (roi_align) reads up to half a pixel past a box's
    edge, and must find the edge there, not black padding."""
    h, w = pixels.shape[:2]
    row[:h, :w] = pixels
    if w < row.shape[1]:
        row[:h, w] = row[:h, w - 1]
    if h < row.shape[0]:
        row[h, : w + 1] = row[h - 1, : w + 1]


# ---------------------------------------------------------------------------------------------
# Building.


def decode_stored(path: str, policy: StorePolicy) -> torch.Tensor:
    """The image as the store keeps it: val (3, S, S), train (h, w, 3) fitted."""
    if policy.kind == "crop":
        return decode_crop(path, policy.stored_size)
    return decode_fit(path, policy.stored_size)


def encode_stored(pixels: torch.Tensor, policy: StorePolicy) -> torch.Tensor:
    """JPEG bytes (uint8, 1-D) of a decoded stored image, at ``policy.quality``."""
    from torchvision.io import encode_jpeg

    chw = pixels if policy.kind == "crop" else pixels.permute(2, 0, 1)
    return encode_jpeg(chw.contiguous(), quality=policy.quality)


class _Chunks(Dataset):
    """Chunk ``c`` decodes images [c * chunk, (c + 1) * chunk) as the store keeps them, and
    hands each to ``keep``; returns (first index, sizes, errors, the chunk's payload)."""

    missing: Any = None  # the payload item of an unreadable image

    def __init__(
        self, split: Split, policy: StorePolicy, skip_errors: bool, chunk: int = BUILD_CHUNK
    ) -> None:
        self.paths = split.paths
        self.policy = policy
        self.skip_errors = skip_errors
        self.chunk = chunk

    def __len__(self) -> int:
        return -(-len(self.paths) // self.chunk)

    def keep(self, index: int, pixels: torch.Tensor) -> Any:
        raise NotImplementedError

    def payload(self, items: list[Any]) -> Any:
        return items

    def __getitem__(self, chunk: int) -> tuple[int, torch.Tensor, list[tuple[int, str]], Any]:
        start = chunk * self.chunk
        stop = min(start + self.chunk, len(self.paths))
        sizes = torch.zeros((stop - start, 2), dtype=torch.int32)
        errors: list[tuple[int, str]] = []
        items: list[Any] = []
        for i in range(start, stop):
            path = self.paths[i]
            try:
                pixels = decode_stored(path, self.policy)
            except Exception as error:
                if not self.skip_errors:
                    raise OSError(f"cannot read image {path}: {error}") from error
                errors.append((i, f"{type(error).__name__}: {error}"))
                items.append(self.missing)
                continue
            hw = pixels.shape[1:] if self.policy.kind == "crop" else pixels.shape[:2]
            sizes[i - start] = torch.tensor(hw)
            items.append(self.keep(i, pixels))
        return start, sizes, errors, self.payload(items)


class _RawChunks(_Chunks):
    """Decoded pixels written straight into the mapped file. Workers open the images file by
    path, shared and writable, so pixels go to the page cache once, with no copy through the
    main process; they return only sizes and errors."""

    def __init__(self, split: Split, policy: StorePolicy, images_file: str, skip: bool) -> None:
        super().__init__(split, policy, skip)
        self.images_file = images_file
        self.shape = (len(split), *policy.image_shape())
        self._images: torch.Tensor | None = None

    def _rows(self) -> torch.Tensor:
        if self._images is None:  # opened in the worker, after the fork
            self._images = MemoryMappedTensor.from_filename(
                self.images_file, torch.uint8, self.shape, mode="r+"
            )
        return self._images

    def keep(self, index: int, pixels: torch.Tensor) -> None:
        if self.policy.kind == "crop":
            self._rows()[index].copy_(pixels)
        else:
            write_fit(self._rows()[index], pixels)

    def payload(self, items: list[Any]) -> None:
        return None


class _JpegChunks(_Chunks):
    """Re-encoded JPEG bytes, sent back to the main process, which appends them to the
    store's one file. Plain bytes, not tensors: a tensor crosses from a worker as a
    shared-memory file descriptor, one per image, which is a lot of descriptor traffic."""

    missing = b""

    def keep(self, index: int, pixels: torch.Tensor) -> bytes:
        return encode_stored(pixels, self.policy).numpy().tobytes()


def _fsync_tree(folder: Path) -> None:
    """Flush every file (memory-mapped writes included) and the folders to disk."""
    for dirpath, _, filenames in os.walk(folder):
        for name in filenames:
            fd = os.open(os.path.join(dirpath, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        fd = os.open(dirpath, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def reserve_space(folder: Path) -> None:
    """Allocate every (sparse) file of a new cache in full now.

    Writing into a sparse memory map when the disk is full kills the writer with SIGBUS, in a
    worker, at some image; reserved blocks cannot run out, so a disk filled by someone else
    after the free-space check fails here, at once, with ENOSPC naming the folder.
    """
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        fd = os.open(path, os.O_RDWR)
        try:
            os.posix_fallocate(fd, 0, os.fstat(fd).st_size)
        except OSError as error:
            free = shutil.disk_usage(folder).free
            raise CacheError(
                f"memmap cache {folder}: cannot reserve {os.fstat(fd).st_size / 1e9:.2f} GB "
                f"for {path.name} ({error.strerror}; {free / 1e9:.2f} GB free); set "
                f"loader.cache_dir to a larger disk"
            ) from error
        finally:
            os.close(fd)


# Rows hashed to check a cache on every open: enough to catch an edited or truncated file
# (sizes catch truncation on their own), few enough to cost milliseconds (~10 MB at 224 px).
SAMPLE_ROWS = 64


def stored_bytes(cache: ImageCache | JpegCache, row: int) -> torch.Tensor:
    """Image ``row`` as stored: its pixels (raw) or its JPEG bytes."""
    if isinstance(cache, JpegCache):
        start = int(cache.offsets[row])
        return cache.data[start : start + int(cache.lengths[row])]
    return cache.images[row]


def sample_digest(cache: ImageCache | JpegCache) -> str:
    """A hash of the small fields in full and of ``SAMPLE_ROWS`` image rows spread evenly."""
    n = len(cache.labels)
    digest = hashlib.blake2b(digest_size=16)
    small = [cache.labels, cache.heights, cache.widths]
    if isinstance(cache, JpegCache):
        small += [cache.offsets, cache.lengths]
    for field in small:
        digest.update(field.contiguous().numpy().tobytes())
    for row in torch.linspace(0, n - 1, min(n, SAMPLE_ROWS)).round().long().unique().tolist():
        digest.update(stored_bytes(cache, row).contiguous().numpy().tobytes())
    return digest.hexdigest()


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


def check_sample(folder: Path, data: ImageCache | JpegCache, meta: dict[str, Any]) -> None:
    """``CacheChanged`` if the sampled rows (or labels, sizes) were edited since the build."""
    expected = (meta.get("integrity") or {}).get("sample")
    if expected is not None and sample_digest(data) != expected:
        raise CacheChanged(
            f"memmap cache {folder} was changed after it was built: its labels, sizes or "
            f"sampled image rows no longer match their checksum"
        )


def allocate(dest: Path, split: Split, policy: StorePolicy) -> ImageCache:
    """A new raw cache's files in ``dest``, every block reserved, the labels written."""
    n = len(split)
    # Shapes only (one element, expanded): memmap_like allocates the files, sparse, without
    # ever holding the split in memory; unwritten bytes (the padding) read as zeros.
    template = ImageCache(
        images=torch.empty((1, *policy.image_shape()), dtype=torch.uint8).expand(n, -1, -1, -1),
        labels=torch.empty(1, dtype=torch.int64).expand(n),
        heights=torch.empty(1, dtype=torch.int32).expand(n),
        widths=torch.empty(1, dtype=torch.int32).expand(n),
        batch_size=[n],
    )
    cache = template.memmap_like(dest)
    reserve_space(dest)
    cache.labels.copy_(torch.tensor(split.labels, dtype=torch.int64))
    return cache


@dataclass
class Decoded:
    """What decoding every image left to record."""

    heights: torch.Tensor
    widths: torch.Tensor
    skipped: list[dict[str, Any]]
    decode_s: float = 0.0  # worker start-up included
    steady_images_per_s: float | None = None  # from the first chunk's arrival on


ChunkSink = Callable[[int, Any], None]  # (first image, the chunk's payload)


def run_chunks(
    chunks: Dataset, split: Split, num_workers: int, progress: bool, sink: ChunkSink | None = None
) -> Decoded:
    """Decode every image, chunk by chunk, in ``num_workers`` processes; sizes, skipped files
    and timings come back here (and each chunk's payload goes to ``sink``, in order)."""
    n, started = len(split), time.perf_counter()
    loader = DataLoader(
        chunks,
        batch_size=None,
        shuffle=False,
        num_workers=num_workers,
        prefetch_factor=4 if num_workers > 0 else None,
        generator=torch.Generator(),  # else DataLoader draws its worker seed from the global RNG
    )
    done = Decoded(torch.zeros(n, dtype=torch.int32), torch.zeros(n, dtype=torch.int32), [])
    first_at, first_count = 0.0, 0
    bar = tqdm(
        total=n,
        desc=f"building memmap cache ({split.name})",
        unit="img",
        dynamic_ncols=True,
        disable=not progress or None,
        file=sys.stderr,
    )
    with bar:
        for start, sizes, errors, payload in loader:
            raise_if_stop_requested()
            done.heights[start : start + len(sizes)] = sizes[:, 0]
            done.widths[start : start + len(sizes)] = sizes[:, 1]
            for index, message in errors:
                log.warning("skipping unreadable image %s: %s", split.paths[index], message)
                done.skipped.append({"index": index, "path": split.paths[index], "error": message})
            if sink is not None:
                sink(start, payload)
            bar.update(len(sizes))
            if not first_count:
                first_at, first_count = time.perf_counter(), len(sizes)
    done.decode_s = time.perf_counter() - started
    if n > first_count:
        done.steady_images_per_s = (n - first_count) / (time.perf_counter() - first_at)
    done.skipped.sort(key=lambda item: item["index"])
    return done


def build_raw(
    split: Split,
    policy: StorePolicy,
    dest: Path,
    num_workers: int,
    skip_errors: bool,
    progress: bool,
) -> tuple[ImageCache, Decoded]:
    """Decoded pixels, written by the workers straight into the mapped rows."""
    cache = allocate(dest, split, policy)
    chunks = _RawChunks(split, policy, str(cache.images.filename), skip_errors)
    return cache, run_chunks(chunks, split, num_workers, progress)


BYTES_FILE = "jpeg-bytes.tmp"


def build_jpeg(
    split: Split,
    policy: StorePolicy,
    dest: Path,
    num_workers: int,
    skip_errors: bool,
    progress: bool,
) -> tuple[JpegCache, Decoded]:
    """Re-encoded JPEGs: the workers encode, this process appends the bytes to one file,
    which then becomes the ``data`` field's memory-mapped file (no second copy)."""
    n = len(split)
    offsets = torch.zeros(n, dtype=torch.int64)
    lengths = torch.zeros(n, dtype=torch.int32)
    dest.mkdir(parents=True, exist_ok=True)
    with open(dest / BYTES_FILE, "wb") as out:  # a full disk: ENOSPC here, at once

        def append(start: int, encoded: list[bytes]) -> None:
            for i, data in enumerate(encoded, start):
                offsets[i], lengths[i] = out.tell(), len(data)
                out.write(data)

        decoded = run_chunks(
            _JpegChunks(split, policy, skip_errors), split, num_workers, progress, append
        )
        total = out.tell()
    template = JpegCache(
        data=torch.empty(1, dtype=torch.uint8).expand(total),
        offsets=offsets,
        lengths=lengths,
        labels=torch.tensor(split.labels, dtype=torch.int64),
        heights=decoded.heights,
        widths=decoded.widths,
        batch_size=[],
    )
    cache = template.memmap_like(dest)
    cache.offsets.copy_(offsets)
    cache.lengths.copy_(lengths)
    cache.labels.copy_(template.labels)
    data_file = cache.data.filename
    del cache  # the placeholder file (sparse, of the same size) gives way to the bytes
    os.replace(dest / BYTES_FILE, data_file)
    return JpegCache.load_memmap(dest), decoded


BUILDERS = {"raw": build_raw, "jpeg": build_jpeg}


def build_cache(
    split: Split,
    policy: StorePolicy,
    dest: Path,
    name: str,
    num_workers: int,
    skip_errors: bool,
    progress: bool = True,
) -> dict[str, Any]:
    """Decode every image of ``split`` into a new cache folder ``dest``; returns its metadata.

    ``num_workers`` processes decode in parallel (0: in this process). The caller renames
    ``dest`` into place; until then nothing else looks at it.
    """
    n = len(split)
    if n == 0:
        raise CacheError(f"split {split.name!r} has no images; nothing to cache in {dest}")
    started = time.perf_counter()
    cache, decoded = BUILDERS[policy.codec](split, policy, dest, num_workers, skip_errors, progress)
    cache.heights.copy_(decoded.heights)
    cache.widths.copy_(decoded.widths)
    integrity = {"sample": sample_digest(cache)}
    del cache
    _fsync_tree(dest)
    integrity["files"] = file_sizes(dest)
    return {
        "format_version": FORMAT_VERSION,
        "name": name,
        "split": split.name,
        "num_images": n,
        "skipped": decoded.skipped,
        "build_workers": num_workers,
        "build_s": time.perf_counter() - started,
        "build_images_per_s": n / decoded.decode_s,  # start-up included, fsync not
        "build_steady_images_per_s": decoded.steady_images_per_s,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "integrity": integrity,
    }


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
    try:
        data = CACHE_TYPES[policy.codec].load_memmap(folder)
    except Exception as error:
        raise CacheChanged(f"memmap cache {folder} cannot be mapped: {error}") from error
    check_sample(folder, data, meta)
    problem = shape_problem(data, policy, meta["num_images"])
    if problem:
        raise CacheError(f"memmap cache {folder}: {problem}")
    return OpenedCache(folder, data, meta, built)


CACHE_TYPES: dict[str, type[ImageCache] | type[JpegCache]] = {"raw": ImageCache, "jpeg": JpegCache}


def shape_problem(data: ImageCache | JpegCache, policy: StorePolicy, n: int) -> str:
    """What does not fit the policy in a mapped cache ('' when all does)."""
    if isinstance(data, JpegCache):
        ends = data.offsets + data.lengths
        if len(data.offsets) != n or (n and int(ends.max()) > data.data.numel()):
            return f"{len(data.offsets)} images ending at {int(ends.max())}, expected {n} images"
        return ""
    expected = (n, *policy.image_shape())
    if tuple(data.images.shape) != expected or data.images.dtype != torch.uint8:
        return (
            f"images are {data.images.dtype} {tuple(data.images.shape)}, expected uint8 {expected}"
        )
    return ""


def _remove_stale(cache_dir: Path, name: str) -> None:
    """Remains of killed builds of ``name`` (only called while holding its lock)."""
    for stale in cache_dir.glob(f".{name}.tmp-*"):
        log.warning("removing the remains of an interrupted cache build: %s", stale)
        shutil.rmtree(stale, ignore_errors=True)
    final = cache_dir / name
    if final.exists() and not is_complete(final):
        log.warning("removing incomplete cache folder %s", final)
        shutil.rmtree(final, ignore_errors=True)


def _check_space(cache_dir: Path, final: Path, needed: int, policy: StorePolicy) -> None:
    """Fail now, naming the folder, rather than with a SIGBUS in a worker when the disk fills
    under the (sparse) memory-mapped files."""
    free = shutil.disk_usage(cache_dir).free
    log.info(
        "memmap cache %s will take %.2f GB; %s has %.2f GB free",
        final,
        needed / 1e9,
        cache_dir,
        free / 1e9,
    )
    if needed > free:
        raise CacheError(
            f"memmap cache {final} needs {needed / 1e9:.1f} GB but {cache_dir} has "
            f"{free / 1e9:.1f} GB free; set loader.cache_dir to a larger disk"
            + (
                f", or loader.store=jpeg (about {needed * JPEG_BYTES_ESTIMATE / 1e9:.1f} GB)"
                if policy.codec == "raw"
                else ""
            )
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
        cache_dir / f".{name}.lock",
        wait_message=f"Waiting for another run building memmap cache {final} ...",
    )
    with lock:
        if is_complete(final):  # built by the run we waited for, or changed since
            if (opened := _open_unchanged(final, policy)) is not None:
                return opened
            shutil.rmtree(final)
        _remove_stale(cache_dir, name)
        # Stated before the build, and refused at once when it cannot fit.
        _check_space(cache_dir, final, len(split) * policy.bytes_per_image(), policy)
        tmp = cache_dir / f".{name}.tmp-{os.getpid()}"
        log.info("building memmap cache %s (%d images, %d workers)", final, len(split), num_workers)
        try:
            meta = build_cache(split, policy, tmp, name, num_workers, skip_errors, progress)
            meta["source"] = source
            # The commit: a stop signal now waits for its end (then the cache is complete).
            with critical_section():
                atomic_write_text(tmp / META_FILE, json.dumps(meta, indent=1) + "\n")
                atomic_write_text(tmp / COMPLETE_FILE, f"{name}\n")
                os.rename(tmp, final)
                dir_fd = os.open(cache_dir, os.O_RDONLY)
                try:
                    os.fsync(dir_fd)
                finally:
                    os.close(dir_fd)
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
