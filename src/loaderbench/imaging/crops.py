"""Every loader's train crops: a random-resized crop box and a flip per (seed, epoch, image).

The draws are counter-based: draw ``j`` of image ``i`` is SplitMix64's sequence from the key
(seed, epoch), read at position ``(i, j)`` without stepping through the ones before it (Steele,
Lea and Flood, "Fast splittable pseudorandom number generators", 2014). So an image gets the
same box and flip whichever loader, process, thread, rank or batch prepares it, a batch's draws
are one vectorised numpy computation, and no loader touches the global RNG. ``CROP_STREAM``
names this stream in every run's metrics (docs/loaders.md, "The crop stream").
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch

RRC_SCALE = (0.08, 1.0)
RRC_RATIO = (3.0 / 4.0, 4.0 / 3.0)

CROP_STREAM = 2  # see the module docstring; in every run's metrics (loader_<split>_crop_stream)

DRAWS_PER_ATTEMPT = 2  # area fraction, log aspect ratio
RRC_ATTEMPTS = 10
DRAWS = DRAWS_PER_ATTEMPT * RRC_ATTEMPTS + 3  # + top, left, flip

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)
_MASK64 = (1 << 64) - 1


def _mix64(x: np.ndarray) -> np.ndarray:
    """SplitMix64's output function on uint64 arrays (wrapping arithmetic), in place."""
    x ^= x >> np.uint64(30)
    x *= _MIX1
    x ^= x >> np.uint64(27)
    x *= _MIX2
    x ^= x >> np.uint64(31)
    return x


def _key(seed: int, epoch: int) -> np.uint64:
    """The stream's key for (seed, epoch): the seed mixed, then the epoch mixed in."""
    key = _mix64(np.array([seed & _MASK64], dtype=np.uint64))
    key = _mix64(key ^ np.array([epoch & _MASK64], dtype=np.uint64) * _GOLDEN)
    return key[0]


def augmentation_draws(
    seed: int, epoch: int, indices: Sequence[int] | np.ndarray | torch.Tensor
) -> torch.Tensor:
    """Uniform [0, 1) draws (float64, N x ``DRAWS``) for images ``indices``: row ``r`` holds
    everything image ``indices[r]``'s random-resized crop and flip need in ``epoch``."""
    images = np.asarray(indices, dtype=np.int64).astype(np.uint64)
    counters = images[:, None] * np.uint64(DRAWS) + np.arange(1, DRAWS + 1, dtype=np.uint64)
    values = _mix64(counters * _GOLDEN + _key(seed, epoch))
    # The top 53 bits as a double in [0, 1): every value a multiple of 2**-53.
    return torch.from_numpy((values >> np.uint64(11)).astype(np.float64) * 2.0**-53)


def random_crops(
    heights: torch.Tensor | np.ndarray,
    widths: torch.Tensor | np.ndarray,
    draws: torch.Tensor,
    scale: tuple[float, float] = RRC_SCALE,
    ratio: tuple[float, float] = RRC_RATIO,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Boxes ``(top, left, height, width)`` (int64, N x 4) and flips (bool, N) for images of
    size (h, w), from their ``augmentation_draws``; vectorised over the batch.

    The distribution of torchvision's ``RandomResizedCrop.get_params`` (area fraction uniform in
    ``scale``, log-aspect uniform in ``ratio``, up to ten tries, then the central crop clamped
    to ``ratio``) and ``RandomHorizontalFlip``.

    In numpy float64 (a batch's ~40 small ops cost less there than torch's dispatch): every op
    is IEEE-exact and rounds half to even in both libraries, so the boxes are torch's to the
    bit. Only ``exp`` is not exact; it stays torch's own kernel, on the same contiguous (N,
    attempts) block as ever.
    """
    # (h, w) side by side: each step below is one op for both sides.
    sizes = np.stack([np.asarray(heights, np.float64), np.asarray(widths, np.float64)], axis=1)
    u = draws.numpy()
    attempts = RRC_ATTEMPTS
    area = (sizes[:, 0] * sizes[:, 1])[:, None]
    area_draws, ratio_draws = u[:, :attempts], u[:, attempts : 2 * attempts]
    target_area = area * (scale[0] + (scale[1] - scale[0]) * area_draws)
    low, high = math.log(ratio[0]), math.log(ratio[1])
    aspect = torch.from_numpy(low + (high - low) * ratio_draws).exp_().numpy()
    tries = np.round(np.sqrt(np.stack([target_area / aspect, target_area * aspect], axis=2)))
    ok = ((tries > 0) & (tries <= sizes[:, None, :])).all(axis=2)
    found = ok.any(axis=1)
    first = ok.argmax(axis=1)  # the first attempt that fits (0 where none does)
    box = tries[np.arange(len(sizes)), first]
    top_left = np.floor(u[:, -3:-1] * (sizes - box + 1))
    if not found.all():
        _central_fallback(sizes, box, top_left, ~found, ratio)
    boxes = np.concatenate([top_left, box], axis=1).astype(np.int64)
    return torch.from_numpy(boxes), torch.from_numpy(u[:, -1] < 0.5)


def _central_fallback(
    sizes: np.ndarray,
    box: np.ndarray,
    top_left: np.ndarray,
    rows: np.ndarray,
    ratio: tuple[float, float],
) -> None:
    """Where no attempt fits (``rows``), the box becomes the whole image cropped to the nearest
    allowed aspect ratio, centred: written into ``box`` and ``top_left``, (h, w) each."""
    heights, widths = sizes[rows, 0], sizes[rows, 1]
    in_ratio = widths / heights
    fb_w = np.where(
        in_ratio < ratio[0],
        widths,
        np.where(in_ratio > ratio[1], np.round(heights * ratio[1]), widths),
    )
    fb_h = np.where(in_ratio < ratio[0], np.round(widths / ratio[0]), heights)
    box[rows] = np.stack([fb_h, fb_w], axis=1)
    top_left[rows] = np.floor((sizes[rows] - box[rows]) / 2)


def seeded_crops(
    heights: Sequence[int] | torch.Tensor | np.ndarray,
    widths: Sequence[int] | torch.Tensor | np.ndarray,
    seed: int,
    epoch: int,
    indices: Sequence[int] | np.ndarray | torch.Tensor,
    scale: tuple[float, float] = RRC_SCALE,
    ratio: tuple[float, float] = RRC_RATIO,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The crops and flips of images ``indices`` in ``epoch``: what every loader calls."""
    draws = augmentation_draws(seed, epoch, indices)
    return random_crops(np.asarray(heights), np.asarray(widths), draws, scale, ratio)
