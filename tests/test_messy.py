"""A folder the project never saw, with odd and broken files: every loader loads every valid
image, skips (and counts) the broken ones, or with on_error=raise stops naming one."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from tests.conftest import run_entry, single_run

pytestmark = pytest.mark.slow

LOADERS = ["torchvision", "memmap", "spdl"]


def _photo(seed: int, size: tuple[int, int] = (120, 90)) -> Image.Image:
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 255, (size[1], size[0], 3), dtype=np.uint8))


@pytest.fixture(scope="module")
def messy_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """2 classes; val holds 5 valid odd images and 3 broken files."""
    root = tmp_path_factory.mktemp("messy")
    for split in ("train", "val"):
        for c, name in enumerate(("n00000001", "n00000002")):
            folder = root / split / name
            folder.mkdir(parents=True)
            for i in range(4):
                _photo(100 * c + i).save(folder / f"ok_{i}.JPEG", quality=90)
    val = root / "val" / "n00000001"
    _photo(1).convert("L").save(val / "gray.JPEG", quality=90)
    _photo(2).convert("CMYK").save(val / "cmyk.JPEG", quality=90)
    _photo(3).save(val / "png_named.JPEG", format="PNG")
    _photo(4).convert("RGBA").save(val / "rgba.png")
    _photo(5).convert("P").save(val / "palette.png")
    buffer = io.BytesIO()
    _photo(6).save(buffer, format="JPEG", quality=90)
    (val / "truncated.JPEG").write_bytes(buffer.getvalue()[: len(buffer.getvalue()) // 3])
    (val / "empty.JPEG").write_bytes(b"")
    (val / "text.JPEG").write_text("this is not an image\n")
    return root


def messy_eval(loader: str, root: Path, tmp_path: Path) -> list[str]:
    """eval.py overrides: the loader alone over the messy folder's val split."""
    cache = [f"loader.cache_dir={tmp_path / 'cache'}"] if loader == "memmap" else []
    return [
        "model=none",
        f"loader={loader}",
        f"dataset.root={root}",
        "logger=none",
        "loader.batch_size=4",
        "loader.num_workers=1",
        "image_size=32",
        *cache,
    ]


VALID_VAL = 8 + 5
BROKEN = 3


@pytest.mark.parametrize("loader", LOADERS)
def test_every_loader_skips_and_counts_broken_files(
    loader: str, messy_root: Path, tmp_path: Path
) -> None:
    run_entry("eval.py", *messy_eval(loader, messy_root, tmp_path), cwd=tmp_path)
    _, metrics = single_run(tmp_path, "eval")
    assert metrics["status"] == "ok"
    assert metrics["images"] == VALID_VAL
    assert metrics["skipped_files"] == BROKEN


@pytest.mark.parametrize("loader", LOADERS)
def test_on_error_raise_names_a_broken_file(loader: str, messy_root: Path, tmp_path: Path) -> None:
    proc = run_entry(
        "eval.py",
        *messy_eval(loader, messy_root, tmp_path),
        "dataset.on_error=raise",
        cwd=tmp_path,
        check=False,
        timeout=300,
    )
    assert proc.returncode != 0
    assert any(name in proc.stderr for name in ("truncated.JPEG", "empty.JPEG", "text.JPEG"))
