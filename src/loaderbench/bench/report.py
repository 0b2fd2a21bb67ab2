"""``make bench``: the benchmark report, on one data set, in one go.

It runs, one after another so nothing competes for the cores:

1. the limits that give the numbers a meaning: this machine's CPU decode limit (cores x the
   single-core rate of the fastest JPEG decode + resize, ``loaderbench.bench.limits``), its
   memory-copy bandwidth (what a reader of uint8 images from RAM, the memmap loader, cannot
   beat) and its crop-and-resize limit (cores x the single-core rate of cutting, resizing and
   flipping the train boxes from stored rows: what memmap's raw train path cannot beat);
2. the project's loaders with ``model=none`` (the loader benchmark), val and train pipelines,
   over a worker sweep: real ``eval.py`` / ``train.py --multirun`` runs, so the numbers are the
   ones users get;
3. the peers: the classic torchvision float pipeline (the tensordict tutorial's "regular"
   loader), the tutorial's tensorclass loader, and where they are installed NVIDIA DALI and
   FFCV (its raw and jpg stores, ``loaderbench.bench.ffcv``), timed with the same meter on the
   same files.

It writes ``bench/report.md`` and ``bench/report.png``: each pipeline's images/s, its share of
its limit, CPU seconds per 1000 images and data wait. ``--quick`` runs a small version (CI).
Everything else the runs write (sweep folders, the memmap cache, the tutorial loader's files,
the quick data set) goes to ``<out>/work``; only the full run's data set is shared, in ``data/``.

A shared 2-core machine is noisy (the same run varies by 20-30% from one minute to the next), so
every measurement, limits included, is the best of ``--repeats`` (2 by default): the sweeps run
once per repeat, one after the other, and each row keeps the figures of its fastest run.
"""

from __future__ import annotations

import argparse
import csv
import itertools
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from loaderbench.bench.ffcv import ffcv_runs, ffcv_unavailable, ffcv_version
from loaderbench.bench.limits import (
    DecodeLimit,
    measure_crop_limit,
    measure_decode_limit,
    measure_region_decode_limit,
    usable_cores,
)
from loaderbench.bench.stores import CORES, StoreRow, measure_stores, store_lines
from loaderbench.synthetic import SyntheticSpec, ensure_synthetic

REPO = Path(__file__).resolve().parents[3]
LOADERS = ("torchvision", "memmap", "spdl")
DALI_NAMES = {"cpu": "dali (cpu)", "gpu": "dali (mixed)"}
# FFCV's rows by its store (our store names: raw, jpeg).
FFCV_NAMES = {"raw": "ffcv (raw)", "jpeg": "ffcv (jpg)"}
# The FFCV store a row is held against: stored pixels for the readers of stored pixels, the
# JPEG store for everything that decodes JPEGs.
FFCV_PEER_STORE = {"memmap": "raw", FFCV_NAMES["raw"]: "raw"}
# The crop-and-resize limit's train images (stored rows in memory: ~340 KB each at 224 px).
CROP_LIMIT_IMAGES = 512
COLOURS = {"torchvision": "C0", "memmap": "C1", "spdl": "C2"}
# Each loader once more with the count left to its probe, probing afresh every time (a choice
# remembered from the run before would cost nothing and measure nothing).
AUTO_SWEPT = [
    f"loader={','.join(LOADERS)}",
    "loader.num_workers=auto",
    "loader.autotune.refresh=true",
]
# --quick (CI): shorter probe windows; its 96 images fill a 1.5 s window many times over.
AUTO_SWEPT_QUICK = ["loader.autotune.window_s=0.3"]
COLOURS |= {name: "C3" for name in DALI_NAMES.values()}
COLOURS |= {name: "C4" for name in FFCV_NAMES.values()}


@dataclass
class Options:
    out: Path
    quick: bool = False
    image_size: int = 224
    batch_size: int = 32
    workers: tuple[int, ...] = (1, 2)
    # Passes over each split: the val split is small, and a pass of a fast loader takes
    # milliseconds, so more passes keep per-epoch start-up from dominating.
    epochs: dict[str, int] = field(default_factory=lambda: {"val": 4, "train": 3})
    drop_page_cache: bool = False
    repeats: int = 2
    root: Path | None = None
    own_data: bool = False  # --root: the user's images, not the generated set

    @property
    def work(self) -> Path:
        """What the runs write besides the report: sweeps, the memmap cache, the tutorial's
        files, the quick data set. Nothing is written under the repository but ``out``."""
        return self.out / "work"

    @property
    def spec(self) -> SyntheticSpec:
        if self.quick:
            return SyntheticSpec(num_classes=4, train_per_class=24, val_per_class=24)
        # A val split as large as the train split: with the default 300 val images an epoch
        # is ten batches, and every loader's per-epoch start and drain would weigh far more
        # than on a real val set (50,000 images on ImageNet).
        return SyntheticSpec(train_per_class=100, val_per_class=100)


@dataclass
class Row:
    pipeline: str  # val | train
    name: str
    workers: int | None
    images_per_s: float | None
    cpu_s_per_1k_images: float | None = None
    data_wait_frac: float | None = None
    ttfb_s: float | None = None
    limit_name: str = ""
    limit_images_per_s: float | None = None
    note: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def share(self) -> float | None:
        if not self.images_per_s or not self.limit_images_per_s:
            return None
        return self.images_per_s / self.limit_images_per_s


