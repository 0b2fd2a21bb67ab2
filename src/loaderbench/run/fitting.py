"""Training a model over epochs: the optimizer and schedule, resuming, validating and
checkpointing after every epoch. ``fit`` yields each epoch's numbers; the task records them."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

import torch
from torch import nn

from loaderbench.config.schema import BenchConfig, RunConfig
from loaderbench.loaders import Loader
from loaderbench.measure.meters import Average, IntervalRates, LoopMeter
from loaderbench.measure.metrics import (
    GLOBAL_BATCH,
    TOP1,
    epoch_curves,
    rates_text,
    with_epoch_ranks,
)
from loaderbench.measure.process_tree import CpuWindow
from loaderbench.platform import distributed
from loaderbench.platform.stopping import Preempted, preemption_requested
from loaderbench.run._elastic import continued_rank_state, pack_places, resume_path
from loaderbench.run._ledger import SampleLedger
from loaderbench.run._resume_rules import ResumingRun, check_resumable, train_set_signature
from loaderbench.run.checkpoint import (
    CHECKPOINT_FILE,
    load_checkpoint,
    rng_state,
    save_checkpoint,
    set_rng_state,
)
from loaderbench.run.session import Session
from loaderbench.training.loops import (
    EvalCounts,
    StepLog,
    TrainStep,
    blank_batch,
    evaluate,
    train_one_epoch,
)
from loaderbench.training.models import maybe_compile
from loaderbench.training.optim import build_optimizer, build_scheduler, load_optimizer_state

log = logging.getLogger(__name__)


@dataclass
class Training:
    """The state one training run advances: the model, its optimizer and schedule."""

    model: nn.Module  # the bare model (what the checkpoint holds)
    step: TrainStep  # runs the DDP-wrapped (and maybe compiled) model
    eval_model: nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    # The images each epoch trained on, over every rank (None: not kept, outside ``fit``).
    ledger: SampleLedger | None = None


def parallel_models(session: Session, model: nn.Module) -> tuple[nn.Module, nn.Module]:
    """(the model to train, the model to evaluate), compiled alike (``model.compile``) with or
    without DDP: in a torchrun job DDP wraps the bare model and the wrapper is compiled (so
    its gradient buckets still overlap the backward pass), and the bare model is compiled
    apart for evaluation, which needs no gradient synchronisation."""
    eval_model = maybe_compile(model, session.config.model)
    if not session.dist.enabled:
        return eval_model, eval_model
    from torch.nn.parallel import DistributedDataParallel

    device_ids = [session.device.index] if session.device.type == "cuda" else None
    wrapped = DistributedDataParallel(model, device_ids=device_ids)
    return maybe_compile(wrapped, session.config.model), eval_model


def start_training(session: Session, model: nn.Module, steps_per_epoch: int) -> Training:
    config = session.config
    optimizer = build_optimizer(config.optim, model, session.device)
    scheduler = build_scheduler(config.scheduler, optimizer, steps_per_epoch, config.epochs)
    train_model, eval_model = parallel_models(session, model)
    step = TrainStep(
        model=train_model,
        optimizer=optimizer,
        scheduler=scheduler,
        criterion=nn.CrossEntropyLoss(label_smoothing=config.train.label_smoothing),
        precision=session.precision,
        scaler=session.precision.grad_scaler(session.device),
        device=session.device,
        grad_clip=config.train.grad_clip,
    )
    return Training(model, step, eval_model, optimizer, scheduler)


@dataclass
class Start:
    """Where a run starts: after ``epoch`` epochs and ``batches`` steps of the next, whose
    loss so far (this rank's) ``epoch_loss`` holds, and whose order this rank's loader had
    gone through up to its batch ``position``: more than ``batches`` where a batch of
    unreadable files only was left out (a step fewer), so the loader continues from there."""

    epoch: int = 0
    batches: int = 0
    epoch_loss: Average = field(default_factory=Average)
    position: int = 0


def resume(session: Session, training: Training, path: Path) -> Start:
    """Load a checkpoint into the training state (this rank's random streams and running
    loss included); returns where to continue from."""
    state = load_checkpoint(path, map_location=session.device)
    run = ResumingRun(
        session.dataset, session.composed, session.dist.world_size, session.loader.batch_size
    )
    check_resumable(state, path, run)
    load_training_state(training, state)
    if training.ledger is not None:
        training.ledger.restore(state["ledger"])
    world = session.dist.world_size
    if int(state["world_size"]) == world:
        mine = state["ranks"][session.dist.rank]
    else:  # another number of ranks shares out the rest of the epoch (``elastic``)
        mine = continued_rank_state(state["ranks"], session.dist.rank, world)
    if "rng" in mine:  # else a rank beyond the checkpoint's: its own streams, seeded
        set_rng_state(mine["rng"])
    epoch_loss = Average()
    epoch_loss.total, epoch_loss.count = mine["epoch_loss"]
    batches, position = int(state["batches"]), int(mine["position"])
    start = Start(int(state["epoch"]), batches, epoch_loss, position)
    log.info(
        "resuming from %s after %d epochs%s, to %d",
        path,
        start.epoch,
        f" and {batches} steps (batch {position} of its order on)" if batches else "",
        session.config.epochs,
    )
    return start


class PreemptionCheck:
    """Whether the training loop stops after this step for a preemption or a time limit.

    In one process: after the step under way. In a data-parallel job every rank must take the
    same decision at the same step, or one would stop while the others wait for it in the
    next step's all-reduce: the ranks agree in one small all-reduce (of the flag, its maximum)
    at each log point (every ``every`` steps of an epoch, where the loop reads from the device
    anyway) and at the epoch's last step. A stop comes at most ``every`` steps after the
    signal, or at the end of the epoch under way if that is sooner (a signal that arrives
    during validation: in the next epoch, by the same bound).
    """

    def __init__(self, world_size: int, every: int) -> None:
        self.world_size = world_size
        self.every = every
        self.last = 0  # the steps of the pass under way (its last step is a check)
        self.stopped_at: int | None = None

    def start_pass(self, steps: int) -> None:
        self.last = steps

    def __call__(self, steps: int) -> bool:
        if self.world_size > 1:
            if steps % self.every and steps != self.last:
                return False
            (flag,) = distributed.all_reduce([float(preemption_requested())], op="max")
            stop = flag > 0
        else:
            stop = preemption_requested()
        if stop:
            self.stopped_at = steps
        return stop


def epochs_to_run(config: RunConfig, start: int) -> range:
    end = config.epochs
    if config.train.stop_after_epochs is not None:
        end = min(end, start + config.train.stop_after_epochs)
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
        log_every=session.config.logger.log_every_n_steps,
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


def training_state(training: Training) -> dict[str, Any]:
    """What the checkpoint keeps of the training state: the model (rank 0's BatchNorm
    statistics, which every rank validates with), optimizer, schedule and the fp16
    GradScaler's scale and growth tracker (empty without one)."""
    return {
        "model": training.model.state_dict(),
        "optimizer": training.optimizer.state_dict(),
        "scheduler": training.scheduler.state_dict(),
        "scaler": training.step.scaler.state_dict(),
    }


def load_training_state(training: Training, state: dict[str, Any]) -> None:
    """Undo ``training_state``. A GradScaler starts afresh only where the checkpoint had none
    (trained in another precision)."""
    training.model.load_state_dict(state["model"])
    load_optimizer_state(training.optimizer, state["optimizer"])
    training.scheduler.load_state_dict(state["scheduler"])
    if state["scaler"] and training.step.scaler.is_enabled():
        training.step.scaler.load_state_dict(state["scaler"])


def rank_state(epoch_loss: Average, position: int) -> dict[str, Any]:
    """What differs per rank and a resume needs: the random streams, the running loss and
    the batches of the epoch's order gone through (``Loader.position``: a rank whose loader
    left out an unreadable batch is further on than its steps)."""
    return {
        "rng": rng_state(),
        "epoch_loss": (epoch_loss.total, epoch_loss.count),
        "position": position,
    }


def save_training(
    session: Session,
    training: Training,
    epoch: int,
    metrics: dict,
    batches: int = 0,
    epoch_loss: Average | None = None,
    position: int = 0,
) -> None:
    """The checkpoint after ``epoch`` epochs and ``batches`` steps more, this rank's loader at
    batch ``position`` of the order (every rank calls it: each hands over its own state; rank
    0 writes, atomically)."""
    ranks = distributed.gather_objects(rank_state(epoch_loss or Average(), position))
    if not session.dist.is_main:
        return
    save_checkpoint(
        session.run_dir / CHECKPOINT_FILE,
        {
            **training_state(training),
            "epoch": epoch,
            "batches": batches,
            "requeues": session.metrics.get("requeues", 0) + (1 if batches else 0),
            "wandb_run_id": session.logger.run_id,
            "config": session.composed,
            "classes": list(session.dataset.classes),
            "world_size": session.dist.world_size,
            GLOBAL_BATCH: session.loader.batch_size * session.dist.world_size,
            "order_base": order_base(session, epoch, batches),
            "train_set": train_set_signature(session.dataset.train),
            "metrics": {
                k: v for k, v in metrics.items() if isinstance(v, int | float | str) or v is None
            },
            "ranks": ranks,
            "ledger": training.ledger.state() if training.ledger is not None else None,
        },
    )


def order_base(session: Session, epoch: int, batches: int) -> torch.Tensor | None:
    """A stop in an epoch that this run resumed on another number of ranks: the places of
    its order gone through before (packed), from which the ranks' positions count."""
    resumed = session.resumed_epoch
    if not batches or resumed is None or resumed.epoch != epoch:
        return None
    return pack_places(resumed.done)


def log_epoch(
    session: Session, epoch: int, result: dict[str, Any], rates: dict[str, Any], lr: float
) -> None:
    """The epoch's row: its loss, its own throughput and data wait (``rates``, over every
    rank; None for an epoch a resumed run found already trained), its val accuracy; in a
    data-parallel run also the slowest rank's data wait, and each rank's figures appended to
    the run's ``epoch_rank_<key>`` lists."""
    log.info(
        "epoch %d/%d: loss %.4f, top1 %.4f, top5 %.4f, %s",
        epoch,
        session.config.epochs,
        result["loss"],
        result[TOP1],
        result["top5"],
        rates_text(rates),
    )
    session.record(with_epoch_ranks(session.metrics, rates))
    session.logger.log(
        {
            "epoch": epoch,
            "epoch/train_loss": result["loss"],
            "epoch/lr": lr,
            **epoch_curves(rates),
            **{  # data-parallel runs: the rank the others wait for
                f"epoch/{key}": rates[key]
                for key in ("slowest_rank", "slowest_rank_data_wait_frac")
                if key in rates
            },
            "val/top1": result[TOP1],
            "val/top5": result["top5"],
            "val/loss": result["val_loss"],
        }
    )


def steps_per_epoch(bench: BenchConfig, train_loader: Loader) -> int:
    steps = len(train_loader)
    return steps if bench.max_batches is None else min(steps, bench.max_batches)


def agree_on_buffers(model: nn.Module) -> None:
    """Every rank's BatchNorm statistics (every buffer) become rank 0's. DDP broadcasts rank
    0's buffers at the start of each training forward, then each rank moves its own with its
    own batch: after an epoch they differ per rank, and validation on every rank must use the
    model the checkpoint holds (rank 0's), or the reported accuracy is not the saved model's."""
    distributed.broadcast_from_main(list(model.buffers()))


def fit(
    session: Session, model: nn.Module, train_loader: Loader, val_loader: Loader
) -> Iterator[dict[str, Any]]:
    """Train and validate epoch after epoch (resuming when asked); yields each epoch's
    metrics (the training loop's so far, the epoch's loss, val accuracy) once checkpointed."""
    config = session.config
    steps = steps_per_epoch(config.bench, train_loader)
    training = start_training(session, model, steps)
    ledger = training.ledger = SampleLedger(len(session.dataset.train))
    path = resume_path(config, session.resumable)
    start = resume(session, training, path) if path else Start()
    if path:
        session.record_.what.resumed_from = str(path.absolute())
    meter, window = session.meter(), CpuWindow(session.monitor)
    stop = PreemptionCheck(session.dist.world_size, config.logger.log_every_n_steps)
    # Only a data-parallel job needs every rank to take as many steps.
    blank = (
        blank_batch(train_loader.spec.image_size, session.device) if session.dist.enabled else None
    )
    epochs = epochs_to_run(config, start.epoch)
    for epoch in epochs:
        resumed = epoch == start.epoch
        first = start.batches if resumed else 0  # steps of this epoch taken before a requeue
        position = start.position if resumed else 0  # and batches of its order gone through
        epoch_loss = start.epoch_loss if resumed else Average()
        mark = (meter.batches, window.cpu_s)
        trained: list[torch.Tensor] = []  # the indices of the batches the steps had
        if first < steps:  # else preempted at its last step: only its validation is left
            train_loader.set_epoch(epoch, position, next_epoch=epoch + 1 < epochs.stop)
            stop.start_pass(steps - first)
            with window:
                train_one_epoch(
                    training.step,
                    train_loader,
                    meter,
                    max_batches=steps - first,
                    desc=f"epoch {epoch + 1}/{config.epochs}",
                    log_every=config.logger.log_every_n_steps,
                    on_log=train_curve(session, training, meter, epoch * steps + first),
                    stop=stop,
                    epoch_loss=epoch_loss,
                    blank=blank,
                    trained=trained,
                )
        # Every rank, whether or not it trained now (preempted at the epoch's last step).
        ledger.tally(epoch, torch.cat(trained) if trained else torch.empty(0, dtype=torch.int64))
        if stop.stopped_at is not None:
            stopped = first + stop.stopped_at
            preempt(session, training, epoch, stopped, epoch_loss, train_loader.position)
        agree_on_buffers(training.model)
        val = validate(session, training.eval_model, val_loader, f"val {epoch + 1}/{config.epochs}")
        (loss_sum,) = distributed.all_reduce([epoch_loss.mean])
        ledger.close_epoch(epoch)
        result = {
            **session.loop_metrics(meter, window),
            "loss": loss_sum / session.dist.world_size,
            "epochs": epoch + 1,
            **val,
            **ledger.metrics(),  # epoch_samples, epoch_repeats
        }
        rates = session.loop_metrics(meter, window, since=mark)
        lr = training.optimizer.param_groups[0]["lr"]
        log_epoch(session, epoch + 1, result, rates, lr)
        save_training(session, training, epoch + 1, {**session.metrics, **result})
        if session.dist.is_main and config.logger.log_checkpoint and epoch + 1 == epochs.stop:
            session.logger.log_checkpoint(session.run_dir / CHECKPOINT_FILE, epoch + 1)
        yield result


def preempt(
    session: Session,
    training: Training,
    epoch: int,
    batches: int,
    epoch_loss: Average,
    position: int,
) -> NoReturn:
    """Save the state after ``batches`` steps of ``epoch`` (this rank's loader at batch
    ``position`` of its order) and stop the run (``Preempted``); the requeued job continues
    from there. No rank leaves before the checkpoint is in place (torchrun stops every rank
    as soon as one exits)."""
    save_training(session, training, epoch, session.metrics, batches, epoch_loss, position)
    distributed.barrier()
    log.warning(
        "preempted (SIGUSR2) after %d batches of epoch %d: checkpoint written, requeueing",
        batches,
        epoch + 1,
    )
    raise Preempted(f"preempted after {batches} batches of epoch {epoch + 1}")
