"""Image transforms shared by the loaders: the per-image reference pipeline and batched ops.

The geometry is fixed once here so that every loader hands the model the same kind of image:

* val: resize the short side to ``val_resize_size(size)`` (256 for 224), then centre-crop
  ``size`` x ``size``, as in torchvision's ImageNet references;
* train: a random-resized crop (scale 0.08-1, ratio 3/4-4/3) to ``size`` x ``size`` plus a random
  horizontal flip, each image's drawn by ``loaderbench.imaging.crops`` from (seed, epoch, image)
  (``seeded_crops``), whichever loader, process or thread prepares it.

All outputs are uint8 CHW / NCHW; normalisation happens on the device, in the model wrapper.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from loaderbench.imaging.batch_resize import resize_images_into, resize_rows_into
from loaderbench.imaging.crops import RRC_RATIO, RRC_SCALE, seeded_crops

if TYPE_CHECKING:  # annotations only: PIL and torchvision load where a loader needs them
    from PIL import Image
    from torchvision.transforms import v2


def val_resize_size(size: int) -> int:
    """Short side before the centre crop: 256 for 224, in proportion otherwise."""
    return (size * 256) // 224


def pil_val_transform(size: int) -> v2.Compose:
    """The per-image val pipeline (PIL in, uint8 CHW out); the reference every loader matches."""
    # Imported here: torchvision's import costs ~1.5 s of CPU (it pulls in torch._dynamo), which
    # memmap and spdl runs, and each of their worker processes, need not pay.
    from torchvision.transforms import v2

    return v2.Compose(
        [
            v2.Resize(val_resize_size(size), antialias=True),
            v2.CenterCrop(size),
            v2.PILToTensor(),
        ]
    )


@dataclass(frozen=True)
class PilTrainTransform:
    """The per-image train pipeline (PIL in, uint8 CHW out): RandomResizedCrop to ``size`` and
    RandomHorizontalFlip, their parameters drawn by ``seeded_crops`` from (seed, epoch, image),
    so a PIL-based loader gives every other loader's crops. Called as
    ``transform(image, index, epoch)``; a loader builds it from its spec:
    ``PilTrainTransform(spec.image_size, spec.seed, spec.rrc_scale, spec.rrc_ratio)``."""

    size: int
    seed: int
    scale: tuple[float, float] = RRC_SCALE
    ratio: tuple[float, float] = RRC_RATIO

    def __post_init__(self) -> None:
        # torchvision imported where the transform is made, not where this module is (its
        # import is costly, see pil_val_transform): a loader's forked workers inherit it.
        import torchvision.transforms.v2.functional  # noqa: F401

    def __call__(self, image: Image.Image, index: int, epoch: int) -> torch.Tensor:
        from torchvision.transforms.v2 import functional as TF

        width, height = image.size
        boxes, flips = seeded_crops(
            [height], [width], self.seed, epoch, [index], self.scale, self.ratio
        )
        top, left, h, w = boxes[0].tolist()
        image = TF.resized_crop(image, top, left, h, w, [self.size] * 2, antialias=True)
        if flips[0]:
            image = TF.horizontal_flip(image)
        return TF.pil_to_tensor(image)


def normalize_uint8(images: torch.Tensor, mean: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
    """uint8 NCHW in [0, 255] -> float, normalised with per-channel mean/std given in [0, 1]."""
    return (images.float() - mean.view(1, -1, 1, 1) * 255) / (std.view(1, -1, 1, 1) * 255)


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
    # image_box, not image[None]: its batch stride keeps a channels-last image channels-last,
    # and so the output, which the kernel writes twice as fast as a planar one.
    batch = image[None].float() if via_float else image_box(image, (0, 0, *image.shape[-2:]))
    out = F.interpolate(batch, size=size, mode="bilinear", antialias=True, align_corners=False)[0]
    if out.dtype != torch.uint8:
        out = out.round_().clamp_(0, 255).to(torch.uint8)
    return out


# torch's uint8 antialiased bilinear kernel (what F.interpolate(antialias=True) calls), through its
# out= overload: the resized box is written straight into its place in the batch, with no
# tensor allocated and nothing copied after. At 224 px from ImageNet-like boxes that is half the
# cost of F.interpolate + copy (whose new tensor, laid out NCHW for a box view, is slow to write).
_resize_aa = torch._C._nn._upsample_bilinear2d_aa


def _box_view(
    base: torch.Tensor,
    offset: int,
    channels: int,
    strides: tuple[int, int, int],
    box: Sequence[int],
) -> torch.Tensor:
    """The box ``(top, left, h, w)`` of the image at ``offset`` in ``base``'s storage, whose
    channel, row and column strides are ``strides``, as a (1, C, h, w) view: one ``as_strided``
    call (cheaper than indexing, permute and unsqueeze). The batch stride spans the box, so
    that a channels-last image's box reads as channels-last to the kernel."""
    top, left, h, w = box
    channel, y, x = strides
    extent = max(channel * channels, y * h, x * w)
    start = offset + top * y + left * x
    return base.as_strided((1, channels, h, w), (extent, channel, y, x), start)


