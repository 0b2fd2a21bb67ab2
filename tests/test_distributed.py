"""Data-parallel runs: sharding in every loader, and real torchrun jobs with gloo on the CPU."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import torch

from loaderbench.loaders import build_loader
from loaderbench.loaders.base import shard_indices
from tests.conftest import (
    REPO,
    cpu_spec,
    folder_index,
    read_metrics,
    run_dirs,
    run_entry,
    single_run,
)

LOADERS = ["torchvision", "memmap", "spdl"]


def test_shard_indices_cover_the_epoch_once() -> None:
    order = torch.randperm(103, generator=torch.Generator().manual_seed(0))
    val = [shard_indices(order, 8, False, r, 3) for r in range(3)]
    assert sorted(torch.cat(val).tolist()) == list(range(103))
    train = [shard_indices(order, 8, True, r, 3) for r in range(3)]
    assert {len(t) for t in train} == {32}  # equal full batches on every rank
    assert len(set(torch.cat(train).tolist())) == 96


def epoch_images(name: str, split, rank: int, world: int, tmp_path: Path, train: bool):
    spec = cpu_spec(
        split,
        train,
        batch_size=4,
        rank=rank,
        world_size=world,
        loader=name,
        on_error="raise",
        **({"cache_dir": str(tmp_path / "cache")} if name == "memmap" else {}),
    )
    loader = build_loader(spec)
    try:
        batches = list(loader)
    finally:
        loader.close()
    images = torch.cat([b.images for b in batches])
    labels = torch.cat([b.labels for b in batches]).tolist()
    return [hashlib.sha1(img.numpy().tobytes()).hexdigest() for img in images], labels


@pytest.mark.parametrize("name", LOADERS)
def test_ranks_see_disjoint_shares_of_every_epoch(
    name: str, tiny_root: Path, tmp_path: Path
) -> None:
    index = folder_index(tiny_root)
    whole, whole_labels = epoch_images(name, index.val, 0, 1, tmp_path, train=False)
    shares = [epoch_images(name, index.val, r, 2, tmp_path, train=False) for r in range(2)]
    union = shares[0][0] + shares[1][0]
    assert Counter(union) == Counter(whole) and len(whole) == len(index.val)
    assert Counter(shares[0][1] + shares[1][1]) == Counter(whole_labels)
    assert not set(shares[0][0]) & set(shares[1][0])
    train = [epoch_images(name, index.train, r, 2, tmp_path, train=True)[1] for r in range(2)]
    assert len(train[0]) == len(train[1]) == 12  # 24 images, 12 a rank, whole batches of 4


def torchrun(*args: str, cwd: Path, check: bool = True) -> subprocess.CompletedProcess:
    """train.py under torchrun, two processes on this machine."""
    env = {**os.environ, "WANDB_MODE": "offline", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node=2",
            str(REPO / "train.py"),
            *args,
        ],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    if check:
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return proc


@pytest.mark.slow
@pytest.mark.parametrize("name", LOADERS)
def test_torchrun_two_processes(name: str, small_root: Path, tmp_path: Path) -> None:
    cache = [f"loader.cache_dir={tmp_path / 'cache'}"] if name == "memmap" else []
    torchrun(
        "device=cpu",
        f"loader={name}",
        f"dataset.root={small_root}",
        "epochs=2",
        "model.name=test_resnet",
        "loader.batch_size=16",
        "loader.num_workers=1",
        "logger=none",
        *cache,
        cwd=tmp_path,
    )
    run_dir, metrics = single_run(tmp_path, "train")
    assert run_dir.name.startswith("torchrun-")
    assert metrics["world_size"] == 2 and metrics["status"] == "ok"
    # 160 images: 80 a rank, 5 whole batches of 16 each, 2 epochs.
    assert metrics["images"] == 2 * 160
    assert (run_dir / "checkpoint.pt").is_file()
    assert len(list((tmp_path / "outputs").rglob("checkpoint.pt"))) == 1

    # The val accuracy reduced over the ranks is the whole val set's, as one process sees it.
    eval_cwd = tmp_path / "eval"
    eval_cwd.mkdir()
    run_entry(
        "eval.py",
        f"checkpoint={run_dir / 'checkpoint.pt'}",
        f"dataset.root={small_root}",
        "device=cpu",
        "logger=none",
        f"loader={name}",
        *cache,
        cwd=eval_cwd,
    )
    (eval_dir,) = run_dirs(eval_cwd, "eval")
    assert abs(read_metrics(eval_dir)["top1"] - metrics["top1"]) <= 0.005


@pytest.mark.slow
def test_a_failing_rank_ends_the_job_within_seconds(small_root: Path, tmp_path: Path) -> None:
    """Rank 1 meets an unreadable file (dataset.on_error=raise) in its second batch while rank 0
    waits for it in DDP's gradient all-reduce: the job ends at once with the file named, not
    after the process group's timeout."""
    import shutil
    import time

    from loaderbench.loaders.base import epoch_permutation

    root = tmp_path / "data"
    shutil.copytree(small_root, root)
    train = folder_index(root).train
    rank1 = shard_indices(epoch_permutation(len(train), 0, 0, shuffle=True), 16, True, 1, 2)
    bad = Path(train.paths[int(rank1[20])])  # rank 1's second batch
    bad.write_bytes(bad.read_bytes()[:300])
    started = time.monotonic()
    proc = torchrun(
        "device=cpu",
        "loader=torchvision",
        "loader.num_workers=0",
        f"dataset.root={root}",
        "dataset.on_error=raise",
        "epochs=1",
        "model.name=test_resnet",
        "loader.batch_size=16",
        "logger=none",
        cwd=tmp_path,
        check=False,
    )
    elapsed = time.monotonic() - started
    assert proc.returncode != 0
    assert bad.name in proc.stdout + proc.stderr
    assert elapsed < 90, f"the job took {elapsed:.0f} s to end"
    # Rank 0 writes metrics.json if it leaves the collective before torchrun kills it (gloo
    # usually reports the closed peer first); if it does, the run says it did not end well.
    for run_dir in run_dirs(tmp_path, "train"):
        assert read_metrics(run_dir)["status"] in ("failed", "interrupted")