@dataclass
class AutoRow:
    """A loader run with ``loader.num_workers=auto``: the count its probe chose, that run's
    images/s, and what the probe cost against the run's whole wall time."""

    pipeline: str  # val | train
    name: str
    workers: int | None
    images_per_s: float | None
    autotune_s: float | None
    wall_s: float | None
    note: str = ""


def memory_copy_bandwidth(nbytes: int = 256 * 2**20, repeats: int = 5) -> float:
    """Bytes per second of a large uint8 tensor copy (the best of ``repeats``)."""
    src = torch.randint(0, 255, (nbytes,), dtype=torch.uint8)
    dst = torch.empty_like(src)
    dst.copy_(src)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        dst.copy_(src)
        best = min(best, time.perf_counter() - start)
    return nbytes / best


def sweep_command(
    opts: Options, root: Path, task: str, sweep_dir: Path, swept: list[str] | None = None
) -> list[str]:
    """The ``model=none`` multirun of every loader over the worker counts (or of ``swept``)."""
    script = "eval.py" if task == "val" else "train.py"
    if swept is None:
        workers = ",".join(map(str, opts.workers))
        swept = [f"loader={','.join(LOADERS)}", f"loader.num_workers={workers}"]
    cmd = [
        sys.executable,
        str(REPO / script),
        "--multirun",
        "model=none",
        "logger=none",
        *swept,
        f"loader.batch_size={opts.batch_size}",
        f"image_size={opts.image_size}",
        f"dataset.root={root}",
        f"bench.epochs={opts.epochs[task]}",
        f"bench.drop_page_cache={str(opts.drop_page_cache).lower()}",
        f"hydra.sweep.dir={sweep_dir}",
    ]
    if task == "train":
        cmd.append("augment.scale=[0.08,1.0]")
    return cmd


def run_sweep(
    opts: Options, root: Path, task: str, repeat: int = 0, auto: bool = False
) -> list[dict[str, str]]:
    """Run the sweep of ``task`` (val or train); the rows of its summary. ``auto``: every loader
    once with ``loader.num_workers=auto`` instead (``AUTO_SWEPT``).

    The runs start in the work folder, so what they write at a relative path lands there and
    never in the repository: the memmap loader's cache above all (``loader.cache_dir=cache``
    by default, hence ``<out>/work/cache``). A sweep over loaders cannot name the cache itself:
    ``loader.cache_dir`` is a memmap key, which the other loaders' settings refuse.
    """
    sweep_dir = opts.work / task / f"{'auto' if auto else 'repeat'}{repeat}"
    swept = [*AUTO_SWEPT, *(AUTO_SWEPT_QUICK if opts.quick else [])] if auto else None
    cmd = sweep_command(opts, root, task, sweep_dir, swept)
    print("$", " ".join(cmd[1:]), flush=True)
    opts.work.mkdir(parents=True, exist_ok=True)
    subprocess.run(cmd, cwd=opts.work, check=True)
    if not auto:  # the sweep's own summary plot, as README shows it
        shutil.copyfile(sweep_dir / "summary.png", opts.out / f"sweep_{task}.png")
    with open(sweep_dir / "summary.csv") as f:
        return list(csv.DictReader(f))


def best_runs(runs: list[dict[str, str]]) -> list[dict[str, str]]:
    """Per (loader, workers), the run with the most images/s (failed runs only if no other)."""
    best: dict[tuple[str, str], dict[str, str]] = {}
    for run in runs:
        key = (run["loader"], run["num_workers"])
        speed = _float(run.get("images_per_s")) or 0.0
        if key not in best or speed > (_float(best[key].get("images_per_s")) or 0.0):
            best[key] = run
    return list(best.values())


def auto_rows(task: str, runs: list[dict[str, str]]) -> list[AutoRow]:
    """Per loader, its ``auto`` run with the most images/s (failed runs only if no other)."""
    best: dict[str, dict[str, str]] = {}
    for run in runs:
        speed = _float(run.get("images_per_s")) or 0.0
        if run["loader"] not in best or speed > (_float(best[run["loader"]]["images_per_s"]) or 0):
            best[run["loader"]] = run
    return [
        AutoRow(
            pipeline=task,
            name=name,
            workers=int(run["num_workers"]) if run.get("num_workers", "").isdigit() else None,
            images_per_s=_float(run.get("images_per_s")),
            autotune_s=_float(run.get("autotune_s")),
            wall_s=_float(run.get("wall_s")),
            note="" if run.get("status") == "ok" else f"failed: {run.get('error')}",
        )
        for name, run in sorted(best.items())
    ]


def measure_auto(opts: Options, root: Path) -> list[AutoRow]:
    """Every loader with ``loader.num_workers=auto``, per pass, best of the repeats."""
    rows = []
    for task in ("val", "train"):
        runs = [run for r in range(opts.repeats) for run in run_sweep(opts, root, task, r, True)]
        rows += auto_rows(task, runs)
    return rows


