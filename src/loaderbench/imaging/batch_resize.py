"""A batch of boxes resized (and flipped) on the CPU in one call that holds no GIL.

memmap's reading threads resize each train box into its slot of the batch. Image by image, the
Python around each resize (the box's view, the flip, the call) holds the GIL and the threads
wait for each other's; so the batch's loop runs in TorchScript, whose interpreter releases the
GIL for the call (deprecated, but still torch's one way to run a loop of ATen calls without the
GIL). Where it cannot compile, the same loop runs in Python (``scripted=False``), with the same
pixels to the bit. The flip is the box's one copy: torch's uint8 kernel copies a box that is
not contiguous channels-last before it resizes anyway, and its symmetric taps resize a mirrored
box to the mirrored output. docs/measurements.md ("memmap: the crop path") has the figures.
"""

from __future__ import annotations

import logging
import threading
import warnings
from typing import Any

import torch

log = logging.getLogger(__name__)


def _rows_loop(
    rows: torch.Tensor,
    index: torch.Tensor,
    boxes: torch.Tensor,
    flips: torch.Tensor,
    out: torch.Tensor,
) -> None:
    """Box ``boxes[k]`` (top, left, h, w) of stored channels-last row ``index[k]`` of ``rows``
    (N, H, W, C), mirrored where ``flips[k]``, resized into ``out[k]`` (n, C, S, S)."""
    s_image, s_y, s_x, s_channel = rows.stride(0), rows.stride(1), rows.stride(2), rows.stride(3)
    channels = rows.size(3)
    base = rows.storage_offset()
    size = [out.size(2), out.size(3)]
    at: list[int] = index.tolist()
    cut: list[list[int]] = boxes.tolist()
    mirror: list[bool] = flips.tolist()
    for k in range(len(at)):
        top, left, h, w = cut[k][0], cut[k][1], cut[k][2], cut[k][3]
        # The batch stride spans the box, so that the box reads as channels-last.
        extent = max(s_channel * channels, max(s_y * h, s_x * w))
        start = base + at[k] * s_image + top * s_y + left * s_x
        box = rows.as_strided([1, channels, h, w], [extent, s_channel, s_y, s_x], start)
        if mirror[k]:
            box = box.flip(-1)
        # torch's uint8 antialiased bilinear kernel (F.interpolate's), through its out=
        # overload: the box is written straight into its slot of the batch.
        torch.ops.aten._upsample_bilinear2d_aa(
            box, size, False, None, None, out=out.narrow(0, k, 1)
        )


def _images_loop(
    images: list[torch.Tensor], boxes: torch.Tensor, flips: torch.Tensor, out: torch.Tensor
) -> None:
    """Box ``boxes[k]`` of uint8 CHW ``images[k]`` (any strides), mirrored where ``flips[k]``,
    resized into ``out[k]`` (n, C, S, S)."""
    size = [out.size(2), out.size(3)]
    cut: list[list[int]] = boxes.tolist()
    mirror: list[bool] = flips.tolist()
    for k in range(len(images)):
        top, left, h, w = cut[k][0], cut[k][1], cut[k][2], cut[k][3]
        box = images[k].narrow(1, top, h).narrow(2, left, w).unsqueeze(0)
        if mirror[k]:
            box = box.flip(-1)
        if box.stride(1) != 1:
            # Planar (CHW) pixels, as decoders give them: the kernel copies such a box to
            # channels-last anyway, and a planar one into a channels-last slot trips its
            # internal assert (torch 2.14).
            box = box.contiguous(memory_format=torch.channels_last)
        torch.ops.aten._upsample_bilinear2d_aa(
            box, size, False, None, None, out=out.narrow(0, k, 1)
        )


_compiled: dict[str, Any] = {}
_compile_lock = threading.Lock()


def _loop(name: str, scripted: bool | None) -> Any:
    """The loop ``name`` compiled by TorchScript (once per process), or in Python where
    ``scripted`` is False or TorchScript cannot compile it here."""
    python = _rows_loop if name == "rows" else _images_loop
    if scripted is False:
        return python
    compiled = _compiled.get(name)
    if compiled is not None:  # every batch but the first: no lock taken
        return compiled
    with _compile_lock:
        if name not in _compiled:
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", FutureWarning)  # "torch.jit is deprecated"
                    _compiled[name] = torch.jit.script(python)
            except Exception as error:  # no TorchScript here: the loop in Python
                log.warning("TorchScript cannot compile the crop loop (%s): Python runs it", error)
                _compiled[name] = python
        return _compiled[name]


def warm_up() -> None:
    """Compile the loops and run each a few times on a tiny batch: TorchScript compiles at the
    first call and optimises over the next ones, which a loader pays when it is built rather
    than in its first batch (``ttfb_s``)."""
    rows = torch.zeros((1, 4, 4, 3), dtype=torch.uint8)
    out = torch.empty((1, 2, 2, 3), dtype=torch.uint8).permute(0, 3, 1, 2)
    box, flip = torch.tensor([[0, 0, 4, 4]]), torch.tensor([True])
    for _ in range(3):
        resize_rows_into(rows, torch.tensor([0]), box, flip, out)
        resize_images_into([rows[0].permute(2, 0, 1)], box, flip, out)


def scripted_available() -> bool:
    """Whether the crop loops run in TorchScript here (for metrics and tests)."""
    return not isinstance(_loop("rows", None), type(_rows_loop))


def resize_rows_into(
    rows: torch.Tensor,
    index: torch.Tensor,
    boxes: torch.Tensor,
    flips: torch.Tensor,
    out: torch.Tensor,
    *,
    scripted: bool | None = None,
) -> torch.Tensor:
    """The boxes of stored channels-last rows, mirrored where ``flips`` says, resized into
    ``out``: one call for the batch (``_rows_loop``)."""
    _loop("rows", scripted)(rows, index, boxes, flips, out)
    return out


def resize_images_into(
    images: list[torch.Tensor],
    boxes: torch.Tensor,
    flips: torch.Tensor,
    out: torch.Tensor,
    *,
    scripted: bool | None = None,
) -> torch.Tensor:
    """The boxes of uint8 CHW images, mirrored where ``flips`` says, resized into ``out``: one
    call for the batch (``_images_loop``)."""
    _loop("images", scripted)(images, boxes, flips, out)
    return out
