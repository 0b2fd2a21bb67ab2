"""What the probe runs per batch (the run's own forward and loss, ``engine.LossStep``), and
what it must leave as it found it: the model's buffers, mode and gradients, and every random
stream."""

from __future__ import annotations

import contextlib
import random
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from loaderbench.loaders import Batch
from loaderbench.platform.runtime import Precision
from loaderbench.training.loops import LossStep


@dataclass
class ModelStep:
    """The run's step without its optimizer: forward and backward (``train``), or the forward
    pass alone (eval.py), on the bare model (no DDP wrapper: the probe has no collectives), in
    the run's precision. Eager even with ``model.compile=true``: compiling for a probe of
    seconds would cost more than the probe (docs/loaders.md: when to pin a count)."""

    forward: LossStep
    train: bool

    @property
    def model(self) -> nn.Module:
        return self.forward.model

    def __call__(self, batch: Batch) -> None:
        if not len(batch.labels):
            return
        if not self.train:
            with torch.no_grad():
                self.forward.logits(batch.images)
            return
        self.model.zero_grad(set_to_none=True)  # as the optimizer's zero_grad does each step
        self.forward.loss(batch).backward()

    @contextlib.contextmanager
    def untouched(self) -> Iterator[None]:
        """The model's buffers (BatchNorm running statistics and counts) and mode restored,
        its gradients dropped, whatever happens inside."""
        model, was_training = self.model, self.model.training
        saved = [buffer.detach().clone() for buffer in model.buffers()]
        model.train(self.train)
        try:
            yield
        finally:
            with torch.no_grad():
                for buffer, value in zip(model.buffers(), saved, strict=True):
                    buffer.copy_(value)
            model.zero_grad(set_to_none=True)
            model.train(was_training)


def model_step(
    model: nn.Module,
    precision: Precision,
    device: torch.device,
    *,
    train: bool,
    label_smoothing: float = 0.0,
) -> ModelStep:
    """The probe's step for ``model``: the run's loss (cross-entropy, ``label_smoothing`` as
    ``train.label_smoothing``) in ``precision`` on ``device``."""
    criterion = nn.CrossEntropyLoss(label_smoothing=label_smoothing)
    return ModelStep(LossStep(model, criterion, precision, device), train)


@contextlib.contextmanager
def random_states_untouched(device: torch.device) -> Iterator[None]:
    """torch's generators (the CPU's and the run's CUDA device's), Python's and numpy's as
    they were, whatever happens inside."""
    python, numpy = random.getstate(), np.random.get_state()
    devices = [device.index or 0] if device.type == "cuda" else []
    try:
        with torch.random.fork_rng(devices=devices):
            yield
    finally:
        random.setstate(python)
        np.random.set_state(numpy)
