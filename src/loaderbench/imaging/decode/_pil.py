"""Pillow: always there, the CPU's last resort and the reference the other backends match
(its CMYK and YCCK conversion included)."""

from __future__ import annotations

import io
from collections.abc import Sequence

import torch

from loaderbench.imaging import decoded_by
from loaderbench.imaging.decode._base import Box, Capabilities, Decoded, JpegBackend, check_box


class PilBackend(JpegBackend):
    name = "pil"
    can = Capabilities(frozenset({"cpu"}), batch=False, region=False)

    def load(self) -> None:
        import PIL.Image  # noqa: F401

    def decode_whole(self, datas: list[torch.Tensor], device: torch.device) -> list[torch.Tensor]:
        return [decode_pil(data) for data in datas]

    def decode(
        self,
        datas: Sequence[torch.Tensor],
        device: torch.device,
        boxes: Sequence[Box | None],
        *,
        admitted: bool = False,
    ) -> list[Decoded]:
        results: list[Decoded] = []
        for data, box in zip(datas, boxes, strict=True):
            try:
                results.append(decode_pil(data, box))
            except OSError as error:  # PIL's error for a file it cannot read
                results.append(error)
        return results


def decode_pil(data: torch.Tensor, box: Box | None = None) -> torch.Tensor:
    """JPEG bytes decoded by Pillow into RGB (``images.to_rgb``: its CMYK and YCCK conversion
    is the reference), cut to ``box``; uint8 CHW."""
    import numpy as np
    from PIL import Image

    from loaderbench.imaging.files import to_rgb

    image = Image.open(io.BytesIO(data.numpy().tobytes()))
    image = to_rgb(image)
    if box is not None:
        check_box(box, image.height, image.width)
        top, left, h, w = box
        image = image.crop((left, top, left + w, top + h))
    pixels = torch.from_numpy(np.array(image)).permute(2, 0, 1)
    decoded_by.note("pil")
    return pixels
