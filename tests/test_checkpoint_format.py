"""Checkpoints of formats 1-3 are no longer read (issue 44): a checkpoint of any format but
``FORMAT_VERSION``, or of none, is refused wherever a run reads one (train.resume=true, a
requeued job's own run directory, eval.py), with an error naming the file, its format, the
format this version reads and what to do. The files are written as the versions that wrote
those formats did (``torch.save`` of their dict), not through ``save_checkpoint``."""

from __future__ import annotations

import random
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf
from torch import nn

from loaderbench.run._elastic import fit_to_checkpoint
from loaderbench.run._resume_rules import find_resumable
from loaderbench.run._validation import validate_config
from loaderbench.run.checkpoint import (
    CHECKPOINT_FILE,
    FORMAT_VERSION,
    CheckpointFormatError,
    load_checkpoint,
)
from tests.conftest import read_metrics, run_dirs, run_entry
from tests.helpers import compose_cfg
from tests.in_process import run_here

CLASSES = ["n01440764", "n01443537", "n01484850"]


def train_config(*overrides: str) -> tuple[Any, dict[str, Any]]:
    """A train.py run's typed config and the config as composed (what a checkpoint keeps)."""
    cfg = compose_cfg("train", ["device=cpu", "logger=none", *overrides])
    return validate_config(cfg), OmegaConf.to_container(cfg, resolve=True)


def old_checkpoint(version: int, composed: dict[str, Any]) -> dict[str, Any]:
    """A checkpoint as the version that wrote format ``version`` saved it, stopped 2 steps into
    epoch 2: format 1 with rank 0's random streams alone (numpy's key only) and no GradScaler;
    2 with every rank's streams, running loss and the run's world size and train set; 3 with
    each rank's position in the epoch's order too. None had the global batch, the elastic
    resume's ``order_base`` or the ledger (format 4)."""
    model = nn.Linear(4, len(CLASSES))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    model(torch.randn(2, 4)).sum().backward()
    optimizer.step()
    scheduler.step()
    streams = {
        "torch": torch.get_rng_state(),
        "python": list(random.getstate()[1]),
        "numpy": torch.from_numpy(np.random.get_state()[1].astype(np.int64)),
    }
    state: dict[str, Any] = {
        "format_version": version,
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "scheduler": scheduler.state_dict(),
        "epoch": 1,
        "batches": 2,
        "requeues": 1,
        "wandb_run_id": None,
        "config": composed,
        "classes": CLASSES,
        "metrics": {"epochs": 1, "loss": 1.0},
    }
    if version == 1:
        return {**state, "rng": streams}
    rank = {"rng": streams, "epoch_loss": (2.0, 2)}
    if version >= 3:
        rank["position"] = 2
    return {
        **state,
        "scaler": {},
        "world_size": 1,
        "train_set": {"images": 24, "labels_sha1": "0" * 40},
        "ranks": [rank],
    }


def assert_names_it(message: str, path: Path, version: int) -> None:
    assert f"checkpoint {path} is in checkpoint format {version}" in message, message
    assert f"reads checkpoint format {FORMAT_VERSION} only" in message, message
    assert "train the run again with this version" in message, message
    assert f"a loaderbench checkout that writes format {version}" in message, message


@pytest.mark.parametrize("version", [1, 2, 3])
def test_an_old_checkpoint_is_refused_naming_its_format_and_what_to_do(
    version: int, tmp_path: Path
) -> None:
    path = tmp_path / f"format{version}.pt"
    torch.save(old_checkpoint(version, train_config()[1]), path)
    with pytest.raises(CheckpointFormatError) as raised:
        load_checkpoint(path)
    assert_names_it(str(raised.value), path, version)


