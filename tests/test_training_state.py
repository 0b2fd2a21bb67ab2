"""What a resume needs and a data-parallel step relies on, piece by piece: random streams and
the GradScaler through a checkpoint file, the preemption check's agreed steps, a step without
images."""

from __future__ import annotations

import os
import random
import signal
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from loaderbench.loaders import Batch
from loaderbench.measure.meters import LoopMeter
from loaderbench.platform.runtime import PRECISIONS
from loaderbench.platform.stopping import preemption_noted
from loaderbench.run.checkpoint import load_checkpoint, rng_state, save_checkpoint, set_rng_state
from loaderbench.run.fitting import PreemptionCheck, Training, load_training_state, training_state
from loaderbench.training.loops import TrainStep, blank_batch, train_one_epoch
from tests.test_loops import InMemoryLoader


def draws() -> tuple:
    return (
        torch.rand(3).tolist(),
        random.random(),
        np.random.random(3).tolist(),
        float(np.random.standard_normal()),  # leaves a cached Gaussian half the time
    )


def test_random_streams_continue_through_a_checkpoint_file(tmp_path: Path) -> None:
    torch.manual_seed(1)
    random.seed(1)
    np.random.seed(1)
    draws()  # numpy's position is mid-key now: the key alone would not say where it is
    path = tmp_path / "checkpoint.pt"
    save_checkpoint(path, {"model": {}, "config": {}, "rng": rng_state()})
    expected = draws()
    draws()
    set_rng_state(load_checkpoint(path)["rng"])
    assert draws() == expected


