"""The report's "How many cores feed my GPUs?" section, from the CPU cost per image measured.

A pipeline whose process tree spends ``c`` CPU seconds on an image needs ``rate x c`` cores to
keep one GPU that consumes ``rate`` images/s fed (CPU seconds per second are cores). A node of
``gpus`` GPUs and ``cores`` cores keeps every GPU fed where ``gpus x rate x c <= cores``, with
the rest to spare; otherwise its cores feed ``cores / (gpus x rate x c)`` of the GPU rate.

The per-GPU rate, first found first: a GPU run's own model rate (``--gpu-metrics``: its
metrics.json), else ``--gpu-rate``, else ``DEFAULT_GPU_RATE``, a published ResNet-50 training
rate. The renderer's own ``--gpu-rate`` / ``--gpu-metrics`` / ``--gpus`` / ``--cores`` replace
what report.json stored, so a user re-draws the answer for their GPU and node without measuring.
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import dataclass
from pathlib import Path

from loaderbench.measure.metrics import (
    CPU_S_PER_1K_IMAGES,
    DATA_WAIT_FRAC,
    IMAGES_PER_S,
)
from loaderbench.platform.tables import markdown_table
from tools.bench.columns import cell
from tools.bench.schema import NODE_CORES, NODE_GPUS, GpuModelRate, Report, Row

# NVIDIA DeepLearningExamples, ResNet50 v1.5 for PyTorch, "Training performance: NVIDIA DGX A100
# (8x A100 80GB)" (pytorch-21.03 NGC container): mixed precision, 1 GPU 2,470 images/s; 8 GPUs
# 16,621 images/s (2,078 a GPU). The one-GPU figure: what a GPU consumes when nothing else
# holds it back, so the cores it asks for are not understated.
DEFAULT_GPU_RATE = 2470.0
DEFAULT_RATE_SOURCE = (
    "ResNet-50 v1.5 training in mixed precision on one A100 80GB, as NVIDIA publishes it "
    "(DeepLearningExamples, PyTorch/Classification/ConvNets/resnet50v1.5/README.md, "
    '"Training performance: NVIDIA DGX A100 (8x A100 80GB)": 2,470 images/s on 1 GPU, 16,621 '
    "on 8 = 2,078 a GPU; "
    "https://github.com/NVIDIA/DeepLearningExamples/tree/master/PyTorch/Classification/"
    "ConvNets/resnet50v1.5#training-performance-results); no GPU run measured a rate for this "
    "report and none was given with `--gpu-rate`"
)
# Tolerance of the fed / not-fed comparison (a node needing exactly its cores is fed).
_EPS = 1e-9


@dataclass(frozen=True)
class GpuRate:
    """The images/s one GPU consumes, and where the figure comes from (said in the report)."""

    images_per_s: float
    source: str


@dataclass(frozen=True)
class CoresRow:
    """One pipeline (a loader's or a peer's, at the most workers it was measured with) fitted
    to the node."""

    pipeline: str
    name: str
    workers: int | None
    cpu_s_per_1k_images: float
    cores_per_gpu: float
    node_gpus: int
    node_cores: int
    bound: str  # its first declared bound ("" where none)

    @property
    def cores_needed(self) -> float:
        return self.node_gpus * self.cores_per_gpu

    @property
    def fed(self) -> bool:
        return self.cores_needed <= self.node_cores + _EPS

    @property
    def spare(self) -> float:
        return self.node_cores - self.cores_needed

    @property
    def share_fed(self) -> float:
        """The share of the GPU rate the node's cores feed (1.0: every GPU fed)."""
        return min(1.0, self.node_cores / self.cores_needed) if self.cores_needed else 1.0

    @property
    def gpus_fed(self) -> int:
        """GPUs at the full rate that the node's cores keep fed."""
        if not self.cores_per_gpu:
            return 0
        return math.floor(self.node_cores / self.cores_per_gpu + _EPS)


def gpu_rate(report: Report) -> GpuRate:
    """The per-GPU rate the section answers for: a GPU run's own model rate, else the
    ``--gpu-rate`` given, else the published ResNet-50 rate."""
    if report.gpu_model_rate is not None:
        model = report.gpu_model_rate
        return GpuRate(model.images_per_s, f"a GPU run's own model rate: {model.source}")
    if report.options.gpu_rate:
        return GpuRate(report.options.gpu_rate, "given with `--gpu-rate` (not measured here)")
    return GpuRate(DEFAULT_GPU_RATE, DEFAULT_RATE_SOURCE)


def costed_rows(rows: list[Row]) -> list[Row]:
    """Per (pipeline, name), the row measured at the most workers (the nearest to a node's many
    workers, their own overhead included) among those with a measured CPU cost."""
    chosen: dict[tuple[str, str], Row] = {}
    for row in rows:
        if not row.cpu_s_per_1k_images:
            continue
        held = chosen.get((row.pipeline, row.name))
        if held is None or (row.workers or 0) > (held.workers or 0):
            chosen[(row.pipeline, row.name)] = row
    return list(chosen.values())


