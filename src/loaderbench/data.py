"""Dataset discovery: the one step, shared by every loader, that turns a config into file lists.

Two layouts are understood:

* an ImageFolder tree: ``root/train/<class>/<image>`` and ``root/val/<class>/<image>``; the label
  of an image is the index of its class folder in sorted order (what torchvision and timm do);
* ImageNet-style file lists: a text file per split of paths relative to ``root``; the label is
  the position of the WordNet ID (``nXXXXXXXX``) found in each path among the sorted IDs.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from omegaconf import DictConfig

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")
SPLITS = ("train", "val")
_WNID = re.compile(r"n\d{8}")


class DatasetError(ValueError):
    """A dataset that cannot be used as configured; the message names the path or key."""


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


def stat_files(paths: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """Sizes and modification times (ns) of ``paths``; -1 for a file gone since discovery
    (the loaders skip it, naming it)."""
    sizes = np.full(len(paths), -1, dtype=np.int64)
    mtimes = np.full(len(paths), -1, dtype=np.int64)
    for i, path in enumerate(paths):
        try:
            st = os.stat(path)
        except OSError:
            continue
        sizes[i], mtimes[i] = st.st_size, st.st_mtime_ns
    return sizes, mtimes


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

    @property
    def num_classes(self) -> int:
        return len(self.classes)

    def split(self, name: str) -> Split:
        if name not in SPLITS:
            raise KeyError(f"unknown split {name!r}; choose one of {SPLITS}")
        return self.train if name == "train" else self.val


def resolve_path(path: str | os.PathLike[str]) -> Path:
    """Absolute path; relative ones are relative to the working directory the run started in."""
    return Path(path).expanduser().absolute()


def is_image_file(name: str) -> bool:
    return name.lower().endswith(IMAGE_EXTENSIONS)


def scan_image_folder(
    split_dir: Path, watched: dict[str, int] | None = None
) -> tuple[list[str], list[str], list[int]]:
    """Classes (sorted folder names), paths and labels of one ImageFolder split; every folder
    walked goes into ``watched`` with its mtime (a file added or removed changes it)."""
    if not split_dir.is_dir():
        raise DatasetError(f"dataset folder {split_dir} does not exist (expected train/ and val/)")
    watched = {} if watched is None else watched
    watched[str(split_dir)] = split_dir.stat().st_mtime_ns
    classes = sorted(entry.name for entry in os.scandir(split_dir) if entry.is_dir())
    if not classes:
        raise DatasetError(f"{split_dir} holds no class folders (ImageFolder layout expected)")
    paths: list[str] = []
    labels: list[int] = []
    for label, name in enumerate(classes):
        class_dir = split_dir / name
        files = []
        for dirpath, _, filenames in os.walk(class_dir, followlinks=True):
            watched[dirpath] = os.stat(dirpath).st_mtime_ns
            files += [os.path.join(dirpath, f) for f in filenames if is_image_file(f)]
        if not files:
            raise DatasetError(
                f"class folder {class_dir} holds no image files "
                f"(extensions: {', '.join(IMAGE_EXTENSIONS)})"
            )
        paths.extend(sorted(files))
        labels.extend([label] * len(files))
    return classes, paths, labels


def parse_wnid(path: str) -> str:
    """The first WordNet ID (nXXXXXXXX) in a path."""
    match = _WNID.search(path)
    if match is None:
        raise DatasetError(f"no WordNet ID (nXXXXXXXX) in path {path!r}")
    return match.group(0)


def read_file_list(list_file: Path, root: Path) -> tuple[list[str], list[str]]:
    """Absolute paths and WordNet IDs from a text file of paths relative to ``root``."""
    if not list_file.is_file():
        raise DatasetError(f"file list {list_file} does not exist")
    paths: list[str] = []
    wnids: list[str] = []
    for line in list_file.read_text().splitlines():
        if line := line.strip():
            paths.append(str(root / line))
            wnids.append(parse_wnid(line))
    if not paths:
        raise DatasetError(f"file list {list_file} is empty")
    return paths, wnids


def spread_indices(n: int, count: int) -> list[int]:
    """``count`` indices of ``range(n)`` spread evenly (a sorted split keeps every class)."""
    step = n / count
    return [int(i * step) for i in range(count)]


def _limit(split: Split, limit: int | None) -> Split:
    """At most ``limit`` images, spread evenly over the split (so every class keeps some)."""
    if limit is None or limit >= len(split):
        return split
    return split.subset(spread_indices(len(split), limit))


def make_split(name: str, paths: Sequence[str], labels: Sequence[int], root: Path) -> Split:
    """A discovered split: compact paths, labels as an array, the files' sizes and times."""
    return Split(
        name,
        PathTable.from_paths(paths, str(root)),
        np.asarray(labels, dtype=np.int64),
        str(root),
        stat_files(paths),
    )


Scanned = tuple["DatasetIndex", dict[str, int]]  # the index, and the paths that date it


def scan_image_folders(root: Path) -> Scanned:
    watched: dict[str, int] = {}
    scanned = {name: scan_image_folder(root / name, watched) for name in SPLITS}
    train_classes, val_classes = scanned["train"][0], scanned["val"][0]
    if train_classes != val_classes:
        only_train = sorted(set(train_classes) - set(val_classes))
        only_val = sorted(set(val_classes) - set(train_classes))
        raise DatasetError(
            f"train/ and val/ of {root} hold different classes: "
            f"only in train: {only_train[:5]}, only in val: {only_val[:5]}"
        )
    splits = {name: make_split(name, p, lab, root) for name, (_, p, lab) in scanned.items()}
    index = DatasetIndex(root, tuple(train_classes), splits["train"], splits["val"])
    return index, watched


def scan_file_lists(root: Path, lists: dict[str, Path]) -> Scanned:
    read = {name: read_file_list(path, root) for name, path in lists.items()}
    classes = sorted({wnid for _, wnids in read.values() for wnid in wnids})
    number = {wnid: i for i, wnid in enumerate(classes)}
    splits = {
        name: make_split(name, paths, [number[w] for w in wnids], root)
        for name, (paths, wnids) in read.items()
    }
    watched = {str(path): path.stat().st_mtime_ns for path in lists.values()}
    return DatasetIndex(root, tuple(classes), splits["train"], splits["val"]), watched


def discover(cfg: DictConfig) -> DatasetIndex:
    """The dataset a run uses, from its ``dataset`` config node."""
    if cfg.root is None:
        from loaderbench.synthetic import SyntheticSpec, ensure_synthetic

        root = ensure_synthetic(SyntheticSpec(**cfg.synthetic), resolve_path(cfg.generated_dir))
    else:
        root = resolve_path(cfg.root)
        if not root.is_dir():
            raise DatasetError(f"dataset.root={cfg.root!r}: folder {root} does not exist")
    lists: dict[str, Path] = {}
    if cfg.train_list is not None or cfg.val_list is not None:
        if cfg.train_list is None or cfg.val_list is None:
            raise DatasetError("dataset.train_list and dataset.val_list must be set together")
        lists = {"train": resolve_path(cfg.train_list), "val": resolve_path(cfg.val_list)}

    def scan() -> Scanned:
        return scan_file_lists(root, lists) if lists else scan_image_folders(root)

    if cfg.get("index_dir") is None:
        index = scan()[0]
    else:
        from loaderbench.dataset_index import indexed

        index = indexed(root, lists, resolve_path(cfg.index_dir), scan, rescan=cfg.rescan)
    limit = cfg.get("max_images")
    return DatasetIndex(
        index.root, index.classes, _limit(index.train, limit), _limit(index.val, limit)
    )
