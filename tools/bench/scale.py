"""``make bench-scale``: start-up and memory on a tree the size of a real data set.

On a generated 1000-class tree of small real JPEGs (cached under ``data/``): the first scan and
the index load (with its per-file check and with folders only), the memmap jpeg store's build
rate, a second run's reopen and wait for its first batch, and the memory of DataLoader workers
over an epoch with the paths in the index's byte buffer against a tuple of Python strings; each
figure projected to ImageNet's train set. Writes ``bench/scale.md`` and ``bench/scale.json``;
``--quick`` runs a small tree (the test).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from loaderbench.data.synthetic import SyntheticSpec, ensure_synthetic
from loaderbench.measure.metrics import PEAK_RSS_MB
from loaderbench.platform.tables import markdown_table

REPO = Path(__file__).resolve().parents[2]
IMAGENET_TRAIN = 1_281_167
FULL = SyntheticSpec(num_classes=1000, train_per_class=250, val_per_class=10, max_side=64)
QUICK = SyntheticSpec(num_classes=20, train_per_class=12, val_per_class=3, max_side=64)
WORKERS = 8

DISCOVER = """
import json, sys, time
from omegaconf import OmegaConf
from loaderbench.config.schema import DatasetConfig
from loaderbench.data.discovery import discover
root, index_dir, rescan, check = sys.argv[1], sys.argv[2], sys.argv[3] == "true", sys.argv[4]
start = time.perf_counter()
index = discover(OmegaConf.structured(DatasetConfig(
    name="folder", root=root, index_dir=index_dir, rescan=rescan, index_check=check)))
print(json.dumps({"s": time.perf_counter() - start, "files": len(index.train) + len(index.val)}))
"""


@dataclass
class Options:
    out: Path
    work: Path
    spec: SyntheticSpec
    data_parent: Path


def discover_s(root: Path, index_dir: Path, rescan: bool, check: str = "files") -> dict[str, Any]:
    """One discovery in a fresh process (``check``: dataset.index_check): its seconds and the
    files found."""
    args = [sys.executable, "-c", DISCOVER, str(root), str(index_dir), str(rescan).lower(), check]
    done = subprocess.run(args, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def entry_run(opts: Options, root: Path, script: str, *overrides: str) -> dict[str, Any]:
    """A real train.py / eval.py run in the work folder; its metrics.json."""
    run_dir = opts.work / "runs" / f"{script}-{time.time_ns()}"
    args = [
        sys.executable,
        str(REPO / script),
        "model=none",
        "logger=none",
        f"dataset.root={root}",
        f"dataset.index_dir={opts.work / 'index'}",
        f"hydra.run.dir={run_dir}",
        *overrides,
    ]
    print("$", " ".join(args[1:]), flush=True)
    subprocess.run(args, cwd=opts.work, check=True, capture_output=True, text=True)
    return json.loads((run_dir / "metrics.json").read_text())


def first_batch_s(metrics: dict[str, Any]) -> float:
    """Process start to the first batch: start-up plus the loop's time to its first batch."""
    return float(metrics["startup_s"]) + float(metrics["ttfb_s"])


