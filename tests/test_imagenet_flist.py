"""ImageNet-style file lists (dataset=imagenet_flist): labels from the WordNet IDs in the paths,
the same as the ImageFolder labels of the same files, for every loader."""

from __future__ import annotations

import os
import random
import shutil
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf
from PIL import Image
from torch import Tensor

from loaderbench.config.schema import DatasetConfig
from loaderbench.data.discovery import DatasetError, DatasetIndex, discover, parse_wnid
from loaderbench.loaders import build_loader, file_loader_names
from tests.conftest import (
    cpu_spec,
    folder_index,
    loader_folders,
    rewrite_in_place,
    single_run,
)
from tests.in_process import run_here

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


@pytest.mark.parametrize("loader_name", file_loader_names())
def test_loaders_read_file_list_splits(tiny_root: Path, tmp_path: Path, loader_name: str) -> None:
    index = flist_index(tiny_root, *write_file_lists(tiny_root, tmp_path))
    own = loader_folders(loader_name, tmp_path)
    spec = cpu_spec(index.val, False, loader=loader_name, batch_size=4, on_error="raise", **own)
    loader = build_loader(spec)
    try:
        labels = torch.cat([b.labels for b in loader]).tolist()
    finally:
        loader.close()
    assert labels == list(index.val.labels)  # val keeps the list's order


@pytest.mark.slow
@pytest.mark.parametrize("loader_name", file_loader_names())
def test_eval_py_runs_on_imagenet_file_lists(
    tiny_root: Path, tmp_path: Path, loader_name: str
) -> None:
    train_list, val_list = write_file_lists(tiny_root, tmp_path)
    run_here(
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
    assert metrics["images"] == 12 * metrics["passes"] and metrics["num_classes"] == 3
    assert metrics["skipped_files"] == 0


def discover_indexed(
    root: Path, index_dir: Path, lists: tuple[Path, Path] | None, rescan: bool = False
) -> DatasetIndex:
    """Discovery as a run does it by default: through the saved dataset index."""
    cfg = OmegaConf.structured(DatasetConfig(index_dir=str(index_dir), rescan=rescan))
    cfg.name, cfg.root = "folder" if lists is None else "imagenet_flist", str(root)
    if lists is not None:
        cfg.train_list, cfg.val_list = str(lists[0]), str(lists[1])
    return discover(cfg)


def val_images(index: DatasetIndex, loader_name: str, cache_dir: Path) -> tuple[Path, Tensor]:
    """Every val image as ``loader_name`` serves it, and (memmap) the cache it read."""
    extra = {"cache_dir": str(cache_dir)} if loader_name == "memmap" else {}
    spec = cpu_spec(index.val, False, loader=loader_name, num_workers=0, **extra)
    with build_loader(spec) as loader:
        images = torch.cat([batch.images for batch in loader])
        return getattr(getattr(loader, "cache", None), "path", None), images


def replace_image(path: Path, colour: tuple[int, int, int]) -> None:
    """A different photo at ``path``, written beside it and renamed over it (rsync, mv)."""
    written = path.with_name(f".{path.name}.partial")
    Image.new("RGB", (47, 41), colour).save(written, "JPEG", quality=95)
    os.replace(written, path)


@pytest.mark.parametrize("layout", ["imagenet_flist", "folder"])
def test_an_image_replaced_on_disk_is_served_new_by_memmap_like_the_other_loaders(
    tiny_root: Path, tmp_path: Path, layout: str
) -> None:
    """The memmap cache is keyed by the split's fingerprint (the files' sizes and mtimes, from
    the saved dataset index). A file list once watched only the lists, so an image replaced
    under it kept the index, the fingerprint and the cache: memmap served the old photo while
    torchvision read the new one. Now its images' folders are watched, as a folder scan's,
    and every file's size and mtime is checked (a file rewritten in place changes no folder)."""
    root = tmp_path / "data"
    shutil.copytree(tiny_root, root)
    lists = write_file_lists(root, tmp_path) if layout == "imagenet_flist" else None
    index_dir = cache_dir = tmp_path / "cache"
    index = discover_indexed(root, index_dir, lists)
    first_cache, before = val_images(index, "memmap", cache_dir)
    target = Path(index.val.paths[5])
    replace_image(target, (250, 20, 20))

    index = discover_indexed(root, index_dir, lists)
    new_cache, served = val_images(index, "memmap", cache_dir)
    _, read = val_images(index, "torchvision", cache_dir)
    assert new_cache != first_cache
    assert torch.equal(served, read) and not torch.equal(served[5], before[5])
    assert torch.equal(served[:5], before[:5]) and torch.equal(served[6:], before[6:])

    # Rewritten in place (same size, same folder mtime), a file changes no folder: the index's
    # per-file check (the default) sees it, and every loader serves the new pixels.
    rewrite_in_place(target, (20, 20, 250), same_size=True)
    index = discover_indexed(root, index_dir, lists)
    assert index.files_changed == 1
    newest_cache, served = val_images(index, "memmap", cache_dir)
    _, read = val_images(index, "torchvision", cache_dir)
    _, spdl = val_images(index, "spdl", cache_dir)
    assert newest_cache != new_cache
    assert torch.equal(served, read) and served[5, 2].float().mean() > 200  # blue now
    assert spdl[5, 2].float().mean() > 200 and spdl[5, 0].float().mean() < 60
    assert torch.equal(served[:5], before[:5]) and torch.equal(served[6:], before[6:])


def test_a_listed_image_whose_folder_appears_later_rescans(tiny_root: Path, tmp_path: Path) -> None:
    """A list may name images not there yet (a copy under way): their folder, missing at the
    scan, is watched as missing, and its arrival rescans, so the file's stats become real."""
    root = tmp_path / "data"
    shutil.copytree(tiny_root, root)
    train_list, val_list = write_file_lists(root, tmp_path)
    late = root / "val" / "n00000002" / "late" / "n00000002_late.JPEG"
    val_list.write_text(val_list.read_text() + f"{late.relative_to(root)}\n")
    lists, index_dir = (train_list, val_list), tmp_path / "index"
    stats = discover_indexed(root, index_dir, lists).val.stats
    assert stats is not None and stats[0][-1] == -1  # not there: the loaders skip it, naming it
    assert discover_indexed(root, index_dir, lists).val.stats[0][-1] == -1  # still current
    late.parent.mkdir()
    shutil.copy2(next((root / "val" / "n00000002").glob("*.JPEG")), late)
    assert discover_indexed(root, index_dir, lists).val.stats[0][-1] == late.stat().st_size
