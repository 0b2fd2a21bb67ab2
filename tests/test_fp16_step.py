"""precision=fp16 without a host sync a step: where the run trains on CUDA the optimizers are
fused, so the GradScaler hands them its inverse scale and inf/NaN flag as device tensors instead
of reading the flag with ``.item()`` before every step. Shown here on the CPU, whose torch has the
same fused kernels and GradScaler path (the no-sync test itself, on a GPU: tests/test_gpu.py)."""

from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf

from loaderbench.config.schema import OptimConfig
from loaderbench.platform.runtime import PRECISIONS
from loaderbench.training.loops import TrainStep
from loaderbench.training.optim import build_optimizer, load_optimizer_state
from tests.test_loops import InMemoryLoader, Tiny

CUDA, CPU = torch.device("cuda"), torch.device("cpu")


def optim_cfg(name: str):
    return OmegaConf.structured(OptimConfig(name=name))


@pytest.mark.parametrize("name", ["sgd", "adamw"])
def test_the_optimizer_is_fused_where_the_run_trains_on_cuda(name: str) -> None:
    on_cuda = build_optimizer(optim_cfg(name), Tiny(), CUDA)
    assert all(group["fused"] for group in on_cuda.param_groups)
    # What GradScaler.step asks before it hands over the scale and flag as tensors.
    assert getattr(on_cuda, "_step_supports_amp_scaling", False)
    on_cpu = build_optimizer(optim_cfg(name), Tiny(), CPU)
    assert not any(group["fused"] for group in on_cpu.param_groups)
    assert not getattr(on_cpu, "_step_supports_amp_scaling", False)


def fp16_step(name: str, device_for_optimizer: torch.device, init_scale: float) -> TrainStep:
    """The run's fp16 training step (clipping included: the scaler unscales before it), with
    the optimizer the run builds for ``device_for_optimizer``, stepping on the CPU."""
    torch.manual_seed(0)
    model = Tiny()
    optimizer = build_optimizer(optim_cfg(name), model, device_for_optimizer)
    return TrainStep(
        model=model,
        optimizer=optimizer,
        scheduler=torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0),
        criterion=torch.nn.CrossEntropyLoss(),
        precision=PRECISIONS["fp16"][0],
        scaler=torch.amp.GradScaler("cpu", init_scale=init_scale),
        device=CPU,
        grad_clip=1.0,
    )


def host_reads_per_step(step: TrainStep, monkeypatch: pytest.MonkeyPatch) -> int:
    """``Tensor.item`` calls (GradScaler's per-step read of its inf flag) over 3 steps."""
    calls = []
    item = torch.Tensor.item

    def counted(tensor: torch.Tensor):
        calls.append(1)
        return item(tensor)

    batches = InMemoryLoader(3).batches
    with monkeypatch.context() as patch:
        patch.setattr(torch.Tensor, "item", counted)
        for batch in batches:
            step(batch)
    return len(calls)


@pytest.mark.parametrize("name", ["sgd", "adamw"])
def test_an_fp16_step_with_the_cuda_optimizer_reads_no_flag(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert host_reads_per_step(fp16_step(name, CUDA, 2.0**8), monkeypatch) == 0
    # The unfused optimizer of a CPU run: the scaler reads its flag before every step.
    assert host_reads_per_step(fp16_step(name, CPU, 2.0**8), monkeypatch) >= 3


@pytest.mark.parametrize("name", ["sgd", "adamw"])
def test_the_fused_step_skips_an_overflow_on_the_device(name: str) -> None:
    """A scale that overflows the gradients: the fused kernel leaves the weights alone and the
    scaler backs off, as the unfused path's host-side check would."""
    step = fp16_step(name, CUDA, 3e38)
    before = [p.detach().clone() for p in step.model.parameters()]
    step(InMemoryLoader(1).batches[0])
    after = list(step.model.parameters())
    assert all(torch.equal(a, b) for a, b in zip(before, after, strict=True))
    assert step.scaler.get_scale() == pytest.approx(1.5e38)
    step.scaler.update(2.0**8)  # a scale the gradients fit in: the next step updates
    step(InMemoryLoader(1).batches[0])
    assert not all(torch.equal(a, b) for a, b in zip(before, after, strict=True))


@pytest.mark.parametrize("name", ["sgd", "adamw"])
def test_an_unfused_checkpoint_resumes_into_the_fused_optimizer(name: str) -> None:
    """A checkpoint saved by an unfused optimizer (a CPU run, an earlier version): loading it
    keeps this run's fused kernels, or the first fp16 step would fail."""
    saved = fp16_step(name, CPU, 2.0**8)
    saved(InMemoryLoader(1).batches[0])
    resumed = fp16_step(name, CUDA, 2.0**8)
    load_optimizer_state(resumed.optimizer, saved.optimizer.state_dict())
    assert all(group["fused"] for group in resumed.optimizer.param_groups)
    resumed(InMemoryLoader(1).batches[0])  # torch's own load would make this step raise
    assert len(resumed.optimizer.state) == len(saved.optimizer.state)
