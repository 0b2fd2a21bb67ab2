"""TorchCodec: libjpeg-turbo on the CPU and a batched nvJPEG on a GPU, whole images only; kept
for where nvImageCodec does not load. It applies a JPEG's EXIF orientation with no switch to
stop it, so the loaders send such files to PIL (``images.fast_jpeg``)."""

from __future__ import annotations

import torch

from loaderbench.imaging.decode._base import Capabilities, JpegBackend


class TorchCodecBackend(JpegBackend):
    name = "torchcodec"
    can = Capabilities(frozenset({"cpu", "cuda"}), batch=True, region=False)

    def load(self) -> None:
        from torchcodec.decoders import decode_jpeg  # noqa: F401

    def decode_whole(self, datas: list[torch.Tensor], device: torch.device) -> list[torch.Tensor]:
        from torchcodec.decoders import decode_jpeg

        return list(decode_jpeg(datas, mode="RGB", device=device))
