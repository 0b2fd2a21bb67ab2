"""A batch of boxes resized on any device in a few kernels, with the CPU path's pixels.

torch's uint8 antialiased bilinear kernel (the CPU path: ``transforms.resize_uint8``,
``batch_resize``) is separable: a horizontal pass rounded to uint8, then a vertical one, each
output pixel a normalised weighted sum of the box's pixels. Here those weights are built for the
whole batch at once, as matrices zero outside each image's box, and each pass is one batched
matmul (a flip is the horizontal matrix's rows reversed): the same handful of kernels whatever
the boxes, and the CPU kernel's pixels but for its fixed-point weights
(tests/test_device_resize.py). ``resize_boxes`` takes images of one stored size (memmap's raw
rows), ``resize_images`` images of any sizes (decoded JPEG boxes, padded into chunks).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

# The float rows one matmul step converts at once: 256 stored rows of 3 x 336 x 336 are 347 MB
# in float, so such a batch goes in 2-3 steps.
CHUNK_BYTES = 192 * 2**20


def axis_weights(
    start: torch.Tensor,
    length: torch.Tensor,
    resized: torch.Tensor,
    offset: torch.Tensor,
    out_size: int,
    full: int,
    flip: torch.Tensor | None = None,
) -> torch.Tensor:
    """The antialiased bilinear weights of one axis, for every image at once: (n, out_size,
    full) float32 on ``start``'s device.

    Image k's pixels ``[start, start + length)`` of an axis ``full`` long are resized to
    ``resized`` pixels, of which ``out_size`` are kept from ``offset`` on (a centre crop after
    the resize; 0 and ``resized == out_size`` otherwise); ``flip`` reverses the kept pixels.
    The filter is the one torch's antialiased kernel computes (``aten/src/ATen/native/cpu/
    UpSampleKernel.cpp``, ``_compute_indices_min_size_weights_aa``): scale = length / resized,
    support = max(scale, 1), taps from trunc(centre - support + 0.5) to trunc(centre + support +
    0.5) clamped to the box, triangle weights normalised to sum to 1.
    """
    device = start.device
    length = length.to(torch.float64)
    scale = (length / resized.to(torch.float64))[:, None, None]  # (n, 1, 1)
    support = scale.clamp(min=1.0)
    inverse = 1.0 / support
    kept = torch.arange(out_size, device=device, dtype=torch.float64)[None, :, None]
    if flip is not None:
        kept = torch.where(flip.to(torch.bool)[:, None, None], out_size - 1 - kept, kept)
    centre = (kept + offset.to(torch.float64)[:, None, None] + 0.5) * scale  # (n, S, 1)
    first = (centre - support + 0.5).trunc().clamp(min=0.0)
    last = torch.minimum((centre + support + 0.5).trunc(), length[:, None, None])
    # The tap at x (box coordinates) of the output pixel: filter((x - centre + 0.5) / support).
    x = torch.arange(full, device=device, dtype=torch.float64)[None, None, :]
    x = x - start.to(torch.float64)[:, None, None]  # (n, 1, full)
    weights = (1.0 - ((x - centre + 0.5) * inverse).abs()).clamp(min=0.0)
    weights = torch.where((x >= first) & (x < last), weights, 0.0)
    total = weights.sum(-1, keepdim=True)
    return (weights / torch.where(total > 0, total, 1.0)).to(torch.float32)


def _exact_dtype(device: torch.device) -> torch.dtype:
    """float32, or float64 where fp32 matmuls are allowed a lower precision (TF32), whose
    rounding would move pixels by a grey level here and there."""
    if device.type == "cuda" and torch.get_float32_matmul_precision() != "highest":
        return torch.float64
    return torch.float32


def _rounded(values: torch.Tensor) -> torch.Tensor:
    """Round half up and clip to uint8's range, as the CPU kernel's fixed-point passes do."""
    return values.add_(0.5).floor_().clamp_(0, 255)


def _geometry(
    boxes: torch.Tensor,
    size: int,
    resized: torch.Tensor | None,
    offsets: torch.Tensor | None,
    device: torch.device,
) -> torch.Tensor:
    """(n, 8) int64 on ``device`` in one copy: top, left, h, w, resized h, w, offset y, x."""
    n = len(boxes)
    if resized is None:
        resized = torch.full((n, 2), size, dtype=torch.int64)
    if offsets is None:
        offsets = torch.zeros((n, 2), dtype=torch.int64)
    table = torch.cat([boxes.to(torch.int64), resized.to(torch.int64), offsets.to(torch.int64)], 1)
    return table.to(device, non_blocking=True)


def resize_boxes(
    images: torch.Tensor,
    boxes: torch.Tensor,
    size: int,
    flips: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    *,
    resized: torch.Tensor | None = None,
    offsets: torch.Tensor | None = None,
    chunk_bytes: int = CHUNK_BYTES,
) -> torch.Tensor:
    """The box ``(top, left, h, w)`` of each uint8 image of an (n, C, H, W) batch (any strides,
    any device) resized to ``size`` x ``size`` (or to ``resized`` (n, 2), then cut ``size`` x
    ``size`` from ``offsets`` (n, 2)), mirrored where ``flips``: into ``out`` (n, C, size, size).
    A few kernels a step of ``chunk_bytes`` of float rows, whatever the boxes."""
    n, channels, height, width = images.shape
    device = images.device
    if out is None:
        out = torch.empty((n, channels, size, size), dtype=torch.uint8, device=device)
    if n == 0:
        return out
    table = _geometry(boxes, size, resized, offsets, device)
    flip = None if flips is None else flips.to(device, non_blocking=True)
    dtype = _exact_dtype(device)
    step = max(1, chunk_bytes // max(1, images[0].numel() * dtype.itemsize))
    for begin in range(0, n, step):  # the weights too a step at a time: bounded memory
        end = min(n, begin + step)
        top, left, h, w, resize_h, resize_w, offset_y, offset_x = table[begin:end].unbind(1)
        mirror = None if flip is None else flip[begin:end]
        across = axis_weights(left, w, resize_w, offset_x, size, width, mirror)  # (n, S, W)
        down = axis_weights(top, h, resize_h, offset_y, size, height)  # (n, S, H)
        rows = images[begin:end].to(dtype)
        horizontal = torch.matmul(rows, across.to(dtype)[:, None].transpose(-1, -2))
        del rows  # the chunk's float rows go before its second pass
        vertical = _rounded(torch.matmul(down.to(dtype)[:, None], _rounded(horizontal)))
        out[begin:end].copy_(vertical)
    return out


def _chunks(heights: list[int], widths: list[int], budget: int, channels: int) -> list[list[int]]:
    """Image positions grouped by size (largest first) so that each group, padded to its
    largest height and width, holds at most ``budget`` bytes of float rows (at least one)."""
    order = sorted(range(len(heights)), key=lambda k: (heights[k], widths[k]), reverse=True)
    groups: list[list[int]] = []
    group: list[int] = []
    tall = wide = 0
    for k in order:
        new_tall, new_wide = max(tall, heights[k]), max(wide, widths[k])
        if group and (len(group) + 1) * channels * new_tall * new_wide * 4 > budget:
            groups.append(group)
            group, new_tall, new_wide = [], heights[k], widths[k]
        group.append(k)
        tall, wide = new_tall, new_wide
    if group:
        groups.append(group)
    return groups


def resize_images(
    images: Sequence[torch.Tensor],
    size: int,
    flips: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    *,
    resized: torch.Tensor | None = None,
    offsets: torch.Tensor | None = None,
    chunk_bytes: int = CHUNK_BYTES,
) -> torch.Tensor:
    """Whole uint8 CHW images of any sizes (and strides: nvImageCodec's HWC views) on one
    device, each resized as ``resize_boxes`` does its box: into ``out`` (n, C, size, size).

    Images of similar sizes are padded into one batch (a copy each: the one step an image
    takes alone), a group at a time (``_chunks``), and resized in a few kernels per group."""
    n = len(images)
    channels = images[0].shape[0] if n else 3
    device = images[0].device if n else torch.device("cpu")
    if out is None:
        out = torch.empty((n, channels, size, size), dtype=torch.uint8, device=device)
    if n == 0:
        return out
    heights = [int(image.shape[-2]) for image in images]
    widths = [int(image.shape[-1]) for image in images]
    boxes = torch.tensor([[0, 0, h, w] for h, w in zip(heights, widths, strict=True)])
    for group in _chunks(heights, widths, chunk_bytes, channels):
        tall, wide = max(heights[k] for k in group), max(widths[k] for k in group)
        padded = torch.empty((len(group), channels, tall, wide), dtype=torch.uint8, device=device)
        torch._foreach_copy_(
            [padded[i, :, : heights[k], : widths[k]] for i, k in enumerate(group)],
            [images[k] for k in group],
        )
        index = torch.tensor(group)
        pick = index.to(device, non_blocking=True)
        done = resize_boxes(
            padded,
            boxes[index],
            size,
            None if flips is None else flips[index],
            resized=None if resized is None else resized[index],
            offsets=None if offsets is None else offsets[index],
            chunk_bytes=chunk_bytes,
        )
        out.index_copy_(0, pick, done)
    return out


__all__ = ["CHUNK_BYTES", "axis_weights", "resize_boxes", "resize_images"]