def test_a_checkpoint_of_no_format_or_a_later_one_is_refused(tmp_path: Path) -> None:
    state = old_checkpoint(3, train_config()[1])
    del state["format_version"]
    path = tmp_path / "none.pt"
    torch.save(state, path)
    with pytest.raises(CheckpointFormatError, match=r"records no format_version") as raised:
        load_checkpoint(path)
    assert str(path) in str(raised.value) and f"format {FORMAT_VERSION} only" in str(raised.value)
    later = tmp_path / "later.pt"
    torch.save({**state, "format_version": FORMAT_VERSION + 1}, later)
    with pytest.raises(CheckpointFormatError) as raised:
        load_checkpoint(later)
    message = str(raised.value)
    assert f"checkpoint {later} is in checkpoint format {FORMAT_VERSION + 1}" in message
    assert "a later loaderbench" in message and "update this checkout" in message


def test_train_resume_refuses_an_old_checkpoint_before_any_loader_is_built(
    tmp_path: Path,
) -> None:
    """``fit_to_checkpoint`` reads the checkpoint's global batch before anything is built:
    an old checkpoint (which has none) is refused there, by name, not with a KeyError."""
    path = tmp_path / "format3.pt"
    config, composed = train_config("train.resume=true", f"checkpoint={path}")
    torch.save(old_checkpoint(3, composed), path)
    with pytest.raises(CheckpointFormatError) as raised:
        fit_to_checkpoint(config, None, 1)
    assert_names_it(str(raised.value), path, 3)


def test_a_requeued_run_refuses_its_own_old_checkpoint_rather_than_start_afresh(
    tmp_path: Path,
) -> None:
    """The run directory's checkpoint of this very config, in format 3: a fresh start would
    overwrite it, so the requeued job stops, naming it."""
    config, composed = train_config()
    path = tmp_path / CHECKPOINT_FILE
    torch.save(old_checkpoint(3, composed), path)
    with pytest.raises(CheckpointFormatError) as raised:
        find_resumable(config, composed, tmp_path, "train")
    assert_names_it(str(raised.value), path, 3)
    # Another run's checkpoint is left alone, whatever its format, as before.
    other = train_config("seed=1")[1]
    torch.save(old_checkpoint(3, other), path)
    assert find_resumable(config, composed, tmp_path, "train") is None


@pytest.mark.slow
def test_train_and_eval_refuse_a_real_format_3_checkpoint(tiny_root: Path, tmp_path: Path) -> None:
    """A real train.py checkpoint made into what format 3 wrote (no global batch, order base
    nor ledger): train.resume=true and eval.py both fail, saying why in their output and in
    metrics.json."""
    common = [
        f"dataset.root={tiny_root}",
        "device=cpu",
        "logger=none",
        "model.name=test_convnext",
        "image_size=32",
        "loader.batch_size=8",
        "loader.num_workers=0",
        "bench.ceiling_batches=0",
    ]
    (tmp_path / "a").mkdir()
    run_here("train.py", *common, "epochs=2", "train.stop_after_epochs=1", cwd=tmp_path / "a")
    (first,) = run_dirs(tmp_path / "a", "train")
    state = torch.load(first / CHECKPOINT_FILE, weights_only=True)
    for key in ("global_batch", "order_base", "ledger"):
        state.pop(key)
    older = tmp_path / "format3.pt"
    torch.save({**state, "format_version": 3}, older)
    for script, task, args in [
        ("train.py", "train", ["epochs=2", "train.resume=true"]),
        ("eval.py", "eval", ["model=from_checkpoint"]),
    ]:
        cwd = tmp_path / task
        cwd.mkdir()
        proc = run_entry(script, *common, *args, f"checkpoint={older}", cwd=cwd, check=False)
        said = proc.stdout + proc.stderr
        assert proc.returncode != 0, said[-3000:]
        assert_names_it(re.sub(r"\s+", " ", said), older, 3)
        (run_dir,) = run_dirs(cwd, task)
        metrics = read_metrics(run_dir)
        assert metrics["status"] == "failed"
        assert metrics["error"].startswith("CheckpointFormatError: ")
        assert_names_it(metrics["error"], older, 3)
