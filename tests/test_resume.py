"""train.resume=true continues a stopped run and ends where an uninterrupted run would."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.conftest import run_dirs, run_entry

pytestmark = pytest.mark.slow

RECIPE = [
    "model.name=test_resnet",
    "device=cpu",
    "logger=none",
    "epochs=3",
    "loader.batch_size=16",
    "loader.num_workers=2",
]


@pytest.mark.parametrize("loader", ["torchvision", "memmap"])
def test_resume_ends_where_an_uninterrupted_run_would(
    loader: str, small_root: Path, tmp_path: Path
) -> None:
    common = [f"dataset.root={small_root}", f"loader={loader}", *RECIPE]
    if loader == "memmap":
        common.append(f"loader.cache_dir={tmp_path / 'cache'}")
    whole, part, rest = (tmp_path / name for name in ("whole", "part", "rest"))
    for folder in (whole, part, rest):
        folder.mkdir()
    run_entry("train.py", *common, cwd=whole)
    run_entry("train.py", *common, "train.stop_after_epochs=2", cwd=part)
    (part_dir,) = run_dirs(part, "train")
    assert torch.load(part_dir / "checkpoint.pt", weights_only=True)["epoch"] == 2
    run_entry(
        "train.py",
        *common,
        "train.resume=true",
        f"checkpoint={part_dir / 'checkpoint.pt'}",
        cwd=rest,
    )

    (whole_dir,) = run_dirs(whole, "train")
    (rest_dir,) = run_dirs(rest, "train")
    expected = torch.load(whole_dir / "checkpoint.pt", weights_only=True)
    resumed = torch.load(rest_dir / "checkpoint.pt", weights_only=True)
    assert resumed["epoch"] == expected["epoch"] == 3
    for name, tensor in expected["model"].items():
        torch.testing.assert_close(
            resumed["model"][name],
            tensor,
            rtol=1e-5,
            atol=1e-6,
            msg=lambda m, name=name: f"{name}: {m}",
        )
    assert resumed["metrics"]["top1"] == pytest.approx(expected["metrics"]["top1"], abs=0.01)


def test_resume_needs_a_checkpoint(tiny_root: Path, tmp_path: Path) -> None:
    proc = run_entry(
        "train.py",
        f"dataset.root={tiny_root}",
        *RECIPE,
        "train.resume=true",
        cwd=tmp_path,
        check=False,
    )
    assert proc.returncode != 0 and "checkpoint=PATH" in proc.stderr