def cores_rows(report: Report, rate: GpuRate) -> list[CoresRow]:
    """Every costed pipeline fitted to the node: train first (the rate is a training rate),
    then val; in each, the fewest cores per GPU first."""
    opts = report.options
    fitted = [
        CoresRow(
            pipeline=row.pipeline,
            name=row.name,
            workers=row.workers,
            cpu_s_per_1k_images=row.cpu_s_per_1k_images or 0.0,
            cores_per_gpu=rate.images_per_s * (row.cpu_s_per_1k_images or 0.0) / 1000.0,
            node_gpus=opts.node_gpus,
            node_cores=opts.node_cores,
            bound=row.bounds[0] if row.bounds else "",
        )
        for row in costed_rows(report.rows)
    ]
    return sorted(fitted, key=lambda r: (r.pipeline != "train", r.cores_per_gpu, r.name))


def method_lines(report: Report, rate: GpuRate, fitted: list[CoresRow]) -> list[str]:
    """Where the rate comes from, what is computed, and what it assumes."""
    opts = report.options
    lines = [
        f"Per-GPU rate: {rate.images_per_s:,.0f} images/s, {rate.source}. Node: "
        f"{opts.node_gpus} GPUs and {opts.node_cores} cores (`--gpus`, `--cores`; "
        '`make report ARGS="--gpu-rate R --gpus G --cores C"` re-draws this for yours without '
        "measuring).",
        "",
        "Cores per GPU = the per-GPU rate x the CPU seconds an image costs the pipeline's whole "
        "process tree (its row at the most workers measured). The node keeps every GPU fed "
        "where GPUs x cores per GPU fit in its cores; otherwise its cores feed that share of "
        "the GPU rate. It assumes the CPU cost per image stays as measured here when a pipeline "
        f"runs on more cores, on cores as fast as this machine's ({report.machine.arch}); the "
        "rate is a training rate, and the val rows are held to it too (evaluation runs faster "
        "on a GPU, so they need more cores than shown).",
    ]
    copy_bound = sorted({f"{r.pipeline}: {r.name}" for r in fitted if r.bound == "copy"})
    if copy_bound:
        need = opts.node_gpus * rate.images_per_s * report.image_bytes
        lines[-1] += (
            f" The readers bound by memory copy ({', '.join(copy_bound)}) may be held by the "
            f"node's memory bandwidth rather than its cores: {opts.node_gpus} GPUs at this rate "
            f"draw {need / 1e9:,.2f} GB/s of {report.image_bytes:,}-byte images, against "
            f"{report.memory_copy_bytes_per_s / 1e9:,.2f} GB/s copied on this machine's "
            f"{report.machine.cores} cores; a node's bandwidth is shared by all its cores."
        )
    return lines


def table_lines(fitted: list[CoresRow], gpus: int, cores: int) -> list[str]:
    """One line a pipeline."""
    headers = [
        "pipeline",
        "loader",
        "workers",
        "CPU s / 1k images",
        "cores per GPU",
        f"cores for {gpus} GPUs",
        f"every GPU fed on {cores} cores",
        "cores to spare",
        "share of the GPU rate fed",
        f"GPUs {cores} cores could feed at the full rate",
    ]
    cells = [
        [
            row.pipeline,
            row.name,
            str(row.workers),
            cell(CPU_S_PER_1K_IMAGES, row.cpu_s_per_1k_images),
            f"{row.cores_per_gpu:,.2f}",
            f"{row.cores_needed:,.1f}",
            "yes" if row.fed else "no",
            f"{row.spare:,.1f}" if row.fed else "-",
            f"{100 * row.share_fed:.0f}%",
            f"{row.gpus_fed:,}",
        ]
        for row in fitted
    ]
    return markdown_table(headers, cells).splitlines()


def answer_lines(fitted: list[CoresRow], rate: GpuRate, gpus: int, cores: int) -> list[str]:
    """Per pipeline: how many keep every GPU fed, which with the most cores to spare, and the
    share of the GPU rate each of the others feeds."""
    lines = []
    for task in ("train", "val"):
        rows = [r for r in fitted if r.pipeline == task]
        if not rows:
            continue
        fed = [r for r in rows if r.fed]
        line = (
            f"- **{task}**: {len(fed)} of {len(rows)} pipelines keep {gpus} GPUs fed on "
            f"{cores} cores"
        )
        if fed:
            most, fewest = max(fed, key=lambda r: r.spare), min(fed, key=lambda r: r.spare)
            line += f"; the most to spare: {most.name} ({most.spare:,.1f} cores)"
            if fewest is not most:
                line += f", the fewest: {fewest.name} ({fewest.spare:,.1f})"
        starved = [
            f"{r.name} ({100 * r.share_fed:.0f}% of the GPU rate: "
            f"{r.share_fed * rate.images_per_s:,.0f} images/s a GPU)"
            for r in rows
            if not r.fed
        ]
        if starved:
            line += f"; not fed: {', '.join(starved)}"
        lines.append(line + ".")
    return lines


@dataclass(frozen=True)
class CoresAnswer:
    """The section's figures: the per-GPU rate and every costed pipeline fitted to the node
    (what the table and the plot draw)."""

    rate: GpuRate
    rows: list[CoresRow]


