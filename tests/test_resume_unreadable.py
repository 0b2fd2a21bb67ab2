"""A run preempted after its loader left out an all-unreadable batch continues from the right
place in the epoch's order: the resumed run ends with the weights and the step count of an
uninterrupted run, in every loader (issue 29, A3). A loader's ``position`` itself (the batches
of the order gone through, a left-out one included) is the loader contract's
(tests/test_loader_contract.py).

Every loader leaves out a batch whose files are all unreadable, so an epoch takes fewer steps
than it has batches in its order; a resume that skipped ``steps`` batches of the order would
train the batch before the preemption point a second time.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from loaderbench.data.order import epoch_permutation, shard_indices
from loaderbench.data.synthetic import SyntheticSpec, ensure_synthetic
from loaderbench.loaders import file_loader_names
from tests.conftest import (
    REPO,
    finish,
    folder_index,
    loader_folder_overrides,
    start_torchrun,
    torchrun,
)
from tests.in_process import run_here

pytestmark = pytest.mark.slow

# 24 train images: 6 batches an epoch; the second of epoch 1 (seed 0) all unreadable files.
BATCH, BAD_BATCH, BATCHES, EPOCHS = 4, 1, 6, 2
RECIPE = [
    "model.name=test_resnet",
    "model.drop_rate=0.3",  # a dropout stream: a batch trained twice shows in the weights
    "device=cpu",
    "logger=none",
    f"epochs={EPOCHS}",
    "image_size=32",
    f"loader.batch_size={BATCH}",
    "loader.num_workers=1",
    "seed=0",
    "bench.ceiling_batches=0",  # no resident pass at the end: tests/test_ceiling.py's subject
]


def with_bad_batch(folder: Path, per_class: int, world_size: int = 1) -> Path:
    """A 2-class tree of ``per_class`` train images a class whose rank 0's second batch of
    epoch 1 (seed 0) holds files that are not JPEGs but carry the name of one: truncated
    bytes of a real JPEG, and garbage."""
    spec = SyntheticSpec(
        num_classes=2, train_per_class=per_class, val_per_class=4, seed=7, max_side=64
    )
    root = ensure_synthetic(spec, folder)
    train = folder_index(root).train
    first_epoch = epoch_orders(len(train), world_size)[0]
    assert len(first_epoch) == BATCHES
    for number, index in enumerate(first_epoch[BAD_BATCH].tolist()):
        path = Path(train.paths[index])
        assert path.suffix.lower() in (".jpg", ".jpeg")
        data = path.read_bytes()
        path.write_bytes(data[:40] if number % 2 else b"\x00garbage, not a JPEG" * 8)
    return root


@pytest.fixture(scope="module")
def bad_batch_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """24 train images: 6 batches an epoch, the second of epoch 1 all unreadable files."""
    return with_bad_batch(tmp_path_factory.mktemp("data"), 12)


def epoch_orders(images: int, world_size: int = 1) -> list[list[torch.Tensor]]:
    """Rank 0's batches of image indices each epoch (seed 0), as every loader goes through."""
    orders = (epoch_permutation(images, 0, epoch, shuffle=True) for epoch in range(EPOCHS))
    shares = (shard_indices(o, BATCH, True, 0, world_size) for o in orders)
    return [list(torch.split(share, BATCH)) for share in shares]


def steps_taken(root: Path) -> int:
    """The steps of an uninterrupted run: its batches, less those of unreadable files only."""
    train = folder_index(root).train
    orders = epoch_orders(len(train))
    bad = set(orders[0][BAD_BATCH].tolist())
    return sum(any(i not in bad for i in batch.tolist()) for order in orders for batch in order)


