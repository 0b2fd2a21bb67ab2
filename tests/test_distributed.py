"""Data-parallel runs: the shares of an epoch, and real torchrun jobs with gloo on the CPU. Each
loader's own shares (disjoint, covering the epoch) are the loader contract's
(tests/test_loader_contract.py)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from loaderbench.data.order import shard_indices
from loaderbench.loaders import file_loader_names
from tests.conftest import (
    REPO,
    finish,
    folder_index,
    loader_folder_overrides,
    read_metrics,
    run_dirs,
    single_run,
    torchrun,
)
from tests.in_process import run_here


def test_shard_indices_cover_the_epoch_once() -> None:
    order = torch.randperm(103, generator=torch.Generator().manual_seed(0))
    val = [shard_indices(order, 8, False, r, 3) for r in range(3)]
    assert sorted(torch.cat(val).tolist()) == list(range(103))
    train = [shard_indices(order, 8, True, r, 3) for r in range(3)]
    assert {len(t) for t in train} == {32}  # equal full batches on every rank
    assert len(set(torch.cat(train).tolist())) == 96


@pytest.mark.slow
@pytest.mark.parametrize("name", file_loader_names())
def test_torchrun_two_processes(name: str, small_root: Path, tmp_path: Path) -> None:
    """Two ranks train and validate; the top-1 and val loss they report, reduced over the ranks,
    are eval.py's of the checkpoint saved, in one process. torchvision: rank 1's images of the
    last epoch are colour-inverted, so its BatchNorm statistics differ from rank 0's on purpose
    (every rank validates with rank 0's, the checkpoint's)."""
    root = small_root
    if name == "torchvision":
        root = inverted_for_rank_1(small_root, tmp_path / "data", epoch=1)
    cache = loader_folder_overrides(name, tmp_path)
    torchrun(
        "device=cpu",
        f"loader={name}",
        f"dataset.root={root}",
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
    assert_validated_the_saved_model(run_dir, metrics, root, tmp_path, f"loader={name}", *cache)


def assert_validated_the_saved_model(
    run_dir: Path, metrics: dict, root: Path, tmp_path: Path, *overrides: str
) -> None:
    """eval.py of the run's checkpoint, in one process, finds the top-1 and val loss the run
    reported (reduced over its ranks)."""
    eval_cwd = tmp_path / "eval"
    eval_cwd.mkdir()
    run_here(
        "eval.py",
        f"checkpoint={run_dir / 'checkpoint.pt'}",
        f"dataset.root={root}",
        "device=cpu",
        "logger=none",
        *overrides,
        cwd=eval_cwd,
    )
    (eval_dir,) = run_dirs(eval_cwd, "eval")
    evaluated = read_metrics(eval_dir)
    # Every pass over the val set (bench.epochs=auto measures its rate); top-1 is the first's.
    assert evaluated["images"] == metrics["val_size"] * evaluated["passes"]
    assert (evaluated["top1"], evaluated["top5"]) == (metrics["top1"], metrics["top5"])
    assert evaluated["val_loss"] == pytest.approx(metrics["val_loss"], rel=1e-5)


def rank_share(split, rank: int, batch_size: int = 16, epoch: int = 0) -> list[Path]:
    """The files of ``rank``'s share of a train epoch (of two ranks, seed 0), in order."""
    from loaderbench.data.order import epoch_permutation

    order = epoch_permutation(len(split), 0, epoch, shuffle=True)
    mine = shard_indices(order, batch_size, True, rank, 2)
    return [Path(split.paths[int(i)]) for i in mine]


def inverted_for_rank_1(source: Path, root: Path, epoch: int) -> Path:
    """A copy of ``source`` whose train images in rank 1's share of ``epoch`` are
    colour-inverted."""
    import shutil

    from PIL import Image, ImageOps

    shutil.copytree(source, root)
    for path in rank_share(folder_index(root).train, rank=1, epoch=epoch):
        with Image.open(path) as image:
            inverted = ImageOps.invert(image.convert("RGB"))
        inverted.save(path, format="JPEG", quality=90)
    return root


