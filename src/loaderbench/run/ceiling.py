"""The model's own rate in a job: ``ceiling_images_per_s`` and ``ceiling_frac``.

A train or eval job with a model ends with a short pass over ``loader=resident`` (a batch of
the run's shape made once on the run's device, no decode) at the run's model, image size,
batch, precision and device: the rate the model runs at when nothing waits for data. The pass
runs on a deep copy of the trained model (train.py: with an optimizer and schedule of the
run's kind, built for the copy), with the random streams restored after it, so the run's
weights, optimizer state, accuracy and checkpoint are untouched. ``bench.ceiling_batches``
sets its least steady batches, ``bench.min_window_s`` its least seconds (passes as
``run.autorange``'s; 0 batches: no pass, and ``ceiling_frac`` is null and says why). A sweep that
holds ``loader=resident`` jobs takes the ceiling from them instead (``loaderbench.run.sweeps``).
"""

from __future__ import annotations

import copy
import dataclasses
import logging
from collections.abc import Callable
from typing import Any

from torch import nn

from loaderbench.loaders import Loader, build_loader, settings_class
from loaderbench.measure.meters import LoopMeter
from loaderbench.measure.metrics import (
    CEILING_FRAC,
    CEILING_IMAGES_PER_S,
    IMAGES_PER_S,
    ceiling_fraction,
)
from loaderbench.platform import distributed
from loaderbench.run.autorange import WindowRule, run_passes
from loaderbench.run.checkpoint import rng_state, set_rng_state
from loaderbench.run.session import Session
from loaderbench.training.loops import TrainStep, evaluate, train_one_epoch
from loaderbench.training.models import maybe_compile
from loaderbench.training.optim import build_optimizer, build_scheduler

log = logging.getLogger(__name__)

RESIDENT = "resident"
NO_MODEL_REASON = "model=none: the loader alone has no model, so no ceiling"


def no_ceiling(reason: str) -> dict[str, Any]:
    return {CEILING_IMAGES_PER_S: None, CEILING_FRAC: None, "ceiling_frac_null_reason": reason}


def with_ceiling(metrics: dict[str, Any], ceiling: float | None, source: str) -> dict[str, Any]:
    """``ceiling_images_per_s``, ``ceiling_frac`` and where the ceiling came from, for
    ``metrics`` (a loop's: its ``images_per_s``); the reason where the fraction is null."""
    frac = ceiling_fraction(metrics.get(IMAGES_PER_S), ceiling)
    reason = None
    if ceiling is None:
        reason = f"no ceiling measured ({source})"
    elif frac is None:
        reason = f"images_per_s is null: {metrics.get('images_per_s_null_reason')}"
    return {
        CEILING_IMAGES_PER_S: ceiling,
        CEILING_FRAC: frac,
        "ceiling_frac_null_reason": reason,
        "ceiling_from": source,
    }


def resident_loader(session: Session, split: str, train: bool, image_size: int) -> Loader:
    """``loader=resident`` for the run's split, at the run's batch size."""
    spec = session.loader_spec(split, train=train, image_size=image_size)
    settings = settings_class(RESIDENT)(name=RESIDENT, batch_size=spec.batch_size)
    return build_loader(dataclasses.replace(spec, settings=settings))


def measured_rate(meter: LoopMeter) -> float | None:
    summary = meter.summary()
    return summary[IMAGES_PER_S] if summary["measured_batches"] else None


RunBatches = Callable[[Loader, LoopMeter, int], None]


def ceiling_passes(session: Session, loader: Loader, meter: LoopMeter, run: RunBatches) -> None:
    """Passes over ``loader`` until the window holds ``bench.ceiling_batches`` batches and
    ``bench.min_window_s`` (``run.autorange``, auto whatever ``bench.epochs`` says). Each pass
    is twice the last, from the warm-up and ``ceiling_batches`` (at most an epoch), as timeit
    grows its loops: few pass ends, where the device is drained, on a fast model."""
    bench = session.config.bench
    first = bench.warmup_batches + bench.ceiling_batches
    rule = WindowRule.of(bench, min_batches=bench.ceiling_batches, explicit=False)

    def one_pass(epoch: int, next_epoch: bool) -> None:
        loader.set_epoch(epoch, next_epoch=next_epoch)
        run(loader, meter, min(len(loader), first * 2**epoch))

    # The hint and the reason take the first pass's length (passes double after it).
    run_passes(meter, one_pass, rule, min(len(loader), first))


def training_ceiling(session: Session, model: nn.Module, image_size: int) -> float | None:
    """images/s of the run's training step on a copy of ``model`` fed by ``loader=resident``."""
    config, device = session.config, session.device
    twin = copy.deepcopy(model)
    optimizer = build_optimizer(config.optim, twin, device)
    step = TrainStep(
        model=maybe_compile(twin, config.model),
        optimizer=optimizer,
        scheduler=build_scheduler(config.scheduler, optimizer, 1, max(1, config.epochs)),
        criterion=nn.CrossEntropyLoss(label_smoothing=config.train.label_smoothing),
        precision=session.precision,
        scaler=session.precision.grad_scaler(device),
        device=device,
        grad_clip=config.train.grad_clip,
    )
    meter = session.meter()

    def run_pass(loader: Loader, meter: LoopMeter, batches: int) -> None:
        train_one_epoch(step, loader, meter, max_batches=batches, desc="ceiling")

    with resident_loader(session, "train", True, image_size) as loader:
        ceiling_passes(session, loader, meter, run_pass)
    return measured_rate(meter)


def evaluation_ceiling(session: Session, model: nn.Module, image_size: int) -> float | None:
    """images/s of the run's evaluation forward pass on ``model`` fed by ``loader=resident``."""
    meter = session.meter()

    def run_pass(loader: Loader, meter: LoopMeter, batches: int) -> None:
        evaluate(model, loader, session.precision, session.device, meter, max_batches=batches)

    with resident_loader(session, "val", False, image_size) as loader:
        ceiling_passes(session, loader, meter, run_pass)
    return measured_rate(meter)


def job_ceiling(
    session: Session, model: nn.Module | None, image_size: int, *, train: bool
) -> dict[str, Any]:
    """The job's ceiling figures for its recorded ``images_per_s``: measured in a short pass,
    the job's own rate where it ran ``loader=resident``, or null with the reason."""
    metrics = session.metrics
    if model is None:
        return no_ceiling(NO_MODEL_REASON)
    if session.loader.name == RESIDENT:
        return with_ceiling(metrics, metrics.get(IMAGES_PER_S), "this job (loader=resident)")
    wanted = session.config.bench.ceiling_batches
    if wanted == 0:
        return no_ceiling("bench.ceiling_batches=0: no ceiling pass")
    state = rng_state()
    try:
        measure = training_ceiling if train else evaluation_ceiling
        rate = measure(session, model, image_size)
    finally:
        set_rng_state(state)
    if session.dist.world_size > 1:  # the ranks' rates add up, as images_per_s's do
        (total,) = distributed.all_reduce([float("nan") if rate is None else rate])
        rate = None if total != total else total
    result = with_ceiling(metrics, rate, "this job's resident pass")
    log.info(
        "ceiling (loader=resident, at least %d steady batches): %s images/s; ceiling_frac %s",
        wanted,
        f"{rate:.1f}" if rate else None,
        f"{result[CEILING_FRAC]:.3f}" if result[CEILING_FRAC] is not None else None,
    )
    return result
