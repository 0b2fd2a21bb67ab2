"""Image transforms shared by the loaders: the per-image reference pipeline and batched ops.

The geometry is fixed once here so that every loader hands the model the same kind of image:

* val: resize the short side to ``val_resize_size(size)`` (256 for 224), then centre-crop
  ``size`` x ``size``, as in torchvision's ImageNet references;
* train: a random-resized crop (scale 0.08-1, ratio 3/4-4/3) to ``size`` x ``size`` plus a random
  horizontal flip.

All outputs are uint8 CHW / NCHW; normalisation happens on the device, in the model wrapper.
"""

from __future__ import annotations

import hashlib
import math

import torch
from torchvision.transforms import v2

from loaderbench.images import load_rgb  # noqa: F401 - the reference pipeline's first step

RRC_SCALE = (0.08, 1.0)
RRC_RATIO = (3.0 / 4.0, 4.0 / 3.0)


def val_resize_size(size: int) -> int:
    """Short side before the centre crop: 256 for 224, in proportion otherwise."""
    return (size * 256) // 224


def pil_train_transform(
    size: int,
    scale: tuple[float, float] = RRC_SCALE,
    ratio: tuple[float, float] = RRC_RATIO,
) -> v2.Compose:
    """The per-image train pipeline of the torchvision loader (PIL in, uint8 CHW out)."""
    return v2.Compose(
        [
            v2.RandomResizedCrop(size, scale=scale, ratio=ratio, antialias=True),
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


# ---------------------------------------------------------------------------------------------
# Batched random-resized crop: one box per image, sampled for the whole batch at once.


def sample_rrc_boxes(
    heights: torch.Tensor,
    widths: torch.Tensor,
    generator: torch.Generator,
    scale: tuple[float, float] = RRC_SCALE,
    ratio: tuple[float, float] = RRC_RATIO,
    attempts: int = 10,
) -> torch.Tensor:
    """Boxes ``(top, left, height, width)`` (int64, N x 4), one per image of size (h, w).

    The same distribution as torchvision's ``RandomResizedCrop.get_params`` (area fraction
    uniform in ``scale``, log-aspect uniform in ``ratio``, up to ``attempts`` tries, then the
    central crop clamped to ``ratio``), vectorised over the batch.
    """
    heights = heights.to(torch.float64)
    widths = widths.to(torch.float64)
    n = heights.shape[0]
    area = (heights * widths)[:, None]
    target_area = area * torch.empty(n, attempts, dtype=torch.float64).uniform_(
        scale[0], scale[1], generator=generator
    )
    log_ratio = torch.empty(n, attempts, dtype=torch.float64).uniform_(
        math.log(ratio[0]), math.log(ratio[1]), generator=generator
    )
    aspect = torch.exp(log_ratio)
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
    box_w = torch.where(first >= 0, w[rows, pick], fb_w)
    box_h = torch.where(first >= 0, h[rows, pick], fb_h)
    u = torch.rand(n, 2, dtype=torch.float64, generator=generator)
    top = torch.where(
        first >= 0, torch.floor(u[:, 0] * (heights - box_h + 1)), torch.floor((heights - box_h) / 2)
    )
    left = torch.where(
        first >= 0, torch.floor(u[:, 1] * (widths - box_w + 1)), torch.floor((widths - box_w) / 2)
    )
    return torch.stack([top, left, box_h, box_w], dim=1).to(torch.int64)


def sample_flips(n: int, generator: torch.Generator, p: float = 0.5) -> torch.Tensor:
    """Bool (N,): which images to flip horizontally."""
    return torch.rand(n, generator=generator) < p


def resized_crop_batch(
    images: torch.Tensor, boxes: torch.Tensor, size: int, flips: torch.Tensor | None = None
) -> torch.Tensor:
    """Crop a box from each image and resize it to ``size`` x ``size``: one call per batch.

    ``images`` is uint8 or float NCHW on any device; ``boxes`` holds ``(top, left, h, w)`` in
    pixels. Bilinear with area averaging when shrinking (``roi_align``'s adaptive sampling),
    so a large box is anti-aliased as PIL's resize would be. Returns uint8 NCHW.
    """
    from torchvision.ops import roi_align

    n = images.shape[0]
    boxes = boxes.to(device=images.device, dtype=torch.float32)
    top, left, h, w = boxes.unbind(dim=1)
    rois = torch.stack(
        [torch.arange(n, device=images.device, dtype=torch.float32), left, top, left + w, top + h],
        dim=1,
    )
    out = roi_align(
        images.float(),
        rois,
        output_size=(size, size),
        spatial_scale=1.0,
        sampling_ratio=-1,
        aligned=True,
    )
    if flips is not None:
        flips = flips.to(images.device)
        out = torch.where(flips[:, None, None, None], out.flip(-1), out)
    return out.round_().clamp_(0, 255).to(torch.uint8)


def resized_crop_batch_uint8(
    images: torch.Tensor,
    boxes: torch.Tensor,
    size: int,
    flips: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """``resized_crop_batch`` for uint8 images on the CPU, about 20x cheaper there.

    roi_align has no uint8 kernel, so on the CPU it converts the whole batch to float and runs a
    scalar loop; torch's antialiased bilinear uint8 kernel (vectorised, PIL's triangle filter)
    does the same crop and resize straight from uint8, fastest on channels-last storage. It
    takes one box at a time, so it is called once per image; each call releases the GIL, so
    several threads can share the work. Returns uint8 NCHW in channels-last memory format
    (writing NCHW-contiguous costs about 40% more), in ``out`` when given (N, C, size, size).
    """
    import torch.nn.functional as F

    n, channels = images.shape[0], images.shape[1]
    if out is None:
        out = torch.empty((n, size, size, channels), dtype=torch.uint8).permute(0, 3, 1, 2)
    flip_list = [False] * n if flips is None else flips.tolist()
    for i, (top, left, h, w) in enumerate(boxes.tolist()):
        crop = images[i : i + 1, :, top : top + h, left : left + w]
        resized = F.interpolate(crop, size=(size, size), mode="bilinear", antialias=True)[0]
        out[i].copy_(resized.flip(-1) if flip_list[i] else resized)
    return out


def crop_resize_flip_batch(
    images: torch.Tensor,
    boxes: torch.Tensor,
    size: int,
    flips: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """The batched random-resized crop and flip with the fastest kernel for where images are.

    uint8 on the CPU: ``resized_crop_batch_uint8``; anywhere else (a GPU, float images):
    ``resized_crop_batch`` (one roi_align call). Both return uint8 NCHW ``size`` x ``size``
    (in ``out`` when given); they agree to within a few grey levels, not bit for bit.
    """
    if images.device.type == "cpu" and images.dtype == torch.uint8:
        return resized_crop_batch_uint8(images, boxes, size, flips, out=out)
    result = resized_crop_batch(images, boxes, size, flips)
    return result if out is None else out.copy_(result)


def batch_generator(seed: int, epoch: int, rank: int, batch: int) -> torch.Generator:
    """A CPU generator for one batch's random augmentation, from (seed, epoch, rank, batch).

    Per batch rather than per loader, so that the boxes and flips do not depend on which thread
    or process prepares a batch, or in which order: a run is reproducible from its seed.
    """
    key = f"{seed}/{epoch}/{rank}/{batch}".encode()
    digest = hashlib.blake2b(key, digest_size=8).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest, "little") >> 1)
