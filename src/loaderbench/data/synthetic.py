"""A deterministic, ImageNet-like image set, generated once.

JPEG files of ImageNet's spread of sizes (mostly 500x375 in both orientations, 50-150 KB each),
in ImageFolder layout with WordNet-style class folder names, so the same tree also serves as an
ImageNet file-list dataset. Each class is a shape or a texture drawn in random colours on a noisy,
randomly coloured background: the classes can be told apart by shape and texture, never by mean
colour. Every image depends only on (seed, split, class, index), so two machines generate the
same files.

``python -m loaderbench.data.synthetic [DIR]`` generates the default set.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import sys
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
from PIL import Image

from loaderbench.platform.locking import FileLock
from loaderbench.platform.runtime import cpus_allowed

FORMAT_VERSION = 3

# (width, height) and weights: ImageNet's most common sizes, both orientations.
_SIZES = [
    (500, 375),
    (375, 500),
    (500, 333),
    (333, 500),
    (500, 400),
    (400, 500),
    (500, 500),
    (640, 480),
    (450, 338),
]
_SIZE_WEIGHTS = np.array([34, 14, 14, 6, 8, 4, 8, 6, 6], dtype=float)

Mask = np.ndarray  # bool (H, W)


@dataclass(frozen=True)
class SyntheticSpec:
    num_classes: int = 10
    train_per_class: int = 100
    val_per_class: int = 30
    seed: int = 0
    jpeg_quality: int = 90
    # Shrink every image so its long side is at most this (None: ImageNet's sizes). Small
    # images make trees of hundreds of thousands of files quick to generate (bench-scale).
    max_side: int | None = None

    def key(self) -> str:
        fields = asdict(self)
        if fields["max_side"] is None:  # sets generated before the field keep their key
            del fields["max_side"]
        payload = json.dumps({**fields, "version": FORMAT_VERSION}, sort_keys=True)
        return hashlib.sha256(payload.encode()).hexdigest()[:10]

    def dirname(self) -> str:
        counts = f"{self.num_classes}c-{self.train_per_class}x{self.val_per_class}"
        small = f"-{self.max_side}px" if self.max_side else ""
        return f"synthetic-{counts}{small}-{self.key()}"


def class_folder(label: int) -> str:
    """WordNet-style folder name: sorted order equals label order."""
    return f"n{label + 1:08d}"


# ---------------------------------------------------------------------------------------------
# Class shapes and textures: each returns the mask of the object's pixels.


def _polygon_mask(xx: np.ndarray, yy: np.ndarray, vertices: np.ndarray) -> Mask:
    """Inside test for a convex or star polygon given in order (even-odd rule)."""
    inside = np.zeros(xx.shape, dtype=bool)
    n = len(vertices)
    for i in range(n):
        x1, y1 = vertices[i]
        x2, y2 = vertices[(i + 1) % n]
        crosses = (y1 > yy) != (y2 > yy)
        with np.errstate(divide="ignore", invalid="ignore"):
            x_at = (x2 - x1) * (yy - y1) / (y2 - y1) + x1
        inside ^= crosses & (xx < x_at)
    return inside


def _regular(n: int, radius: float, angle: float, inner: float | None = None) -> np.ndarray:
    count = 2 * n if inner else n
    thetas = angle + np.arange(count) * 2 * math.pi / count
    radii = np.full(count, radius)
    if inner:
        radii[1::2] = radius * inner
    return np.stack([radii * np.cos(thetas), radii * np.sin(thetas)], axis=1)


def _rotated(u: np.ndarray, v: np.ndarray, angle: float) -> tuple[np.ndarray, np.ndarray]:
    c, s = math.cos(angle), math.sin(angle)
    return c * u + s * v, -s * u + c * v


def _disc(u: np.ndarray, v: np.ndarray, r: float) -> Mask:
    return u * u + v * v <= r * r


def _circle(u, v, r, angle, rng):
    return _disc(u, v, r)


def _square(u, v, r, angle, rng):
    a, b = _rotated(u, v, angle)
    return (np.abs(a) <= r * 0.8) & (np.abs(b) <= r * 0.8)


def _triangle(u, v, r, angle, rng):
    return _polygon_mask(u, v, _regular(3, r, angle))


def _ring(u, v, r, angle, rng):
    d2 = u * u + v * v
    return (d2 <= r * r) & (d2 >= (0.55 * r) ** 2)


def _cross(u, v, r, angle, rng):
    a, b = _rotated(u, v, angle)
    arm = 0.28 * r
    return ((np.abs(a) <= r) & (np.abs(b) <= arm)) | ((np.abs(b) <= r) & (np.abs(a) <= arm))


def _star(u, v, r, angle, rng):
    return _polygon_mask(u, v, _regular(5, r, angle, inner=0.42))


def _stripes(u, v, r, angle, rng):
    a, _ = _rotated(u, v, angle)
    period = r * rng.uniform(0.32, 0.42)
    return _disc(u, v, r) & (np.sin(2 * math.pi * a / period) > 0)


def _checker(u, v, r, angle, rng):
    a, b = _rotated(u, v, angle)
    period = r * rng.uniform(0.5, 0.6)
    wave = np.sin(2 * math.pi * a / period) * np.sin(2 * math.pi * b / period)
    return (np.abs(a) <= r * 0.85) & (np.abs(b) <= r * 0.85) & (wave > 0)


def _dots(u, v, r, angle, rng):
    a, b = _rotated(u, v, angle)
    period = r * rng.uniform(0.5, 0.6)
    ca = (a / period) - np.round(a / period)
    cb = (b / period) - np.round(b / period)
    return _disc(u, v, r) & (ca * ca + cb * cb <= 0.09)


def _crescent(u, v, r, angle, rng):
    du, dv = 0.45 * r * math.cos(angle), 0.45 * r * math.sin(angle)
    return _disc(u, v, r) & ~_disc(u - du, v - dv, 0.8 * r)


_PAINTERS: list[Callable[..., Mask]] = [
    _circle,
    _square,
    _triangle,
    _ring,
    _cross,
    _star,
    _stripes,
    _checker,
    _dots,
    _crescent,
]
CLASS_NAMES = [p.__name__.lstrip("_") for p in _PAINTERS]


def render_image(label: int, rng: np.random.Generator, max_side: int | None = None) -> np.ndarray:
    """One HxWx3 uint8 image of class ``label`` (long side at most ``max_side`` if given)."""
    width, height = _SIZES[rng.choice(len(_SIZES), p=_SIZE_WEIGHTS / _SIZE_WEIGHTS.sum())]
    if max_side is not None and max(width, height) > max_side:
        shrink = max_side / max(width, height)
        width, height = max(8, round(width * shrink)), max(8, round(height * shrink))
    yy, xx = np.mgrid[0:height, 0:width].astype(np.float32)

    # Background: a random-colour gradient plus blotches and grain, so that JPEG sizes and
    # statistics look like photographs rather than flat fills.
    c0, c1 = rng.uniform(0, 255, 3), rng.uniform(0, 255, 3)
    t = xx * math.cos(rng.uniform(0, 2 * math.pi)) + yy * math.sin(rng.uniform(0, 2 * math.pi))
    t = (t - t.min()) / max(float(t.max() - t.min()), 1.0)
    image = c0 + (c1 - c0) * t[..., None]
    low = rng.normal(0, 1, (height // 25 + 2, width // 25 + 2, 3)).astype(np.float32)
    low = np.asarray(
        Image.fromarray(((low * 14) + 128).clip(0, 255).astype(np.uint8)).resize(
            (width, height), Image.BICUBIC
        ),
        dtype=np.float32,
    )
    image += low - 128

    # Objects: several instances of the class's shape or texture, each of random size, place
    # and rotation, in random colours (independent of the class). Several instances keep the
    # class visible in most random-resized crops, as objects in photographs usually are.
    short = min(width, height)
    painter = _PAINTERS[label % len(_PAINTERS)]
    for _ in range(int(rng.integers(3, 6))):
        radius = rng.uniform(0.13, 0.24) * short
        cx = rng.uniform(radius, width - radius)
        cy = rng.uniform(radius, height - radius)
        x0, x1 = int(cx - radius) - 1, int(cx + radius) + 2
        y0, y1 = int(cy - radius) - 1, int(cy + radius) + 2
        x0, y0 = max(x0, 0), max(y0, 0)
        mask = painter(
            xx[y0:y1, x0:x1] - cx, yy[y0:y1, x0:x1] - cy, radius, rng.uniform(0, 2 * math.pi), rng
        )
        colour = rng.uniform(0, 255, 3)
        # Keep the object visible against the background under it.
        if np.abs(colour - image[int(cy), int(cx)]).sum() < 150:
            colour = 255 - colour
        region = image[y0:y1, x0:x1]
        region[mask] = colour + rng.normal(0, 10, (int(mask.sum()), 3))

    image += rng.normal(0, 9, image.shape)
    return image.clip(0, 255).astype(np.uint8)


def _image_seed(spec: SyntheticSpec, split: str, label: int, index: int) -> int:
    digest = hashlib.sha256(f"{spec.seed}/{split}/{label}/{index}".encode()).digest()
    return int.from_bytes(digest[:8], "little")


def _write_one(args: tuple[SyntheticSpec, str, int, int, str]) -> None:
    spec, split, label, index, path = args
    rng = np.random.default_rng(_image_seed(spec, split, label, index))
    image = render_image(label, rng, spec.max_side)
    Image.fromarray(image).save(path, format="JPEG", quality=spec.jpeg_quality)


def _jobs(spec: SyntheticSpec, root: Path) -> list[tuple[SyntheticSpec, str, int, int, str]]:
    jobs = []
    for split, per_class in (("train", spec.train_per_class), ("val", spec.val_per_class)):
        for label in range(spec.num_classes):
            folder = root / split / class_folder(label)
            folder.mkdir(parents=True, exist_ok=True)
            for index in range(per_class):
                name = f"{class_folder(label)}_{index:05d}.JPEG"
                jobs.append((spec, split, label, index, str(folder / name)))
    return jobs


def generate(spec: SyntheticSpec, root: Path, workers: int | None = None) -> None:
    """Write the whole set under ``root`` (which must not exist)."""
    jobs = _jobs(spec, root)
    workers = workers or min(len(jobs), cpus_allowed())
    if workers <= 1:
        for job in jobs:
            _write_one(job)
    else:
        with ProcessPoolExecutor(workers) as pool:
            list(pool.map(_write_one, jobs, chunksize=16))
    names = {class_folder(i): CLASS_NAMES[i % len(CLASS_NAMES)] for i in range(spec.num_classes)}
    (root / "classes.json").write_text(json.dumps(names, indent=1))


def ensure_synthetic(spec: SyntheticSpec, parent: Path) -> Path:
    """The generated set's root under ``parent``, generating it first if needed.

    Generation writes into a temporary folder and renames it into place once complete, under a
    lock, so a killed generation is never taken for a set and two runs never both write it.
    """
    if spec.num_classes < 2 or spec.train_per_class < 1 or spec.val_per_class < 1:
        raise ValueError(
            "dataset.synthetic needs num_classes >= 2 and train_per_class, val_per_class >= 1; "
            f"got {spec}"
        )
    final = parent / spec.dirname()
    if (final / "classes.json").is_file():
        return final
    parent.mkdir(parents=True, exist_ok=True)
    with FileLock(parent / f".{spec.dirname()}.lock"):
        if (final / "classes.json").is_file():
            return final
        partial = parent / f".{spec.dirname()}.partial-{os.getpid()}"
        shutil.rmtree(partial, ignore_errors=True)
        for stale in parent.glob(f".{spec.dirname()}.partial-*"):
            shutil.rmtree(stale, ignore_errors=True)
        print(f"Generating the synthetic dataset into {final} ...", file=sys.stderr)
        try:
            generate(spec, partial)
            shutil.rmtree(final, ignore_errors=True)
            os.replace(partial, final)
        finally:
            shutil.rmtree(partial, ignore_errors=True)
    return final


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    parent = Path(argv[0]) if argv else Path("data")
    print(ensure_synthetic(SyntheticSpec(), parent.absolute()))


if __name__ == "__main__":
    main()
