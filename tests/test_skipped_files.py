"""``skipped_files`` counts distinct files: the same number in every loader, on one rank or two,
after one epoch or three; ``loader_<split>_skipped_files`` is each split's, over every rank."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from loaderbench.data import Split
from loaderbench.loaders import build_loader
from loaderbench.loaders.base import epoch_permutation, shard_indices
from loaderbench.session import skipped_counts, skipped_over_ranks
from loaderbench.synthetic import SyntheticSpec, ensure_synthetic
from tests.conftest import cpu_spec, folder_index, single_run
from tests.test_distributed import torchrun

LOADERS = ["torchvision", "memmap", "spdl"]
BAD_TRAIN, BAD_VAL = 5, 3  # the unreadable file of each split (its index)


@pytest.fixture(scope="module")
def two_bad_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """2 classes, 16 train and 8 val images, one of each split unreadable: with batches of 4,
    two ranks get whole batches and no image is left out of an epoch."""
    spec = SyntheticSpec(num_classes=2, train_per_class=8, val_per_class=4, seed=3, max_side=96)
    root = ensure_synthetic(spec, tmp_path_factory.mktemp("data"))
    index = folder_index(root)
    for path in (index.train.paths[BAD_TRAIN], index.val.paths[BAD_VAL]):
        Path(path).write_bytes(b"not an image")
    return root


def skipped_by_rank(
    name: str, split: Split, train: bool, world_size: int, epochs: int, tmp_path: Path
) -> list[list[frozenset[int]]]:
    """Each rank's ``skipped_indices`` after each of ``epochs`` epochs (one loader a rank)."""
    cache = {"cache_dir": str(tmp_path / "cache")} if name == "memmap" else {}
    by_rank = []
    for rank in range(world_size):
        spec = cpu_spec(
            split, train, loader=name, batch_size=4, rank=rank, world_size=world_size, **cache
        )
        after_epoch = []
        with build_loader(spec) as loader:
            for epoch in range(epochs):
                loader.set_epoch(epoch)
                for _ in loader:
                    pass
                after_epoch.append(loader.skipped_indices())
                assert loader.stats()["skipped_files"] == len(after_epoch[-1])
        by_rank.append(after_epoch)
    return by_rank


@pytest.mark.parametrize("name", LOADERS)
def test_a_skipped_file_counts_once_over_epochs_and_ranks(
    name: str, two_bad_root: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """One rank: the bad file counted (and named) once, after one epoch as after three. Two
    ranks: each counts only what its own share met; their union is the file, once."""
    index = folder_index(two_bad_root)
    caplog.set_level(logging.WARNING)
    for split, train, bad in ((index.train, True, BAD_TRAIN), (index.val, False, BAD_VAL)):
        caplog.clear()
        (alone,) = skipped_by_rank(name, split, train, 1, 3, tmp_path)
        assert alone == [{bad}] * 3, split.name
        assert caplog.text.count(f"unreadable image {split.paths[bad]}:") == 1, caplog.text
        ranks = skipped_by_rank(name, split, train, 2, 3, tmp_path)
        assert all(after <= {bad} for epochs in ranks for after in epochs), ranks
        assert ranks[0][-1] | ranks[1][-1] == {bad}, split.name
        if not train:  # val: every epoch the same shares, the file in one rank's only
            assert sorted(len(epochs[-1]) for epochs in ranks) == [0, 1]


def test_the_session_counts_distinct_files_per_split_and_in_all(two_bad_root: Path) -> None:
    """Each split's files counted once; over the splits, by path. One process's own sets are
    what the ranks' union gives (torchrun's case is the test below)."""
    index = folder_index(two_bad_root)
    skipped = {"train": {BAD_TRAIN}, "val": {BAD_VAL}}
    assert skipped_over_ranks(skipped) == skipped
    assert skipped_counts(index, skipped) == {
        "loader_train_skipped_files": 1,
        "loader_val_skipped_files": 1,
        "skipped_files": 2,
    }
    assert skipped_counts(index, {"val": set()}) == {
        "loader_val_skipped_files": 0,
        "skipped_files": 0,
    }


@pytest.mark.slow
@pytest.mark.parametrize("name", LOADERS)
def test_two_ranks_three_epochs_report_each_skipped_file_once(
    name: str, two_bad_root: Path, tmp_path: Path
) -> None:
    """train.py under torchrun: the bad train file is met by either rank from epoch to epoch,
    the bad val file by rank 1 every epoch; each is counted once, in its split and in all."""
    meets = [
        {rank for rank in range(2) if BAD_TRAIN in shard_indices(order, 4, True, rank, 2)}
        for order in (epoch_permutation(16, 0, epoch, shuffle=True) for epoch in range(3))
    ]
    assert set.union(*meets) == {0, 1}  # the premise, for seed 0
    cache = [f"loader.cache_dir={tmp_path / 'cache'}"] if name == "memmap" else []
    torchrun(
        "device=cpu",
        f"loader={name}",
        f"dataset.root={two_bad_root}",
        "epochs=3",
        "model.name=test_resnet",
        "image_size=32",
        "loader.batch_size=4",
        "loader.num_workers=1",
        "logger=none",
        *cache,
        cwd=tmp_path,
        timeout=300,
    )
    _, metrics = single_run(tmp_path, "train")
    assert metrics["status"] == "ok" and metrics["world_size"] == 2
    assert metrics["loader_train_skipped_files"] == 1
    assert metrics["loader_val_skipped_files"] == 1
    assert metrics["skipped_files"] == 2
