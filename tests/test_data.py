"""Discovery and the generated data set, on real files."""

from __future__ import annotations

import io
import shutil
from pathlib import Path

import numpy as np
import pytest
from omegaconf import OmegaConf
from PIL import Image

from loaderbench.config.schema import DatasetConfig
from loaderbench.data.discovery import DatasetError, discover, scan_image_folder
from loaderbench.data.synthetic import SyntheticSpec, ensure_synthetic, render_image


def dataset_cfg(**kwargs):
    cfg = OmegaConf.structured(DatasetConfig(index_dir=None))
    cfg.name = "folder"
    for key, value in kwargs.items():
        OmegaConf.update(cfg, key, value)
    return cfg


def test_labels_are_sorted_folder_indices(tmp_path: Path) -> None:
    for split in ("train", "val"):
        for name in ("zebra", "apple", "mango"):
            folder = tmp_path / split / name
            folder.mkdir(parents=True)
            Image.new("RGB", (8, 8)).save(folder / "a.jpg")
            Image.new("RGB", (8, 8)).save(folder / "b.PNG")
            (folder / "notes.txt").write_text("not an image")
    index = discover(dataset_cfg(root=str(tmp_path)))
    assert index.classes == ("apple", "mango", "zebra")
    assert len(index.train) == 6 and len(index.val) == 6
    for path, label in zip(index.train.paths, index.train.labels, strict=True):
        assert Path(path).parent.name == index.classes[label]


def test_tiny_root_discovery(tiny_root: Path) -> None:
    index = discover(dataset_cfg(root=str(tiny_root)))
    assert index.num_classes == 3
    assert len(index.train) == 24 and len(index.val) == 12
    assert sorted(set(index.val.labels)) == [0, 1, 2]


def test_missing_root_names_it(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match="does-not-exist"):
        discover(dataset_cfg(root=str(tmp_path / "does-not-exist")))


def test_empty_class_folder_names_it(tmp_path: Path, tiny_root: Path) -> None:
    root = tmp_path / "copy"
    shutil.copytree(tiny_root, root)
    (root / "train" / "n99999999").mkdir()
    with pytest.raises(DatasetError, match="n99999999"):
        scan_image_folder(root / "train")


def test_val_classes_must_match_train(tmp_path: Path, tiny_root: Path) -> None:
    root = tmp_path / "copy"
    shutil.copytree(tiny_root, root)
    shutil.rmtree(root / "val" / "n00000002")
    with pytest.raises(DatasetError, match="n00000002"):
        discover(dataset_cfg(root=str(root)))


def test_generation_is_deterministic_and_atomic(tmp_path: Path) -> None:
    spec = SyntheticSpec(num_classes=2, train_per_class=2, val_per_class=1, seed=7)
    a = ensure_synthetic(spec, tmp_path / "a")
    b = ensure_synthetic(spec, tmp_path / "b")
    files_a = sorted(p.relative_to(a) for p in a.rglob("*.JPEG"))
    assert len(files_a) == 6
    for rel in files_a:
        assert (a / rel).read_bytes() == (b / rel).read_bytes()
    assert not list((tmp_path / "a").glob(".*partial*"))
    # A second call finds the set and does not regenerate it.
    mtime = (a / files_a[0]).stat().st_mtime_ns
    assert ensure_synthetic(spec, tmp_path / "a") == a
    assert (a / files_a[0]).stat().st_mtime_ns == mtime


def test_images_look_like_imagenet() -> None:
    sizes, shapes = [], set()
    for label in range(10):
        for i in range(3):
            array = render_image(label, np.random.default_rng(1000 * label + i))
            buffer = io.BytesIO()
            Image.fromarray(array).save(buffer, format="JPEG", quality=90)
            sizes.append(len(buffer.getvalue()))
            shapes.add(array.shape[:2])
    assert 45_000 <= min(sizes) and max(sizes) <= 160_000, (min(sizes), max(sizes))
    assert any(h > w for h, w in shapes) and any(w > h for h, w in shapes)
    assert all(300 <= min(h, w) and max(h, w) <= 640 for h, w in shapes)


def test_mean_colour_does_not_give_the_class_away() -> None:
    """A nearest-class-mean classifier on mean colour must do about as well as chance."""
    rng = np.random.default_rng(0)
    classes, per_class = 10, 12
    feats = np.array(
        [
            [render_image(c, rng).reshape(-1, 3).mean(0) for _ in range(per_class)]
            for c in range(classes)
        ]
    )  # (classes, per_class, 3)
    train, test = feats[:, : per_class // 2], feats[:, per_class // 2 :]
    centroids = train.mean(1)
    dists = ((test[:, :, None, :] - centroids[None, None]) ** 2).sum(-1)
    accuracy = (dists.argmin(-1) == np.arange(classes)[:, None]).mean()
    assert accuracy < 0.3, accuracy