class Small(nn.Module):
    """A convolution, BatchNorm and dropout: every kind of state a step touches."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.bn = nn.BatchNorm2d(4)
        self.drop = nn.Dropout(0.5)
        self.fc = nn.Linear(4, 3)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        x = self.bn(self.conv(images.float() / 255)).relu().mean((2, 3))
        return self.fc(self.drop(x))


def training(
    scaler: torch.amp.GradScaler, precision: str = "fp32", device: str = "cpu"
) -> Training:
    model = Small().to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1 / (1 + step))
    step = TrainStep(
        model=model,
        optimizer=optimizer,
        scheduler=scheduler,
        criterion=nn.CrossEntropyLoss(),
        precision=PRECISIONS[precision][0],
        scaler=scaler,
        device=torch.device(device),
    )
    return Training(model, step, model, optimizer, scheduler)


def test_the_grad_scaler_resumes_with_its_scale_and_growth_tracker(tmp_path: Path) -> None:
    """fp16's GradScaler (here on the CPU, where it works the same): a resume that started it
    afresh would scale by 65536 again and skip overflowing steps while the schedule moves."""
    before = training(torch.amp.GradScaler("cpu", init_scale=2.0**16, growth_interval=100))
    train_one_epoch(before.step, InMemoryLoader(5), LoopMeter())
    before.step.scaler.update(new_scale=512.0)  # as after a few overflows
    train_one_epoch(before.step, InMemoryLoader(2), LoopMeter())
    saved = before.step.scaler.state_dict()
    assert saved["scale"] == 512.0 and saved["_growth_tracker"] == 7
    path = tmp_path / "checkpoint.pt"
    save_checkpoint(path, {**training_state(before), "config": {}})

    after = training(torch.amp.GradScaler("cpu", init_scale=2.0**16, growth_interval=100))
    load_training_state(after, load_checkpoint(path))
    assert after.step.scaler.state_dict() == saved
    assert after.scheduler.last_epoch == before.scheduler.last_epoch == 7


def test_a_data_parallel_run_agrees_to_stop_at_an_epoch_s_last_step() -> None:
    """In an epoch shorter than the log interval the last step is the only agreed one: the
    stop comes there, not never (single process: the agreement is the flag itself)."""
    check = PreemptionCheck(world_size=2, every=50)
    check.start_pass(5)
    with preemption_noted():
        assert [check(step) for step in range(1, 6)] == [False] * 5
        # Sent to this whole (xdist worker) process: only ever with the handler in place.
        assert signal.getsignal(signal.SIGUSR2) not in (signal.SIG_DFL, signal.SIG_IGN, None)
        os.kill(os.getpid(), signal.SIGUSR2)
        assert [check(step) for step in range(1, 6)] == [False] * 4 + [True]
        assert check.stopped_at == 5
        check.start_pass(120)
        assert [s for s in range(1, 121) if check(s)] == [50, 100, 120]


def test_a_step_without_images_moves_no_statistic_and_adds_no_gradient() -> None:
    torch.manual_seed(0)
    run = training(torch.amp.GradScaler("cpu", enabled=False))
    model = run.model
    for param in model.parameters():
        param.grad = torch.ones_like(param)
    buffers = {name: b.clone() for name, b in model.named_buffers()}
    rng = torch.get_rng_state()
    blank = blank_batch(8, torch.device("cpu"))
    loss = run.step.no_contribution(blank.images)
    loss.backward()
    assert float(loss.detach()) == 0.0 and model.training
    assert torch.equal(torch.get_rng_state(), rng)  # dropout drew nothing
    for name, buffer in model.named_buffers():
        assert torch.equal(buffer, buffers[name]), name
    for name, param in model.named_parameters():  # the blank step's gradient adds nothing
        assert torch.equal(param.grad, torch.ones_like(param)), name


def test_an_epoch_takes_its_steps_even_when_the_loader_delivers_fewer() -> None:
    """A loader that left out a batch (all its files unreadable): the pass still takes the
    epoch's count of steps, the missing ones without images, and the loss counts only images."""
    torch.manual_seed(0)
    reference = training(torch.amp.GradScaler("cpu", enabled=False))
    expected = train_one_epoch(reference.step, InMemoryLoader(3), LoopMeter())
    torch.manual_seed(0)
    run = training(torch.amp.GradScaler("cpu", enabled=False))
    blank = blank_batch(8, torch.device("cpu"))
    steps: list[int] = []
    loss = train_one_epoch(
        run.step,
        InMemoryLoader(3),
        LoopMeter(),
        max_batches=5,
        blank=blank,
        stop=lambda n: steps.append(n) or False,
    )
    assert steps == [1, 2, 3, 4, 5]
    assert run.scheduler.last_epoch == 5
    assert loss == pytest.approx(expected)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_fp16_training_on_cuda_continues_exactly_through_a_checkpoint(tmp_path: Path) -> None:
    """fp16 steps with dropout on the GPU: the GradScaler and this device's generator come
    back from the checkpoint, so the steps after it are the ones an uninterrupted run takes."""
    batches = [
        Batch(b.images.cuda(), b.labels.cuda(), b.indices)
        for b in InMemoryLoader(6, classes=3).batches
    ]
    torch.manual_seed(0)
    whole = training(torch.amp.GradScaler("cuda"), "fp16", "cuda")
    for batch in batches[:3]:
        whole.step(batch)
    whole.step.scaler.update(new_scale=1024.0)
    path = tmp_path / "checkpoint.pt"
    save_checkpoint(path, {**training_state(whole), "config": {}, "rng": rng_state()})
    for batch in batches[3:]:
        whole.step(batch)

    torch.manual_seed(1)  # another model and stream: the checkpoint must set both
    resumed = training(torch.amp.GradScaler("cuda"), "fp16", "cuda")
    state = load_checkpoint(path, map_location="cuda")
    load_training_state(resumed, state)
    set_rng_state(state["rng"])
    for batch in batches[3:]:
        resumed.step(batch)
    assert resumed.step.scaler.get_scale() == whole.step.scaler.get_scale()
    for (name, param), other in zip(
        whole.model.named_parameters(), resumed.model.parameters(), strict=True
    ):
        torch.testing.assert_close(other, param, msg=lambda m, n=name: f"{n}: {m}")