def _float(value: str | None) -> float | None:
    try:
        return float(value) if value not in (None, "") else None
    except ValueError:
        return None


def row_limit(
    task: str,
    loader: str,
    decode: DecodeLimit,
    copy_images_per_s: float,
    crop: DecodeLimit | None = None,
) -> tuple[str, float]:
    """The limit a loader's row is held to, (name, images/s): the one on the same work. memmap
    decodes nothing: its val rows copy stored crops (memory copy), its train rows crop, resize
    and flip stored rows (the crop-and-resize limit); the other loaders decode every image."""
    if loader != "memmap":
        return "CPU decode", decode.images_per_s
    if task == "train" and crop is not None:
        return "crop + resize", crop.images_per_s
    return "memory copy", copy_images_per_s


def loader_rows(
    task: str,
    rows: list[dict[str, str]],
    decode: DecodeLimit,
    copy_images_per_s: float,
    crop: DecodeLimit | None = None,
) -> list[Row]:
    out = []
    for r in rows:
        limit_name, limit_images_per_s = row_limit(
            task, r["loader"], decode, copy_images_per_s, crop
        )
        out.append(
            Row(
                pipeline=task,
                name=r["loader"],
                workers=int(r["num_workers"]),
                images_per_s=_float(r.get("images_per_s")),
                cpu_s_per_1k_images=_float(r.get("cpu_s_per_1k_images")),
                data_wait_frac=_float(r.get("data_wait_frac")),
                ttfb_s=_float(r.get("ttfb_s")),
                limit_name=limit_name,
                limit_images_per_s=limit_images_per_s,
                note=_row_note(r),
            )
        )
    return out


def _row_note(run: dict[str, str]) -> str:
    """A sweep row's note: why it failed, or what decoded its images (``decoded_by``)."""
    if run.get("status") != "ok":
        return f"failed: {run.get('error')}"
    return f"decoded by {run['decoded_by']}" if run.get("decoded_by") else ""


def measure_loader(loader: Any, epochs: int, repeats: int) -> dict[str, Any]:
    """The project's meter over ``epochs`` passes of ``loader``: the best of ``repeats``."""
    results = [_measure_once(loader, epochs) for _ in range(repeats)]
    return max(results, key=lambda result: result["images_per_s"] or 0.0)


def _measure_once(loader: Any, epochs: int) -> dict[str, Any]:
    from loaderbench.meters import CpuWindow, LoopMeter, ProcessTreeMonitor

    meter = LoopMeter(warmup_batches=3)
    with ProcessTreeMonitor() as monitor:
        window = CpuWindow(monitor)
        for _ in range(epochs):
            with window:
                for _ in meter.iterate(loader):
                    pass
    summary = meter.summary()
    images = summary["images"] or 1
    return {**summary, "cpu_s_per_1k_images": 1000 * window.cpu_s / images}


def measured_row(task: str, name: str, workers: int, result: dict[str, Any], **kwargs: Any) -> Row:
    """A row of a loader timed in this process (``kwargs``: its limit, a note)."""
    return Row(
        task,
        name,
        workers,
        result["images_per_s"],
        result["cpu_s_per_1k_images"],
        result["data_wait_frac"],
        result["ttfb_s"],
        **kwargs,
    )


def classic_rows(opts: Options, split: Any, task: str, decode: DecodeLimit) -> list[Row]:
    """The classic float pipeline at every worker count."""
    from loaderbench.bench.peers import classic_loader

    rows = []
    for workers in opts.workers:
        loader = classic_loader(split, opts.image_size, task == "train", opts.batch_size, workers)
        result = measure_loader(loader, opts.epochs[task], opts.repeats)
        rows.append(
            measured_row(
                task,
                "classic (float in workers)",
                workers,
                result,
                limit_name="CPU decode",
                limit_images_per_s=decode.images_per_s,
            )
        )
    return rows


def tutorial_row(opts: Options, split: Any, task: str) -> Row:
    """The tutorial's tensorclass loader, its files under the work folder (removed after)."""
    from loaderbench.bench.peers import build_tutorial_tensorclass, tutorial_tensorclass_loader

    train = task == "train"
    prefix = opts.work / "tutorial" / task
    data = build_tutorial_tensorclass(split, opts.image_size, train, max(opts.workers), prefix)
    loader = tutorial_tensorclass_loader(data, opts.image_size, train, opts.batch_size)
    result = measure_loader(loader, opts.epochs[task], opts.repeats)
    del loader, data
    shutil.rmtree(prefix, ignore_errors=True)
    return measured_row(
        task, "tutorial tensorclass", 0, result, note="single process; CPU float collate"
    )


def dali_rows(opts: Options, split: Any, task: str, decode: DecodeLimit) -> list[Row]:
    """DALI's pipelines at every worker count (as many threads): the CPU backend, and on a
    CUDA machine the ``mixed`` (nvJPEG) one too; none where DALI is not installed."""
    from loaderbench.bench.dali import DaliLoader, dali_version

    if dali_version() is None:
        return []
    devices = ["cpu", "gpu"] if torch.cuda.is_available() else ["cpu"]
    rows = []
    for device, workers in itertools.product(devices, opts.workers):
        loader = DaliLoader(
            split, opts.image_size, task == "train", opts.batch_size, workers, device=device
        )
        result = measure_loader(loader, opts.epochs[task], opts.repeats)
        limit = {"limit_name": "CPU decode", "limit_images_per_s": decode.images_per_s}
        rows.append(
            measured_row(
                task, DALI_NAMES[device], workers, result, **(limit if device == "cpu" else {})
            )
        )
    return rows


