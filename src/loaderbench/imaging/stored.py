"""An image as a memmap store keeps it: the val crop (the reference pipeline itself), the train
image shrunk to fit a long side, and the JPEG a jpeg store re-encodes it as."""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from loaderbench.imaging.files import load_rgb, read_rgb
from loaderbench.imaging.transforms import pil_val_transform


@functools.lru_cache(maxsize=8)
def _val_transform(size: int) -> Any:
    return pil_val_transform(size)


def decode_crop(path: str, size: int) -> torch.Tensor:
    """The val image, uint8 (3, S, S): the reference pipeline itself, so bit-identical to it."""
    return _val_transform(size)(load_rgb(path))


def fit_size(width: int, height: int, long_side: int) -> tuple[int, int]:
    """(w, h) after shrinking, never enlarging, so that the long side is at most ``long_side``."""
    scale = min(1.0, long_side / max(width, height))
    return max(1, round(width * scale)), max(1, round(height * scale))


def decode_fit(path: str, long_side: int) -> torch.Tensor:
    """The train image, uint8 (h, w, 3), aspect kept, long side shrunk to at most ``long_side``.

    Read by ``files.read_rgb``, the torchvision loader's own ``load_rgb`` (the same files
    admitted and refused) but for a JPEG's decode at the smallest of 1/1, 1/2, 1/4, 1/8 scale
    that is still at least the target size (the DCT does the power-of-two part), then resized
    with torch's uint8 antialiased bilinear kernel, which computes PIL's BILINEAR resize faster,
    so that the build keeps pace with the torchvision loader's decoding.
    """
    image, target = read_rgb(path, functools.partial(fit_size, long_side=long_side))
    pixels = torch.from_numpy(np.array(image))  # np.array: writable
    if (pixels.shape[1], pixels.shape[0]) == target:
        return pixels
    nchw = pixels.permute(2, 0, 1)[None]  # channels-last view: the kernel's fast layout
    resized = F.interpolate(nchw, size=(target[1], target[0]), mode="bilinear", antialias=True)
    return resized[0].permute(1, 2, 0)


def encode_jpeg_bytes(chw: torch.Tensor, quality: int) -> torch.Tensor:
    """JPEG bytes (uint8, 1-D) of a uint8 (3, H, W) image at ``quality``."""
    from torchvision.io import encode_jpeg  # at first use: torchvision's import is heavy

    return encode_jpeg(chw.contiguous(), quality=quality)
