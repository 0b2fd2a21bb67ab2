"""The model wrapper, device and precision resolution, checkpoints."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf
from torch import nn

from loaderbench.config.schema import DeviceConfig, ModelConfig
from loaderbench.platform.runtime import UnsupportedSetting, resolve_device, resolve_precision
from loaderbench.run.checkpoint import load_checkpoint, save_checkpoint
from loaderbench.training.models import ImageClassifier, build_model


def model_cfg(name: str, **kwargs):
    cfg = OmegaConf.structured(ModelConfig)
    cfg.name = name
    for key, value in kwargs.items():
        cfg[key] = value
    return cfg


def test_wrapper_normalises_uint8_on_the_device() -> None:
    mean, std = (0.5, 0.25, 0.0), (0.5, 0.25, 1.0)
    model = ImageClassifier(nn.Identity(), mean, std)
    images = torch.randint(0, 256, (2, 3, 4, 4), dtype=torch.uint8)
    out = model(images)
    expected = (images.float() / 255 - torch.tensor(mean).view(1, 3, 1, 1)) / torch.tensor(
        std
    ).view(1, 3, 1, 1)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)


def test_build_model_uses_timm_and_its_mean_std() -> None:
    model = build_model(model_cfg("test_resnet", channels_last=True), 7, torch.device("cpu"))
    logits = model(torch.randint(0, 256, (2, 3, 32, 32), dtype=torch.uint8))
    assert logits.shape == (2, 7)
    import timm

    expected = timm.data.resolve_model_data_config(model.backbone)
    torch.testing.assert_close(model.mean, torch.tensor(expected["mean"], dtype=torch.float32))
    torch.testing.assert_close(model.std, torch.tensor(expected["std"], dtype=torch.float32))


def test_model_none_and_unknown_model() -> None:
    assert build_model(model_cfg("none"), 3, torch.device("cpu")) is None
    with pytest.raises(ValueError, match="model.name='no_such_net'"):
        build_model(model_cfg("no_such_net"), 3, torch.device("cpu"))


def test_device_and_precision_errors_are_clear() -> None:
    cpu = torch.device("cpu")
    assert resolve_device(OmegaConf.structured(DeviceConfig(type="cpu"))) == cpu
    if not torch.cuda.is_available():
        assert resolve_device(OmegaConf.structured(DeviceConfig(type="auto"))) == cpu
        with pytest.raises(UnsupportedSetting, match="no CUDA device"):
            resolve_device(OmegaConf.structured(DeviceConfig(type="cuda")))
        with pytest.raises(UnsupportedSetting, match="fp16 needs a CUDA device"):
            resolve_precision("fp16", cpu)
    with pytest.raises(UnsupportedSetting, match="tpu"):
        resolve_device(OmegaConf.structured(DeviceConfig(type="tpu")))
    bf16 = resolve_precision("bf16", cpu)
    with bf16.autocast(cpu):
        out = nn.Linear(4, 4)(torch.randn(2, 4))
    assert out.dtype == torch.bfloat16
    with pytest.raises(UnsupportedSetting, match="fp8"):
        resolve_precision("fp8", cpu)


def test_checkpoint_is_atomic_and_weights_only(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint.pt"
    state = {"model": {"w": torch.ones(3)}, "config": {"a": 1}, "epoch": 2}
    save_checkpoint(path, state)
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint.pt"]
    loaded = torch.load(path, weights_only=True)
    assert loaded["epoch"] == 2 and torch.equal(loaded["model"]["w"], torch.ones(3))

    # A failed write leaves the previous checkpoint whole, and no temporary file.
    class Boom(Exception):
        pass

    def bad(tmp: Path) -> None:
        tmp.write_bytes(b"partial")
        raise Boom

    from loaderbench.platform.atomic import atomic_write

    with pytest.raises(Boom):
        atomic_write(path, bad)
    assert load_checkpoint(path)["epoch"] == 2
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint.pt"]

    path.write_bytes(b"garbage")
    with pytest.raises(ValueError, match="cannot be read"):
        load_checkpoint(path)


def test_intra_op_threads_follow_the_allotment_less_the_loader() -> None:
    import os

    from loaderbench.platform.runtime import allotted_cpus, set_intra_op_threads

    before, omp = torch.get_num_threads(), os.environ.get("OMP_NUM_THREADS")
    try:
        slurm = {"SLURM_JOB_ID": "7", "SLURM_CPUS_PER_TASK": "4"}
        assert set_intra_op_threads(None, 1, slurm).threads == 3
        assert torch.get_num_threads() == 3 and os.environ["OMP_NUM_THREADS"] == "3"
        # No -c: the node's CPUs shared by its tasks.
        node = {"SLURM_JOB_ID": "7", "SLURM_CPUS_ON_NODE": "16", "SLURM_TASKS_PER_NODE": "4(x2)"}
        assert allotted_cpus(node) == (4, "SLURM_CPUS_ON_NODE=16 / 4 tasks")
        assert set_intra_op_threads(None, 8, node).threads == 1  # at least one
        cpus = len(os.sched_getaffinity(0))
        torchrun = {"LOCAL_WORLD_SIZE": "2"}
        assert allotted_cpus(torchrun) == (max(1, cpus // 2), f"{cpus} CPUs / 2 local ranks")
        assert set_intra_op_threads(5, 2, slurm) == (5, "runtime.threads")
        torch.set_num_threads(before)
        plain = set_intra_op_threads(None, 2, {})
        assert plain == (before, "torch")
    finally:
        torch.set_num_threads(before)
        if omp is None:
            os.environ.pop("OMP_NUM_THREADS", None)
        else:
            os.environ["OMP_NUM_THREADS"] = omp
