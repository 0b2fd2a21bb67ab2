"""ImageNet-style file lists (dataset=imagenet_flist): labels from the WordNet IDs in the paths,
the same as the ImageFolder labels of the same files, for every loader."""

from __future__ import annotations

import importlib.util
import random
import shutil
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from loaderbench.config import DatasetConfig
from loaderbench.data import DatasetError, DatasetIndex, discover, parse_wnid
from loaderbench.loaders import build_loader
from tests.conftest import cpu_spec, run_entry, single_run

pytestmark = pytest.mark.filterwarnings(
    "ignore:The image decoding and encoding capabilities of TorchVision:DeprecationWarning"
)


def write_file_lists(root: Path, out: Path) -> tuple[Path, Path]:
    """One list per split, paths relative to root (``find val -name '*.JPEG'``), shuffled so
    that no label can come from the order of the lines."""
    lists = []
    for split in ("train", "val"):
        lines = sorted(str(p.relative_to(root)) for p in (root / split).rglob("*.JPEG"))
        random.Random(split).shuffle(lines)
        path = out / f"{split}.flist"
        path.write_text("\n".join(lines) + "\n\n")  # a trailing blank line is fine
        lists.append(path)
    return lists[0], lists[1]


def folder_index(root: Path) -> DatasetIndex:
    cfg = OmegaConf.structured(DatasetConfig(index_dir=None))
    cfg.name, cfg.root = "folder", str(root)
    return discover(cfg)


def flist_index(root: Path, train_list: Path, val_list: Path) -> DatasetIndex:
    cfg = OmegaConf.structured(DatasetConfig(index_dir=None))
    cfg.name, cfg.root = "imagenet_flist", str(root)
    cfg.train_list, cfg.val_list = str(train_list), str(val_list)
    return discover(cfg)


def test_file_list_labels_match_image_folder_labels(tiny_root: Path, tmp_path: Path) -> None:
    folder = folder_index(tiny_root)
    flist = flist_index(tiny_root, *write_file_lists(tiny_root, tmp_path))
    assert flist.classes == folder.classes == ("n00000001", "n00000002", "n00000003")
    for name in ("train", "val"):
        by_folder = dict(zip(folder.split(name).paths, folder.split(name).labels, strict=True))
        by_list = dict(zip(flist.split(name).paths, flist.split(name).labels, strict=True))
        assert by_list == by_folder


def test_absolute_paths_with_a_wnid_like_prefix_label_by_class_folder(
    tiny_root: Path, tmp_path: Path
) -> None:
    """``n\\d{8}`` inside "run20240101" once gave every image the class n20240101; a folder
    named like a WNID above the split is not a class either."""
    root = tmp_path / "run20240101" / "n12345678" / "imagenet"
    shutil.copytree(tiny_root, root)
    lists = []
    for split in ("train", "val"):
        path = tmp_path / f"{split}.flist"
        path.write_text("".join(f"{p}\n" for p in sorted((root / split).rglob("*.JPEG"))))
        lists.append(path)
    flist = flist_index(root, *lists)
    folder = folder_index(root)
    assert flist.classes == folder.classes == ("n00000001", "n00000002", "n00000003")
    for name in ("train", "val"):
        assert list(flist.split(name).labels) == list(folder.split(name).labels)


@pytest.mark.parametrize(
    ("path", "wnid"),
    [
        ("/data/run20240101/train/n01440764/x.JPEG", "n01440764"),
        ("/data/n12345678/train/n01440764/x.JPEG", "n01440764"),
        ("/data/n12345678/val/n01440764_10026.JPEG", "n01440764"),  # flat: the file's prefix
        ("train/n01440764/n02102040_7.JPEG", "n01440764"),  # the class folder comes first
    ],
)
def test_the_wnid_is_the_class_folders_or_the_file_names(path: str, wnid: str) -> None:
    assert parse_wnid(path) == wnid


@pytest.mark.parametrize(
    "path", ["/data/n12345678/val/x.JPEG", "/data/run20240101/n0144076/x.JPEG", "n01440764x.JPEG"]
)
def test_a_path_whose_own_names_hold_no_wnid_is_refused(path: str) -> None:
    with pytest.raises(DatasetError, match="no WordNet ID"):
        parse_wnid(path)


def test_file_list_without_wnids_names_the_line(tiny_root: Path, tmp_path: Path) -> None:
    train_list, val_list = write_file_lists(tiny_root, tmp_path)
    lines = val_list.read_text().splitlines()
    lines[2] = "val/some_class/photo.JPEG"
    val_list.write_text("\n".join(lines))
    with pytest.raises(DatasetError, match=r"val.flist, line 3: .*val/some_class/photo.JPEG"):
        flist_index(tiny_root, train_list, val_list)


def test_file_list_of_one_class_is_refused(tiny_root: Path, tmp_path: Path) -> None:
    train_list, val_list = write_file_lists(tiny_root, tmp_path)
    one_class = [line for line in val_list.read_text().splitlines() if "n00000002" in line]
    val_list.write_text("\n".join(one_class))
    with pytest.raises(DatasetError, match=f"one class n00000002 \\(first line: {one_class[0]}"):
        flist_index(tiny_root, train_list, val_list)


@pytest.mark.parametrize("loader_name", ["torchvision", "spdl"])
def test_loaders_read_file_list_splits(tiny_root: Path, tmp_path: Path, loader_name: str) -> None:
    index = flist_index(tiny_root, *write_file_lists(tiny_root, tmp_path))
    spec = cpu_spec(index.val, False, loader=loader_name, batch_size=4, on_error="raise")
    loader = build_loader(spec)
    try:
        labels = torch.cat([b.labels for b in loader]).tolist()
    finally:
        loader.close()
    assert labels == list(index.val.labels)  # val keeps the list's order


LOADERS = ["torchvision", "spdl"] + (
    ["memmap"] if importlib.util.find_spec("loaderbench.loaders.memmap.loader") else []
)


@pytest.mark.slow
@pytest.mark.parametrize("loader_name", LOADERS)
def test_eval_py_runs_on_imagenet_file_lists(
    tiny_root: Path, tmp_path: Path, loader_name: str
) -> None:
    train_list, val_list = write_file_lists(tiny_root, tmp_path)
    run_entry(
        "eval.py",
        "model=none",
        "dataset=imagenet_flist",
        f"dataset.root={tiny_root}",
        f"dataset.train_list={train_list}",
        f"dataset.val_list={val_list}",
        f"loader={loader_name}",
        "logger=none",
        cwd=tmp_path,
    )
    _, metrics = single_run(tmp_path, "eval")
    assert metrics["status"] == "ok" and metrics["loader"] == loader_name
    assert metrics["images"] == 12 and metrics["num_classes"] == 3
    assert metrics["skipped_files"] == 0
