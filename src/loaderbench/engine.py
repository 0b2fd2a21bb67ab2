"""The loops: one training epoch, one evaluation pass, and the loader-alone benchmark pass."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch
from torch import nn
from tqdm import tqdm

from loaderbench.loaders import Batch, Loader
from loaderbench.meters import Average, LoopMeter
from loaderbench.runtime import Precision


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
class TrainStep:
    model: nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    criterion: nn.Module
    precision: Precision
    scaler: torch.amp.GradScaler
    device: torch.device
    grad_clip: float | None = None

    def __call__(self, batch: Batch) -> torch.Tensor:
        with self.precision.autocast(self.device):
            loss = self.criterion(self.model(batch.images), batch.labels)
        self.optimizer.zero_grad(set_to_none=True)
        self.scaler.scale(loss).backward()
        if self.grad_clip:
            self.scaler.unscale_(self.optimizer)
            nn.utils.clip_grad_norm_(self.model.parameters(), self.grad_clip)
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.scheduler.step()
        return loss.detach()


def train_one_epoch(
    step: TrainStep,
    loader: Loader,
    meter: LoopMeter,
    *,
    max_batches: int | None = None,
    desc: str = "train",
) -> float:
    """One pass of training; returns the epoch's mean loss."""
    step.model.train()
    loss_avg = Average()
    with progress(loader, desc) as bar:
        for batch in meter.iterate(loader, max_batches):
            loss = step(batch)
            n = batch.labels.shape[0]
            loss_value = float(loss)
            loss_avg.update(loss_value, n)
            bar.update(n)
            bar.set_postfix(loss=f"{loss_avg.mean:.3f}", refresh=False)
    return loss_avg.mean


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
            "top1": self.correct_top1 / n,
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
) -> EvalCounts:
    model.eval()
    top1 = torch.zeros((), dtype=torch.int64, device=device)
    top5 = torch.zeros((), dtype=torch.int64, device=device)
    loss_sum = torch.zeros((), dtype=torch.float64, device=device)
    images = 0
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
    return EvalCounts(images, int(top1), int(top5), float(loss_sum))


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
