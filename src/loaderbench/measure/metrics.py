"""Every run metric declared once: its key, what it means, how ranks combine it, where it shows.

The meters compute a metric; everything after that reads its declaration here: the reduction
over data-parallel ranks (``combine_over_ranks``), the sweep summary's columns and charts, the
W&B summary rule of its per-epoch curve, and its format in tables. A new metric is a meter plus
one ``Metric`` line below (docs/metrics.md says what each one means to a user).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

# The metrics other modules read or write: named here, once, and imported there by these names
# (tests/test_metrics.py holds every metric's name to at most three modules).
IMAGES_PER_S = "images_per_s"
DECODED_BY = "decoded_by"
CPU_S_PER_1K_IMAGES = "cpu_s_per_1k_images"
DATA_WAIT_FRAC = "data_wait_frac"
TOP1 = "top1"
SKIPPED_FILES = "skipped_files"
PEAK_RSS_MB = "peak_rss_mb"
GLOBAL_BATCH = "global_batch"  # also the checkpoint's field of the same number
CEILING_FRAC = "ceiling_frac"
CEILING_IMAGES_PER_S = "ceiling_images_per_s"
NULL_REASON = "images_per_s_null_reason"
SPREAD = "images_per_s_spread"
SLOWEST_RANK_WAIT = "slowest_rank_data_wait_frac"
TTFB_S = "ttfb_s"
GIL_FRAC = "gil_frac"

OverRanks = Literal["sum", "max", "mean", "derived", "same"]


@dataclass(frozen=True)
class Metric:
    """One metric of a run.

    ``over_ranks``: ``sum`` (rates and counts add up), ``max`` (the slowest rank decides),
    ``mean`` (a share or a time per rank), ``derived`` (computed again from the combined
    metrics by ``derive``), ``same`` (every rank holds the same value: what ran, accuracy).
    ``summary``: a column of the sweep summary. ``chart``: its label where the sweep summary and
    W&B chart it. ``epoch_summary``: the W&B summary rule of its ``epoch/<key>`` curve.
    ``per_rank``: each rank's own
    value is kept too, in the list ``rank_<key>`` (the slowest rank is the one that waited
    longest for data: ``slowest_rank``).
    """

    key: str
    meaning: str
    over_ranks: OverRanks = "same"
    summary: bool = False
    chart: str | None = None
    epoch_summary: str | None = None
    derive: Callable[[Mapping[str, Any]], Any] | None = None
    per_rank: bool = False  # also kept by rank, as ``rank_<key>`` (data-parallel runs)
    # Drawn per epoch in W&B, as ``epoch/<key>`` (train.py's epoch rows: ``epoch_curves``).
    epoch_curve: bool = False


def _per_1k(metrics: Mapping[str, Any]) -> float | None:
    images = metrics.get("images")
    return 1000 * metrics["cpu_s"] / images if images else None


def ceiling_fraction(images_per_s: float | None, ceiling: float | None) -> float | None:
    """``ceiling_frac``: images/s over the ceiling's (None where either is missing)."""
    return images_per_s / ceiling if images_per_s is not None and ceiling else None


def _ceiling_frac(metrics: Mapping[str, Any]) -> float | None:
    return ceiling_fraction(metrics.get("images_per_s"), metrics.get("ceiling_images_per_s"))


