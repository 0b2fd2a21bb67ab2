"""This machine's decode and crop limits, and given runs' ratios to them.

``python -m tools.bench.limit_report [--root DIR] [--image-size 224] [METRICS_JSON ...]``:
this machine's limits (``limits``: the val decode limit and the region decode limit;
``crop_limit``: the crop-and-resize limit) and, for each ``metrics.json`` of a ``model=none``
run, the ratios to the limit of its work (a raw store's train run: the crop-and-resize limit).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from loaderbench.measure.metrics import CPU_S_PER_1K_IMAGES, IMAGES_PER_S
from tools.bench.crop_limit import measure_crop_limit
from tools.bench.limits import (
    format_limit,
    format_ratio,
    measure_decode_limit,
    measure_region_decode_limit,
    run_bounds,
    run_label,
)


def _default_paths(root: Path | None, split: str, count: int | None) -> list[str]:
    from loaderbench.data.discovery import scan_image_folder, spread_indices
    from loaderbench.data.synthetic import SyntheticSpec, ensure_synthetic

    if root is None:
        root = ensure_synthetic(SyntheticSpec(), Path("data"))
    _, paths, _ = scan_image_folder(root / split)
    if count is None or count >= len(paths):
        return paths
    return [paths[i] for i in spread_indices(len(paths), count)]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("metrics", nargs="*", type=Path, help="metrics.json of model=none runs")
    parser.add_argument("--root", type=Path, help="ImageFolder root (default: synthetic set)")
    parser.add_argument("--split", default="val")
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--images", type=int, default=None, help="default: the whole split")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument("--train-split", default="train", help="for the region decode limit")
    parser.add_argument(
        "--crop-images", type=int, default=512, help="train images for the crop limit"
    )
    args = parser.parse_args(argv)
    paths = _default_paths(args.root, args.split, args.images)
    limit = measure_decode_limit(paths, args.image_size, args.repeats)
    print(format_limit(limit))
    train_paths = _default_paths(args.root, args.train_split, args.images)
    region = measure_region_decode_limit(train_paths, args.image_size, args.repeats)
    print(format_limit(region))
    crop_paths = _default_paths(args.root, args.train_split, args.crop_images)
    crop = measure_crop_limit(crop_paths, args.image_size, args.repeats)
    print(format_limit(crop))
    report: dict[str, Any] = {"limit": limit.to_json(), "region_limit": region.to_json()}
    report |= {"crop_limit": crop.to_json(), "runs": {}}
    for path in args.metrics:
        metrics = json.loads(path.read_text())
        label = run_label(path, metrics)
        # A run that decodes nothing (a raw store's train run) crops and resizes stored rows.
        applies = crop if run_bounds(path, metrics)[0] == "crop" else limit
        print(format_ratio(applies, metrics, f"{label} ({path})"))
        ips = metrics.get(IMAGES_PER_S) or 0.0
        report["runs"][str(path)] = {
            IMAGES_PER_S: ips,
            "limit": applies.title,
            "limit_ratio": applies.ratio(ips),
            "pool_ratio": applies.pool_ratio(ips),
            "cpu_efficiency": applies.efficiency(metrics.get(CPU_S_PER_1K_IMAGES) or 0.0),
        }
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
