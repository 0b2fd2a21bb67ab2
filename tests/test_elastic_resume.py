"""A checkpoint taken on N ranks resumes on M (issue 31, item 2): the global batch is kept
(each rank takes global / M; a count that does not divide it is refused, naming both), the
epoch's global order and the place in it are kept, and the ledger of the images trained on
(metrics.json ``epoch_samples``, ``epoch_repeats``) is an uninterrupted run's: every image of
every epoch once, none twice, counted from the batches the steps had, and the weights are an
uninterrupted run's, in every loader.

The end-to-end runs are real torchrun jobs (gloo on the CPU) preempted by SIGUSR2 the way
SLURM signals every task, and requeued with the same command on another number of ranks:
2 ranks stopped in epoch 2 continue on 1, which is stopped in epoch 3 and continues on 2.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import time
from pathlib import Path

import psutil
import pytest
import torch

from loaderbench.data.order import training_places
from loaderbench.data.synthetic import SyntheticSpec, ensure_synthetic
from loaderbench.loaders import file_loader_names
from loaderbench.run._elastic import continued_rank_state, per_rank_batch, resumed_epoch
from loaderbench.run._ledger import SampleLedger
from loaderbench.run._validation import ConfigError
from tests.conftest import (
    finish,
    loader_folder_overrides,
    read_metrics,
    start_torchrun,
    torchrun,
)
from tests.in_process import run_here

# 44 train images, a global batch of 8 (2 ranks x 4, or 1 x 8): 5 steps an epoch, and the 4
# images past the last whole global batch are left out of every epoch, at any rank count.
BATCH, RANKS, EPOCHS, STEPS, PER_EPOCH = 4, 2, 3, 5, 40
# test_convnext normalises with LayerNorm (no statistics over the batch) and draws nothing at
# random in training: the weights do not depend on how the global batch is split over ranks,
# but for the order of the floating-point sums.
RECIPE = [
    "device=cpu",
    "model.name=test_convnext",
    "logger=none",
    f"epochs={EPOCHS}",
    "image_size=32",
    f"loader.batch_size={BATCH}",
    "loader.num_workers=1",
    "logger.log_every_n_steps=1",  # the ranks agree on a stop at every step
    "seed=0",
    "bench.ceiling_batches=0",  # no resident pass at the end: tests/test_ceiling.py's subject
]


@pytest.fixture(scope="module")
def elastic_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    spec = SyntheticSpec(num_classes=2, train_per_class=22, val_per_class=4, seed=5, max_side=64)
    return ensure_synthetic(spec, tmp_path_factory.mktemp("elastic"))


def preempt_after(proc: subprocess.Popen, marker: str, timeout: float = 600) -> str:
    """Read the job's output until ``marker``, send SIGUSR2 to every rank (the torchrun
    agent's children, as SLURM signals every task); return everything it printed."""
    lines, deadline = [], time.monotonic() + timeout
    assert proc.stdout is not None
    for line in proc.stdout:
        lines.append(line)
        if marker in line:
            for rank in psutil.Process(proc.pid).children():
                rank.send_signal(signal.SIGUSR2)
            break
        assert time.monotonic() < deadline, "".join(lines[-20:])
    output = "".join(lines) + finish(proc, timeout)
    assert "preempted (SIGUSR2)" in output, output[-4000:]
    return output


def checkpoint(run_dir: Path) -> dict:
    return torch.load(run_dir / "checkpoint.pt", weights_only=True)


@pytest.mark.slow
@pytest.mark.parametrize("loader", file_loader_names())
def test_two_ranks_preempted_resume_on_one_then_one_on_two(
    loader: str, elastic_root: Path, tmp_path: Path
) -> None:
    run_dir = tmp_path / "run"
    args = [
        *RECIPE,
        f"dataset.root={elastic_root}",
        f"loader={loader}",
        *loader_folder_overrides(loader, tmp_path),
        f"hydra.run.dir={run_dir}",
    ]
    preempt_after(start_torchrun(*args, cwd=tmp_path, nproc=RANKS), "epoch 1/3:")
    first = checkpoint(run_dir)
    assert (first["epoch"], first["world_size"], first["global_batch"]) == (1, 2, 8)
    assert 0 < first["batches"] < STEPS  # in the middle of epoch 2
    if loader == "torchvision":  # the refusal, from this checkpoint (once: it is the loaders')
        refused_on_three_ranks(first, args, tmp_path)

    # The requeued job, on 1 rank with the same command: a per-rank batch of 8.
    said = preempt_after(start_torchrun(*args, cwd=tmp_path, nproc=1), "epoch 2/3:")
    assert "global batch 8 kept, loader.batch_size=8 per rank (4 on" in said, said[-4000:]
    second = checkpoint(run_dir)
    assert (second["epoch"], second["world_size"], second["global_batch"]) == (2, 1, 8)
    assert 0 < second["batches"] < STEPS  # in the middle of epoch 3
    assert read_metrics(run_dir)["batch_size"] == 8

    said = torchrun(*args, cwd=tmp_path, nproc=RANKS).stdout  # and again on 2 ranks
    assert "global batch 8 kept, loader.batch_size=4 per rank (8 on" in said, said[-4000:]
    metrics = read_metrics(run_dir)
    assert metrics["status"] == "ok" and metrics["requeues"] == 2, said[-3000:]
    assert metrics["epoch_samples"] == [PER_EPOCH] * EPOCHS, said[-3000:]
    assert metrics["epoch_repeats"] == [0] * EPOCHS
    resumed = checkpoint(run_dir)
    assert resumed["scheduler"]["last_epoch"] == EPOCHS * STEPS  # the run's steps, no more
    # The ledger counts the batches the steps had, and the weights show which images they
    # were: a batch served twice or the wrong images after a resume fail one or the other.
    same_as_uninterrupted(resumed, metrics, elastic_root, tmp_path, loader)