def train_run(*overrides: str, run_dir: Path, preempt: bool) -> subprocess.CompletedProcess | None:
    """train.py, or (``preempt``) train.py that sends itself SIGUSR2 at its first skipped
    file (tests/preempt_on_skip.py): it stops at the next step with a checkpoint."""
    args = [*overrides, f"hydra.run.dir={run_dir}"]
    if not preempt:
        run_here("train.py", *args, cwd=run_dir.parent)
        return None
    proc = subprocess.run(
        [sys.executable, str(REPO / "tests" / "preempt_on_skip.py"), *args],
        cwd=run_dir.parent,
        env={**os.environ, "WANDB_MODE": "offline", "PYTHONUNBUFFERED": "1"},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode != 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "preempted (SIGUSR2)" in proc.stderr + proc.stdout, proc.stderr[-4000:]
    return proc


@pytest.mark.parametrize("loader", file_loader_names())
def test_a_resume_after_an_all_unreadable_batch_trains_no_batch_twice(
    loader: str, bad_batch_root: Path, tmp_path: Path
) -> None:
    # (memmap builds its cache without the unreadable files; a batch of them all is left out
    # when an epoch meets it, as in the other loaders.)
    common = [
        f"dataset.root={bad_batch_root}",
        f"loader={loader}",
        *RECIPE,
        *loader_folder_overrides(loader, tmp_path),
    ]
    whole_dir, run_dir = tmp_path / "whole" / "run", tmp_path / "preempted" / "run"
    for folder in (whole_dir.parent, run_dir.parent):
        folder.mkdir(parents=True)
    train_run(*common, run_dir=whole_dir, preempt=False)
    expected = torch.load(whole_dir / "checkpoint.pt", weights_only=True)

    train_run(*common, run_dir=run_dir, preempt=True)
    stopped = torch.load(run_dir / "checkpoint.pt", weights_only=True)
    # Stopped in epoch 1 at the step after the left-out batch: 2 steps taken, 3 of its
    # batches gone through.
    assert (stopped["epoch"], stopped["batches"]) == (0, BAD_BATCH + 1)
    assert stopped["ranks"][0]["position"] == BAD_BATCH + 2

    run_here("train.py", *common, f"hydra.run.dir={run_dir}", cwd=run_dir.parent)  # requeued
    resumed = torch.load(run_dir / "checkpoint.pt", weights_only=True)
    assert resumed["epoch"] == expected["epoch"] == 2
    # Epoch 1 took 5 steps (its 6 batches but the unreadable one), and so did the resumed
    # run; the schedule counts the steps taken (its last_epoch: steps, after LambdaLR's own).
    assert expected["scheduler"]["last_epoch"] == steps_taken(bad_batch_root) <= 2 * BATCHES - 1
    assert resumed["scheduler"]["last_epoch"] == expected["scheduler"]["last_epoch"]
    assert_same_weights(resumed, expected)
    assert resumed["metrics"]["loss"] == pytest.approx(expected["metrics"]["loss"], rel=1e-5)


def assert_same_weights(resumed: dict, expected: dict) -> None:
    for name, tensor in expected["model"].items():
        torch.testing.assert_close(
            resumed["model"][name], tensor, rtol=1e-5, atol=1e-6, msg=lambda m, n=name: f"{n}: {m}"
        )


def test_two_ranks_resume_each_from_its_own_place_in_the_order(
    tmp_path_factory: pytest.TempPathFactory, tmp_path: Path
) -> None:
    """Rank 0 leaves out its second batch (a blank step at the epoch's end makes up its
    count); rank 1 leaves out none. Stopped at step 2 (the ranks agree at every step), rank 0
    has gone through 3 batches of its share and rank 1 through 2: each resumes from its own."""
    root = with_bad_batch(tmp_path_factory.mktemp("data2"), 24, world_size=2)
    common = [
        f"dataset.root={root}",
        "loader=torchvision",
        *RECIPE,
        "logger.log_every_n_steps=1",  # the ranks agree on a stop at every step
    ]
    whole_dir, run_dir = tmp_path / "whole" / "run", tmp_path / "preempted" / "run"
    for folder in (whole_dir.parent, run_dir.parent):
        folder.mkdir(parents=True)
    torchrun(*common, f"hydra.run.dir={whole_dir}", cwd=whole_dir.parent)
    expected = torch.load(whole_dir / "checkpoint.pt", weights_only=True)

    args = [*common, f"hydra.run.dir={run_dir}"]
    proc = start_torchrun(*args, cwd=run_dir.parent, script=REPO / "tests" / "preempt_on_skip.py")
    output = finish(proc, 900)
    assert "preempted (SIGUSR2)" in output, output[-4000:]
    stopped = torch.load(run_dir / "checkpoint.pt", weights_only=True)
    assert (stopped["epoch"], stopped["batches"]) == (0, BAD_BATCH + 1), output[-3000:]
    positions = [rank["position"] for rank in stopped["ranks"]]
    assert positions == [BAD_BATCH + 2, BAD_BATCH + 1]

    torchrun(*args, cwd=run_dir.parent)  # the requeued job: same command, no flag
    resumed = torch.load(run_dir / "checkpoint.pt", weights_only=True)
    assert resumed["epoch"] == expected["epoch"] == 2
    assert resumed["scheduler"]["last_epoch"] == expected["scheduler"]["last_epoch"]
    assert_same_weights(resumed, expected)
