"""``skipped_files`` counts distinct files: the same number in every loader, on one rank or two,
after one epoch or three; ``loader_<split>_skipped_files`` is each split's, over every rank.
Each loader's own count (one rank or two, epoch after epoch) is the loader contract's
(tests/test_loader_contract.py); here the session's union and a real two-rank job."""

from __future__ import annotations

from pathlib import Path

import pytest

from loaderbench.data.order import epoch_permutation, shard_indices
from loaderbench.data.synthetic import SyntheticSpec, ensure_synthetic
from loaderbench.loaders import file_loader_names
from loaderbench.run._records import skipped_counts, skipped_over_ranks
from tests.conftest import folder_index, loader_folder_overrides, single_run, torchrun

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
@pytest.mark.parametrize("name", file_loader_names())
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
        *loader_folder_overrides(name, tmp_path),
        cwd=tmp_path,
        timeout=300,
    )
    _, metrics = single_run(tmp_path, "train")
    assert metrics["status"] == "ok" and metrics["world_size"] == 2
    assert metrics["loader_train_skipped_files"] == 1
    assert metrics["loader_val_skipped_files"] == 1
    assert metrics["skipped_files"] == 2