def refused_on_three_ranks(state: dict, args: list[str], tmp_path: Path) -> None:
    """3 ranks do not divide the global batch of 8: refused before anything starts, naming
    both counts."""
    saved = tmp_path / "two_ranks.pt"
    torch.save(state, saved)
    cwd = tmp_path / "three"
    cwd.mkdir()
    others = [a for a in args if not a.startswith("hydra.run.dir=")]
    resume = ["train.resume=true", f"checkpoint={saved}", f"hydra.run.dir={cwd / 'run'}"]
    proc = torchrun(*others, *resume, cwd=cwd, nproc=3, check=False, timeout=600)
    assert proc.returncode != 0
    assert "checkpoint taken on 2 ranks with a global batch of 8" in proc.stdout, proc.stdout
    assert "cannot resume on 3 ranks: 3 does not divide 8" in proc.stdout


def same_as_uninterrupted(
    resumed: dict, metrics: dict, root: Path, tmp_path: Path, loader: str
) -> None:
    """The uninterrupted run of ``loader`` with the same global batch (1 rank of 8): the same
    samples, the same steps, the same weights (within the summation order's rounding)."""
    whole = tmp_path / "whole"
    whole.mkdir()
    recipe = [a for a in RECIPE if not a.startswith("loader.batch_size=")]
    run_here(
        "train.py",
        *recipe,
        f"loader={loader}",
        *loader_folder_overrides(loader, tmp_path),
        f"loader.batch_size={BATCH * RANKS}",
        f"dataset.root={root}",
        f"hydra.run.dir={whole / 'run'}",
        cwd=whole,
    )
    expected = checkpoint(whole / "run")
    uninterrupted = read_metrics(whole / "run")
    assert metrics["epoch_samples"] == uninterrupted["epoch_samples"] == [PER_EPOCH] * EPOCHS
    assert metrics["epoch_repeats"] == uninterrupted["epoch_repeats"]
    assert resumed["scheduler"]["last_epoch"] == expected["scheduler"]["last_epoch"]
    for name, tensor in expected["model"].items():
        torch.testing.assert_close(
            resumed["model"][name], tensor, rtol=1e-3, atol=2e-4, msg=lambda m, n=name: f"{n}: {m}"
        )  # AdamW's steps are ~1e-3 a weight: a batch lost or repeated shows
    assert metrics["top1"] == pytest.approx(uninterrupted["top1"], abs=1 / 8)  # 8 val images
    shutil.rmtree(whole / "run" / ".hydra", ignore_errors=True)


# ---------------------------------------------------------------------------------------------
# The parts, in one process.


def stopped_state(
    images: int, per_rank: int, positions: list[int], steps: int, base: torch.Tensor | None
) -> dict:
    """A checkpoint's fields as ``resumed_epoch`` reads them: stopped after ``steps`` steps of
    epoch 3, each rank at its ``positions`` (more than ``steps`` after a left-out batch)."""
    from loaderbench.run._elastic import pack_places

    return {
        "epoch": 3,
        "batches": steps,
        "world_size": len(positions),
        "global_batch": per_rank * len(positions),
        "train_set": {"images": images},
        "ranks": [{"position": p} for p in positions],
        "order_base": None if base is None else pack_places(base),
    }


def shares(images: int, global_batch: int, ranks: int, done: torch.Tensor | None) -> list:
    return [training_places(images, global_batch, r, ranks, done) for r in range(ranks)]


