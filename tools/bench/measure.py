"""``make bench``: measure the benchmark, on one data set, in one go, into ``bench/report.json``.

One after another, so nothing competes for the cores: the limits that give the numbers a
meaning (``limits``: CPU decode, memory copy, crop-and-resize), the project's loaders with
``model=none`` over a worker sweep (real ``eval.py`` / ``train.py --multirun`` runs, each row
held to the limit of the work its loader declares: ``work_bounds``), then the peers
(``peer_rows``) timed with the same meter on the same files. It writes ``bench/report.json``
(``schema``) and draws report.md and report.png from it (``render``). ``--quick`` is a small
version (CI); the runs' files go to ``<out>/work`` (the full run's data set to ``data/``). A
shared machine is noisy (docs/measurements.md), so every measurement is the best of ``--repeats``.
"""

from __future__ import annotations

import argparse
import csv
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

import torch

from loaderbench.data.synthetic import SyntheticSpec, ensure_synthetic
from loaderbench.loaders import file_loader_names, settings_class
from loaderbench.measure.metrics import DECODED_BY, IMAGES_PER_S
from tools.bench.columns import COLUMNS
from tools.bench.crop_limit import measure_crop_limit
from tools.bench.limits import (
    DecodeLimit,
    measure_decode_limit,
    measure_region_decode_limit,
    usable_cores,
)
from tools.bench.peer_rows import Limits, held_to, peer_rows
from tools.bench.render import render
from tools.bench.render_cores import add_gpu_options, checked_gpu_options
from tools.bench.schema import AutoRow, GpuModelRate, Machine, Options, Report, Row
from tools.bench.stores import measure_stores
from tools.bench.work_bounds import work_bounds

REPO = Path(__file__).resolve().parents[2]
# The crop-and-resize limit's train images (stored rows in memory: ~340 KB each at 224 px).
CROP_LIMIT_IMAGES = 512
# --quick (CI): shorter probe windows; its 192 images fill a 1.5 s window many times over.
AUTO_SWEPT_QUICK = ["loader.autotune.window_s=0.3"]
# --quick's batches: small enough that an epoch of its 192 images (24 batches) outlasts the
# warm-up and the deepest loader's head start, so every row has a steady window.
QUICK_BATCH_SIZE = 8


def auto_swept() -> list[str]:
    """Each loader once more with the count left to its probe, probing afresh every time (a
    choice remembered from the run before would cost nothing and measure nothing)."""
    return [
        f"loader={','.join(file_loader_names())}",
        "loader.num_workers=auto",
        "loader.autotune.refresh=true",
    ]


def data_spec(opts: Options) -> SyntheticSpec:
    """The generated data set (where ``--root`` names none)."""
    if opts.quick:
        return SyntheticSpec(num_classes=4, train_per_class=48, val_per_class=48)
    # A val split as large as the train split: with the default 300 val images an epoch is ten
    # batches, and every loader's per-epoch start and drain would weigh far more than on a
    # real val set (50,000 images on ImageNet).
    return SyntheticSpec(train_per_class=100, val_per_class=100)


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
        # The loaders that read the files: loader=resident alone (model=none) measures no work.
        swept = [f"loader={','.join(file_loader_names())}", f"loader.num_workers={workers}"]
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
    once with ``loader.num_workers=auto`` instead (``auto_swept``).

    The runs start in the work folder, so what they write at a relative path lands there and
    never in the repository: the memmap loader's cache above all (``loader.cache_dir=cache``
    by default, hence ``<out>/work/cache``). A sweep over loaders cannot name the cache itself:
    ``loader.cache_dir`` is a memmap key, which the other loaders' settings refuse.
    """
    sweep_dir = opts.work / task / f"{'auto' if auto else 'repeat'}{repeat}"
    swept = [*auto_swept(), *(AUTO_SWEPT_QUICK if opts.quick else [])] if auto else None
    cmd = sweep_command(opts, root, task, sweep_dir, swept)
    print("$", " ".join(cmd[1:]), flush=True)
    opts.work.mkdir(parents=True, exist_ok=True)
    subprocess.run(cmd, cwd=opts.work, check=True)
    if not auto:  # the sweep's own summary plot, as docs/benchmark.md shows it
        shutil.copyfile(sweep_dir / "summary.png", opts.out / f"sweep_{task}.png")
    with open(sweep_dir / "summary.csv") as f:
        return list(csv.DictReader(f))


def number(value: str | None) -> float | None:
    """A summary.csv cell as a number (None: empty or not a number)."""
    try:
        return float(value) if value not in (None, "") else None
    except ValueError:
        return None


def best_runs(runs: list[dict[str, str]]) -> list[dict[str, str]]:
    """Per (loader, workers), the run with the most images/s (failed runs only if no other)."""
    best: dict[tuple[str, str], dict[str, str]] = {}
    for run in runs:
        key = (run["loader"], run["num_workers"])
        speed = number(run.get(IMAGES_PER_S)) or 0.0
        if key not in best or speed > (number(best[key].get(IMAGES_PER_S)) or 0.0):
            best[key] = run
    return list(best.values())


def row_note(run: dict[str, str]) -> str:
    """A sweep row's note: why it failed, or what decoded its images (``decoded_by``)."""
    if run.get("status") != "ok":
        return f"failed: {run.get('error')}"
    return f"decoded by {run[DECODED_BY]}" if run.get(DECODED_BY) else ""


