"""The loops read from the device only at log points: counted, not assumed."""

from __future__ import annotations

import itertools
from types import SimpleNamespace

import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from loaderbench.loaders import Batch
from loaderbench.measure.meters import LoopMeter
from loaderbench.platform.runtime import PRECISIONS
from loaderbench.run._ledger import SampleLedger
from loaderbench.training.loops import StepLog, TrainStep, evaluate, train_one_epoch


class ScalarReads(TorchDispatchMode):
    """Counts every tensor-to-Python-number read (``float(t)``, ``t.item()``, ``int(t)``,
    ``bool(t)``): on CUDA each one is a device-to-host copy that waits for the device."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten._local_scalar_dense.default:
            self.count += 1
        return func(*args, **(kwargs or {}))


class InMemoryLoader:
    def __init__(self, batches: int, batch_size: int = 4, classes: int = 3) -> None:
        generator = torch.Generator().manual_seed(0)
        shape = (batch_size, 3, 8, 8)
        self.spec = SimpleNamespace(batch_size=batch_size)
        self.batches = [
            Batch(
                torch.randint(0, 256, shape, dtype=torch.uint8, generator=generator),
                torch.randint(0, classes, (batch_size,), generator=generator),
                torch.arange(b * batch_size, (b + 1) * batch_size),
            )
            for b in range(batches)
        ]

    def __len__(self) -> int:
        return len(self.batches)

    def __iter__(self):
        return iter(self.batches)


class Tiny(nn.Module):
    def __init__(self, classes: int = 3) -> None:
        super().__init__()
        self.fc = nn.Linear(3 * 8 * 8, classes)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.fc(images.float().flatten(1) / 255)


def train_step(model: nn.Module) -> TrainStep:
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    precision = PRECISIONS["fp32"][0]
    device = torch.device("cpu")
    return TrainStep(
        model=model,
        optimizer=optimizer,
        scheduler=torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0),
        criterion=nn.CrossEntropyLoss(),
        precision=precision,
        scaler=precision.grad_scaler(device),
        device=device,
        grad_clip=1.0,
    )


@pytest.mark.parametrize(("steps", "every"), [(120, 50), (7, 50), (10, 1)])
def test_training_reads_the_loss_once_per_log_interval(steps: int, every: int) -> None:
    torch.manual_seed(0)
    hook_reads: list[float] = []
    logs: list[StepLog] = []

    def read(value: torch.Tensor) -> float:
        hook_reads.append(float(value))
        return hook_reads[-1]

    step = train_step(Tiny())
    with ScalarReads() as every_read:
        mean = train_one_epoch(
            step,
            InMemoryLoader(steps),
            LoopMeter(warmup_batches=1),
            log_every=every,
            on_log=logs.append,
            read=read,
            trained=[],  # the ledger's indices: kept without a read
        )
    expected = -(-steps // every)  # the log points, the end of the epoch included
    assert len(hook_reads) == expected
    # Nothing else in the step (optimizer, clipping, scheduler, the meter) reads either.
    assert every_read.count == expected
    assert [log.steps for log in logs] == [min(every * (i + 1), steps) for i in range(expected)]
    assert logs[-1].images == steps * 4
    intervals = [logs[0].steps, *(b.steps - a.steps for a, b in itertools.pairwise(logs))]
    weighted = sum(log.loss * n for log, n in zip(logs, intervals, strict=True)) / steps
    assert mean == pytest.approx(weighted)


def test_the_ledger_counts_the_batches_the_steps_had_a_batch_served_twice_included() -> None:
    """The loop hands over the indices of each batch it stepped on, up to a stop: a loader
    that serves a batch twice (say after a resume) shows a repeat, not a clean epoch."""
    loader = InMemoryLoader(4)
    loader.batches.insert(2, loader.batches[1])  # batch 1 again
    trained: list[torch.Tensor] = []
    stop_after = 4
    train_one_epoch(
        train_step(Tiny()),
        loader,
        LoopMeter(warmup_batches=0),
        stop=lambda steps: steps == stop_after,
        trained=trained,
    )
    assert torch.cat(trained).tolist() == [*range(8), *range(4, 12)]  # the 5th not trained
    ledger = SampleLedger(16)
    ledger.tally(0, torch.cat(trained))
    ledger.close_epoch(0)
    assert ledger.metrics() == {"epoch_samples": [12], "epoch_repeats": [4]}


def test_the_epoch_loss_is_the_mean_over_steps() -> None:
    """The device-side sum gives what a per-step float(loss) average would."""
    torch.manual_seed(0)
    loader, model = InMemoryLoader(9), Tiny()
    reference = Tiny()
    reference.load_state_dict(model.state_dict())
    mean = train_one_epoch(train_step(model), loader, LoopMeter(), log_every=4)
    ref_step, losses = train_step(reference), []
    for batch in loader:
        losses.append(float(ref_step(batch)))
    assert mean == pytest.approx(sum(losses) / len(losses), rel=1e-6)


def test_evaluation_reads_its_counts_once_at_the_end() -> None:
    model = Tiny()
    precision = PRECISIONS["fp32"][0]
    with ScalarReads() as reads:
        counts = evaluate(model, InMemoryLoader(20), precision, torch.device("cpu"), LoopMeter())
    assert counts.images == 80
    assert reads.count == 3  # top1, top5, loss sum


def test_top1_and_top5_count_the_labels_ranked_first_and_in_the_first_five() -> None:
    """Ten classes, so that top-5 is not 1 by construction: each count against the true
    label's rank among the logits, worked out image by image."""
    loader = InMemoryLoader(6, classes=10)
    model = Tiny(classes=10)
    precision = PRECISIONS["fp32"][0]
    counts = evaluate(model, loader, precision, torch.device("cpu"), LoopMeter())
    ranks = []
    for batch in loader.batches:
        logits = model(batch.images)
        for row, label in zip(logits.tolist(), batch.labels.tolist(), strict=True):
            ranks.append(sum(value > row[label] for value in row))
    assert counts.images == len(ranks) == 24
    assert counts.correct_top1 == sum(rank == 0 for rank in ranks)
    assert counts.correct_top5 == sum(rank < 5 for rank in ranks)
    assert 0 < counts.correct_top5 < counts.images  # a case where top-5 can miss
