"""The training layer: models by name, optimisers and schedules by name, and the loops (one
training epoch, one evaluation pass, the loader-alone benchmark pass)."""

from loaderbench.training.loops import (
    EvalCounts,
    LossStep,
    StepLog,
    TrainStep,
    blank_batch,
    consume,
    evaluate,
    train_one_epoch,
)
from loaderbench.training.models import NO_MODEL, ImageClassifier, build_model, maybe_compile
from loaderbench.training.optim import (
    OPTIMIZERS,
    SCHEDULES,
    build_optimizer,
    build_scheduler,
    load_optimizer_state,
)

__all__ = [
    "NO_MODEL",
    "OPTIMIZERS",
    "SCHEDULES",
    "EvalCounts",
    "ImageClassifier",
    "LossStep",
    "StepLog",
    "TrainStep",
    "blank_batch",
    "build_model",
    "build_optimizer",
    "build_scheduler",
    "consume",
    "evaluate",
    "load_optimizer_state",
    "maybe_compile",
    "train_one_epoch",
]
