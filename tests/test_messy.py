"""A folder the project never saw, with odd and broken files: every loader loads every valid
image (with the same pixels), skips (and counts) the broken ones, or with on_error=raise stops
naming one."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from loaderbench.imaging.spdl.decoders import Sample, is_encoded, open_file
from loaderbench.imaging.transforms import pil_val_transform
from loaderbench.loaders import build_loader, file_loader_names
from tests.conftest import (
    MAX_PIXELS,
    cpu_spec,
    folder_index,
    loader_folder_overrides,
    loader_folders,
    run_entry,
    single_run,
)
from tests.helpers import photo
from tests.in_process import run_here

pytestmark = pytest.mark.slow

LOADERS = file_loader_names()


# Valid but unusual files: each must load, with the same pixels in every loader.
ODD = (
    "gray.JPEG",
    "cmyk.JPEG",
    "png_named.JPEG",
    "webp_named.JPEG",
    "rgba.png",
    "palette.png",
    "gray16.png",
    "exif_rotated.JPEG",
)
# Files no loader can use: broken, or over the pixel limit the tests set.
BROKEN = ("truncated.JPEG", "empty.JPEG", "text.JPEG", "huge.JPEG")
EXIF_ORIENTATION = 0x0112


def gradient16() -> np.ndarray:
    """A 16-bit grey ramp over the whole range (90 x 120)."""
    return np.linspace(0, 65535, 90 * 120).reshape(90, 120).astype(np.uint16)


def plain_tree(root: Path) -> Path:
    """2 classes of 4 plain JPEGs in train and val, under ``root``."""
    for split in ("train", "val"):
        for c, name in enumerate(("n00000001", "n00000002")):
            folder = root / split / name
            folder.mkdir(parents=True)
            for i in range(4):
                photo(100 * c + i).save(folder / f"ok_{i}.JPEG", quality=90)
    return root


@pytest.fixture(scope="module")
def messy_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """2 classes; val holds 8 plain JPEGs, the odd files and the broken ones."""
    root = plain_tree(tmp_path_factory.mktemp("messy"))
    val = root / "val" / "n00000001"
    photo(1).convert("L").save(val / "gray.JPEG", quality=90)
    photo(2).convert("CMYK").save(val / "cmyk.JPEG", quality=90)
    photo(3).save(val / "png_named.JPEG", format="PNG")
    photo(7).save(val / "webp_named.JPEG", format="WEBP", lossless=True)
    photo(4).convert("RGBA").save(val / "rgba.png")
    photo(5).convert("P").save(val / "palette.png")
    Image.fromarray(gradient16()).save(val / "gray16.png")  # mode I;16
    exif = Image.Exif()
    exif[EXIF_ORIENTATION] = 6  # "rotate 90 clockwise to display"
    photo(8).save(val / "exif_rotated.JPEG", quality=90, exif=exif)
    buffer = io.BytesIO()
    photo(6).save(buffer, format="JPEG", quality=90)
    (val / "truncated.JPEG").write_bytes(buffer.getvalue()[: len(buffer.getvalue()) // 3])
    (val / "empty.JPEG").write_bytes(b"")
    (val / "text.JPEG").write_text("this is not an image\n")
    Image.new("RGB", (1200, 1000), (90, 140, 200)).save(val / "huge.JPEG", quality=90)
    return root


def messy_eval(loader: str, root: Path, tmp_path: Path) -> list[str]:
    """eval.py overrides: the loader alone over the messy folder's val split."""
    cache = loader_folder_overrides(loader, tmp_path)
    return [
        "model=none",
        f"loader={loader}",
        f"dataset.root={root}",
        "logger=none",
        "loader.batch_size=4",
        "loader.num_workers=1",
        "image_size=32",
        f"dataset.max_image_pixels={MAX_PIXELS}",
        *cache,
    ]


VALID_VAL = 8 + len(ODD)


@pytest.mark.parametrize("loader", LOADERS)
def test_every_loader_skips_and_counts_broken_files(
    loader: str, messy_root: Path, tmp_path: Path
) -> None:
    run_here("eval.py", *messy_eval(loader, messy_root, tmp_path), cwd=tmp_path)
    _, metrics = single_run(tmp_path, "eval")
    assert metrics["status"] == "ok"
    assert metrics["images"] == VALID_VAL * metrics["passes"]
    assert metrics["skipped_files"] == len(BROKEN)


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
    assert any(name in proc.stderr for name in BROKEN)


# ---------------------------------------------------------------------------------------------
# In process: the pixels of every valid image, loader against loader.

SIZE = 32


def val_pixels(loader: str, root: Path, tmp_path: Path, **options: object) -> torch.Tensor:
    """Every image the loader yields for the val split, in order (each broken file skipped)."""
    split = folder_index(root).val
    options = {"on_error": "skip", **loader_folders(loader, tmp_path), **options}
    spec = cpu_spec(split, False, loader=loader, image_size=SIZE, batch_size=4, **options)
    with build_loader(spec) as built:
        images = torch.cat([batch.images for batch in built])
        assert built.stats()["skipped_files"] == len(BROKEN), loader
    return images


def test_odd_images_give_the_same_pixels_in_every_loader(
    messy_root: Path, tmp_path: Path, pixel_limit: int
) -> None:
    split = folder_index(messy_root).val
    valid = [Path(p).name for p in split.paths if Path(p).name not in BROKEN]
    assert len(valid) == VALID_VAL
    reference = val_pixels("torchvision", messy_root, tmp_path)
    assert torch.equal(val_pixels("memmap", messy_root, tmp_path), reference)
    turbo = val_pixels("spdl", messy_root, tmp_path, decoder="turbo")
    # libjpeg-turbo + the same filter: a file decoded whole to a grey level; a JPEG whose centre
    # crop is decoded as a region of the original up to half a source pixel off (the spdl
    # loader's turbo tolerance, tests/test_spdl.py).
    turbo_diff = (turbo.int() - reference.int()).abs()
    as_region = [
        is_encoded(open_file(Sample(0, p, 0, 0))) for p in split.paths if Path(p).name in valid
    ]
    for name, diff, region in zip(valid, turbo_diff, as_region, strict=True):
        assert diff.float().mean() <= 2.4 if region else diff.max() <= 1, name
    ffmpeg = val_pixels("spdl", messy_root, tmp_path, decoder="ffmpeg")
    per_image = (ffmpeg.float() - reference.float()).abs().mean(dim=(1, 2, 3))
    worst = valid[int(per_image.argmax())]
    assert per_image.max() <= 6.0, f"{worst}: mean |diff| {per_image.max():.2f}"

    by_name = dict(zip(valid, reference, strict=True))
    # 16 bits keep their high byte: the ramp's mean, not white (PIL's convert clips at 255).
    ramp = pil_val_transform(SIZE)(Image.fromarray((gradient16() >> 8).astype(np.uint8)))
    assert (by_name["gray16.png"].int() - ramp.int()).abs().max() <= 1
    # EXIF orientation is not applied: the stored pixels, as torchvision's ImageFolder sees them.
    raw = pil_val_transform(SIZE)(photo(8))
    rotated = pil_val_transform(SIZE)(photo(8).transpose(Image.Transpose.ROTATE_270))
    got = by_name["exif_rotated.JPEG"].float()
    assert (got - raw.float()).abs().mean() < (got - rotated.float()).abs().mean() / 3