def image_box(image: torch.Tensor, box: Sequence[int]) -> torch.Tensor:
    """The box ``(top, left, h, w)`` of a CHW image (any strides) as a (1, C, h, w) view."""
    channel, y, x = image.stride()
    return _box_view(image, image.storage_offset(), image.shape[0], (channel, y, x), box)


def stored_box(rows: torch.Tensor, row: int, box: Sequence[int]) -> torch.Tensor:
    """The box ``(top, left, h, w)`` of image ``row`` of channels-last rows (N, H, W, C) as a
    (1, C, h, w) view: nothing is copied, and over a memory map only the box's lines are read."""
    image, y, x, channel = rows.stride()
    offset = rows.storage_offset() + row * image
    return _box_view(rows, offset, rows.shape[3], (channel, y, x), box)


def resize_into(box: torch.Tensor, slot: torch.Tensor, flip: bool = False) -> None:
    """Resize a uint8 (1, C, h, w) box on the CPU to ``slot``'s size, in place into ``slot``
    (1, C, S, S; channels-last is the kernel's fast layout), mirrored where ``flip``: the pixels
    of ``resize_uint8`` (then ``flip(-1)``).

    The box is flipped, not the output: the filter's taps are symmetric, so a mirrored box
    resizes to the mirrored output (to the bit: tests check it), and flipping the box costs
    less than a flip of the output and a copy into the slot."""
    if flip:
        box = box.flip(-1)
    if box.stride(1) != 1:
        # Planar (CHW) pixels, as decoders give them: the kernel copies a box that is not
        # contiguous to channels-last anyway, and a contiguous planar one into a channels-last
        # slot trips its internal assert (torch 2.14).
        box = box.contiguous(memory_format=torch.channels_last)
    _resize_aa(box, slot.shape[-2:], False, None, None, out=slot)


def _batch_out(n: int, size: int, channels: int, device: torch.device) -> torch.Tensor:
    """A new (n, C, size, size) uint8 batch, channels-last (the uint8 kernel's fast layout)."""
    out = torch.empty((n, size, size, channels), dtype=torch.uint8, device=device)
    return out.permute(0, 3, 1, 2)


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
    size), by default channels-last on the CPU (writing NCHW-contiguous costs more there).

    One box at a time, so the memory beyond ``out`` is bounded by one box and one output image
    (in float off the CPU), whatever the batch size (the CUDA loaders resize a batch at once
    with ``device_resize`` instead). On the CPU each box is resized straight into
    ``out``, the whole batch in one call that holds no GIL (``batch_resize``).
    """
    n, channels = len(images), images[0].shape[0] if len(images) else 3
    if out is None:
        out = _batch_out(n, size, channels, images[0].device if n else torch.device("cpu"))
    in_place = out.device.type == "cpu" and not via_float
    if in_place and all(image.dtype == torch.uint8 for image in images):
        return resize_images_into(list(images), boxes, _flips_or_none(flips, n), out)
    flip_list = None if flips is None else flips.tolist()
    for i, (top, left, h, w) in enumerate(boxes.tolist()):
        crop = images[i][:, top : top + h, left : left + w]
        resized = resize_uint8(crop, (size, size), via_float=via_float)
        out[i].copy_(resized.flip(-1) if flip_list and flip_list[i] else resized)
    return out


def _flips_or_none(flips: torch.Tensor | None, n: int) -> torch.Tensor:
    return torch.zeros(n, dtype=torch.bool) if flips is None else flips


def crop_resize_flip_rows(
    rows: torch.Tensor,
    indices: Sequence[int] | torch.Tensor,
    boxes: torch.Tensor,
    size: int,
    flips: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """The boxes of images ``indices`` of channels-last stored rows (N, H, W, C: a memory map,
    on the CPU) resized (and flipped) into ``out`` (n, C, size, size): cut straight from the
    rows, so only the boxes' lines are read and no row is gathered first; the whole batch in
    one call that holds no GIL (``batch_resize``)."""
    n = len(indices)
    if out is None:
        out = _batch_out(n, size, rows.shape[3], rows.device)
    index = torch.as_tensor(indices, dtype=torch.int64)
    return resize_rows_into(rows, index, boxes, _flips_or_none(flips, n), out)


def crop_resize_flip_batch(
    images: torch.Tensor,
    boxes: torch.Tensor,
    size: int,
    flips: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """``resized_crop_images`` for a uint8 NCHW batch of one stored size (memmap's rows)."""
    return resized_crop_images(list(images.unbind(0)), boxes, size, flips, out)