METRICS: tuple[Metric, ...] = (
    Metric("status", "ok, failed, or running (the run has not ended)", summary=True),
    Metric("loader", "the loader's name", summary=True),
    Metric(
        "model",
        "the model's name (none: the loader alone)",
        summary=True,
    ),
    Metric("device", "the device the batches land on", summary=True),
    Metric("batch_size", "images a batch, per rank", summary=True),
    Metric("num_workers", "the worker count the run used", summary=True),
    Metric("autotune_s", "num_workers=auto: the probe's seconds", summary=True),
    Metric("images", "images the main loop processed", "sum", summary=True),
    Metric(
        "images_per_s",
        "steady-state images/s of the main loop, past warm-up and the loader's head start",
        "sum",
        summary=True,
        chart="images/s",
        epoch_summary="mean,last",
        per_rank=True,
        epoch_curve=True,
    ),
    Metric(
        "images_per_s_end_to_end",
        "images/s from the loop's start, start-up and the head start included",
        "sum",
        summary=True,
        epoch_summary="mean,last",
        epoch_curve=True,
    ),
    Metric(
        "images_per_s_null_reason",
        "why images_per_s is null (no steady window); absent or null where it is a rate",
        summary=True,
    ),
    Metric(
        "steady_batches",
        "batches images_per_s counts (0: none; rank 0's)",
        summary=True,
    ),
    Metric("steady_window_s", "seconds of that window (rank 0's)", summary=True),
    Metric(
        "images_per_s_spread",
        "the window's rate's own noise (docs/metrics.md)",
        "max",
        summary=True,
    ),
    Metric("passes", "passes over the data that measured the loop (bench.epochs)", summary=True),
    Metric(
        "ceiling_images_per_s",
        "loader=resident's images/s at the same model, image size, batch, precision and "
        "device: the model's own rate (the job's resident pass, or the sweep's resident job)",
        "sum",
        summary=True,
    ),
    Metric(
        "ceiling_frac",
        "images_per_s over ceiling_images_per_s (null where either is; then see "
        "ceiling_frac_null_reason)",
        "derived",
        summary=True,
        derive=_ceiling_frac,
    ),
    Metric("ceiling_frac_null_reason", "why ceiling_frac is null", summary=True),
    Metric(
        "ceiling_from",
        "where the ceiling came from: the job's resident pass, the job itself "
        "(loader=resident), or the sweep's resident job",
        summary=True,
    ),
    Metric(
        "ttfb_s",
        "seconds from the loop's start to the first batch",
        "max",
        summary=True,
    ),
    Metric(
        "startup_s",
        "seconds from the process's start to its first loop (with ttfb_s: the first batch's wait)",
        "max",
    ),
    Metric(
        "data_wait_frac",
        "share of the loop's wall time spent waiting for the next batch (mean over ranks)",
        "mean",
        summary=True,
        chart="data wait (share of the loop)",
        per_rank=True,
        epoch_curve=True,
    ),
    Metric(
        SLOWEST_RANK_WAIT,
        "data-parallel runs: the data wait of the rank that waited longest (``slowest_rank``)",
        summary=True,
    ),
    Metric(
        "gil_frac",
        "share of the steady loop's wall time the GIL was held (an in-process probe; docs/gil.md)",
        "mean",
        summary=True,
    ),
    Metric("loop_s", "the main loop's wall seconds (mean over ranks)", "mean"),
    Metric("cpu_s", "CPU seconds of the process trees in the loop", "sum"),
    Metric(
        "cpu_s_per_1k_images",
        "CPU seconds of the process tree (workers included) per 1000 images",
        "derived",
        summary=True,
        chart="CPU s per 1000 images",
        derive=_per_1k,
        per_rank=True,
    ),
    Metric(
        "slowest_rank",
        "data-parallel runs: the rank that waited longest for data (its loader is the slowest)",
        summary=True,
    ),
    Metric("batches", "the auto-tuning probe: batches a count measured", "sum"),
    Metric("seconds", "the auto-tuning probe: a count's whole rung, the slowest rank's", "max"),
    Metric(
        "peak_rss_mb",
        "peak resident memory of the process trees (so far, at an epoch's end)",
        "sum",
        summary=True,
        per_rank=True,
    ),
    # Each rank's own only (``rank_cpus``): what its loader could use, beside its data wait.
    Metric("cpus", "the CPUs a rank may use (runtime.cpus_allowed)", per_rank=True),
    Metric(
        "skipped_files",
        "unreadable image files skipped (``rank_skipped_files``: each rank's own)",
        summary=True,
        per_rank=True,
    ),
    Metric(
        "dataset_index_check",
        "how the saved dataset index was found current: files (every file's size and mtime), "
        "folders (dataset.index_check=folders: their mtimes only), scan (scanned in this run)",
    ),
    Metric(
        "dataset_files_changed",
        "files the dataset index's check found changed (rewritten in place); read anew",
    ),
    Metric("decoded_by", "what decoded the images, per split", summary=True),
    Metric("top1", "validation top-1 accuracy (0 to 1)", summary=True),
    Metric("top5", "validation top-5 accuracy (0 to 1)", summary=True),
    Metric("loss", "mean training loss of the last epoch", summary=True),
    Metric("val_loss", "mean validation loss of the last epoch"),
    Metric("epochs", "epochs run", summary=True),
    Metric(GLOBAL_BATCH, "images a step over every rank (kept on a resume on M ranks)"),
    Metric(
        "epoch_samples",
        "train.py: distinct images trained on in each epoch, over every rank (a list by epoch)",
    ),
    Metric(
        "epoch_repeats",
        "train.py: images trained on more than once in each epoch (a list by epoch; 0)",
    ),
    Metric("wall_s", "wall seconds of the whole run", summary=True),
    Metric("error", "why the run failed", summary=True),
)
BY_KEY: dict[str, Metric] = {metric.key: metric for metric in METRICS}