@pytest.mark.slow
def test_a_rank_whose_batch_is_all_unreadable_still_takes_the_step(
    small_root: Path, tmp_path: Path
) -> None:
    """Every file of rank 1's second batch is unreadable (dataset.on_error=skip): the loader
    leaves the batch out, and rank 1 makes up the step with no images (a zero contribution)
    instead of leaving rank 0 in the gradient all-reduce; the job ends well, in seconds."""
    import shutil
    import time

    root = tmp_path / "data"
    shutil.copytree(small_root, root)
    bad = rank_share(folder_index(root).train, rank=1)[16:32]
    for path in bad:
        path.write_bytes(path.read_bytes()[:200])
    started = time.monotonic()
    torchrun(
        "device=cpu",
        "loader=torchvision",
        "loader.num_workers=0",
        f"dataset.root={root}",
        "epochs=1",
        "model.name=test_resnet",
        "loader.batch_size=16",
        "logger=none",
        cwd=tmp_path,
        timeout=120,
    )
    elapsed = time.monotonic() - started
    run_dir, metrics = single_run(tmp_path, "train")
    assert metrics["status"] == "ok" and metrics["epochs"] == 1
    assert metrics["skipped_files"] == len(bad) == 16
    assert metrics["images"] == 160 - 16
    assert elapsed < 90, f"the job took {elapsed:.0f} s"
    assert_validated_the_saved_model(run_dir, metrics, root, tmp_path, "loader=torchvision")


@pytest.mark.slow
def test_a_failing_rank_ends_the_job_within_seconds(small_root: Path, tmp_path: Path) -> None:
    """Rank 1 meets an unreadable file (dataset.on_error=raise) in its second batch while rank 0
    waits for it in DDP's gradient all-reduce: the job ends at once with the file named, not
    after the process group's timeout."""
    import shutil
    import time

    from loaderbench.data.order import epoch_permutation

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


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.slow
@pytest.mark.parametrize("scratch", ["node_local", "shared"])
def test_two_nodes_on_one_machine(scratch: str, small_root: Path, tmp_path: Path) -> None:
    """``torchrun --nnodes=2`` as two agents on this machine (c10d rendezvous), one process a
    node, each "node" with its own memmap cache and dataset index (node-local scratch) or both
    with the same: every node finds its caches, built where they are missing; LOCAL_RANK is 0
    on both nodes, yet only RANK 0 writes: one metrics.json, one checkpoint."""
    port, env = free_port(), {**os.environ, "WANDB_MODE": "offline", "OMP_NUM_THREADS": "1"}

    def scratch_dir(node: int, name: str) -> Path:
        return tmp_path / (f"node{node}" if scratch == "node_local" else "shared") / name

    agents = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--nnodes=2",
                "--nproc_per_node=1",
                "--rdzv_backend=c10d",
                f"--rdzv_endpoint=127.0.0.1:{port}",
                "--rdzv_id=twonodes",
                f"--rdzv_conf=is_host={int(node == 0)}",  # node 0 hosts the rendezvous store
                str(REPO / "train.py"),
                "device=cpu",
                "loader=memmap",
                f"loader.cache_dir={scratch_dir(node, 'cache')}",
                f"dataset.index_dir={scratch_dir(node, 'index')}",
                f"dataset.root={small_root}",
                "epochs=1",
                "model.name=test_resnet",
                "loader.batch_size=16",
                "loader.num_workers=1",
                "logger=none",
            ],
            cwd=tmp_path,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for node in (0, 1)
    ]
    outputs = [finish(agent, timeout=300) for agent in agents]
    for agent, output in zip(agents, outputs, strict=True):
        assert agent.returncode == 0, output[-4000:]
    assert len(list((tmp_path / "outputs").rglob("checkpoint.pt"))) == 1
    run_dir, metrics = single_run(tmp_path, "train")
    assert run_dir.name == "torchrun-twonodes"
    assert metrics["status"] == "ok" and metrics["world_size"] == 2
    assert metrics["images"] == 160  # 80 a rank, each node its own share
    nodes = (0, 1) if scratch == "node_local" else (0,)
    for node in nodes:
        caches = sorted(p.name.split("-")[0] for p in scratch_dir(node, "cache").iterdir())
        assert [c for c in caches if c in ("train", "val")] == ["train", "val"], caches
        assert len(list(scratch_dir(node, "index").glob("dataset-*.npz"))) == 1
    # Rank 0 built its node's caches; with shared ones, whoever took the lock first did.
    if scratch == "node_local":
        assert metrics["loader_train_cache_built"] and metrics["loader_val_cache_built"]
