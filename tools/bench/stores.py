"""The memmap stores projected to ImageNet: bytes per image, the store's size for 1,281,167
train and 50,000 val images, and the time to build it at 16 and 64 cores from the per-core
build rate measured here. Runs ``loader=memmap loader.store=raw,jpeg`` (``loader.val_store``
for val) with ``model=none``."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

from loaderbench.measure.metrics import CPU_S_PER_1K_IMAGES, IMAGES_PER_S
from tools.bench.schema import StoreRow

STORES = ("raw", "jpeg")


def store_row(task: str, metrics: dict[str, Any]) -> StoreRow:
    """A row from one run's metrics.json."""
    prefix = f"loader_{task}_"
    workers = max(1, int(metrics.get(f"{prefix}cache_build_workers") or 1))
    return StoreRow(
        pipeline=task,
        store=metrics[f"{prefix}cache_store"],
        bytes_per_image=float(metrics[f"{prefix}bytes_per_image"]),
        images_per_s=metrics.get(IMAGES_PER_S),
        build_images_per_s_per_core=float(metrics[f"{prefix}cache_build_images_per_s"]) / workers,
        cpu_s_per_1k_images=metrics.get(CPU_S_PER_1K_IMAGES),
    )


def measure_stores(
    command: Callable[[str, Path, list[str]], list[str]], work: Path, workers: int
) -> list[StoreRow]:
    """Both stores, val and train: ``command(task, sweep_dir, overrides)`` is the bench's own
    sweep command line, here over the stores instead of the loaders."""
    rows = []
    for task in ("val", "train"):
        sweep_dir = work / "stores" / task
        key = "loader.store" if task == "train" else "loader.val_store"
        overrides = ["loader=memmap", f"{key}={','.join(STORES)}"]
        cmd = command(task, sweep_dir, [*overrides, f"loader.num_workers={workers}"])
        print("$", " ".join(cmd[1:]), flush=True)
        subprocess.run(cmd, cwd=work, check=True)
        for metrics_file in sorted(sweep_dir.glob("*/metrics.json")):
            rows.append(store_row(task, json.loads(metrics_file.read_text())))
    return rows
