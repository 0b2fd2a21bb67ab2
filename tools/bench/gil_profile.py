"""GIL-held milliseconds per 1,000 images, by thread: ``make profile ARGS='--gil ...'``.

py-spy samples only the thread holding the GIL (``py-spy record --gil``). The same command runs
twice, for ``--gil-epochs`` A and B epochs, and the steady part is their difference:

    GIL ms per 1,000 images = (samples_B - samples_A) / rate / (images_B - images_A) * 1e6

so start-up, the first batches' one-off costs and the end of the run cancel out. Threads are
grouped as the loader's (by name prefix), the training loop's and the rest. docs/gil.md gives
the method's limits.
"""

from __future__ import annotations

import argparse
import json
import subprocess
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from loaderbench.measure.metrics import IMAGES_PER_S
from loaderbench.platform.tables import markdown_table
from tools.bench import py_spy

# The loader's threads, by name prefix: spdl's decoding pool and SPDL's own event loop and
# source threads; memmap's reading threads.
LOADER_THREADS = ("loaderbench_spdl_decode", "spdl_", "memmap-loader")
MAIN_THREAD = "MainThread"
# The training loop: the main thread inside the engine's loops (train, evaluate, consume);
# its samples elsewhere (start-up, checkpoints, the report) are not the loop's.
LOOP_FILE = "loaderbench/training/loops.py"
GROUPS = ("loader", "main", "other")


def thread_group(
    name: str, stack: str, loader_threads: Sequence[str] = LOADER_THREADS
) -> str | None:
    """``loader``, ``main`` (the training loop's), ``other``, or None (the main thread outside
    the loop), for a py-spy sample's thread name and stack."""
    if any(name.startswith(prefix) for prefix in loader_threads):
        return "loader"
    if name == MAIN_THREAD:
        return "main" if LOOP_FILE in stack else None
    return "other"


def group_samples(
    lines: Iterable[str], loader_threads: Sequence[str] = LOADER_THREADS
) -> Counter[str]:
    """Samples per thread group from py-spy's raw (collapsed) output, ``--threads`` on:
    ``thread (tid): name;frame;...;frame count`` a line."""
    counts: Counter[str] = Counter()
    for line in lines:
        stack, _, count_text = line.rstrip("\n").rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        head = stack.split(";", 1)[0]
        name = head.split(": ", 1)[1] if ": " in head else MAIN_THREAD
        group = thread_group(name, stack, loader_threads)
        if group is not None:
            counts[group] += int(count_text)
    return counts


@dataclass(frozen=True)
class GilRun:
    """One profiled run: its samples by group and the images its main loop took."""

    samples: Counter[str]
    images: int
    images_per_s: float | None


def ms_per_1k(short: GilRun, long: GilRun, rate: int) -> dict[str, float]:
    """GIL-held ms per 1,000 images by group, from the difference of two runs."""
    images = long.images - short.images
    if images <= 0:
        raise ValueError(f"the longer run took {long.images} images, the shorter {short.images}")
    return {
        group: max(0.0, long.samples[group] - short.samples[group]) / rate / images * 1e6
        for group in GROUPS
    }


def record(args: argparse.Namespace, epochs: int, run_command: object) -> GilRun:
    """A profiled run of ``epochs`` epochs; its raw samples in ``gil-<epochs>.txt``."""
    folder = f"gil-{epochs}"
    raw = args.out / f"{folder}.txt"
    run = run_command(args, folder, f"bench.epochs={epochs}")  # type: ignore[operator]
    spy = [py_spy.executable(), "record", "--gil", "--threads", "-r", str(args.rate), "-f", "raw"]
    command = [*spy, "-o", str(raw), "--", *run]
    print("+", " ".join(command), flush=True)
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    metrics = json.loads((args.out / folder / "metrics.json").read_text())
    with open(raw) as f:
        samples = group_samples(f, args.loader_threads)
    return GilRun(samples, int(metrics["images"]), metrics.get(IMAGES_PER_S))


def render(result: dict[str, float], runs: Sequence[GilRun], args: argparse.Namespace) -> str:
    lines = [
        f"# GIL-held ms per 1,000 images: {' '.join(args.overrides)}",
        "",
        f"py-spy --gil at {args.rate} Hz; the difference of {args.gil_epochs[0]} and "
        f"{args.gil_epochs[1]} epochs ({runs[1].images - runs[0].images} images).",
        "",
        markdown_table(
            ["threads", "GIL ms per 1,000 images"],
            [[group, f"{result[group]:.1f}"] for group in GROUPS],
            align=["left", "right"],
        ),
    ]
    rates = ", ".join(f"{run.images_per_s or 0:.0f}" for run in runs)
    return "\n".join([*lines, "", f"images/s of the runs (under py-spy): {rates}", ""])


def measure(args: argparse.Namespace, run_command: object) -> dict[str, float]:
    """Both runs, the figures written to ``gil.md`` and ``gil.json`` in ``args.out``."""
    short, long = (record(args, epochs, run_command) for epochs in args.gil_epochs)
    result = ms_per_1k(short, long, args.rate)
    text = render(result, (short, long), args)
    (args.out / "gil.md").write_text(text)
    (args.out / "gil.json").write_text(json.dumps({"gil_ms_per_1k_images": result}) + "\n")
    print(text)
    return result


def epochs_pair(text: str) -> tuple[int, int]:
    """``--gil-epochs A,B``: two epoch counts, A < B."""
    short, long = (int(part) for part in text.split(","))
    if not 1 <= short < long:
        raise argparse.ArgumentTypeError(f"--gil-epochs {text}: need 1 <= A < B")
    return short, long


__all__ = ["GROUPS", "LOADER_THREADS", "GilRun", "group_samples", "measure", "ms_per_1k"]