def auto_rows(task: str, runs: list[dict[str, str]]) -> list[AutoRow]:
    """Per loader, its ``auto`` run with the most images/s (failed runs only if no other)."""
    best: dict[str, dict[str, str]] = {}
    for run in runs:
        speed = number(run.get(IMAGES_PER_S)) or 0.0
        if run["loader"] not in best or speed > (number(best[run["loader"]][IMAGES_PER_S]) or 0):
            best[run["loader"]] = run
    return [
        AutoRow(
            pipeline=task,
            name=name,
            workers=int(run["num_workers"]) if run.get("num_workers", "").isdigit() else None,
            images_per_s=number(run.get(IMAGES_PER_S)),
            autotune_s=number(run.get("autotune_s")),
            wall_s=number(run.get("wall_s")),
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


def loader_rows(task: str, runs: list[dict[str, str]], limits: Limits) -> list[Row]:
    """A row per sweep run, held to the limit of the work its loader declares (at the
    defaults the sweeps run it with)."""
    out = []
    for run in runs:
        bounds = work_bounds(settings_class(run["loader"])(name=run["loader"]), task == "train")
        out.append(
            Row(
                pipeline=task,
                name=run["loader"],
                workers=int(run["num_workers"]),
                **{key: number(run.get(key)) for key in COLUMNS},
                note=row_note(run),
                kind="loader",
                ceiling_frac_null_reason=run.get("ceiling_frac_null_reason") or None,
                **held_to(bounds, limits),
            )
        )
    return out


def parse_options(argv: list[str] | None = None) -> tuple[Options, GpuModelRate | None]:
    """The options, and the model rate of ``--gpu-metrics`` where given (checked before any
    measuring)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO / "bench")
    parser.add_argument("--quick", action="store_true", help="small data, for CI")
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument(
        "--batch-size", type=int, default=None, help=f"32 (quick: {QUICK_BATCH_SIZE})"
    )
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
    parser.add_argument(
        "--baseline", default="torchvision", help="the loader the ratios are taken against"
    )
    add_gpu_options(parser, defaults=True)  # "How many cores feed my GPUs?"
    args = parser.parse_args(argv)
    model_rate = checked_gpu_options(parser, args)
    if args.baseline not in file_loader_names():
        choices = list(file_loader_names())
        parser.error(f"--baseline {args.baseline!r}: choose one of {choices}")
    workers = (
        tuple(int(w) for w in args.workers.split(","))
        if args.workers
        else tuple(sorted({1, usable_cores()}))
    )
    opts = Options(
        out=args.out.absolute(),
        quick=args.quick,
        image_size=args.image_size,
        batch_size=args.batch_size or (QUICK_BATCH_SIZE if args.quick else 32),
        workers=workers,
        epochs=dict(zip(("val", "train"), map(int, args.epochs.split(",")), strict=True)),
        drop_page_cache=args.drop_page_cache,
        repeats=max(1, args.repeats or (1 if args.quick else 2)),
        root=args.root.absolute() if args.root else None,
        own_data=args.root is not None,
        baseline=args.baseline,
        gpu_rate=args.gpu_rate,
        node_gpus=args.gpus,
        node_cores=args.cores,
    )
    return opts, model_rate


def measure_limits(opts: Options, root: Path) -> tuple[DecodeLimit, float]:
    """The CPU decode limit over every val image the val pipelines read (the limit is a rate
    on the same work), and the memory-copy bandwidth in bytes/s."""
    from loaderbench.data.discovery import scan_image_folder

    _, val_paths, _ = scan_image_folder(root / "val")
    decode = measure_decode_limit(val_paths, opts.image_size, repeats=opts.repeats)
    copy_bps = memory_copy_bandwidth(64 * 2**20 if opts.quick else 256 * 2**20)
    return decode, copy_bps


def train_limit_paths(root: Path) -> list[str]:
    """(Up to ``CROP_LIMIT_IMAGES`` of) the train images the train pipelines read."""
    from loaderbench.data.discovery import scan_image_folder, spread_indices

    _, paths, _ = scan_image_folder(root / "train")
    return [paths[i] for i in spread_indices(len(paths), min(len(paths), CROP_LIMIT_IMAGES))]


def measure_crop(opts: Options, root: Path) -> DecodeLimit:
    """The crop-and-resize limit over the train limit's images, stored as memmap's raw store
    keeps them, with their epoch-0 boxes."""
    return measure_crop_limit(train_limit_paths(root), opts.image_size, repeats=opts.repeats)


def measure_region(opts: Options, root: Path) -> DecodeLimit | None:
    """The region decode limit over the train limit's images (the crop limit's), with their
    epoch-0 boxes; None where no CPU JPEG backend decodes regions here."""
    from loaderbench.imaging import decode

    if not decode.region_decode("cpu"):
        return None
    paths = train_limit_paths(root)
    return measure_region_decode_limit(paths, opts.image_size, repeats=opts.repeats)


def measure_rows(opts: Options, root: Path, limits: Limits) -> list[Row]:
    """The loaders' sweeps (best of the repeats), then the peers; val rows first."""
    rows: list[Row] = []
    for task in ("val", "train"):
        runs = [run for r in range(opts.repeats) for run in run_sweep(opts, root, task, r)]
        rows += loader_rows(task, best_runs(runs), limits)
    rows += peer_rows(opts, root, limits)
    rows.sort(key=lambda r: (r.pipeline != "val", r.name, r.workers or 0))
    return rows


def this_machine() -> Machine:
    return Machine(platform.machine(), usable_cores(), platform.python_version(), torch.__version__)


def measure(opts: Options) -> Report:
    """Everything the report shows, measured in one go (see the module's docstring)."""
    from tools.bench.ffcv import ffcv_version

    started = time.perf_counter()
    if not opts.own_data:
        data = (opts.work / "data") if opts.quick else REPO / "data"
        opts.root = ensure_synthetic(data_spec(opts), data)
    root = opts.root
    assert root is not None
    os.environ.setdefault("WANDB_MODE", "disabled")
    decode, copy_bps = measure_limits(opts, root)
    crop = measure_crop(opts, root)
    image_bytes = 3 * opts.image_size * opts.image_size
    limits = {
        "decode": decode.images_per_s,
        "copy": copy_bps / image_bytes,
        "crop": crop.images_per_s,
    }
    rows = measure_rows(opts, root, limits)
    auto = measure_auto(opts, root)
    stores = measure_stores(
        lambda task, sweep_dir, swept: sweep_command(opts, root, task, sweep_dir, swept),
        opts.work,
        max(opts.workers),
    )
    region = measure_region(opts, root)
    return Report(
        options=opts,
        machine=this_machine(),
        wall_s=time.perf_counter() - started,
        rows=rows,
        decode_limit=decode,
        memory_copy_bytes_per_s=copy_bps,
        stores=stores,
        crop_limit=crop,
        region_decode_limit=region,
        auto=auto,
        ffcv_version=ffcv_version(),
    )


def main(argv: list[str] | None = None) -> int:
    """Measure, write report.json, draw report.md and report.png from it."""
    opts, model_rate = parse_options(argv)
    opts.out.mkdir(parents=True, exist_ok=True)
    report = measure(opts)
    report.gpu_model_rate = model_rate
    report.write(opts.out / "report.json")
    # Drawn from the file just written, as `make report` draws it: the file holds it all.
    render(Report.load(opts.out / "report.json"), opts.out)
    print((opts.out / "report.md").read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
