"""Training a model over epochs: the optimizer and schedule, resuming, validating and
checkpointing after every epoch. ``fit`` yields each epoch's numbers; the task records them."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import torch
from omegaconf import DictConfig, OmegaConf
from torch import nn

from loaderbench import distributed
from loaderbench.checkpoint import (
    CHECKPOINT_FILE,
    load_checkpoint,
    rng_state,
    save_checkpoint,
    set_rng_state,
)
from loaderbench.engine import EvalCounts, StepLog, TrainStep, evaluate, train_one_epoch
from loaderbench.loaders import Loader
from loaderbench.meters import CpuWindow, IntervalRates, LoopMeter
from loaderbench.models import maybe_compile
from loaderbench.optim import build_optimizer, build_scheduler
from loaderbench.session import Session
from loaderbench.stopping import Preempted, preemption_requested

log = logging.getLogger(__name__)


@dataclass
class Training:
    """The state one training run advances: the model, its optimizer and schedule."""

    model: nn.Module  # the bare model (what the checkpoint holds)
    step: TrainStep  # runs the DDP-wrapped (and maybe compiled) model
    eval_model: nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler


def parallel_models(session: Session, model: nn.Module) -> tuple[nn.Module, nn.Module]:
    """(the model to train, the model to evaluate), compiled alike (``model.compile``) with or
    without DDP: in a torchrun job DDP wraps the bare model and the wrapper is compiled (so
    its gradient buckets still overlap the backward pass), and the bare model is compiled
    apart for evaluation, which needs no gradient synchronisation."""
    eval_model = maybe_compile(model, session.cfg.model)
    if not session.dist.enabled:
        return eval_model, eval_model
    from torch.nn.parallel import DistributedDataParallel

    device_ids = [session.device.index] if session.device.type == "cuda" else None
    wrapped = DistributedDataParallel(model, device_ids=device_ids)
    return maybe_compile(wrapped, session.cfg.model), eval_model


def start_training(session: Session, model: nn.Module, steps_per_epoch: int) -> Training:
    cfg = session.cfg
    optimizer = build_optimizer(cfg.optim, model)
    scheduler = build_scheduler(cfg.scheduler, optimizer, steps_per_epoch, cfg.epochs)
    train_model, eval_model = parallel_models(session, model)
    step = TrainStep(
        model=train_model,
        optimizer=optimizer,
        scheduler=scheduler,
        criterion=nn.CrossEntropyLoss(label_smoothing=cfg.train.label_smoothing),
        precision=session.precision,
        scaler=session.precision.grad_scaler(session.device),
        device=session.device,
        grad_clip=cfg.train.grad_clip,
    )
    return Training(model, step, eval_model, optimizer, scheduler)


def resume_from(session: Session) -> Path | None:
    """The checkpoint to continue from: checkpoint=PATH with train.resume=true, or, with no flag
    at all, the run directory's own when it holds a run of the same config (a SLURM job
    requeued after its time limit or a preemption runs again in the same run directory)."""
    cfg = session.cfg
    if cfg.train.resume:
        if cfg.checkpoint is None:
            raise ValueError("train.resume=true needs checkpoint=PATH (a train.py checkpoint.pt)")
        return Path(cfg.checkpoint)
    return session.resumable.path if session.resumable else None


def resume(session: Session, training: Training, path: Path) -> tuple[int, int]:
    """Load a checkpoint into the training state; returns (epoch, batch) to continue from."""
    cfg = session.cfg
    state = load_checkpoint(path, map_location=session.device)
    if list(state["classes"]) != list(session.dataset.classes):
        raise ValueError(f"checkpoint {path} was trained on other classes")
    for key in ("image_size", "seed"):
        if state["config"][key] != cfg[key]:
            raise ValueError(
                f"{key}={cfg[key]} but checkpoint {path} was trained with "
                f"{state['config'][key]}; a resumed run must keep it"
            )
    training.model.load_state_dict(state["model"])
    training.optimizer.load_state_dict(state["optimizer"])
    training.scheduler.load_state_dict(state["scheduler"])
    set_rng_state(state["rng"])
    epoch, batches = int(state["epoch"]), int(state.get("batches", 0))
    log.info(
        "resuming from %s after %d epochs%s, to %d",
        path,
        epoch,
        f" and {batches} batches" if batches else "",
        cfg.epochs,
    )
    return epoch, batches


class PreemptionCheck:
    """Whether the training loop stops after this step for a preemption or a time limit: at
    once in one process; at a log point in a data-parallel job, where every rank takes the
    same decision (one small all-reduce there, where the loop reads from the device anyway),
    so no rank stops a step before the others and leaves them in a collective."""

    def __init__(self, world_size: int, every: int) -> None:
        self.world_size = world_size
        self.every = every
        self.stopped_at: int | None = None

    def __call__(self, steps: int) -> bool:
        if self.world_size > 1:
            if steps % self.every:
                return False
            (flag,) = distributed.all_reduce([float(preemption_requested())], op="max")
            stop = flag > 0
        else:
            stop = preemption_requested()
        if stop:
            self.stopped_at = steps
        return stop


def epochs_to_run(cfg: DictConfig, start: int) -> range:
    end = cfg.epochs
    if cfg.train.stop_after_epochs is not None:
        end = min(end, start + cfg.train.stop_after_epochs)
    return range(start, end)


def reduce_counts(counts: EvalCounts) -> EvalCounts:
    """Accuracy over the whole val set: every rank's sums added up."""
    images, top1, top5, loss_sum = distributed.all_reduce(
        [counts.images, counts.correct_top1, counts.correct_top5, counts.loss_sum]
    )
    return EvalCounts(int(images), int(top1), int(top5), loss_sum)