def summary_keys() -> list[str]:
    """The sweep summary's metric columns, in declaration order."""
    return [metric.key for metric in METRICS if metric.summary]


def epoch_curves(rates: Mapping[str, Any]) -> dict[str, Any]:
    """The ``epoch/<key>`` values of an epoch's W&B row, from its loop metrics ``rates``."""
    return {f"epoch/{m.key}": rates.get(m.key) for m in METRICS if m.epoch_curve}


def rates_text(rates: Mapping[str, Any]) -> str:
    """A loop's rate and data wait in words (a log line), with the slowest rank's wait in a
    data-parallel run; a loop with no steady window says so (never a rate of 0)."""
    wait = 100 * (rates.get("data_wait_frac") or 0.0)
    rate = rates.get("images_per_s")
    said = "no steady window" if rate is None else f"{rate:.1f} images/s"
    text = f"{said}, data wait {wait:.1f}%"
    slowest = rates.get("slowest_rank")
    if slowest is None:
        return text
    return f"{text} (slowest rank {slowest}: {100 * rates['slowest_rank_data_wait_frac']:.1f}%)"


def loop_rates() -> list[str]:
    """The loop's rates, which a run that has none yet (stopped before its loop) holds as
    None: the metrics drawn per epoch."""
    return [metric.key for metric in METRICS if metric.epoch_curve]


def charted() -> dict[str, str]:
    """Metric key -> label, for the metrics the sweep summary and W&B chart."""
    return {metric.key: metric.chart for metric in METRICS if metric.chart}


def epoch_summaries() -> dict[str, str]:
    """``epoch/<key>`` -> W&B summary rule, for the per-epoch curves that have one."""
    return {f"epoch/{m.key}": m.epoch_summary for m in METRICS if m.epoch_summary}


def combine_over_ranks(
    metrics: Mapping[str, Any],
    rank: int,
    world_size: int,
    all_reduce: Callable[[list[float], str], list[float]],
) -> dict[str, Any]:
    """``metrics`` of this rank combined with every other rank's, each key by its declaration
    (keys not declared, and ``same`` ones, stay this rank's), plus the ``per_rank`` lists and
    ``slowest_rank``. ``all_reduce(values, op)`` is the collective (``op``: sum or max), called
    the same number of times in the same order on every rank."""
    out = dict(metrics)
    if world_size <= 1:
        return out
    declared = [m for m in METRICS if m.key in metrics]
    for metric in declared:  # this rank's own, before the combined value replaces it
        if metric.per_rank:
            out[f"rank_{metric.key}"] = metrics[metric.key]
    for op in ("sum", "max", "mean"):
        keys = [m.key for m in declared if m.over_ranks == op]
        if keys:
            # A value missing on a rank (a rate with no steady window) travels as NaN, which
            # every reduction keeps: the combined value is then missing too, never a partial sum.
            values = [_or_nan(metrics.get(key)) for key in keys]
            values = all_reduce(values, "sum" if op == "mean" else op)
            for key, value in zip(keys, values, strict=True):
                out[key] = None if value != value else value / world_size if op == "mean" else value
    for metric in declared:
        if metric.over_ranks == "derived" and metric.derive:
            out[metric.key] = metric.derive(out)
    _by_rank(out, [m.key for m in declared if m.per_rank], rank, world_size, all_reduce)
    if "images" in out:
        out["images"] = int(out["images"])
    return out


def _or_nan(value: Any) -> float:
    return float("nan") if value is None else float(value)


