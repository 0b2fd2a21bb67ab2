"""What the probe runs, for each task: the split the run's main phase reads and its step."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from torch import nn

from loaderbench.autotune._model_step import ModelStep, model_step
from loaderbench.loaders import LoaderSpec
from loaderbench.run.session import Session


@dataclass(frozen=True)
class Workload:
    """The loop a run's main phase runs: on ``spec``'s split, ``step`` per batch (None: the
    loader alone). ``model`` names the model for the remembered choice's key; ``also_opens``:
    the run's other splits, prepared alike (memmap: their caches built with every CPU)."""

    spec: LoaderSpec
    step: ModelStep | None
    model: dict[str, Any]
    also_opens: tuple[LoaderSpec, ...] = ()


def model_description(session: Session, name: str | None = None) -> dict[str, Any]:
    model = dataclasses.asdict(session.config.model)
    return {**model, "name": name or model["name"]}


def training_workload(session: Session, model: nn.Module | None, image_size: int) -> Workload:
    """train.py: the train split with the training step (or alone, ``model=none``); the val
    split is opened later with the same count."""
    spec = session.loader_spec("train", train=True, image_size=image_size)
    if model is None:
        return Workload(spec, None, model_description(session))
    step = model_step(
        model,
        session.precision,
        session.device,
        train=True,
        label_smoothing=session.config.train.label_smoothing,
    )
    val = session.loader_spec("val", train=False, image_size=image_size)
    return Workload(spec, step, model_description(session), also_opens=(val,))


def evaluation_workload(
    session: Session, model: nn.Module | None, image_size: int, model_name: str | None = None
) -> Workload:
    """eval.py: the val split with the forward pass (or alone, ``model=none``)."""
    spec = session.loader_spec("val", train=False, image_size=image_size)
    step = None
    if model is not None:
        step = model_step(model, session.precision, session.device, train=False)
    return Workload(spec, step, model_description(session, model_name))
