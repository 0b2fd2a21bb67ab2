"""The interface every JPEG backend implements, and what it says it can do.

A backend decodes JPEG bytes (uint8, 1-D, on the CPU) into uint8 RGB CHW images on a device;
``Capabilities`` says on which devices, whether one call decodes a whole batch, whether it
decodes only a box of the image (``region``) and whether it decodes at a reduced, DCT-domain
scale (``scale``: none here does; docs/decoding.md gives the measurement that decided it).
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

import torch

from loaderbench.imaging import decoded_by

Decoded = torch.Tensor | BaseException  # a decoded image, or why that file failed
Box = tuple[int, int, int, int]  # top, left, height, width, in the image's pixels
CPU = torch.device("cpu")


@dataclass(frozen=True)
class Capabilities:
    devices: frozenset[str]  # torch device types it decodes on
    batch: bool  # one call decodes a whole batch (nvJPEG's batched decode)
    region: bool  # decodes only a box of the image
    scale: bool = False  # decodes at a reduced scale in the DCT domain


class JpegBackend(abc.ABC):
    """Decodes JPEG bytes (uint8, 1-D, on the CPU) into uint8 RGB CHW images on a device.

    ``decode`` gives each image's ``box`` (all of it where the box is None): decoded alone
    where the backend can, else cut from the whole image. A failed image comes back as the
    exception saying why, the others still decode. ``admitted``: the bytes are JPEGs this
    project encoded (a memmap jpeg store's), which a backend that checks the loaders' admission
    rule (``images.fast_jpeg``) first may take without parsing their headers again.
    """

    name: ClassVar[str]
    can: ClassVar[Capabilities]

    @abc.abstractmethod
    def load(self) -> None:
        """Import the library; raises where it is missing or does not load."""

    def counted_as(self, device: torch.device) -> str:
        """The ``decoded_by`` key of the images it decodes itself on ``device`` (nvImageCodec's
        names the engine that decodes first there)."""
        return self.name

    @abc.abstractmethod
    def decode_whole(self, datas: list[torch.Tensor], device: torch.device) -> list[torch.Tensor]:
        """Whole images at once; raises if any fails."""

    def decode(
        self,
        datas: Sequence[torch.Tensor],
        device: torch.device,
        boxes: Sequence[Box | None],
        *,
        admitted: bool = False,
    ) -> list[Decoded]:
        datas = list(datas)
        try:
            images: list[Decoded] = list(self.decode_whole(datas, device))
        except RuntimeError:  # one by one, so that each bad file gets its own error
            images = []
            for data in datas:
                try:
                    images.append(self.decode_whole([data], device)[0])
                except RuntimeError as error:
                    images.append(error)
        decoded_by.note(self.name, sum(not isinstance(i, BaseException) for i in images))
        return [cut(image, box) for image, box in zip(images, boxes, strict=True)]


def cut(image: Decoded, box: Box | None) -> Decoded:
    """The box of a whole decoded image (a view)."""
    if box is None or isinstance(image, BaseException):
        return image
    check_box(box, image.shape[-2], image.shape[-1])
    top, left, h, w = box
    return image[:, top : top + h, left : left + w]


def check_box(box: Box, height: int, width: int) -> None:
    """A box must lie inside its image: the loaders draw them from the image's size, so one
    that does not is a bug, and no backend would agree with another on its pixels."""
    top, left, h, w = box
    if not (h > 0 and w > 0 and 0 <= top and top + h <= height and 0 <= left and left + w <= width):
        raise ValueError(
            f"box (top, left, h, w) = {tuple(box)} is not inside a {width}x{height} image"
        )
