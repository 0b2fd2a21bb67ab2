"""Image transforms shared by the loaders: the per-image reference pipeline and batched ops.

The geometry is fixed once here so that every loader hands the model the same kind of image:

* val: resize the short side to ``val_resize_size(size)`` (256 for 224), then centre-crop
  ``size`` x ``size``, as in torchvision's ImageNet references;
* train: a random-resized crop (scale 0.08-1, ratio 3/4-4/3) to ``size`` x ``size`` plus a random
  horizontal flip, each image's drawn from its own generator seeded by (seed, epoch, image)
  (``seeded_crops``), whichever loader, process or thread prepares it.

All outputs are uint8 CHW / NCHW; normalisation happens on the device, in the model wrapper.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torchvision.transforms import v2

RRC_SCALE = (0.08, 1.0)
RRC_RATIO = (3.0 / 4.0, 4.0 / 3.0)


def val_resize_size(size: int) -> int:
    """Short side before the centre crop: 256 for 224, in proportion otherwise."""
    return (size * 256) // 224


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


# ---------------------------------------------------------------------------------------------
# Batched random-resized crop: one box per image, sampled for the whole batch at once.


# One value per (seed, epoch, image): every loader draws an image's crop and flip from a generator
# of its own seeded with it, so the boxes do not depend on which worker, thread or batch
# prepares the image, nor on the rank count, and no loader touches the global RNG (which
# dropout, the optimizer and checkpoints use).
DRAWS_PER_ATTEMPT = 2  # area fraction, log aspect ratio
RRC_ATTEMPTS = 10


def augmentation_seed(seed: int, epoch: int, index: int) -> int:
    """The seed of image ``index``'s augmentation in ``epoch`` of a run seeded with ``seed``."""
    return ((seed * 1_000_003 + epoch) * 1_000_000_007 + index) % (2**63 - 1)


def augmentation_draws(seed: int, epoch: int, indices: Sequence[int]) -> torch.Tensor:
    """Uniform [0, 1) draws (float64, N x D) for images ``indices``, each row from the image's
    own generator: everything its random-resized crop and flip need."""
    width = DRAWS_PER_ATTEMPT * RRC_ATTEMPTS + 3  # + top, left, flip
    draws = torch.empty((len(indices), width), dtype=torch.float64)
    generator = torch.Generator()
    for row, index in enumerate(indices):
        generator.manual_seed(augmentation_seed(seed, epoch, index))
        draws[row].uniform_(generator=generator)
    return draws


def random_crops(
    heights: torch.Tensor,
    widths: torch.Tensor,
    draws: torch.Tensor,
    scale: tuple[float, float] = RRC_SCALE,
    ratio: tuple[float, float] = RRC_RATIO,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Boxes ``(top, left, height, width)`` (int64, N x 4) and flips (bool, N) for images of
    size (h, w), from their ``augmentation_draws``; vectorised over the batch.

    The distribution of torchvision's ``RandomResizedCrop.get_params`` (area fraction uniform in
    ``scale``, log-aspect uniform in ``ratio``, up to ten tries, then the central crop clamped
    to ``ratio``) and ``RandomHorizontalFlip``.
    """
    heights = heights.to(torch.float64)
    widths = widths.to(torch.float64)
    n, attempts = heights.shape[0], RRC_ATTEMPTS
    area = (heights * widths)[:, None]
    area_draws, ratio_draws = draws[:, :attempts], draws[:, attempts : 2 * attempts]
    target_area = area * (scale[0] + (scale[1] - scale[0]) * area_draws)
    low, high = math.log(ratio[0]), math.log(ratio[1])
    aspect = torch.exp(low + (high - low) * ratio_draws)
    w = torch.round(torch.sqrt(target_area * aspect))
    h = torch.round(torch.sqrt(target_area / aspect))
    ok = (w > 0) & (h > 0) & (w <= widths[:, None]) & (h <= heights[:, None])
    first = torch.where(ok.any(dim=1), ok.to(torch.int8).argmax(dim=1), -1)

    # Fallback: the whole image, cropped to the nearest allowed aspect ratio.
    in_ratio = widths / heights
    fb_w = torch.where(
        in_ratio < ratio[0],
        widths,
        torch.where(in_ratio > ratio[1], torch.round(heights * ratio[1]), widths),
    )
    fb_h = torch.where(in_ratio < ratio[0], torch.round(widths / ratio[0]), heights)
    rows = torch.arange(n)
    pick = first.clamp(min=0)
    found = first >= 0
    box_w = torch.where(found, w[rows, pick], fb_w)
    box_h = torch.where(found, h[rows, pick], fb_h)
    u_top, u_left, u_flip = draws[:, -3], draws[:, -2], draws[:, -1]
    top = torch.where(
        found, torch.floor(u_top * (heights - box_h + 1)), torch.floor((heights - box_h) / 2)
    )
    left = torch.where(
        found, torch.floor(u_left * (widths - box_w + 1)), torch.floor((widths - box_w) / 2)
    )
    boxes = torch.stack([top, left, box_h, box_w], dim=1).to(torch.int64)
    return boxes, u_flip < 0.5


def seeded_crops(
    heights: Sequence[int] | torch.Tensor,
    widths: Sequence[int] | torch.Tensor,
    seed: int,
    epoch: int,
    indices: Sequence[int],
    scale: tuple[float, float] = RRC_SCALE,
    ratio: tuple[float, float] = RRC_RATIO,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The crops and flips of images ``indices`` in ``epoch``: what every loader calls."""
    draws = augmentation_draws(seed, epoch, indices)
    return random_crops(torch.as_tensor(heights), torch.as_tensor(widths), draws, scale, ratio)


