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
from dataclasses import dataclass
from pathlib import Path

from omegaconf import DictConfig

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")
SPLITS = ("train", "val")
_WNID = re.compile(r"n\d{8}")


class DatasetError(ValueError):
    """A dataset that cannot be used as configured; the message names the path or key."""


@dataclass(frozen=True)
class Split:
    """One split: absolute image paths and their integer labels, in a fixed order."""

    name: str
    paths: tuple[str, ...]
    labels: tuple[int, ...]
    # The dataset's root: what the fingerprint's paths are relative to ("": absolute paths).
    root: str = ""

    def __len__(self) -> int:
        return len(self.paths)

    def fingerprint(self) -> str:
        """Changes when any file is added, removed, renamed, resized or touched; not when the
        whole data set is copied elsewhere keeping its times (``cp -a``, ``rsync -a``): paths
        count relative to ``root``, so a copy on node-local scratch reuses its caches."""
        digest = hashlib.sha256()
        for path, label in zip(self.paths, self.labels, strict=True):
            try:
                st = os.stat(path)
                size, mtime = st.st_size, st.st_mtime_ns
            except OSError:  # gone since discovery: the loaders skip it, naming it
                size = mtime = -1
            name = os.path.relpath(path, self.root) if self.root else path
            digest.update(f"{name}\0{label}\0{size}\0{mtime}\n".encode())
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


def scan_image_folder(split_dir: Path) -> tuple[list[str], list[str], list[int]]:
    """Classes (sorted folder names), paths and labels of one ImageFolder split."""
    if not split_dir.is_dir():
        raise DatasetError(f"dataset folder {split_dir} does not exist (expected train/ and val/)")
    classes = sorted(entry.name for entry in os.scandir(split_dir) if entry.is_dir())
    if not classes:
        raise DatasetError(f"{split_dir} holds no class folders (ImageFolder layout expected)")
    paths: list[str] = []
    labels: list[int] = []
    for label, name in enumerate(classes):
        class_dir = split_dir / name
        files = sorted(
            str(Path(dirpath) / file)
            for dirpath, _, filenames in os.walk(class_dir, followlinks=True)
            for file in filenames
            if is_image_file(file)
        )
        if not files:
            raise DatasetError(
                f"class folder {class_dir} holds no image files "
                f"(extensions: {', '.join(IMAGE_EXTENSIONS)})"
            )
        paths.extend(files)
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
    keep = spread_indices(len(split), limit)
    return Split(
        split.name,
        tuple(split.paths[i] for i in keep),
        tuple(split.labels[i] for i in keep),
        split.root,
    )


def _image_folder_index(root: Path) -> DatasetIndex:
    scanned = {name: scan_image_folder(root / name) for name in SPLITS}
    train_classes, val_classes = scanned["train"][0], scanned["val"][0]
    if train_classes != val_classes:
        only_train = sorted(set(train_classes) - set(val_classes))
        only_val = sorted(set(val_classes) - set(train_classes))
        raise DatasetError(
            f"train/ and val/ of {root} hold different classes: "
            f"only in train: {only_train[:5]}, only in val: {only_val[:5]}"
        )
    splits = {
        name: Split(name, tuple(p), tuple(lab), str(root)) for name, (_, p, lab) in scanned.items()
    }
    return DatasetIndex(root, tuple(train_classes), splits["train"], splits["val"])


def _file_list_index(root: Path, lists: dict[str, Path]) -> DatasetIndex:
    read = {name: read_file_list(path, root) for name, path in lists.items()}
    classes = sorted({wnid for _, wnids in read.values() for wnid in wnids})
    index = {wnid: i for i, wnid in enumerate(classes)}
    splits = {
        name: Split(name, tuple(paths), tuple(index[w] for w in wnids), str(root))
        for name, (paths, wnids) in read.items()
    }
    return DatasetIndex(root, tuple(classes), splits["train"], splits["val"])


def discover(cfg: DictConfig) -> DatasetIndex:
    """The dataset a run uses, from its ``dataset`` config node."""
    if cfg.root is None:
        from loaderbench.synthetic import SyntheticSpec, ensure_synthetic

        root = ensure_synthetic(SyntheticSpec(**cfg.synthetic), resolve_path(cfg.generated_dir))
    else:
        root = resolve_path(cfg.root)
        if not root.is_dir():
            raise DatasetError(f"dataset.root={cfg.root!r}: folder {root} does not exist")
    if cfg.train_list is not None or cfg.val_list is not None:
        if cfg.train_list is None or cfg.val_list is None:
            raise DatasetError("dataset.train_list and dataset.val_list must be set together")
        lists = {"train": resolve_path(cfg.train_list), "val": resolve_path(cfg.val_list)}
        index = _file_list_index(root, lists)
    else:
        index = _image_folder_index(root)
    limit = cfg.get("max_images")
    return DatasetIndex(
        index.root, index.classes, _limit(index.train, limit), _limit(index.val, limit)
    )
