"""The GPU check's projected time (``python -m tools.gpu_check.plan PLAN --budget S``): a row a
phase and a multirun, in the order they run, each with its estimate on the GPU machine, summed
against the budget.

``gpu_check.sh`` walks its plan once without running anything (every phase and sweep it would
start, with the sweep's overrides) and hands it here; the projection is printed before the
first run, by the dry run too (whose own runs are CPU stand-ins: the projection is always the
GPU plan's). No torch import: this runs in a fraction of a second.

The estimates come from the issue that sized the check (issue 29: today's check, 14 multiruns
of 30 jobs, took an estimated 300-400 s of runs and 150-200 s of set-up on the H200 machine):
a Hydra multirun's start (Python, torch, CUDA, the index) ~7 s, a job ~4-9 s by its task (18
batches of 256 at 224 px), a memmap cache's first build ~6 s, torchvision's worker processes
~3 s a job, ``num_workers=auto``'s probe its ``max_probe_s``. The report's phase table gives
each phase's real time: replace these with the first GPU run's figures.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

MULTIRUN_START_S = 7.0
JOB_S = {"train-model": 9.0, "train-none": 6.0, "eval-none": 4.0}
CACHE_BUILD_S = 6.0
TORCHVISION_JOB_S = 3.0
DEFAULT_PROBE_S = 40.0
SETUP_S = {
    "env-quick": 4.0,
    "kit": 25.0,
    "env": 15.0,
    "data": 40.0,
    "projection": 1.0,
    "tests": 45.0,
    "decode": 25.0,
}
# Above this share of the time left for the runs (budget less the reserve) the projection
# warns: the estimates are rough, and a slow machine start would cut the last runs.
ROOM_SHARE = 0.9


@dataclass
class Estimate:
    name: str
    jobs: int
    seconds: float
    what: str


def _override(overrides: list[str], key: str) -> str | None:
    for item in overrides:
        if item.startswith(f"{key}="):
            return item.split("=", 1)[1]
    return None


def sweep_estimate(name: str, jobs: int, overrides: list[str], built: set[str]) -> Estimate:
    """One multirun's estimate; ``built`` holds the memmap caches earlier sweeps built."""
    task = next((t for t in JOB_S if name.startswith(t)), None)
    if task is None:
        raise ValueError(f"sweep {name!r}: its name must start with one of {list(JOB_S)}")
    seconds = MULTIRUN_START_S + jobs * JOB_S[task]
    parts = [f"{jobs} x {JOB_S[task]:.0f} s"]
    loader = _override(overrides, "loader")
    if loader == "torchvision":
        seconds += jobs * TORCHVISION_JOB_S
        parts.append(f"{jobs} x {TORCHVISION_JOB_S:.0f} s worker processes")
    if loader == "memmap":
        split = "val" if task == "eval-none" else "train"
        stores = _override(overrides, "loader.val_store" if split == "val" else "loader.store")
        new = [s for s in (stores or "raw").split(",") if f"{split}:{s}" not in built]
        built.update(f"{split}:{s}" for s in new)
        if new:
            seconds += len(new) * CACHE_BUILD_S
            parts.append(f"{len(new)} cache build(s)")
    if _override(overrides, "loader.num_workers") == "auto":
        probe = float(_override(overrides, "loader.autotune.max_probe_s") or DEFAULT_PROBE_S)
        seconds += probe
        parts.append(f"probe {probe:.0f} s")
    return Estimate(name, jobs, seconds, f"start {MULTIRUN_START_S:.0f} s + " + ", ".join(parts))


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
            estimates.append(Estimate(fields[1], 0, SETUP_S[fields[1]], "set-up"))
        elif fields[0] == "sweep" and len(fields) >= 3 and fields[2].isdigit():
            estimates.append(sweep_estimate(fields[1], int(fields[2]), fields[3:], built))
        elif line.strip():
            raise ValueError(f"{path}:{number}: not a plan line: {line!r}")
    return estimates


def projection_lines(estimates: list[Estimate], budget_s: float, reserve_s: float) -> list[str]:
    """The table, most valuable run first, with the running total."""
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
    except (OSError, ValueError) as error:
        print(f"gpu_check: cannot project the plan: {error}", file=sys.stderr)
        return 2
    for line in projection_lines(estimates, args.budget, args.reserve):
        print(line)
    code, line = verdict(estimates, args.budget, args.reserve)
    print(line, file=sys.stderr if code else sys.stdout)
    return code


if __name__ == "__main__":
    sys.exit(main())
