"""The memmap stores projected to ImageNet: bytes per image, the store's size for 1,281,167
train and 50,000 val images, and the time to build it at 16 and 64 cores from the per-core
build rate measured here. Runs ``loader=memmap loader.store=raw,jpeg`` (``loader.val_store``
for val) with ``model=none``."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

IMAGENET_IMAGES = {"train": 1_281_167, "val": 50_000}
STORES = ("raw", "jpeg")
CORES = (16, 64)


@dataclass
class StoreRow:
    pipeline: str  # val | train
    store: str
    bytes_per_image: float
    images_per_s: float | None
    build_images_per_s_per_core: float
    cpu_s_per_1k_images: float | None = None

    @property
    def imagenet_gb(self) -> float:
        return self.bytes_per_image * IMAGENET_IMAGES[self.pipeline] / 1e9

    def build_minutes(self, cores: int) -> float:
        return IMAGENET_IMAGES[self.pipeline] / (self.build_images_per_s_per_core * cores) / 60


def store_row(task: str, metrics: dict[str, Any]) -> StoreRow:
    """A row from one run's metrics.json."""
    prefix = f"loader_{task}_"
    workers = max(1, int(metrics.get(f"{prefix}cache_build_workers") or 1))
    return StoreRow(
        pipeline=task,
        store=metrics[f"{prefix}cache_store"],
        bytes_per_image=float(metrics[f"{prefix}bytes_per_image"]),
        images_per_s=metrics.get("images_per_s"),
        build_images_per_s_per_core=float(metrics[f"{prefix}cache_build_images_per_s"]) / workers,
        cpu_s_per_1k_images=metrics.get("cpu_s_per_1k_images"),
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


def store_lines(rows: list[StoreRow]) -> list[str]:
    """The report's section: one line a (pipeline, store)."""
    cores = " | ".join(f"build at {c} cores" for c in CORES)
    lines = [
        "## The memmap stores, projected to ImageNet",
        "",
        "Bytes per image as stored here, times 1,281,167 train or 50,000 val images; build "
        "time from this machine's build rate per core (decode, resize, and for jpeg re-encode).",
        "",
        f"| split | store | bytes / image | ImageNet store | images/s | {cores} |",
        "|---|---|---|---|---|" + "---|" * len(CORES),
    ]
    for row in rows:
        minutes = " | ".join(f"{row.build_minutes(c):.1f} min" for c in CORES)
        speed = f"{row.images_per_s:,.1f}" if row.images_per_s else "-"
        lines.append(
            f"| {row.pipeline} | {row.store} | {row.bytes_per_image:,.0f} | "
            f"{row.imagenet_gb:,.1f} GB | {speed} | {minutes} |"
        )
    return [*lines, ""]
