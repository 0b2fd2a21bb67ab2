"""The GPU check's projected time (``python -m tools.gpu_check.plan PLAN --budget S``): a row a
phase and a multirun, in the order they run, each with its estimate on the GPU machine, summed
against the budget, start-up apart from measuring.

``gpu_check.sh`` walks its plan once without running anything and hands it here, so the
projection is printed before the first run, by the dry run too. No torch import: this runs in a
fraction of a second. The estimates are the constants below, from the H200 check of 2026-12-04
(docs/benchmark.md): start-up per multirun and job, cache builds, then each job's images at the
lower of its loader's rate and its model's (``RATES``, ``CEILINGS``).
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

MULTIRUN_START_S = 7.0
JOB_SETUP_S = 3.0
# A job with a model also measures its model's ceiling (bench.ceiling_batches, 10 by default,
# after warm-up) on the batch it trains on: ~1 s at resnet50's rate.
CEILING_PASS_S = 1.5
CACHE_BUILD_S = 6.0
TORCHVISION_SPAWN_S = 3.0
# The check's data set (gpu_check.sh's data phase) and batch.
TRAIN_IMAGES, VAL_IMAGES, BATCH = 8000, 300, 256
# A loader's images/s alone on the H200 (model=none, measured 2026-12-04): at the count the
# check runs (GPU-side loaders), or a worker's share up to a cap (CPU decoders).
RATES = {
    "resident": float("inf"),
    "spdl-nvjpeg": 3000.0,
    "memmap-raw": 89000.0,
    "memmap-jpeg": 4900.0,
}
# spdl turbo's cap is its rate beside resnet50 (653/s at 14 threads; 954/s alone).
PER_WORKER = {"spdl-turbo": (450.0, 700.0), "torchvision": (116.0, 1620.0)}
# The model's own rate (loader=resident) at 224 px, batch 256, bf16, channels_last.
CEILINGS = {"resnet50": 4730.0, "resnet18": 11000.0, "none": float("inf")}
# The phases' seconds on the H200 (data: 15 s for 5,000 JPEGs then, 8,300 now; sharing: 5
# modes of 1.5 s, their decoders' creation and warm-up, and the import: not measured yet).
SETUP_S = {
    "env-quick": 4.0,
    "kit": 5.0,
    "env": 28.0,
    "data": 25.0,
    "projection": 1.0,
    "tests": 22.0,
    "decode": 18.0,
    "sharing": 16.0,
}
KINDS = ("ceiling", "model", "ladder")
# Above this share of the time left for the runs (budget less the reserve) the projection
# warns: the estimates are rough, and a slow machine start would cut the last runs.
ROOM_SHARE = 0.9


@dataclass
class Estimate:
    name: str
    jobs: int
    seconds: float
    what: str
    start_s: float = 0.0  # of ``seconds``: process starts, set-ups, caches, worker processes


def _override(overrides: list[str], key: str) -> str | None:
    for item in overrides:
        if item.startswith(f"{key}="):
            return item.split("=", 1)[1]
    return None


def _values(overrides: list[str], key: str, default: str) -> list[str]:
    return (_override(overrides, key) or default).split(",")


def loader_rate(loader: str, workers: str) -> float:
    """images/s of the loader alone at ``workers``."""
    if loader in PER_WORKER:
        share, cap = PER_WORKER[loader]
        return min(cap, share * max(1, int(workers)))
    return RATES[loader]


def _images(overrides: list[str]) -> int:
    """The images a job reads: train batches (capped by bench.max_batches) and val."""
    if _override(overrides, "model") == "none":
        batch = int(_override(overrides, "loader.batch_size") or BATCH)
        batches = TRAIN_IMAGES // batch
        cap = _override(overrides, "bench.max_batches")
        given = _override(overrides, "bench.epochs")
        epochs = int(given) if given not in (None, "", "auto") else 1  # auto: a pass at least
        return epochs * batch * (min(batches, int(cap)) if cap else batches)
    epochs = int(_override(overrides, "epochs") or 1)
    return epochs * (TRAIN_IMAGES // BATCH * BATCH + VAL_IMAGES)


def sweep_estimate(name: str, jobs: int, overrides: list[str], built: set[str]) -> Estimate:
    """One multirun's estimate; ``built`` holds the memmap caches earlier sweeps built."""
    if not name.startswith(KINDS):
        raise ValueError(f"sweep {name!r}: its name must start with one of {list(KINDS)}")
    loader = _override(overrides, "loader") or "torchvision"
    variants = _values(overrides, "loader.store", "raw") if loader == "memmap" else [""]
    if loader == "spdl":
        variants = [_override(overrides, "loader.decoder") or "turbo"]
    start = MULTIRUN_START_S + jobs * JOB_SETUP_S
    parts = [f"{jobs} x {JOB_SETUP_S:.0f} s set-up"]
    if _override(overrides, "model") != "none" and loader != "resident":
        start += jobs * CEILING_PASS_S
        parts.append(f"{jobs} x {CEILING_PASS_S:.1f} s ceiling pass")
    if loader == "torchvision":
        start += jobs * TORCHVISION_SPAWN_S
        parts.append(f"{jobs} x {TORCHVISION_SPAWN_S:.0f} s worker processes")
    if loader == "memmap":
        new = [s for s in variants if f"train:{s}" not in built]
        built.update(f"train:{s}" for s in new)
        start += len(new) * CACHE_BUILD_S
        if new:
            parts.append(f"{len(new)} cache build(s)")
    images, measuring = _images(overrides), 0.0
    for variant in variants:
        kind = f"{loader}-{variant}" if variant else loader
        for model in _values(overrides, "model", "none"):
            for workers in _values(overrides, "loader.num_workers", "8"):
                measuring += images / min(loader_rate(kind, workers), CEILINGS[model])
    parts.append(f"{images:,} images a job, {measuring:.0f} s in all")
    what = f"start {MULTIRUN_START_S:.0f} s + " + ", ".join(parts)
    return Estimate(name, jobs, start + measuring, what, start)