def ffcv_rows(opts: Options, split: Any, task: str, decode: DecodeLimit) -> list[Row]:
    """FFCV's raw and jpg stores at every worker count (as many threads), their files under
    the work folder (removed after). A raw row's limit is set from memmap's row later
    (``share_memmap_limits``); a jpg row decodes every pixel: the CPU decode limit."""
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
        limit = {"limit_name": "CPU decode", "limit_images_per_s": decode.images_per_s}
        row = measured_row(
            task,
            FFCV_NAMES[store],
            run.workers,
            run.result,
            note=f"after a warm-up pass ({run.warm_up_s:.1f} s: numba compiles)",
            **(limit if store == "jpeg" else {}),
        )
        row.extra = {**run.store.as_dict(), "warm_up_s": run.warm_up_s}
        rows.append(row)
    return rows


def share_memmap_limits(rows: list[Row]) -> None:
    """FFCV's raw rows get the limit of memmap's row at the same task and worker count: the
    same work on stored pixels."""
    memmap = {(r.pipeline, r.workers): r for r in rows if r.name == "memmap"}
    for row in rows:
        peer = memmap.get((row.pipeline, row.workers))
        if row.name == FFCV_NAMES["raw"] and peer is not None:
            row.limit_name, row.limit_images_per_s = peer.limit_name, peer.limit_images_per_s


def peer_rows(opts: Options, root: Path, decode: DecodeLimit) -> list[Row]:
    """The peers, timed in this process with the project's meter."""
    from omegaconf import OmegaConf

    from loaderbench.config import DatasetConfig
    from loaderbench.data import discover

    cfg = OmegaConf.structured(DatasetConfig(index_dir=None))
    cfg.name, cfg.root = "folder", str(root)
    index = discover(cfg)
    ffcv_missing = ffcv_unavailable()
    if ffcv_missing:
        print(f"make bench: no FFCV rows: it does not import here ({ffcv_missing})", flush=True)
    rows = []
    for task in ("val", "train"):
        split = index.val if task == "val" else index.train
        rows += classic_rows(opts, split, task, decode)
        rows.append(tutorial_row(opts, split, task))
        rows += dali_rows(opts, split, task, decode)
        rows += [] if ffcv_missing else ffcv_rows(opts, split, task, decode)
    return rows


def _fmt(value: Any, digits: int = 1) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    return str(value)


def header_lines(opts: Options, wall_s: float) -> list[str]:
    """The title and what was measured, on what."""
    return [
        "# Benchmark report",
        "",
        f"Machine: {platform.machine()}, {usable_cores()} usable cores, Python "
        f"{platform.python_version()}, torch {torch.__version__}. Data: "
        f"{'your images' if opts.own_data else 'quick ' if opts.quick else ''}"
        f"{'' if opts.own_data else 'synthetic ImageNet-like JPEGs'} at {opts.root}; "
        f"image_size {opts.image_size}, batch_size {opts.batch_size}, "
        f"{opts.epochs['val']} passes over val and {opts.epochs['train']} over train, "
        f"page cache: {'cold (evicted before each run)' if opts.drop_page_cache else 'warm'}. "
        f"All runs `model=none` on the CPU, one after another; every figure is the best of "
        f"{opts.repeats} run(s); {wall_s:.0f} s in all.",
        "",
    ]


def limit_lines(decode: DecodeLimit, copy_bps: float, image_bytes: int) -> list[str]:
    """The limits table: every decode candidate, the CPU decode limit, the pool, memory copy."""
    lines = ["## Limits", "", "| limit | value |", "|---|---|"]
    for rate in sorted(decode.rates, key=lambda r: -r.images_per_s):
        lines.append(
            f"| single-core {rate.name} decode + resize | {rate.images_per_s:,.1f} images/s |"
        )
    lines.append(
        f"| CPU decode limit ({decode.cores} cores x {decode.best.name}) | "
        f"{decode.images_per_s:,.1f} images/s |"
    )
    if decode.pool is not None:
        lines.append(
            f"| plain thread pool ({decode.pool.name}, no pipeline) | "
            f"{decode.pool.images_per_s:,.1f} images/s = "
            f"{100 * decode.ratio(decode.pool.images_per_s):.1f}% of the CPU decode limit |"
        )
    lines.append(
        f"| memory-copy bandwidth | {copy_bps / 1e9:,.2f} GB/s = "
        f"{copy_bps / image_bytes:,.0f} images/s of {image_bytes:,} bytes |"
    )
    return lines


