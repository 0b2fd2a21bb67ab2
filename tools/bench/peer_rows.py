"""The peers' rows of the benchmark: each peer pipeline timed in this process with the project's
meter, on the same files as the loaders' sweeps (the pipelines themselves: ``peers``, ``dali``,
``ffcv``). Each row says what bounds its work, as the loaders declare theirs, and is held to the
limit of that work (``held_to``)."""

from __future__ import annotations

import itertools
import shutil
from pathlib import Path
from typing import Any

import torch

from loaderbench.measure.metrics import CPU_S_PER_1K_IMAGES, IMAGES_PER_S
from tools.bench.columns import COLUMNS
from tools.bench.ffcv import ffcv_runs, ffcv_unavailable
from tools.bench.schema import (
    CLASSIC,
    DALI_NAMES,
    FFCV_NAMES,
    LIMIT_NAMES,
    TUTORIAL,
    Options,
    Row,
)

# A limit's images/s by the kind of work it bounds (schema.LIMIT_NAMES' keys).
Limits = dict[str, float]


def held_to(bounds: tuple[str, ...], limits: Limits) -> dict[str, Any]:
    """A row's fields for ``bounds``: the limit of its first bound (none where that limit was
    not measured, or the row declares no bound)."""
    if not bounds or bounds[0] not in limits:
        return {"bounds": bounds}
    return {
        "bounds": bounds,
        "limit_name": LIMIT_NAMES[bounds[0]],
        "limit_images_per_s": limits[bounds[0]],
    }


def measure_loader(loader: Any, epochs: int, repeats: int) -> dict[str, Any]:
    """The project's meter over ``epochs`` passes of ``loader``: the best of ``repeats``."""
    results = [_measure_once(loader, epochs) for _ in range(repeats)]
    return max(results, key=lambda result: result[IMAGES_PER_S] or 0.0)


def _measure_once(loader: Any, epochs: int) -> dict[str, Any]:
    from loaderbench.measure.meters import LoopMeter
    from loaderbench.measure.process_tree import CpuWindow, ProcessTreeMonitor

    meter = LoopMeter(warmup_batches=3)
    with ProcessTreeMonitor() as monitor:
        window = CpuWindow(monitor)
        for _ in range(epochs):
            with window:
                for _ in meter.iterate(loader):
                    pass
    summary = meter.summary()
    images = summary["images"] or 1
    return {**summary, CPU_S_PER_1K_IMAGES: 1000 * window.cpu_s / images}


def measured_row(task: str, name: str, workers: int, result: dict[str, Any], **kwargs: Any) -> Row:
    """A row of a pipeline timed in this process (``kwargs``: its bounds and limit, a note);
    a pipeline timed alone has no model, so no ceiling (``ceiling_frac`` null)."""
    figures = {key: result.get(key) for key in COLUMNS}
    return Row(task, name, workers, **figures, **kwargs)


def classic_rows(opts: Options, split: Any, task: str, limits: Limits) -> list[Row]:
    """The classic float pipeline at every worker count: it decodes every image."""
    from tools.bench.peers import classic_loader

    rows = []
    for workers in opts.workers:
        loader = classic_loader(split, opts.image_size, task == "train", opts.batch_size, workers)
        result = measure_loader(loader, opts.epochs[task], opts.repeats)
        rows.append(measured_row(task, CLASSIC, workers, result, **held_to(("decode",), limits)))
    return rows


def tutorial_row(opts: Options, split: Any, task: str) -> Row:
    """The tutorial's tensorclass loader, its files under the work folder (removed after); no
    limit: its float collate is work none of the limits measures."""
    from tools.bench.peers import build_tutorial_tensorclass, tutorial_tensorclass_loader

    train = task == "train"
    prefix = opts.work / "tutorial" / task
    data = build_tutorial_tensorclass(split, opts.image_size, train, max(opts.workers), prefix)
    loader = tutorial_tensorclass_loader(data, opts.image_size, train, opts.batch_size)
    result = measure_loader(loader, opts.epochs[task], opts.repeats)
    del loader, data
    shutil.rmtree(prefix, ignore_errors=True)
    return measured_row(task, TUTORIAL, 0, result, note="single process; CPU float collate")


def dali_rows(opts: Options, split: Any, task: str, limits: Limits) -> list[Row]:
    """DALI's pipelines at every worker count (as many threads): the CPU backend (decoding on
    the CPU), and on a CUDA machine the ``mixed`` (nvJPEG) one too, held to no CPU limit; none
    where DALI is not installed."""
    from tools.bench.dali import DaliLoader, dali_version

    if dali_version() is None:
        return []
    devices = ["cpu", "gpu"] if torch.cuda.is_available() else ["cpu"]
    rows = []
    for device, workers in itertools.product(devices, opts.workers):
        loader = DaliLoader(
            split, opts.image_size, task == "train", opts.batch_size, workers, device=device
        )
        result = measure_loader(loader, opts.epochs[task], opts.repeats)
        bounds = ("decode",) if device == "cpu" else ()
        rows.append(
            measured_row(task, DALI_NAMES[device], workers, result, **held_to(bounds, limits))
        )
    return rows


def ffcv_rows(opts: Options, split: Any, task: str, limits: Limits) -> list[Row]:
    """FFCV's raw and jpg stores at every worker count (as many threads), their files under
    the work folder (removed after). A raw row reads stored pixels (val: copies them; train:
    crops and resizes them); a jpg row decodes every image."""
    rows = []
    for run in ffcv_runs(
        split,
        task == "train",
        opts.image_size,
        opts.batch_size,
        opts.workers,
        lambda loader: measure_loader(loader, opts.epochs[task], opts.repeats),
        opts.work / "ffcv",
    ):
        store = run.store.store
        stored = "crop" if task == "train" else "copy"
        row = measured_row(
            task,
            FFCV_NAMES[store],
            run.workers,
            run.result,
            note=f"after a warm-up pass ({run.warm_up_s:.1f} s: numba compiles)",
            **held_to((stored,) if store == "raw" else ("decode",), limits),
        )
        row.extra = {**run.store.as_dict(), "warm_up_s": run.warm_up_s}
        rows.append(row)
    return rows


def peer_rows(opts: Options, root: Path, limits: Limits) -> list[Row]:
    """The peers, timed in this process with the project's meter."""
    from omegaconf import OmegaConf

    from loaderbench.config.schema import DatasetConfig
    from loaderbench.data.discovery import discover

    cfg = OmegaConf.structured(DatasetConfig(index_dir=None))
    cfg.name, cfg.root = "folder", str(root)
    index = discover(cfg)
    ffcv_missing = ffcv_unavailable()
    if ffcv_missing:
        print(f"make bench: no FFCV rows: it does not import here ({ffcv_missing})", flush=True)
    rows = []
    for task in ("val", "train"):
        split = index.val if task == "val" else index.train
        rows += classic_rows(opts, split, task, limits)
        rows.append(tutorial_row(opts, split, task))
        rows += dali_rows(opts, split, task, limits)
        rows += [] if ffcv_missing else ffcv_rows(opts, split, task, limits)
    return rows
