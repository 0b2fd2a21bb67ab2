"""Device and precision: resolved once, with a clear error where a choice cannot run."""

from __future__ import annotations

import contextlib
import random
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from omegaconf import DictConfig

DEVICE_TYPES = ("auto", "cpu", "cuda")


class UnsupportedSetting(RuntimeError):
    """A setting this machine cannot run; the message names the key and what would work."""


def resolve_device(cfg: DictConfig, local_rank: int | None = None) -> torch.device:
    """``device=auto|cpu|cuda`` (and ``device.index``) to a torch.device.

    Under torchrun each process takes the GPU of its LOCAL_RANK, whatever ``device.index`` says.
    """
    kind = cfg.type
    if kind not in DEVICE_TYPES:
        raise UnsupportedSetting(f"device.type={kind!r} is unknown; choose one of {DEVICE_TYPES}")
    if kind == "auto":
        kind = "cuda" if torch.cuda.is_available() else "cpu"
    if kind == "cpu":
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise UnsupportedSetting(
            "device=cuda, but no CUDA device is available here "
            f"(torch {torch.__version__}, CUDA build {torch.version.cuda}); use device=cpu or auto"
        )
    index = local_rank if local_rank is not None else cfg.index
    if not 0 <= index < torch.cuda.device_count():
        raise UnsupportedSetting(
            f"device.index={index} is out of range: {torch.cuda.device_count()} CUDA device(s)"
        )
    torch.cuda.set_device(index)
    return torch.device("cuda", index)


@dataclass(frozen=True)
class Precision:
    name: str
    dtype: torch.dtype | None  # None: no autocast
    needs_grad_scaler: bool = False

    def autocast(self, device: torch.device) -> contextlib.AbstractContextManager:
        if self.dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=device.type, dtype=self.dtype)

    def grad_scaler(self, device: torch.device) -> torch.amp.GradScaler:
        return torch.amp.GradScaler(device.type, enabled=self.needs_grad_scaler)


def _check_bf16(device: torch.device) -> None:
    if device.type == "cuda" and not torch.cuda.is_bf16_supported():
        raise UnsupportedSetting(
            f"precision=bf16: {torch.cuda.get_device_name(device)} has no bfloat16 support; "
            "use precision=fp16 or fp32"
        )


def _check_fp16(device: torch.device) -> None:
    if device.type != "cuda":
        raise UnsupportedSetting(
            "precision=fp16 needs a CUDA device (mixed-precision float16 with a GradScaler); "
            "on the CPU use precision=bf16 or fp32"
        )


PRECISIONS: dict[str, tuple[Precision, Callable[[torch.device], None] | None]] = {
    "fp32": (Precision("fp32", None), None),
    "bf16": (Precision("bf16", torch.bfloat16), _check_bf16),
    "fp16": (Precision("fp16", torch.float16, needs_grad_scaler=True), _check_fp16),
}


def resolve_precision(name: str, device: torch.device) -> Precision:
    if name not in PRECISIONS:
        raise UnsupportedSetting(
            f"precision.name={name!r} is unknown; choose one of {sorted(PRECISIONS)}"
        )
    precision, check = PRECISIONS[name]
    if check is not None:
        check(device)
    return precision


def synchronizer(device: torch.device) -> Callable[[], None] | None:
    """What the meters call so that timings include the device's queued work."""
    if device.type == "cuda":
        return lambda: torch.cuda.synchronize(device)
    return None


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