def job_limit_lines(limit: DecodeLimit | None, job: str) -> list[str]:
    """A train job's limit in the limits table (the crop-and-resize limit of memmap's raw
    rows, the region decode limit of the loaders that decode their crops): each way's
    single-core rate, the limit, the plain pool's share of it, and what the flips cost."""
    if limit is None:
        return []
    lines = [
        f"| single-core {rate.name} {job} | {rate.images_per_s:,.1f} images/s |"
        for rate in sorted(limit.rates, key=lambda r: -r.images_per_s)
    ]
    lines.append(
        f"| {limit.title} ({limit.cores} cores x {limit.best.name}) | "
        f"{limit.images_per_s:,.1f} images/s |"
    )
    if limit.pool is not None:
        lines.append(
            f"| plain thread pool ({limit.pool.name}, {job}) | "
            f"{limit.pool.images_per_s:,.1f} images/s = "
            f"{100 * limit.ratio(limit.pool.images_per_s):.1f}% of the {limit.title} |"
        )
    if limit.without_flips is not None:
        alone = limit.without_flips.images_per_s
        lines.append(
            f"| single-core {limit.without_flips.name} (the resize alone) | {alone:,.1f} "
            f"images/s: the flips cost {100 * (1 - limit.best.images_per_s / alone):.1f}% |"
        )
    return lines


def _rate(row: Row) -> float:
    return row.images_per_s or 0.0


def peer_rate(rows: list[Row], task: str, name: str, workers: int | None = None) -> Row | None:
    """Peer ``name``'s row for ``task`` at ``workers`` threads (the fastest, without
    ``workers``)."""
    peer = [
        r
        for r in rows
        if r.pipeline == task
        and r.name == name
        and r.images_per_s
        and (workers is None or r.workers == workers)
    ]
    return max(peer, key=_rate) if peer else None


def dali_rate(rows: list[Row], task: str, workers: int | None = None) -> Row | None:
    """DALI's CPU row for ``task`` at ``workers`` threads (the fastest, without ``workers``)."""
    return peer_rate(rows, task, DALI_NAMES["cpu"], workers)


def ffcv_rate(rows: list[Row], task: str, against: str, workers: int | None = None) -> Row | None:
    """The FFCV row that loader ``against`` is held to (``FFCV_PEER_STORE``)."""
    return peer_rate(rows, task, FFCV_NAMES[FFCV_PEER_STORE.get(against, "jpeg")], workers)


def versus(row: Row, peer: Row, label: str) -> str:
    """'; 1.23x <label> (its best, 2 threads: 1,000 images/s, 0.50 CPU ms an image)'."""
    return (
        f"; {_rate(row) / _rate(peer):.2f}x {label} (its best, {peer.workers} threads: "
        f"{_rate(peer):,.0f} images/s, {_fmt(peer.cpu_s_per_1k_images, 2)} CPU ms an image)"
    )


def answer_lines(rows: list[Row]) -> list[str]:
    """The report's first lines: for this machine and data, the loader and worker count with
    the most images/s per pipeline, by how much over the next best loader and over DALI, and
    at what CPU cost per image."""
    lines = ["## The answer", ""]
    for task in ("train", "val"):
        ours = [r for r in rows if r.pipeline == task and r.name in LOADERS and r.images_per_s]
        if not ours:
            continue
        best = max(ours, key=_rate)
        others = [r for r in ours if r.name != best.name]
        line = (
            f"- **{task}**: `loader={best.name} loader.num_workers={best.workers}`, "
            f"{_rate(best):,.0f} images/s at {_fmt(best.cpu_s_per_1k_images, 2)} CPU ms an "
            f"image"
        )
        if others:
            runner = max(others, key=_rate)
            line += (
                f"; {_rate(best) / _rate(runner):.2f}x the next best loader ({runner.name} at "
                f"{runner.workers} workers: {_rate(runner):,.0f} images/s, "
                f"{_fmt(runner.cpu_s_per_1k_images, 2)} CPU ms an image)"
            )
        dali = dali_rate(rows, task)
        if dali is not None:
            line += versus(best, dali, "DALI's CPU pipeline")
        else:
            line += "; DALI not measured (not installed: `make bench` installs it)"
        ffcv = ffcv_rate(rows, task, best.name)
        if ffcv is not None:
            line += versus(best, ffcv, f"FFCV on its {ffcv.extra['write_mode']} store")
        else:
            line += "; FFCV not measured (it does not import here: `make bench` installs it)"
        lines.append(line + ".")
    return [*lines, ""]


def pipeline_lines(rows: list[Row]) -> list[str]:
    """The pipelines table, one line a row."""
    return [
        "",
        "## Pipelines",
        "",
        "Share = images/s over the pipeline's limit (CPU decode for decoding loaders; for the "
        "memmap reader memory copy in val, crop + resize in train: its train work is cutting, "
        "resizing and flipping each image's box from its stored row). vs DALI = images/s over "
        "DALI's CPU pipeline with as many threads as the row has workers. vs FFCV = the same "
        "over FFCV's pipeline at as many threads, on its raw store for the readers of stored "
        "pixels (memmap), on its jpg store for the loaders that decode JPEGs.",
        "",
        "| pipeline | loader | workers | images/s | share of limit | limit | vs DALI | vs FFCV "
        "| CPU s / 1k images | data wait | ttfb s | note |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
        *(
            pipeline_line(
                row,
                dali_rate(rows, row.pipeline, row.workers),
                ffcv_rate(rows, row.pipeline, row.name, row.workers),
            )
            for row in rows
        ),
    ]


