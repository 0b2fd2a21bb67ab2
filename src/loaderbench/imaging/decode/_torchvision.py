"""``torchvision.io`` (deprecated in favour of TorchCodec): the same libraries, for where
TorchCodec's native library does not load either (it is built for one torch release); then
the only GPU decoder left."""

from __future__ import annotations

import torch

from loaderbench.imaging.decode._base import Capabilities, JpegBackend


class TorchvisionBackend(JpegBackend):
    name = "torchvision"
    can = Capabilities(frozenset({"cpu", "cuda"}), batch=True, region=False)

    def load(self) -> None:
        from torchvision.io import decode_jpeg  # noqa: F401

        import loaderbench.imaging.files  # noqa: F401 - filters torchvision's deprecation warning

    def decode_whole(self, datas: list[torch.Tensor], device: torch.device) -> list[torch.Tensor]:
        from torchvision.io import ImageReadMode, decode_jpeg

        if device.type == "cpu":  # one by one: its CPU list form is a Python loop anyway
            return [decode_jpeg(data, mode=ImageReadMode.RGB) for data in datas]
        return list(decode_jpeg(datas, mode=ImageReadMode.RGB, device=device))