def evaluation_pass(
    session: Session,
    model: nn.Module,
    loader: Loader,
    meter: LoopMeter,
    *,
    desc: str = "val",
    max_batches: int | None = None,
) -> EvalCounts:
    """One pass over the val set with the run's eval curve; the counts of every rank."""
    counts = evaluate(
        model,
        loader,
        session.precision,
        session.device,
        meter,
        max_batches=max_batches,
        desc=desc,
        log_every=session.cfg.logger.log_every_n_steps,
        on_log=session.eval_curve(meter),
    )
    session.end_eval(meter)
    return reduce_counts(counts)


def validate(session: Session, model: nn.Module, loader: Loader, desc: str) -> dict[str, float]:
    """Accuracy and loss over the whole val set (all ranks)."""
    return evaluation_pass(session, model, loader, session.meter(), desc=desc).metrics()


def train_curve(
    session: Session, training: Training, meter: LoopMeter, first_step: int
) -> Callable[[StepLog], None]:
    """The training loop's log points as W&B rows against ``trainer/global_step``: the loss
    of the steps since the last point, the learning rate, and that interval's throughput
    and data wait (this rank's). Nothing here reads from the device."""
    rates = IntervalRates(meter)

    def on_log(point: StepLog) -> None:
        session.logger.log(
            {
                "trainer/global_step": first_step + point.steps,
                "train/loss": point.loss,
                "train/lr": training.optimizer.param_groups[0]["lr"],
                **{f"train/{key}": value for key, value in rates.take().items()},
            }
        )

    return on_log


def save_training(
    session: Session, training: Training, epoch: int, metrics: dict, batches: int = 0
) -> None:
    """The checkpoint after ``epoch`` epochs and ``batches`` more (rank 0; atomic)."""
    save_checkpoint(
        session.run_dir / CHECKPOINT_FILE,
        {
            "model": training.model.state_dict(),
            "optimizer": training.optimizer.state_dict(),
            "scheduler": training.scheduler.state_dict(),
            "epoch": epoch,
            "batches": batches,
            "requeues": session.metrics.get("requeues", 0) + (1 if batches else 0),
            "wandb_run_id": session.logger.run_id,
            "config": OmegaConf.to_container(session.cfg, resolve=True),
            "classes": list(session.dataset.classes),
            "metrics": {
                k: v for k, v in metrics.items() if isinstance(v, int | float | str) or v is None
            },
            "rng": rng_state(),
        },
    )