def pipeline_line(row: Row, dali: Row | None = None, ffcv: Row | None = None) -> str:
    vs_dali = f"{_rate(row) / _rate(dali):.2f}x" if dali and row.images_per_s else "-"
    vs_ffcv = f"{_rate(row) / _rate(ffcv):.2f}x" if ffcv and row.images_per_s else "-"
    return (
        f"| {row.pipeline} | {row.name} | {_fmt(row.workers)} | {_fmt(row.images_per_s)} | "
        f"{_fmt(row.share and 100 * row.share)}{'%' if row.share else ''} | "
        f"{row.limit_name or '-'} | {vs_dali} | {vs_ffcv} | {_fmt(row.cpu_s_per_1k_images, 2)} | "
        f"{_fmt(row.data_wait_frac, 3)} | {_fmt(row.ttfb_s, 2)} | {row.note} |"
    )


def ratio_lines(opts: Options, rows: list[Row], decode: DecodeLimit) -> list[str]:
    """The ratios section, every figure computed from the rows."""
    return [
        "",
        "## Ratios at the same worker count",
        "",
        *vs_torchvision_lines(opts, rows),
        *spdl_limit_lines(rows, decode),
        *memmap_vs_tutorial_lines(rows),
    ]


def vs_torchvision_lines(opts: Options, rows: list[Row]) -> list[str]:
    """Each pipeline's images/s over torchvision's, per task and worker count."""
    lines = []
    for task in ("val", "train"):
        for workers in opts.workers:
            by_name = {r.name: r for r in rows if r.pipeline == task and r.workers == workers}
            base = by_name.get("torchvision")
            if not base or not base.images_per_s:
                continue
            parts = [
                f"{name} {r.images_per_s / base.images_per_s:.1f}x"
                for name, r in by_name.items()
                if name != "torchvision" and r.images_per_s
            ]
            lines.append(f"- {task}, {workers} workers, vs torchvision: {', '.join(parts)}")
    return lines


def spdl_limit_lines(rows: list[Row], decode: DecodeLimit) -> list[str]:
    """spdl's val rows against the CPU decode limit and the plain pool (both val work: read,
    decode, resize, crop)."""
    lines = []
    for row in rows:
        if row.pipeline == "val" and row.name == "spdl" and row.images_per_s:
            pool = decode.pool_ratio(row.images_per_s)
            lines.append(
                f"- val, spdl at {row.workers} workers: "
                f"{100 * decode.ratio(row.images_per_s):.1f}% of the CPU decode limit"
                + (f", {100 * pool:.1f}% of the plain thread pool" if pool else "")
            )
    return lines


def memmap_vs_tutorial_lines(rows: list[Row]) -> list[str]:
    """The fastest memmap row over the tutorial's tensorclass loader, per task."""
    lines = []
    tutorial = {r.pipeline: r for r in rows if r.name == "tutorial tensorclass"}
    for task in ("val", "train"):
        memmap = [r for r in rows if r.pipeline == task and r.name == "memmap" and r.images_per_s]
        if memmap and tutorial.get(task) and tutorial[task].images_per_s:
            best = max(r.images_per_s for r in memmap)  # type: ignore[type-var]
            lines.append(
                f"- {task}: memmap (best) vs the tutorial's tensorclass loader: "
                f"{best / tutorial[task].images_per_s:.1f}x"
            )
    return lines