def cores_answer(report: Report) -> CoresAnswer:
    rate = gpu_rate(report)
    return CoresAnswer(rate, cores_rows(report, rate))


def cores_lines(report: Report) -> list[str]:
    """The section's markdown lines (none where no row has a measured CPU cost)."""
    answer = cores_answer(report)
    rate, fitted = answer.rate, answer.rows
    if not fitted:
        return []
    gpus, cores = report.options.node_gpus, report.options.node_cores
    return [
        "",
        "## How many cores feed my GPUs?",
        "",
        *answer_lines(fitted, rate, gpus, cores),
        "",
        *method_lines(report, rate, fitted),
        "",
        *table_lines(fitted, gpus, cores),
    ]


def model_rate_from_metrics(path: Path) -> GpuModelRate:
    """The per-GPU model rate of the GPU run that wrote metrics.json ``path``: its images/s
    (summed over ranks) over its ranks, with its data wait taken out, so a run the loader held
    back still gives its model's rate (an upper estimate: the GPU may compute during part of a
    wait). A file that is not a finished GPU run with a model is refused, naming it."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise ValueError(f"--gpu-metrics {path}: {error}") from None
    device, model = str(data.get("device") or ""), data.get("model")
    if not device.startswith("cuda"):
        raise ValueError(f"--gpu-metrics {path}: device is {device!r}, not a GPU run (cuda)")
    if model in (None, "none"):
        raise ValueError(f"--gpu-metrics {path}: model is {model!r}: it measured no model")
    if data.get("status", "ok") != "ok":
        raise ValueError(f"--gpu-metrics {path}: status is {data['status']!r}, not ok")
    images_per_s = data.get(IMAGES_PER_S)
    wait = data.get(DATA_WAIT_FRAC) or 0.0
    if not images_per_s or not 0.0 <= wait < 1.0:
        raise ValueError(
            f"--gpu-metrics {path}: images_per_s {images_per_s!r} and data_wait_frac "
            f"{wait!r} give no rate"
        )
    # The job's ranks (one GPU each); a metrics.json older than ``world_size``: its rank lists.
    ranks = int(data.get("world_size") or len(data.get("rank_images_per_s") or [None]))
    per_gpu = images_per_s / ranks / (1.0 - wait)
    return GpuModelRate(
        per_gpu,
        f"model={model} on {device} ({path}: {images_per_s:,.0f} images/s on {ranks} GPU(s), "
        f"its data wait of {100 * wait:.1f}% taken out)",
    )


def add_gpu_options(parser: argparse.ArgumentParser, defaults: bool) -> None:
    """``--gpu-rate``, ``--gpu-metrics``, ``--gpus``, ``--cores``; without ``defaults`` (the
    renderer) an option not given keeps what report.json stored."""
    parser.add_argument(
        "--gpu-rate",
        type=float,
        default=None,
        help="images/s one GPU consumes (e.g. your model's step rate); default: a GPU run's own "
        f"model rate, else {DEFAULT_GPU_RATE:,.0f} (ResNet-50, one A100, mixed precision)",
    )
    parser.add_argument(
        "--gpu-metrics",
        type=Path,
        default=None,
        help="metrics.json of a device=cuda run with a model: its per-GPU rate, used first",
    )
    parser.add_argument(
        "--gpus", type=int, default=NODE_GPUS if defaults else None, help="GPUs in a node"
    )
    parser.add_argument(
        "--cores", type=int, default=NODE_CORES if defaults else None, help="cores in a node"
    )


def checked_gpu_options(
    parser: argparse.ArgumentParser, args: argparse.Namespace
) -> GpuModelRate | None:
    """The numbers given checked (above 0, else a parser error naming the flag), and the model
    rate of ``--gpu-metrics`` where given (read now: a bad file is refused before measuring)."""
    for flag, value in (
        ("--gpu-rate", args.gpu_rate),
        ("--gpus", args.gpus),
        ("--cores", args.cores),
    ):
        if value is not None and value <= 0:
            parser.error(f"{flag} {value}: must be above 0")
    if args.gpu_metrics is None:
        return None
    try:
        return model_rate_from_metrics(args.gpu_metrics)
    except ValueError as error:
        parser.error(str(error))


def apply_gpu_options(
    parser: argparse.ArgumentParser, args: argparse.Namespace, report: Report
) -> None:
    """The renderer's options into ``report`` (its options and its model rate); an option not
    given (None) leaves what report.json stored. A ``--gpu-rate`` given replaces a stored model
    rate (another GPU's); a ``--gpu-metrics`` given comes first, as at measuring."""
    model_rate = checked_gpu_options(parser, args)
    opts = report.options
    if args.gpu_rate is not None:
        opts.gpu_rate, report.gpu_model_rate = args.gpu_rate, None
    opts.node_gpus = args.gpus if args.gpus is not None else opts.node_gpus
    opts.node_cores = args.cores if args.cores is not None else opts.node_cores
    if model_rate is not None:
        report.gpu_model_rate = model_rate