def log_epoch(session: Session, epoch: int, result: dict[str, Any], lr: float) -> None:
    cfg = session.cfg
    log.info(
        "epoch %d/%d: loss %.4f, top1 %.4f, top5 %.4f, %.1f images/s, data wait %.1f%%",
        epoch,
        cfg.epochs,
        result["loss"],
        result["top1"],
        result["top5"],
        result["images_per_s"] or 0.0,
        100 * (result["data_wait_frac"] or 0.0),
    )
    session.logger.log(
        {
            "epoch": epoch,
            "epoch/train_loss": result["loss"],
            "epoch/lr": lr,
            "epoch/images_per_s": result["images_per_s"],
            "epoch/data_wait_frac": result["data_wait_frac"],
            "val/top1": result["top1"],
            "val/top5": result["top5"],
            "val/loss": result["val_loss"],
        }
    )


def fit(
    session: Session, model: nn.Module, train_loader: Loader, val_loader: Loader
) -> Iterator[dict[str, Any]]:
    """Train and validate epoch after epoch (resuming when asked); yields each epoch's
    metrics (the training loop's so far, the epoch's loss, val accuracy) once checkpointed."""
    cfg = session.cfg
    steps = len(train_loader)
    if cfg.bench.max_batches is not None:
        steps = min(steps, cfg.bench.max_batches)
    training = start_training(session, model, steps)
    path = resume_from(session)
    start, skip = resume(session, training, path) if path else (0, 0)
    if path:
        yield {"resumed_from": str(path.absolute())}
    meter, window = session.meter(), CpuWindow(session.monitor)
    stop = PreemptionCheck(session.dist.world_size, cfg.logger.log_every_n_steps)
    epochs = epochs_to_run(cfg, start)
    for epoch in epochs:
        first = skip if epoch == start else 0  # batches of this epoch done before a requeue
        train_loader.set_epoch(epoch, first)
        limit = cfg.bench.max_batches and max(1, cfg.bench.max_batches - first)
        with window:
            loss = train_one_epoch(
                training.step,
                train_loader,
                meter,
                max_batches=limit,
                desc=f"epoch {epoch + 1}/{cfg.epochs}",
                log_every=cfg.logger.log_every_n_steps,
                on_log=train_curve(session, training, meter, epoch * steps + first),
                stop=stop,
            )
        if stop.stopped_at is not None:
            preempt(session, training, epoch, first + stop.stopped_at)
        val = validate(session, training.eval_model, val_loader, f"val {epoch + 1}/{cfg.epochs}")
        (loss_sum,) = distributed.all_reduce([loss])
        result = {
            **session.loop_metrics(meter, window),
            "loss": loss_sum / session.dist.world_size,
            "epochs": epoch + 1,
            **val,
        }
        log_epoch(session, epoch + 1, result, training.optimizer.param_groups[0]["lr"])
        if session.dist.is_main:
            save_training(session, training, epoch + 1, {**session.metrics, **result})
            if cfg.logger.log_checkpoint and epoch + 1 == epochs.stop:
                session.logger.log_checkpoint(session.run_dir / CHECKPOINT_FILE, epoch + 1)
        yield result


def preempt(session: Session, training: Training, epoch: int, batches: int) -> NoReturn:
    """Save the state after ``batches`` batches of ``epoch`` and stop the run (``Preempted``);
    the requeued job continues from there."""
    if session.dist.is_main:
        save_training(session, training, epoch, session.metrics, batches=batches)
    log.warning(
        "preempted (SIGUSR2) after %d batches of epoch %d: checkpoint written, requeueing",
        batches,
        epoch + 1,
    )
    raise Preempted(f"preempted after {batches} batches of epoch {epoch + 1}")