@pytest.mark.parametrize(
    ("saved_positions", "ranks"),
    [
        ([3, 3], 1),  # 2 ranks at step 3 -> 1
        ([3], 2),  # 1 -> 2
        ([3, 3], 4),  # 2 -> 4
        ([4, 3], 1),  # rank 0 left out an all-unreadable batch: a place further on
    ],
)
def test_the_rest_of_the_epoch_is_shared_out_each_place_once(
    saved_positions: list[int], ranks: int
) -> None:
    images, global_batch = 83, 8  # 10 whole global batches; 3 images never in the epoch
    per_rank = global_batch // len(saved_positions)
    state = stopped_state(images, per_rank, saved_positions, 3, None)
    resumed = resumed_epoch(state, ranks)
    assert resumed is not None and resumed.epoch == 3
    gone = shares(images, global_batch, len(saved_positions), None)
    gone = [share[: p * per_rank] for share, p in zip(gone, saved_positions, strict=True)]
    rest = shares(images, global_batch, ranks, resumed.done)
    every = torch.cat([*gone, *rest]).tolist()
    assert sorted(every) == list(range(80))  # each place of the whole batches exactly once
    if len(set(saved_positions)) == 1:  # the order kept: the global batches that were next
        assert sorted(torch.cat(rest).tolist()) == list(range(3 * global_batch, 80))
        assert {len(share) for share in rest} == {(10 - 3) * global_batch // ranks}


def test_a_second_resume_in_the_same_epoch_counts_from_the_first() -> None:
    """2 ranks stop at step 3, 1 rank continues and stops 2 steps later, 2 continue: each
    place once over the three, with the 1-rank run's position counted in its own order."""
    images, global_batch = 80, 8
    first = resumed_epoch(stopped_state(images, 4, [3, 3], 3, None), 1)
    assert first is not None
    (alone,) = shares(images, global_batch, 1, first.done)
    second = resumed_epoch(stopped_state(images, 8, [2], 5, first.done), 2)
    assert second is not None
    rest = shares(images, global_batch, 2, second.done)
    every = [*range(24), *alone[:16].tolist(), *torch.cat(rest).tolist()]
    assert sorted(every) == list(range(80))
    # The same number of ranks as the checkpoint's continues that order from each position.
    same = resumed_epoch(stopped_state(images, 8, [2], 5, first.done), 1)
    assert same is not None and torch.equal(same.done, first.done)
    assert resumed_epoch(stopped_state(images, 4, [3, 3], 3, None), 2) is None


def test_a_count_that_does_not_divide_the_global_batch_is_refused_naming_both() -> None:
    assert per_rank_batch(96, 8, 4) == 24
    with pytest.raises(ConfigError, match=r"taken on 8 ranks .* 96 .* on 5 ranks"):
        per_rank_batch(96, 8, 5)


def test_the_running_loss_is_shared_out_over_the_new_ranks() -> None:
    saved = [{"epoch_loss": (6.0, 4), "rng": "r0"}, {"epoch_loss": (2.0, 4), "rng": "r1"}]
    one = continued_rank_state(saved, 0, 1)
    assert one["epoch_loss"] == (8.0, 8) and one["rng"] == "r0" and one["position"] == 0
    four = [continued_rank_state(saved, r, 4) for r in range(4)]
    assert sum(s["epoch_loss"][0] for s in four) == 8.0
    assert "rng" not in four[3]  # a rank beyond the saved ones keeps its own streams


def test_the_ledger_counts_each_image_once_and_catches_a_repeat_after_a_restore() -> None:
    ledger = SampleLedger(10)
    ledger.tally(0, torch.arange(10))
    ledger.close_epoch(0)
    ledger.tally(1, torch.tensor([0, 1, 2, 3]))  # preempted in epoch 1
    saved = ledger.state()
    assert saved["epoch"] == 1 and len(saved["seen"]) == 2  # 10 bits, packed
    again = SampleLedger(10)
    again.restore(saved)
    again.tally(1, torch.tensor([3, 4, 5, 6, 7, 8, 9]))  # image 3 a second time
    again.close_epoch(1)
    assert again.metrics() == {"epoch_samples": [10, 10], "epoch_repeats": [0, 1]}
    # A preemption at an epoch's last step: the resumed run trains nothing more of it.
    last = SampleLedger(10)
    last.restore(saved)
    last.tally(1, torch.tensor([], dtype=torch.int64))
    last.close_epoch(1)
    assert last.metrics()["epoch_samples"] == [10, 4]


def test_a_relaunch_that_finds_no_checkpoint_says_where_it_looked(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A plain torchrun re-launch gets a new run directory and starts afresh: the log names
    the directory it looked in, and how to continue a run; a 1-rank launch that is not a
    SLURM requeue, or one that asked for a checkpoint, says nothing."""
    from loaderbench.config.schema import RunConfig
    from loaderbench.run._resume_rules import note_fresh_start

    monkeypatch.delenv("SLURM_RESTART_COUNT", raising=False)
    with caplog.at_level("INFO", logger="loaderbench.run._resume_rules"):
        note_fresh_start(RunConfig(), tmp_path, "train", 1)
        assert "starting afresh" not in caplog.text
        note_fresh_start(RunConfig(), tmp_path, "train", 2)
    assert f"no checkpoint in {tmp_path}" in caplog.text and "hydra.run.dir" in caplog.text
    caplog.clear()
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")  # a requeued SLURM job, one task
    with caplog.at_level("INFO", logger="loaderbench.run._resume_rules"):
        note_fresh_start(RunConfig(), tmp_path, "train", 1)
    assert "starting afresh" in caplog.text