def ffcv_store_lines(rows: list[Row], stores: list[StoreRow], workers: int) -> list[str]:
    """Each memmap store beside FFCV's of the same kind and split, at ``workers`` (the store
    runs' worker count): bytes per image, images/s, CPU; nothing without FFCV rows."""
    ffcv = {
        (r.pipeline, r.extra["store"]): r
        for r in rows
        if r.name in FFCV_NAMES.values() and r.workers == workers
    }
    pairs = [(s, ffcv[(s.pipeline, s.store)]) for s in stores if (s.pipeline, s.store) in ffcv]
    if not pairs:
        return []
    lines = [
        "## FFCV's stores beside memmap's",
        "",
        f"At {workers} workers. FFCV's stores are written at memmap's train store's long side "
        "and JPEG quality; their bytes are the images' own (pixels or JPEG), the file's add "
        "header and page padding. memmap's val stores hold the exact centre crops, FFCV's the "
        "shrunk whole image (cropped and resized at load).",
        "",
        "| split | store | bytes / image: memmap | FFCV | FFCV file | images/s: memmap | FFCV "
        "| memmap / FFCV | CPU s / 1k images: memmap | FFCV |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for ours, peer in pairs:
        faster = ours.images_per_s / _rate(peer) if ours.images_per_s and _rate(peer) else None
        lines.append(
            f"| {ours.pipeline} | {ours.store} / {peer.extra['write_mode']} | "
            f"{ours.bytes_per_image:,.0f} | {peer.extra['payload_bytes_per_image']:,.0f} | "
            f"{peer.extra['bytes_per_image']:,.0f} | {_fmt(ours.images_per_s)} | "
            f"{_fmt(peer.images_per_s)} | {_fmt(faster, 2)}{'x' if faster else ''} | "
            f"{_fmt(ours.cpu_s_per_1k_images, 2)} | {_fmt(peer.cpu_s_per_1k_images, 2)} |"
        )
    return ["", *lines]


def auto_lines(rows: list[Row], auto: list[AutoRow], tolerance: float = 0.05) -> list[str]:
    """A line per pipeline run with ``loader.num_workers=auto``: the count chosen, its images/s
    against the best count of the sweep, the fewest swept workers within ``tolerance`` of
    that best, and the probe's seconds."""
    if not auto:
        return []
    lines = [
        "",
        "## num_workers=auto",
        "",
        "Each loader once more with `loader.num_workers=auto` (probing afresh every time: "
        "`loader.autotune.refresh=true`; best of the repeats, like the sweeps): the count its "
        "probe chose, that run's images/s against the best count of the sweep above, the "
        f"fewest swept workers within {100 * tolerance:.0f}% of that best, and the probe's "
        "seconds in the run's wall time.",
        "",
    ]
    for row in auto:
        line = f"- {row.pipeline}, {row.name}: "
        if row.note or row.workers is None:
            lines.append(line + (row.note or "no count chosen"))
            continue
        swept = [r for r in rows if (r.pipeline, r.name) == (row.pipeline, row.name) and _rate(r)]
        line += f"chose {row.workers} workers, {_fmt(row.images_per_s)} images/s"
        if swept:
            best = max(swept, key=_rate)
            enough = min(r.workers or 0 for r in swept if _rate(r) >= (1 - tolerance) * _rate(best))
            line += (
                f" = {100 * (row.images_per_s or 0.0) / _rate(best):.1f}% of the best swept count "
                f"({best.workers} workers: {_fmt(best.images_per_s)} images/s); fewest swept "
                f"within {100 * tolerance:.0f}%: {enough}"
            )
        line += f"; probe {_fmt(row.autotune_s, 2)} s of the run's {_fmt(row.wall_s)} s"
        lines.append(line)
    return lines


def bench_args(opts: Options) -> str:
    """What ``make bench`` was given for this report (the data set and the quick mode)."""
    args = [
        *(["--quick"] if opts.quick else []),
        *([f"--root {opts.root}"] if opts.own_data else []),
    ]
    return f' BENCH_ARGS="{" ".join(args)}"' if args else ""


def write_report(
    opts: Options,
    rows: list[Row],
    decode: DecodeLimit,
    copy_bps: float,
    image_bytes: int,
    wall_s: float,
    stores: list[StoreRow],
    crop: DecodeLimit | None = None,
    region: DecodeLimit | None = None,
    auto: list[AutoRow] | None = None,
) -> None:
    """report.md, report.json and report.png in ``opts.out``."""
    lines = [
        *header_lines(opts, wall_s),
        *answer_lines(rows),
        *limit_lines(decode, copy_bps, image_bytes),
        *job_limit_lines(crop, "crop + resize + flip"),
        *job_limit_lines(region, "train job"),
        *pipeline_lines(rows),
        *ratio_lines(opts, rows, decode),
        *region_share_lines(rows, region),
        *auto_lines(rows, auto or []),
        "",
        *store_lines(stores),
        *ffcv_store_lines(rows, stores, max(opts.workers)),
        "",
        f"Command: `make bench{bench_args(opts)}`",
        "",
    ]
    (opts.out / "report.md").write_text("\n".join(lines))
    report = {
        "rows": [{**row.__dict__, "share": row.share} for row in rows],
        "auto": [row.__dict__ for row in auto or []],
        "decode_limit": decode.as_dict(),
        "crop_limit": None if crop is None else crop.as_dict(),
        "region_decode_limit": None if region is None else region.as_dict(),
        "memory_copy_bytes_per_s": copy_bps,
        "ffcv_version": ffcv_version(),
        "stores": [
            {**row.__dict__, "imagenet_gb": row.imagenet_gb}
            | {f"build_minutes_{c}_cores": row.build_minutes(c) for c in CORES}
            for row in stores
        ],
    }
    (opts.out / "report.json").write_text(json.dumps(report, indent=1))
    plot_report(opts.out / "report.png", rows)


def plot_report(path: Path, rows: list[Row]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(13, 5.5))
    for ax, task in zip(axes, ("val", "train"), strict=True):
        task_rows = [r for r in rows if r.pipeline == task and r.images_per_s]
        labels = [f"{r.name}\n{r.workers}w" for r in task_rows]
        values = [r.images_per_s for r in task_rows]
        bars = ax.bar(
            range(len(values)),
            values,
            color=[COLOURS.get(r.name, "C7") for r in task_rows],
        )
        for bar, row in zip(bars, task_rows, strict=True):
            if row.share:
                ax.annotate(
                    f"{100 * row.share:.0f}%",
                    (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                    ha="center",
                    va="bottom",
                    fontsize=8,
                )
        ax.set_xticks(range(len(labels)), labels, rotation=45, ha="right", fontsize=8)
        ax.set_yscale("log")
        ax.set_ylabel("images / s (log)")
        ax.set_title(f"{task} pipeline (labels: share of the limit)")
        ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def parse_options(argv: list[str] | None = None) -> Options:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO / "bench")
    parser.add_argument("--quick", action="store_true", help="small data, for CI")
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--workers", default=None, help="comma-separated worker counts")
    parser.add_argument("--epochs", default="4,3", help="passes over val,train")
    parser.add_argument("--drop-page-cache", action="store_true")
    parser.add_argument(
        "--root",
        type=Path,
        default=None,
        help="your own data set (train/ and val/ in ImageFolder layout) instead of the "
        "generated one",
    )
    parser.add_argument(
        "--repeats", type=int, default=None, help="best of this many runs (default 2; quick 1)"
    )
    args = parser.parse_args(argv)
    workers = (
        tuple(int(w) for w in args.workers.split(","))
        if args.workers
        else tuple(sorted({1, usable_cores()}))
    )
    return Options(
        out=args.out.absolute(),
        quick=args.quick,
        image_size=args.image_size,
        batch_size=args.batch_size,
        workers=workers,
        epochs=dict(zip(("val", "train"), map(int, args.epochs.split(",")), strict=True)),
        drop_page_cache=args.drop_page_cache,
        repeats=max(1, args.repeats or (1 if args.quick else 2)),
        root=args.root.absolute() if args.root else None,
        own_data=args.root is not None,
    )


def measure_limits(opts: Options, root: Path) -> tuple[DecodeLimit, float]:
    """The CPU decode limit over every val image the val pipelines read (the limit is a rate
    on the same work), and the memory-copy bandwidth in bytes/s."""
    from loaderbench.data import scan_image_folder

    _, val_paths, _ = scan_image_folder(root / "val")
    decode = measure_decode_limit(val_paths, opts.image_size, repeats=opts.repeats)
    copy_bps = memory_copy_bandwidth(64 * 2**20 if opts.quick else 256 * 2**20)
    return decode, copy_bps


def measure_crop(opts: Options, root: Path) -> DecodeLimit:
    """The crop-and-resize limit over (up to ``CROP_LIMIT_IMAGES`` of) the train images the
    train pipelines read, stored as memmap's raw store keeps them, with their epoch-0 boxes."""
    from loaderbench.data import scan_image_folder, spread_indices

    _, paths, _ = scan_image_folder(root / "train")
    paths = [paths[i] for i in spread_indices(len(paths), min(len(paths), CROP_LIMIT_IMAGES))]
    return measure_crop_limit(paths, opts.image_size, repeats=opts.repeats)


def measure_region(opts: Options, root: Path) -> DecodeLimit | None:
    """The region decode limit over the train images (the same subset as the crop limit's),
    with their epoch-0 boxes; None where no CPU JPEG backend decodes regions here."""
    from loaderbench import decode
    from loaderbench.data import scan_image_folder, spread_indices

    if not decode.region_decode("cpu"):
        return None
    _, paths, _ = scan_image_folder(root / "train")
    paths = [paths[i] for i in spread_indices(len(paths), min(len(paths), CROP_LIMIT_IMAGES))]
    return measure_region_decode_limit(paths, opts.image_size, repeats=opts.repeats)


def region_share_lines(rows: list[Row], region: DecodeLimit | None) -> list[str]:
    """spdl's train rows against the limit of their work: decoding each crop's region."""
    if region is None:
        return []
    return [
        f"- train, spdl at {row.workers} workers: "
        f"{100 * region.ratio(row.images_per_s):.1f}% of the region decode limit"
        for row in rows
        if row.pipeline == "train" and row.name == "spdl"
    ]


def measure_rows(
    opts: Options,
    root: Path,
    decode: DecodeLimit,
    copy_images_per_s: float,
    crop: DecodeLimit | None = None,
) -> list[Row]:
    """The loaders' sweeps (best of the repeats), then the peers; val rows first."""
    rows: list[Row] = []
    for task in ("val", "train"):
        runs = [run for r in range(opts.repeats) for run in run_sweep(opts, root, task, r)]
        rows += loader_rows(task, best_runs(runs), decode, copy_images_per_s, crop)
    rows += peer_rows(opts, root, decode)
    share_memmap_limits(rows)
    rows.sort(key=lambda r: (r.pipeline != "val", r.name, r.workers or 0))
    return rows


def main(argv: list[str] | None = None) -> int:
    opts = parse_options(argv)
    opts.out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    if not opts.own_data:
        data = (opts.work / "data") if opts.quick else REPO / "data"
        opts.root = ensure_synthetic(opts.spec, data)
    os.environ.setdefault("WANDB_MODE", "disabled")
    decode, copy_bps = measure_limits(opts, opts.root)
    crop = measure_crop(opts, opts.root)
    image_bytes = 3 * opts.image_size * opts.image_size
    rows = measure_rows(opts, opts.root, decode, copy_bps / image_bytes, crop)
    auto = measure_auto(opts, opts.root)
    stores = measure_stores(
        lambda task, sweep_dir, swept: sweep_command(opts, opts.root, task, sweep_dir, swept),
        opts.work,
        max(opts.workers),
    )
    region = measure_region(opts, opts.root)
    wall_s = time.perf_counter() - started
    write_report(opts, rows, decode, copy_bps, image_bytes, wall_s, stores, crop, region, auto)
    print((opts.out / "report.md").read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
