"""Dataset discovery: the one step, shared by every loader, that turns a config into file lists.

Two layouts are understood:

* an ImageFolder tree: ``root/train/<class>/<image>`` and ``root/val/<class>/<image>``; the label
  of an image is the index of its class folder in sorted order (what torchvision and timm do);
* ImageNet-style file lists: a text file per split of paths relative to ``root``; the label is
  the position of the WordNet ID (``nXXXXXXXX``) found in each path among the sorted IDs.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np

from loaderbench.config.schema import DatasetConfig
from loaderbench.data._index import MISSING_MTIME, indexed
from loaderbench.data.splits import SPLITS, DatasetIndex, PathTable, Scanned, Split, stat_files

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")
# A WordNet ID is a whole name: a class folder "n01440764", or a file name's prefix
# "n01440764_10026.JPEG"; never digits inside another word ("run20240101").
_WNID_FOLDER = re.compile(r"n\d{8}")
_WNID_FILE = re.compile(r"(n\d{8})(?=[_.])")


class DatasetError(ValueError):
    """A dataset that cannot be used as configured; the message names the path or key."""


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
    """The WordNet ID of an image path: its class folder's name (``.../n01440764/x.JPEG``),
    else its file name's prefix (``n01440764_10026.JPEG``). Only whole names count, so a
    WNID-like string elsewhere in the path (``/data/run20240101/...``) is never taken."""
    parts = path.split("/")
    if len(parts) >= 2 and _WNID_FOLDER.fullmatch(parts[-2]):
        return parts[-2]
    match = _WNID_FILE.match(parts[-1])
    if match is None:
        raise DatasetError(
            f"no WordNet ID in path {path!r}: neither its folder nor its file name is one "
            f"(nXXXXXXXX, as in train/n01440764/n01440764_10026.JPEG)"
        )
    return match.group(1)


def read_file_list(list_file: Path, root: Path) -> tuple[list[str], list[str]]:
    """Absolute paths and WordNet IDs from a text file of paths relative to ``root``.

    A line whose path gives no WordNet ID is an error naming it; so is a list of several
    files that all give one class, the sign of a path layout the parser cannot read."""
    if not list_file.is_file():
        raise DatasetError(f"file list {list_file} does not exist")
    paths: list[str] = []
    wnids: list[str] = []
    for number, line in enumerate(list_file.read_text().splitlines(), start=1):
        if line := line.strip():
            try:
                wnids.append(parse_wnid(line))
            except DatasetError as error:
                raise DatasetError(f"{list_file}, line {number}: {error}") from None
            paths.append(str(root / line))
    if not paths:
        raise DatasetError(f"file list {list_file} is empty")
    if len(paths) > 1 and len(set(wnids)) == 1:
        raise DatasetError(
            f"{list_file}: all {len(paths)} files give the one class {wnids[0]} (first line: "
            f"{Path(paths[0]).relative_to(root)}); a class per folder (train/n01440764/...) "
            f"or per file name prefix is expected"
        )
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
    for paths, _ in read.values():
        watch_folders(paths, watched)
    return DatasetIndex(root, tuple(classes), splits["train"], splits["val"]), watched


def watch_folders(paths: Sequence[str], watched: dict[str, int]) -> None:
    """Put the folders holding ``paths`` into ``watched``, with their mtimes, as an ImageFolder
    scan does its own: an image replaced (written beside it, then renamed over it, as rsync and
    mv do), removed or added changes its folder's mtime, so the saved index is rescanned and the
    split's fingerprint (the files' sizes and mtimes: the memmap cache's key) follows. (A file
    rewritten in place is seen by the per-file check: ``dataset_index``.) ``MISSING_MTIME`` for
    a folder that is not there (yet)."""
    for folder in sorted({os.path.dirname(path) for path in paths}):
        try:
            watched[folder] = os.stat(folder).st_mtime_ns
        except OSError:
            watched[folder] = MISSING_MTIME


def discover(dataset: DatasetConfig) -> DatasetIndex:
    """The dataset a run uses, from its typed ``dataset`` config."""
    if dataset.root is None:
        from loaderbench.data.synthetic import SyntheticSpec, ensure_synthetic

        synthetic = dataset.synthetic
        spec = SyntheticSpec(
            num_classes=synthetic.num_classes,
            train_per_class=synthetic.train_per_class,
            val_per_class=synthetic.val_per_class,
            seed=synthetic.seed,
            jpeg_quality=synthetic.jpeg_quality,
        )
        root = ensure_synthetic(spec, resolve_path(dataset.generated_dir))
    else:
        root = resolve_path(dataset.root)
        if not root.is_dir():
            raise DatasetError(f"dataset.root={dataset.root!r}: folder {root} does not exist")
    lists: dict[str, Path] = {}
    if dataset.train_list is not None or dataset.val_list is not None:
        if dataset.train_list is None or dataset.val_list is None:
            raise DatasetError("dataset.train_list and dataset.val_list must be set together")
        lists = {"train": resolve_path(dataset.train_list), "val": resolve_path(dataset.val_list)}

    def scan() -> Scanned:
        return scan_file_lists(root, lists) if lists else scan_image_folders(root)

    if dataset.index_dir is None:
        index = scan()[0]
    else:
        index_dir = resolve_path(dataset.index_dir)
        index = indexed(root, lists, index_dir, scan, dataset.rescan, dataset.index_check)
    limit = dataset.max_images
    return replace(index, train=_limit(index.train, limit), val=_limit(index.val, limit))
