"""What a run leaves: metrics.json and run_config.json (written atomically, by rank 0), and the
totals over its ranks that metrics.json ends with (peak memory, CPUs, skipped files)."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any

import torch

from loaderbench.config.schema import RunConfig
from loaderbench.data.discovery import DatasetIndex
from loaderbench.loaders import LoaderSettings
from loaderbench.measure.metrics import PEAK_RSS_MB, SKIPPED_FILES
from loaderbench.measure.process_tree import ProcessTreeMonitor
from loaderbench.measure.ranks import reduce_loop_metrics
from loaderbench.platform import distributed
from loaderbench.platform.atomic import atomic_write_text
from loaderbench.platform.runtime import cpus_allowed

METRICS_FILE = "metrics.json"
# The run's typed config as it ran (``loader.num_workers=auto``: the count chosen).
RUN_CONFIG_FILE = "run_config.json"


def skipped_counts(dataset: DatasetIndex, skipped: dict[str, set[int]]) -> dict[str, int]:
    """``loader_<split>_skipped_files``: the distinct files of each split that were skipped;
    ``skipped_files``: the distinct files over every split (by path: one file, one count)."""
    paths = {dataset.split(name).paths[i] for name, indices in skipped.items() for i in indices}
    counts = {f"loader_{name}_skipped_files": len(indices) for name, indices in skipped.items()}
    return {**counts, SKIPPED_FILES: len(paths)}


def skipped_over_ranks(skipped: dict[str, set[int]]) -> dict[str, set[int]]:
    """Every rank's skipped files, united per split (a collective: every rank calls it)."""
    united: dict[str, set[int]] = {}
    for rank in distributed.gather_objects({name: sorted(i) for name, i in skipped.items()}):
        for name, indices in rank.items():
            united.setdefault(name, set()).update(indices)
    return united


def tree_totals(
    monitor: ProcessTreeMonitor,
    dataset: DatasetIndex,
    skipped: dict[str, set[int]],
    world_size: int,
) -> dict[str, Any]:
    """Peak memory summed over ranks; the skipped files counted over ranks, each once; and
    each rank's own peak memory, CPUs and skipped files (``rank_peak_rss_mb``, ``rank_cpus``,
    ``rank_skipped_files``: what tells a starving rank's cause apart). A collective."""
    monitor.sample()
    mine = {
        PEAK_RSS_MB: monitor.peak_rss_bytes / 2**20,
        "cpus": cpus_allowed(),
        SKIPPED_FILES: skipped_counts(dataset, skipped)[SKIPPED_FILES],
    }
    totals = reduce_loop_metrics(mine, world_size)
    monitor.peak_rss_bytes = int(totals[PEAK_RSS_MB] * 2**20)  # the sum, as the run's peak
    return {**totals, **skipped_counts(dataset, skipped_over_ranks(skipped))}


def pinned_host_peak_bytes() -> int:
    """The peak of torch's pinned host memory (the loaders' pools and DataLoader's pinning)."""
    stats = getattr(torch.cuda, "host_memory_stats", dict)()
    return int(stats.get("allocated_bytes.peak", stats.get("allocated_bytes.all.peak", 0)))


def write_run_config(run_dir: Path, config: RunConfig, settings: LoaderSettings) -> None:
    """``run_config.json``: the typed config the run ran with, its loader's ``settings`` as
    the run settled them (the probe's worker count in place of ``auto``, a resume's per-rank
    batch); Hydra's ``.hydra/config.yaml`` keeps what was asked."""
    config = dataclasses.replace(config, loader=settings)
    text = json.dumps(dataclasses.asdict(config), indent=2, sort_keys=True, default=str)
    atomic_write_text(run_dir / RUN_CONFIG_FILE, text + "\n")


def write_metrics(run_dir: Path, metrics: dict[str, Any]) -> None:
    def clean(value: Any) -> Any:
        if isinstance(value, float) and not math.isfinite(value):
            return None
        return value

    payload = {key: clean(value) for key, value in metrics.items()}
    atomic_write_text(run_dir / METRICS_FILE, json.dumps(payload, indent=2, sort_keys=True) + "\n")