def resize_uint8(
    image: torch.Tensor, size: tuple[int, int], *, via_float: bool | None = None
) -> torch.Tensor:
    """Bilinear, antialiased when shrinking (PIL's triangle filter), uint8 CHW in and out.

    On the CPU torch's uint8 kernel does it directly (vectorised, fastest on channels-last
    storage); a GPU's antialiased resize works in float, so only this image is converted
    (``via_float``, the default off the CPU), never a whole batch.
    """
    import torch.nn.functional as F

    if tuple(image.shape[-2:]) == tuple(size):
        return image
    if via_float is None:
        via_float = image.device.type != "cpu" or image.dtype != torch.uint8
    batch = image[None].float() if via_float else image[None]
    out = F.interpolate(batch, size=size, mode="bilinear", antialias=True, align_corners=False)[0]
    if out.dtype != torch.uint8:
        out = out.round_().clamp_(0, 255).to(torch.uint8)
    return out


def resized_crop_images(
    images: Sequence[torch.Tensor],
    boxes: torch.Tensor,
    size: int,
    flips: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    *,
    via_float: bool | None = None,
) -> torch.Tensor:
    """Cut a box ``(top, left, h, w)`` from each uint8 CHW image (any sizes, CPU or GPU),
    resize it to ``size`` x ``size`` and flip it where ``flips`` says: into ``out`` (N, C, size,
    size), by default channels-last on the CPU (writing NCHW-contiguous costs ~40% more there).

    One box at a time, so the memory beyond ``out`` is bounded by one box and one output image
    (in float off the CPU), whatever the batch size: a whole stored batch in float (the roi_align
    way) is ~350 MB at 256 x 3 x 336 x 336. Each call releases the GIL on the CPU.
    """
    n, channels = len(images), images[0].shape[0] if len(images) else 3
    if out is None:
        device = images[0].device if n else torch.device("cpu")
        out = torch.empty((n, size, size, channels), dtype=torch.uint8, device=device)
        out = out.permute(0, 3, 1, 2)
    flip_list = [False] * n if flips is None else flips.tolist()
    for i, (top, left, h, w) in enumerate(boxes.tolist()):
        crop = images[i][:, top : top + h, left : left + w]
        resized = resize_uint8(crop, (size, size), via_float=via_float)
        out[i].copy_(resized.flip(-1) if flip_list[i] else resized)
    return out


def crop_resize_flip_batch(
    images: torch.Tensor,
    boxes: torch.Tensor,
    size: int,
    flips: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """``resized_crop_images`` for a uint8 NCHW batch of one stored size (memmap's rows)."""
    return resized_crop_images(list(images.unbind(0)), boxes, size, flips, out)