def worker_growth_mb(split: Any, workers: int = WORKERS) -> dict[str, float]:
    """Unique memory (USS) each DataLoader worker gains between its first batch and the end of
    an epoch of the torchvision train pipeline, mean and max over the workers, in MB."""
    import torch

    from loaderbench.loaders import LoaderSpec, build_loader, settings_class

    batch = max(1, min(256, len(split) // (4 * workers)))  # at least 4 batches a worker
    settings = settings_class("torchvision")(
        name="torchvision", batch_size=batch, num_workers=workers, prefetch=2 * workers
    )
    spec = LoaderSpec(split, True, 32, torch.device("cpu"), settings)
    loader = build_loader(spec)
    first: dict[int, int] = {}
    last: dict[int, int] = {}

    def sample(into: dict[int, int]) -> None:
        for child in psutil.Process().children():
            try:
                into[child.pid] = child.memory_full_info().uss
            except psutil.Error:
                continue

    try:
        for number, _ in enumerate(loader):
            if number == workers:  # every worker has made a batch
                sample(first)
        sample(last)
    finally:
        loader.close()
    growth = [(last[pid] - first[pid]) / 2**20 for pid in first if pid in last]
    return {"mean": sum(growth) / len(growth), "max": max(growth), "workers": len(growth)}


def measure(opts: Options) -> dict[str, Any]:
    root = ensure_synthetic(opts.spec, opts.data_parent)
    index_dir = opts.work / "index"
    scan = discover_s(root, index_dir, rescan=True)
    load = discover_s(root, index_dir, rescan=False)
    load_folders = discover_s(root, index_dir, rescan=False, check="folders")
    jpeg = ["loader=memmap", "loader.store=jpeg", "image_size=32", "bench.max_batches=2"]
    build = entry_run(opts, root, "train.py", *jpeg, "dataset.max_images=20000")
    cached = ["loader=memmap", "image_size=32", "bench.max_batches=2"]
    entry_run(opts, root, "eval.py", *cached)  # builds the val cache
    second = entry_run(opts, root, "eval.py", *cached)
    plain_first = entry_run(opts, root, "eval.py", "bench.max_batches=2", "dataset.rescan=true")
    plain_second = entry_run(opts, root, "eval.py", "bench.max_batches=2")
    from omegaconf import OmegaConf

    from loaderbench.config.schema import DatasetConfig
    from loaderbench.data.discovery import Split, discover

    cfg = DatasetConfig(name="folder", root=str(root), index_dir=str(index_dir))
    train = discover(OmegaConf.structured(cfg)).train
    as_strings = Split(train.name, tuple(train.paths), tuple(int(x) for x in train.labels))
    return {
        "files": scan["files"],
        "train_files": len(train),
        "first_scan_s": scan["s"],
        "index_load_s": load["s"],
        "index_load_folders_s": load_folders["s"],
        "jpeg_build_images_per_s": build["loader_train_cache_build_images_per_s"],
        "jpeg_build_workers": build["loader_train_cache_build_workers"],
        "reopen_first_batch_s": first_batch_s(second),
        "reopen_cache_built": second["loader_val_cache_built"],
        "scan_run_first_batch_s": first_batch_s(plain_first),
        "index_run_first_batch_s": first_batch_s(plain_second),
        "main_peak_rss_mb": plain_second[PEAK_RSS_MB],
        "worker_growth_mb_index": worker_growth_mb(train),
        "worker_growth_mb_strings": worker_growth_mb(as_strings),
    }


def report_lines(result: dict[str, Any]) -> list[str]:
    scale = IMAGENET_TRAIN / result["train_files"]
    per_core = result["jpeg_build_images_per_s"] / max(1, result["jpeg_build_workers"])

    def row(name: str, here: float, unit: str, projected: str) -> list[str]:
        return [name, f"{here:,.2f} {unit}", projected]

    index, strings = result["worker_growth_mb_index"], result["worker_growth_mb_strings"]
    rows = [
        row(
            "first scan (walk + stat every file)",
            result["first_scan_s"],
            "s",
            f"{result['first_scan_s'] * scale:,.1f} s",
        ),
        row(
            "dataset index load, every file checked (default)",
            result["index_load_s"],
            "s",
            f"{result['index_load_s'] * scale:,.2f} s",
        ),
        row(
            "dataset index load, folders only (dataset.index_check=folders)",
            result["index_load_folders_s"],
            "s",
            f"{result['index_load_folders_s'] * scale:,.2f} s",
        ),
        row(
            "eval.py, process start to first batch, first run (scans)",
            result["scan_run_first_batch_s"],
            "s",
            "-",
        ),
        row(
            "eval.py, process start to first batch, next run (index)",
            result["index_run_first_batch_s"],
            "s",
            "-",
        ),
        row(
            "memmap eval.py, second run (cache reopened): start to first batch",
            result["reopen_first_batch_s"],
            "s",
            "-",
        ),
        row(
            "memmap jpeg store build, per core",
            per_core,
            "images/s",
            f"{IMAGENET_TRAIN / (per_core * 16) / 60:,.1f} min at 16 cores",
        ),
        row("main process peak RSS (eval, index)", result["main_peak_rss_mb"], "MB", "-"),
        row(
            f"worker USS growth over an epoch, index paths (mean of {index['workers']})",
            index["mean"],
            "MB",
            f"{index['mean'] * scale:,.1f} MB",
        ),
        row(
            "worker USS growth over an epoch, paths as Python strings",
            strings["mean"],
            "MB",
            f"{strings['mean'] * scale:,.1f} MB",
        ),
    ]
    return [
        "# Scale: start-up and memory on a large tree",
        "",
        f"{result['files']:,} files ({result['train_files']:,} train); projection x{scale:.2f} "
        "to ImageNet's 1,281,167 train files (scan and index grow with files).",
        "",
        *markdown_table(["measure", "here", "projected to ImageNet"], rows).splitlines(),
        "",
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO / "bench")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    work = args.out / "work" / ("scale-quick" if args.quick else "scale")
    work.mkdir(parents=True, exist_ok=True)
    opts = Options(
        out=args.out,
        work=work,
        spec=QUICK if args.quick else FULL,
        data_parent=work / "data" if args.quick else REPO / "data",
    )
    os.environ.setdefault("WANDB_MODE", "disabled")
    result = measure(opts)
    (args.out / "scale.json").write_text(json.dumps(result, indent=1))
    (args.out / "scale.md").write_text("\n".join(report_lines(result)))
    print((args.out / "scale.md").read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