def read_plan(path: Path) -> list[Estimate]:
    """``gpu_check.sh``'s plan: ``phase NAME`` or ``sweep NAME JOBS OVERRIDES...``, tab
    separated, a line each, in the order they run."""
    estimates: list[Estimate] = []
    built: set[str] = set()
    for number, line in enumerate(path.read_text().splitlines(), 1):
        fields = line.split("\t")
        if fields[0] == "phase" and len(fields) >= 2:
            if fields[1] not in SETUP_S:
                raise ValueError(f"{path}:{number}: no estimate for phase {fields[1]!r}")
            seconds = SETUP_S[fields[1]]
            estimates.append(Estimate(fields[1], 0, seconds, "phase", seconds))
        elif fields[0] == "sweep" and len(fields) >= 3 and fields[2].isdigit():
            estimates.append(sweep_estimate(fields[1], int(fields[2]), fields[3:], built))
        elif line.strip():
            raise ValueError(f"{path}:{number}: not a plan line: {line!r}")
    return estimates


def projection_lines(estimates: list[Estimate], budget_s: float, reserve_s: float) -> list[str]:
    """The table, most valuable run first, with the running total, and the share of it that
    is start-up (processes, set-ups, caches, the phases) rather than measuring."""
    lines = [
        f"gpu_check: projected time on the GPU machine, in the order it runs (budget {budget_s:.0f}"
        f" s, {reserve_s:.0f} s of it kept for the report and the archive):",
        f"{'#':>3}  {'phase':<32} {'jobs':>4} {'est s':>6} {'total s':>8}  basis",
    ]
    total = 0.0
    for number, item in enumerate(estimates, 1):
        total += item.seconds
        jobs = str(item.jobs) if item.jobs else "-"
        lines.append(
            f"{number:>3}  {item.name:<32} {jobs:>4} {item.seconds:>6.0f} {total:>8.0f}  "
            f"{item.what}"
        )
    start = sum(item.start_s for item in estimates)
    lines.append(
        f"gpu_check: of the projected {total:.0f} s, {start:.0f} s is start-up (processes, "
        f"set-ups, caches, workers, the set-up phases and tests) and {total - start:.0f} s "
        "measuring; every job also runs bench.warmup_batches before its steady window"
    )
    return lines


def verdict(estimates: list[Estimate], budget_s: float, reserve_s: float) -> tuple[int, str]:
    """0 and a line when the projection fits with room; 1 and why not."""
    total = sum(item.seconds for item in estimates)
    usable = budget_s - reserve_s
    if total > usable:
        return 1, (
            f"gpu_check: FAILED: the projection ({total:.0f} s) exceeds the {usable:.0f} s the"
            f" runs have: the last phases would be cut; drop or shorten runs"
        )
    if total > ROOM_SHARE * usable:
        return 1, (
            f"gpu_check: WARNING: the projection ({total:.0f} s) leaves under"
            f" {100 * (1 - ROOM_SHARE):.0f}% of the {usable:.0f} s the runs have: no room"
        )
    return 0, (
        f"gpu_check: projection {total:.0f} s of the {usable:.0f} s the runs have"
        f" ({total / usable:.0%}): fits with {usable - total:.0f} s to spare"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.gpu_check.plan")
    parser.add_argument("plan", type=Path)
    parser.add_argument("--budget", type=float, required=True)
    parser.add_argument("--reserve", type=float, default=0.0)
    args = parser.parse_args(argv)
    try:
        estimates = read_plan(args.plan)
    except (OSError, ValueError, KeyError) as error:
        print(f"gpu_check: cannot project the plan: {error}", file=sys.stderr)
        return 2
    for line in projection_lines(estimates, args.budget, args.reserve):
        print(line)
    code, line = verdict(estimates, args.budget, args.reserve)
    print(line, file=sys.stderr if code else sys.stdout)
    return code


if __name__ == "__main__":
    sys.exit(main())
