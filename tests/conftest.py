"""Shared fixtures: small generated data sets on disk and real runs of the entry points."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from loaderbench.synthetic import SyntheticSpec, ensure_synthetic

REPO = Path(__file__).resolve().parents[1]
TINY = SyntheticSpec(num_classes=3, train_per_class=8, val_per_class=4, seed=0)


@pytest.fixture(scope="session")
def tiny_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 3-class ImageFolder tree of real JPEGs: 24 train and 12 val images."""
    return ensure_synthetic(TINY, tmp_path_factory.mktemp("data"))


@pytest.fixture(scope="session")
def small_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 4-class tree big enough to learn from: 160 train and 40 val images."""
    spec = SyntheticSpec(num_classes=4, train_per_class=40, val_per_class=10, seed=1)
    return ensure_synthetic(spec, tmp_path_factory.mktemp("data"))


def run_entry(
    script: str,
    *overrides: str,
    cwd: Path,
    env: dict[str, str] | None = None,
    timeout: float = 600,
    check: bool = True,
) -> subprocess.CompletedProcess:
    """Run train.py or eval.py for real, in a subprocess, with outputs under ``cwd``."""
    full_env = {**os.environ, "WANDB_MODE": "offline", "PYTHONUNBUFFERED": "1"}
    full_env.update(env or {})
    proc = subprocess.run(
        [sys.executable, str(REPO / script), *overrides],
        cwd=cwd,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if check and proc.returncode != 0:
        raise AssertionError(
            f"{script} {' '.join(overrides)} exited {proc.returncode}\n"
            f"--- stdout ---\n{proc.stdout[-4000:]}\n--- stderr ---\n{proc.stderr[-6000:]}"
        )
    return proc


def run_dirs(cwd: Path, task: str) -> list[Path]:
    """Run directories (those holding metrics.json) that a job left under cwd/outputs/<task>."""
    return sorted(p.parent for p in (cwd / "outputs" / task).rglob("metrics.json"))


def read_metrics(run_dir: Path) -> dict:
    return json.loads((run_dir / "metrics.json").read_text())


def single_run(cwd: Path, task: str) -> tuple[Path, dict]:
    dirs = run_dirs(cwd, task)
    assert len(dirs) == 1, f"expected one run directory, found {dirs}"
    return dirs[0], read_metrics(dirs[0])


def folder_index(root: Path):
    """Discover an ImageFolder tree the way every run does."""
    from omegaconf import OmegaConf

    from loaderbench.config import DatasetConfig
    from loaderbench.data import discover

    cfg = OmegaConf.structured(DatasetConfig(index_dir=None))
    cfg.name, cfg.root = "folder", str(root)
    return discover(cfg)


def cpu_spec(split, train: bool, loader: str = "torchvision", **overrides):
    """A small LoaderSpec on the CPU for ``loader``; keyword arguments override the fields of
    the spec or of the loader's typed settings (``cache_dir=...``, ``decoder=...``)."""
    from dataclasses import fields

    import torch

    from loaderbench.loaders import LoaderSpec, settings_class

    settings_type = settings_class(loader)
    keys = {f.name for f in fields(settings_type)}
    settings = {"batch_size": 5, "num_workers": 1, "prefetch": 2}
    settings.update({k: v for k, v in overrides.items() if k in keys})
    spec = {"split": split, "train": train, "image_size": 32, "device": torch.device("cpu")}
    spec.update({k: v for k, v in overrides.items() if k not in keys})
    return LoaderSpec(settings=settings_type(name=loader, **settings), **spec)


@pytest.fixture(scope="session")
def local_slurm(tmp_path_factory: pytest.TempPathFactory):
    """A one-node SLURM cluster started for the session (scripts/local_slurm.sh): yields the
    environment to submit with (SLURM_CONF); stops the daemons it started. Skips, with the
    reason, where SLURM cannot start here (not root, no apt-get)."""
    state = tmp_path_factory.mktemp("slurm")
    script = REPO / "scripts" / "local_slurm.sh"
    proc = subprocess.run(
        [str(script), "start", str(state)], capture_output=True, text=True, timeout=600
    )
    if proc.returncode == 2:
        pytest.skip(f"no local SLURM: {proc.stderr.strip().splitlines()[-1]}")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    conf = proc.stdout.strip().splitlines()[-1].split("=", 1)[1]
    try:
        yield {**os.environ, "SLURM_CONF": conf, "WANDB_MODE": "offline"}
    finally:
        subprocess.run([str(script), "stop", str(state)], timeout=120, check=False)
