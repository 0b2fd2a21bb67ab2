"""Models: timm architectures by name, behind a wrapper whose first layer normalises uint8."""

from __future__ import annotations

import logging

import torch
from torch import nn

from loaderbench.config.schema import ModelConfig
from loaderbench.imaging.transforms import normalize_uint8

log = logging.getLogger(__name__)

NO_MODEL = "none"


class ImageClassifier(nn.Module):
    """uint8 NCHW images on the device -> logits.

    Normalising here rather than in the loader keeps the loaders' output identical (uint8 at
    a quarter of float32's bytes on the bus) and lets the normalisation fuse with the first
    convolution under torch.compile.
    """

    def __init__(
        self,
        backbone: nn.Module,
        mean: tuple[float, ...],
        std: tuple[float, ...],
        channels_last: bool = False,
    ) -> None:
        super().__init__()
        self.backbone = backbone
        self.channels_last = channels_last
        self.register_buffer("mean", torch.tensor(mean, dtype=torch.float32), persistent=False)
        self.register_buffer("std", torch.tensor(std, dtype=torch.float32), persistent=False)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        x = normalize_uint8(images, self.mean, self.std)
        # Every loader's batch reaches the backbone in the same layout (a loader may hand over
        # channels-last uint8, which would otherwise speed up the CPU step and skew the race).
        layout = torch.channels_last if self.channels_last else torch.contiguous_format
        return self.backbone(x.contiguous(memory_format=layout))


def create_backbone(model_config: ModelConfig, num_classes: int) -> nn.Module:
    import timm  # here, not at the top: model=none runs need neither timm nor torchvision

    kwargs = dict(model_config.kwargs or {})
    try:
        return timm.create_model(
            model_config.name,
            pretrained=model_config.pretrained,
            num_classes=num_classes,
            drop_rate=model_config.drop_rate,
            **kwargs,
        )
    except RuntimeError as error:
        if "Unknown model" in str(error):
            raise ValueError(
                f"model.name={model_config.name!r} is not a timm architecture "
                f"(see timm.list_models(); e.g. resnet18, resnet50, mobilenetv3_large_100)"
            ) from error
        raise


def build_model(
    model_config: ModelConfig, num_classes: int, device: torch.device
) -> ImageClassifier | None:
    """The configured model on ``device``, or None for ``model=none``."""
    if model_config.name == NO_MODEL:
        return None
    import timm.data

    backbone = create_backbone(model_config, num_classes)
    data_cfg = timm.data.resolve_model_data_config(backbone)
    model = ImageClassifier(backbone, data_cfg["mean"], data_cfg["std"], model_config.channels_last)
    model.to(device)
    if model_config.channels_last:
        model.to(memory_format=torch.channels_last)
    params = sum(p.numel() for p in model.parameters())
    log.info("model %s: %.2fM parameters, %d classes", model_config.name, params / 1e6, num_classes)
    return model


def maybe_compile(model: nn.Module, model_config: ModelConfig) -> nn.Module:
    if not model_config.compile:
        return model
    log.info("compiling the model (mode=%s)", model_config.compile_mode)
    return torch.compile(model, mode=model_config.compile_mode)
