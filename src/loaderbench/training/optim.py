"""Optimizers and learning-rate schedules by name (registries, not if-chains)."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import nn

from loaderbench.config.schema import OptimConfig, SchedulerConfig


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


def _sgd(optim: OptimConfig, model: nn.Module, fused: bool | None) -> torch.optim.Optimizer:
    return torch.optim.SGD(
        _param_groups(model, optim.weight_decay),
        lr=optim.lr,
        momentum=optim.momentum,
        nesterov=optim.nesterov and optim.momentum > 0,
        fused=fused,
    )


def _adamw(optim: OptimConfig, model: nn.Module, fused: bool | None) -> torch.optim.Optimizer:
    return torch.optim.AdamW(
        _param_groups(model, optim.weight_decay), lr=optim.lr, betas=tuple(optim.betas), fused=fused
    )


OPTIMIZERS: dict[str, Callable[[OptimConfig, nn.Module, bool | None], torch.optim.Optimizer]] = {
    "sgd": _sgd,
    "adamw": _adamw,
}


def fused_step(device: torch.device) -> bool | None:
    """The optimizers' ``fused`` argument on ``device``: True on CUDA, else None (torch's
    default kernels).

    With precision=fp16 the GradScaler checks the gradients for inf/NaN, and before an unfused
    optimizer's step it reads that flag on the host (``GradScaler._maybe_opt_step``: ``.item()``
    per step), a sync that keeps the next batch's copy and decode from overlapping the step. A
    fused optimizer says it handles the scaling itself (``_step_supports_amp_scaling``):
    ``GradScaler.step`` hands it the inverse scale and the flag as device tensors, and its one
    kernel skips an overflowing step on the device; nothing is read. On the CPU there is no
    device to wait for, and fp16 is refused there, so nothing changes."""
    return True if device.type == "cuda" else None


def build_optimizer(
    optim: OptimConfig, model: nn.Module, device: torch.device | None = None
) -> torch.optim.Optimizer:
    """``optim.name``'s optimizer over ``model``; fused kernels where the model trains on CUDA
    (``fused_step``)."""
    if optim.name not in OPTIMIZERS:
        raise ValueError(
            f"optim.name={optim.name!r} is unknown; choose one of {sorted(OPTIMIZERS)}"
        )
    fused = fused_step(device) if device is not None else None
    return OPTIMIZERS[optim.name](optim, model, fused)


def load_optimizer_state(optimizer: torch.optim.Optimizer, state: dict) -> None:
    """``optimizer.load_state_dict(state)``, keeping this run's kernel choice (``fused``,
    ``foreach``). torch copies every group option from the checkpoint, so a checkpoint saved
    unfused (an earlier version, or a CPU run) would turn a fused optimizer's groups unfused
    while the optimizer still tells the GradScaler it handles the scaling, and the first fp16
    step would fail ("Expected grad_scale and found_inf to be None"); the kernels are this
    run's device's business, not the checkpoint's."""
    kernels = {key: optimizer.defaults.get(key) for key in ("fused", "foreach")}
    optimizer.load_state_dict(state)
    for group in optimizer.param_groups:
        group.update(kernels)


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
    schedule: SchedulerConfig, optimizer: torch.optim.Optimizer, steps_per_epoch: int, epochs: int
) -> torch.optim.lr_scheduler.LambdaLR:
    """A per-step schedule: linear warm-up for ``warmup_epochs``, then the named decay."""
    if schedule.name not in SCHEDULES:
        raise ValueError(
            f"scheduler.name={schedule.name!r} is unknown; choose one of {sorted(SCHEDULES)}"
        )
    total = steps_per_epoch * epochs
    warmup = min(round(schedule.warmup_epochs * steps_per_epoch), total)
    factor = SCHEDULES[schedule.name](total, warmup, schedule.min_lr_ratio)
    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
