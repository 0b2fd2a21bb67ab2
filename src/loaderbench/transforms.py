"""Image transforms shared by the loaders: the per-image reference pipeline and batched ops.

The geometry is fixed once here so that every loader hands the model the same kind of image:

* val: resize the short side to ``val_resize_size(size)`` (256 for 224), then centre-crop
  ``size`` x ``size``, as in torchvision's ImageNet references;
* train: a random-resized crop (scale 0.08-1, ratio 3/4-4/3) to ``size`` x ``size`` plus a random
  horizontal flip.

All outputs are uint8 CHW / NCHW; normalisation happens on the device, in the model wrapper.
"""

from __future__ import annotations

import math

import torch
from PIL import Image
from torchvision.transforms import v2

RRC_SCALE = (0.08, 1.0)
RRC_RATIO = (3.0 / 4.0, 4.0 / 3.0)


def val_resize_size(size: int) -> int:
    """Short side before the centre crop: 256 for 224, in proportion otherwise."""
    return int(math.floor(size * 256 / 224))


def load_rgb(path: str) -> Image.Image:
    """Decode an image file with PIL and convert it to RGB (grayscale, CMYK, palette, RGBA)."""
    with open(path, "rb") as f:
        image = Image.open(f)
        image.load()
    return image.convert("RGB")


def pil_train_transform(size: int) -> v2.Compose:
    """The per-image train pipeline of the torchvision loader (PIL in, uint8 CHW out)."""
    return v2.Compose(
        [
            v2.RandomResizedCrop(size, scale=RRC_SCALE, ratio=RRC_RATIO, antialias=True),
            v2.RandomHorizontalFlip(),
            v2.PILToTensor(),
        ]
    )


def pil_val_transform(size: int) -> v2.Compose:
    """The per-image val pipeline (PIL in, uint8 CHW out); the reference every loader matches."""
    return v2.Compose(
        [
            v2.Resize(val_resize_size(size), antialias=True),
            v2.CenterCrop(size),
            v2.PILToTensor(),
        ]
    )


def normalize_uint8(images: torch.Tensor, mean: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
    """uint8 NCHW in [0, 255] -> float, normalised with per-channel mean/std given in [0, 1]."""
    return (images.float() - mean.view(1, -1, 1, 1) * 255) / (std.view(1, -1, 1, 1) * 255)
