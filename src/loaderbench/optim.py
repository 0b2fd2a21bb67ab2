"""Optimizers and learning-rate schedules by name (registries, not if-chains)."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from omegaconf import DictConfig
from torch import nn


def _param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """No weight decay on biases and normalisation parameters (1-D tensors)."""
    decay, no_decay = [], []
    for param in model.parameters():
        if param.requires_grad:
            (no_decay if param.ndim <= 1 else decay).append(param)
    return [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]


def _sgd(cfg: DictConfig, model: nn.Module) -> torch.optim.Optimizer:
    return torch.optim.SGD(
        _param_groups(model, cfg.weight_decay),
        lr=cfg.lr,
        momentum=cfg.momentum,
        nesterov=cfg.nesterov and cfg.momentum > 0,
    )


def _adamw(cfg: DictConfig, model: nn.Module) -> torch.optim.Optimizer:
    return torch.optim.AdamW(
        _param_groups(model, cfg.weight_decay), lr=cfg.lr, betas=tuple(cfg.betas)
    )


OPTIMIZERS: dict[str, Callable[[DictConfig, nn.Module], torch.optim.Optimizer]] = {
    "sgd": _sgd,
    "adamw": _adamw,
}


def build_optimizer(cfg: DictConfig, model: nn.Module) -> torch.optim.Optimizer:
    if cfg.name not in OPTIMIZERS:
        raise ValueError(f"optim.name={cfg.name!r} is unknown; choose one of {sorted(OPTIMIZERS)}")
    return OPTIMIZERS[cfg.name](cfg, model)


def warmup_cosine(total_steps: int, warmup_steps: int, min_ratio: float) -> Callable[[int], float]:
    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)
        return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * min(progress, 1.0)))

    return factor


def warmup_constant(
    total_steps: int, warmup_steps: int, min_ratio: float
) -> Callable[[int], float]:
    return lambda step: min(1.0, (step + 1) / warmup_steps) if warmup_steps else 1.0


SCHEDULES: dict[str, Callable[[int, int, float], Callable[[int], float]]] = {
    "cosine": warmup_cosine,
    "constant": warmup_constant,
}


def build_scheduler(
    cfg: DictConfig, optimizer: torch.optim.Optimizer, steps_per_epoch: int, epochs: int
) -> torch.optim.lr_scheduler.LambdaLR:
    """A per-step schedule: linear warm-up for ``warmup_epochs``, then the named decay."""
    if cfg.name not in SCHEDULES:
        raise ValueError(
            f"scheduler.name={cfg.name!r} is unknown; choose one of {sorted(SCHEDULES)}"
        )
    total = steps_per_epoch * epochs
    warmup = min(round(cfg.warmup_epochs * steps_per_epoch), total)
    factor = SCHEDULES[cfg.name](total, warmup, cfg.min_lr_ratio)
    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