def _by_rank(
    out: dict[str, Any],
    keys: list[str],
    rank: int,
    world_size: int,
    all_reduce: Callable[[list[float], str], list[float]],
) -> None:
    """Each ``rank_<key>`` as a list by rank: every rank puts its value in its own slot of
    zeros, and one sum gathers them (a missing value travels as NaN)."""
    if not keys:
        return
    slots = [0.0] * (len(keys) * world_size)
    for i, key in enumerate(keys):
        value = out[f"rank_{key}"]
        slots[i * world_size + rank] = float("nan") if value is None else float(value)
    gathered = all_reduce(slots, "sum")
    for i, key in enumerate(keys):
        row = gathered[i * world_size : (i + 1) * world_size]
        whole = isinstance(out[f"rank_{key}"], int)  # counts stay counts (CPUs, files)
        out[f"rank_{key}"] = [None if v != v else int(v) if whole else v for v in row]
    waits = out.get("rank_data_wait_frac")
    if waits and all(w is not None for w in waits):
        slowest = max(range(world_size), key=lambda r: waits[r])
        out.update(slowest_rank=slowest, slowest_rank_data_wait_frac=waits[slowest])


def per_rank_keys() -> list[str]:
    """The metrics kept by rank (``rank_<key>``), in declaration order."""
    return [metric.key for metric in METRICS if metric.per_rank]


def rank_derived_keys() -> frozenset[str]:
    """The keys data-parallel runs add beside the catalog's: ``rank_<key>`` for each metric kept
    by rank, and their per-epoch lists ``epoch_rank_<key>`` and ``epoch_slowest_rank``."""
    by_rank = [f"rank_{key}" for key in per_rank_keys()]
    return frozenset(by_rank + [f"epoch_{key}" for key in [*by_rank, "slowest_rank"]])


def with_epoch_ranks(run: Mapping[str, Any], epoch: Mapping[str, Any]) -> dict[str, Any]:
    """The run's per-epoch rank lists with ``epoch``'s appended: ``epoch_rank_<key>`` (a list
    by rank for each epoch) for every ``rank_<key>`` the epoch's combined metrics hold, and
    ``epoch_slowest_rank``; nothing for a single process (whose metrics hold no rank lists)."""
    out: dict[str, Any] = {}
    for key in [f"rank_{key}" for key in per_rank_keys()] + ["slowest_rank"]:
        if key in epoch:
            out[f"epoch_{key}"] = [*run.get(f"epoch_{key}", []), epoch[key]]
    return out


def rank_rows(metrics: Mapping[str, Any]) -> list[dict[str, Any]]:
    """A row a rank (``rank`` and each metric kept by rank), from the ``rank_<key>`` lists
    of a data-parallel run's metrics; none for a single process."""
    lists = {key: metrics[f"rank_{key}"] for key in per_rank_keys() if f"rank_{key}" in metrics}
    ranks = max((len(values) for values in lists.values()), default=0)
    return [
        {"rank": r, **{k: v[r] if r < len(v) else None for k, v in lists.items()}}
        for r in range(ranks)
    ]


# A rank waits markedly more than the others where its data wait exceeds the others' median
# both by this share of the loop and by this factor (a rank at 3% beside 1% is noise).
MARKED_WAIT_MARGIN = 0.1
MARKED_WAIT_FACTOR = 1.5


def straggler_note(metrics: Mapping[str, Any]) -> str | None:
    """A line naming the rank that waited markedly more for data than the others (None where
    none did, or in a single process), and whether its CPUs (``rank_cpus``) or its unreadable
    files (``rank_skipped_files``) differ from the others': the usual causes, told apart."""
    waits = metrics.get("rank_data_wait_frac")
    if not waits or len(waits) < 2 or any(w is None for w in waits):
        return None
    slowest = max(range(len(waits)), key=lambda r: waits[r])
    typical = statistics.median(w for r, w in enumerate(waits) if r != slowest)
    mine = waits[slowest]
    if mine < typical + MARKED_WAIT_MARGIN or mine < MARKED_WAIT_FACTOR * typical:
        return None
    line = (
        f"rank {slowest} waits markedly more for data than the others: {100 * mine:.1f}% of "
        f"its loop against {100 * typical:.1f}% (the others' median)"
    )
    differ = []
    for key, label in (("rank_cpus", "CPUs"), ("rank_skipped_files", "unreadable files")):
        values = metrics.get(key)
        if not values or len(values) != len(waits) or any(v is None for v in values):
            continue
        theirs = statistics.median(v for r, v in enumerate(values) if r != slowest)
        same = values[slowest] == theirs
        differ.append(not same)
        verdict = "the same" if same else "differ"
        line += f"; its {label} {values[slowest]:g} against {theirs:g}: {verdict}"
    if differ and not any(differ):
        line += " (look at its node: disk, network, other jobs)"
    return line
