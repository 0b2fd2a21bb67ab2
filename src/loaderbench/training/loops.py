"""The loops: one training epoch, one evaluation pass, and the loader-alone benchmark pass.

None of them waits for the device per step. Loss and accuracy are summed on the device and read
(``read_scalar``, a device-to-host copy that waits for every step queued before it) only at log
points: every ``log_every`` steps and at the end of the loop. The reference trainers do the
same; a ``float(loss)`` per step would keep the host from running ahead, so the next batch's
copy and decode could not overlap the current step.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import torch
from torch import nn
from tqdm import tqdm

from loaderbench.loaders import Batch, Loader
from loaderbench.measure.meters import Average, LoopMeter
from loaderbench.measure.metrics import TOP1
from loaderbench.platform.runtime import Precision


def progress(loader: Loader, desc: str) -> tqdm:
    """A progress bar counting images, so its rate reads in images/s."""
    total = len(loader) * loader.spec.batch_size
    return tqdm(
        total=total,
        desc=desc,
        unit="img",
        unit_scale=False,
        dynamic_ncols=True,
        disable=None,
        leave=False,
    )


@dataclass
class LossStep:
    """A batch's forward pass and loss in the run's precision: the part of the training step
    (``TrainStep``, which adds the optimizer's) that ``loader.num_workers=auto``'s probe runs
    too (``autotune.model_step``), so the probe times the run's own forward and loss."""

    model: nn.Module
    criterion: nn.Module
    precision: Precision
    device: torch.device

    def logits(self, images: torch.Tensor) -> torch.Tensor:
        with self.precision.autocast(self.device):
            return self.model(images)

    def loss(self, batch: Batch) -> torch.Tensor:
        """The batch's loss; a batch without images: ``no_contribution``."""
        if not len(batch.labels):
            return self.no_contribution(batch.images)
        with self.precision.autocast(self.device):
            return self.criterion(self.model(batch.images), batch.labels)

    def no_contribution(self, images: torch.Tensor) -> torch.Tensor:
        """The loss of a step without images (a rank whose batch was all unreadable files):
        zero, through one forward of a blank image so that a data-parallel rank still joins
        the step's collectives (DDP's buffer broadcast, the gradient all-reduce) with zero
        gradients. In eval mode, so no BatchNorm statistic and no dropout stream moves."""
        blank = images.new_zeros((1, *images.shape[1:]))
        self.model.eval()
        try:
            with self.precision.autocast(self.device):
                return self.model(blank).float().sum() * 0.0
        finally:
            self.model.train()


@dataclass
class TrainStep(LossStep):
    """One optimizer step: ``LossStep``'s loss, its scaled backward pass, clipping, the
    optimizer's and the schedule's step."""

    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    scaler: torch.amp.GradScaler
    grad_clip: float | None = None

    def __call__(self, batch: Batch) -> torch.Tensor:
        loss = self.loss(batch)
        self.optimizer.zero_grad(set_to_none=True)
        self.scaler.scale(loss).backward()
        if self.grad_clip:
            self.scaler.unscale_(self.optimizer)
            nn.utils.clip_grad_norm_(self.model.parameters(), self.grad_clip)
        # fp16: with the fused optimizer the run builds on CUDA (``optim.fused_step``) the
        # scaler passes its inf/NaN flag on the device; an unfused one would read it per step.
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.scheduler.step()
        return loss.detach()


def read_scalar(value: torch.Tensor) -> float:
    """The one device-to-host read of the loops (waits for the device's queued work)."""
    return float(value)


@dataclass(frozen=True)
class StepLog:
    """What a log point knows: the steps and images so far in this epoch, and the mean loss
    of the steps since the previous log point."""

    steps: int
    images: int
    loss: float


def blank_batch(image_size: int, device: torch.device) -> Batch:
    """A batch of no images: a step that contributes nothing (``TrainStep.no_contribution``)."""
    return Batch(
        torch.empty((0, 3, image_size, image_size), dtype=torch.uint8, device=device),
        torch.empty((0,), dtype=torch.int64, device=device),
        torch.empty((0,), dtype=torch.int64),
    )


def exactly(batches: Iterable[Batch], steps: int, blank: Batch) -> Iterator[Batch]:
    """``batches``, then ``blank`` until there were ``steps``. A loader leaves out a batch
    whose files were all unreadable; in a data-parallel job that rank would take a step
    fewer and leave the others waiting in the last step's all-reduce, so it makes up the
    count with steps of no images (a zero contribution, at the epoch's end)."""
    taken = 0
    for batch in batches:
        taken += 1
        yield batch
    for _ in range(steps - taken):
        yield blank


def train_one_epoch(
    step: TrainStep,
    loader: Loader,
    meter: LoopMeter,
    *,
    max_batches: int | None = None,
    desc: str = "train",
    log_every: int = 50,
    on_log: Callable[[StepLog], None] | None = None,
    read: Callable[[torch.Tensor], float] = read_scalar,
    stop: Callable[[int], bool] | None = None,
    epoch_loss: Average | None = None,
    blank: Batch | None = None,
    trained: list[torch.Tensor] | None = None,
) -> float:
    """One pass of training; returns the epoch's mean loss. The loss is summed on the device
    and read every ``log_every`` steps (and at the end), nowhere else. ``stop(steps)``, asked
    after every step, ends the pass early (a preemption). ``epoch_loss``: the running mean to
    continue (an epoch resumed part-way). ``blank``: take exactly ``max_batches`` steps,
    ``blank`` ones where the loader delivered fewer batches (``exactly``). ``trained``: gets
    each step's batch's dataset indices (CPU tensors: no device read), for the ledger."""
    step.model.train()
    epoch_loss = Average() if epoch_loss is None else epoch_loss
    interval_sum: torch.Tensor | None = None  # on the device: sum of loss x images
    interval_images = steps = 0
    batches: Iterable[Batch] = meter.iterate(loader, max_batches)
    if blank is not None:
        assert max_batches is not None, "a count of steps to make up needs max_batches"
        batches = exactly(batches, max_batches, blank)

    def log_point() -> None:
        nonlocal interval_sum, interval_images
        if interval_sum is None or not interval_images:  # no step, or only blank ones
            interval_sum, interval_images = None, 0
            return
        mean = read(interval_sum) / interval_images
        epoch_loss.update(mean, interval_images)
        bar.set_postfix(loss=f"{mean:.3f}", refresh=False)
        if on_log is not None:
            on_log(StepLog(steps, epoch_loss.count, mean))
        interval_sum, interval_images = None, 0

    with progress(loader, desc) as bar:
        for batch in batches:
            loss = step(batch)
            if trained is not None:
                trained.append(batch.indices)
            n = batch.labels.shape[0]
            weighted = loss.float() * n
            interval_sum = weighted if interval_sum is None else interval_sum + weighted
            interval_images += n
            steps += 1
            bar.update(n)
            if steps % log_every == 0:
                log_point()
            if stop is not None and stop(steps):
                break
        log_point()
    return epoch_loss.mean


@dataclass
class EvalCounts:
    """Sums, so that ranks can add theirs before the fractions are taken."""

    images: int = 0
    correct_top1: int = 0
    correct_top5: int = 0
    loss_sum: float = 0.0

    def metrics(self) -> dict[str, float]:
        n = max(self.images, 1)
        return {
            TOP1: self.correct_top1 / n,
            "top5": self.correct_top5 / n,
            "val_loss": self.loss_sum / n,
        }


@torch.no_grad()
def evaluate(
    model: nn.Module,
    loader: Iterable[Batch],
    precision: Precision,
    device: torch.device,
    meter: LoopMeter,
    *,
    max_batches: int | None = None,
    desc: str = "val",
    read: Callable[[torch.Tensor], float] = read_scalar,
    log_every: int = 50,
    on_log: Callable[[int], None] | None = None,
) -> EvalCounts:
    """One pass over ``loader``; the counts stay on the device until the end. ``on_log`` gets
    the batches so far every ``log_every`` batches (it reads nothing from the device)."""
    model.eval()
    top1 = torch.zeros((), dtype=torch.int64, device=device)
    top5 = torch.zeros((), dtype=torch.int64, device=device)
    loss_sum = torch.zeros((), dtype=torch.float64, device=device)
    images = batches = 0
    with progress(loader, desc) as bar:
        for batch in meter.iterate(loader, max_batches):
            with precision.autocast(device):
                logits = model(batch.images)
            logits = logits.float()
            k = min(5, logits.shape[1])
            topk = logits.topk(k, dim=1).indices
            hits = topk == batch.labels[:, None]
            top1 += hits[:, 0].sum()
            top5 += hits.any(dim=1).sum()
            loss_sum += nn.functional.cross_entropy(logits, batch.labels, reduction="sum")
            images += batch.labels.shape[0]
            bar.update(batch.labels.shape[0])
            batches += 1
            if on_log is not None and batches % log_every == 0:
                on_log(batches)
    return EvalCounts(images, int(read(top1)), int(read(top5)), read(loss_sum))


def consume(
    loader: Loader, meter: LoopMeter, *, max_batches: int | None = None, desc: str = "load"
) -> int:
    """The loader alone: pull every batch onto the device and do nothing else with it."""
    images = 0
    with progress(loader, desc) as bar:
        for batch in meter.iterate(loader, max_batches):
            n = batch.labels.shape[0]
            images += n
            bar.update(n)
    return images
