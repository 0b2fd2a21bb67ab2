"""A batch of JPEGs read, decoded, cut, flipped and resized on the CPU in two calls that hold
no GIL: ``read_files`` (every file's bytes) and ``decode_into`` (every image decoded whole by
libjpeg-turbo, its box resized into its slot of the batch and mirrored where asked).

Both are TorchScript loops of torchvision's ``image::read_file`` and ``image::decode_jpeg``
(loaded from its extension library alone: importing torchvision is slow), so a batch costs a
thread two Python calls, not a dozen an image, and decode threads scale with cores instead of
queueing for the GIL. nvImageCodec decodes only each box, but costs Python per image with the
GIL held; docs/gil.md ("spdl turbo") has both measurements.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import threading
import warnings
from pathlib import Path
from typing import Any

import torch

from loaderbench.imaging import decoded_by

log = logging.getLogger(__name__)

RGB = 3  # torchvision's ImageReadMode.RGB
LIBRARY = "torchvision"  # the name decoded_by counts these images under


def _read_loop(paths: list[str]) -> list[torch.Tensor]:
    """Every file's bytes (uint8, 1-D)."""
    return [torch.ops.image.read_file(path) for path in paths]


def _decode_loop(
    datas: list[torch.Tensor],
    boxes: list[list[int]],
    flips: list[bool],
    slots: list[int],
    out: torch.Tensor,
) -> None:
    """JPEG ``datas[k]`` decoded whole to RGB, its box ``boxes[k]`` (top, left, h, w) resized
    into ``out[slots[k]]`` (C, S, S) and mirrored where ``flips[k]``."""
    size = [out.size(2), out.size(3)]
    for k in range(len(datas)):
        image = torch.ops.image.decode_jpeg(datas[k], 3, False)  # CHW view of HWC pixels
        top, left, h, w = boxes[k][0], boxes[k][1], boxes[k][2], boxes[k][3]
        s_channel, s_y, s_x = image.stride(0), image.stride(1), image.stride(2)
        channels = image.size(0)
        # The batch stride spans the box, so that the box reads as channels-last.
        extent = max(s_channel * channels, max(s_y * h, s_x * w))
        start = image.storage_offset() + top * s_y + left * s_x
        box = image.as_strided([1, channels, h, w], [extent, s_channel, s_y, s_x], start)
        slot = out.narrow(0, slots[k], 1)
        if h == size[0] and w == size[1]:
            slot.copy_(box)
        else:
            torch.ops.aten._upsample_bilinear2d_aa(box, size, False, None, None, out=slot)
        if flips[k]:
            # The output mirrored, not the box: the filter's taps are symmetric, so the pixels
            # are the same, and 224 x 224 costs less to copy than a photo's box.
            slot.copy_(slot.flip(-1))


_compiled: dict[str, Any] = {}
_lock = threading.Lock()


def _cpus() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # not Linux
        return max(1, os.cpu_count() or 1)


# At most one batch decode a CPU at once. More threads than CPUs (num_workers=8 on 2 cores)
# would only share the CPUs between more decodes, and a thread holding the GIL for its batch's
# bookkeeping would wait behind them for a CPU, stalling every other thread's Python (the
# training loop's included); waiting here, a thread holds no GIL and takes no CPU.
_decoding = threading.BoundedSemaphore(_cpus())


def _load_ops() -> None:
    """torchvision's image ops, from its extension library (without importing torchvision)."""
    if hasattr(torch.ops.image, "decode_jpeg"):
        return
    spec = importlib.util.find_spec("torchvision")
    if spec is None or spec.origin is None:
        raise ImportError("torchvision is not installed")
    folder = Path(spec.origin).parent
    names = [p for p in folder.glob("image*.so") if p.is_file()]
    if not names:
        raise ImportError(f"no image extension library in {folder}")
    torch.ops.load_library(str(sorted(names)[-1]))  # image_stable.so, or image.so


def _loops() -> dict[str, Any]:
    """The two loops compiled (once per process); raises where that cannot be done here."""
    if _compiled:
        return _compiled
    with _lock:
        if not _compiled:
            _load_ops()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", FutureWarning)  # "torch.jit is deprecated"
                loops = {
                    "read": torch.jit.script(_read_loop),
                    "decode": torch.jit.script(_decode_loop),
                }
            _compiled.update(loops)
    return _compiled


def available() -> bool:
    """Whether the batch calls run here (torchvision's image ops load and TorchScript
    compiles); the reason is logged once where they do not."""
    try:
        _loops()
    except Exception as error:  # ImportError, OSError, RuntimeError from TorchScript
        if not _compiled.get("failed"):
            log.warning("batched CPU decode unavailable (%s): decoding image by image", error)
        _compiled["failed"] = True
        return False
    return "read" in _compiled


def warm_up() -> None:
    """Compile the loops and run each a few times (TorchScript optimises over its first
    calls), when the loader is built rather than in its first batch."""
    if not available():
        return
    from loaderbench.imaging.decode._choice import _tiny_jpeg

    data = _tiny_jpeg()
    out = torch.empty((1, 3, 8, 8), dtype=torch.uint8)
    for _ in range(3):
        _compiled["decode"]([data], [[0, 0, 16, 16]], [True], [0], out)


def read_files(paths: list[str]) -> list[torch.Tensor]:
    """Every file's bytes (uint8, 1-D) in one call; raises for a file that cannot be read."""
    return _loops()["read"](paths)


def decode_into(
    datas: list[torch.Tensor],
    boxes: list[list[int]],
    flips: list[bool],
    slots: list[int],
    out: torch.Tensor,
) -> None:
    """JPEG ``datas[k]`` (whole files that ``images.fast_jpeg`` admits) decoded, box
    ``boxes[k]`` (top, left, h, w) resized to ``out``'s size into ``out[slots[k]]`` and
    mirrored where ``flips[k]``, in one call (at most one a CPU at once); raises (with no
    slot's content promised) where any of them fails to decode."""
    decode = _loops()["decode"]
    with _decoding:
        decode(datas, boxes, flips, slots, out)
    decoded_by.note(LIBRARY, len(datas))


__all__ = ["LIBRARY", "available", "decode_into", "read_files", "warm_up"]
