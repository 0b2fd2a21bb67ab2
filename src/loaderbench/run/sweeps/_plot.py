"""summary.png: images/s against the swept key, a line a loader (with its ceiling, where the
jobs had a model), CPU ms an image and data wait below, and every job without a rate or that
failed named at the foot, with why."""

from __future__ import annotations

import textwrap
from pathlib import Path

from loaderbench.measure.metrics import (
    CEILING_IMAGES_PER_S,
    CPU_S_PER_1K_IMAGES,
    DATA_WAIT_FRAC,
    NULL_REASON,
    SPREAD,
)
from loaderbench.run.sweeps._identity import job_name
from loaderbench.run.sweeps._ranking import Ranking, is_loader_key, rate

NOTE_WIDTH = 110  # characters a line of the foot's notes


def numeric(value: object) -> float | None:
    try:
        return float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None


def x_axis(keys: list[str], rows: list[dict]) -> tuple[str | None, list[str]]:
    """The numeric swept key the x axis takes (None: one point a job), and the other swept
    keys that, with the loader, name a line."""
    others = [k for k in keys if not is_loader_key(k)]
    x_key = next((k for k in others if all(numeric(r.get(k)) is not None for r in rows)), None)
    return x_key, [k for k in others if k != x_key]


def series_name(row: dict, keys: list[str]) -> str:
    """A line: the loader, and the row's values of ``keys``."""
    extra = job_name([f"{k}={row.get(k)}" for k in keys], keys)
    return f"{row.get('loader')}{f' ({extra})' if extra else ''}"


def foot_notes(ranking: Ranking) -> list[tuple[str, str]]:
    """(text, colour) lines: each job without a rate and why, each failed job and its error."""
    notes = []
    for row, what, key, colour in [
        *((r, "no rate", NULL_REASON, "darkorange") for r in ranking.unrated),
        *((r, "failed", "error", "red") for r in ranking.failed),
        *((r, "did not finish", "error", "grey") for r in ranking.stopped),
    ]:
        name = job_name([f"{k}={row.get(k)}" for k in ranking.keys], ranking.keys)
        text = f"job {row.get('job')} ({name or '-'}) {what}: {row.get(key) or row.get('status')}"
        notes += [(line, colour) for line in textwrap.wrap(text, NOTE_WIDTH)[:3]]
    return notes


def plot_summary(path: Path, ranking: Ranking) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = ranking.ranked
    x_key, series_keys = x_axis(ranking.keys, rows)
    notes = foot_notes(ranking)
    fig, (top, bottom) = plt.subplots(
        2, 1, figsize=(9, 7 + 0.22 * len(notes)), sharex=True, height_ratios=(3, 2)
    )
    wait_axis = bottom.twinx()
    lines: dict[str, list[dict]] = {}
    for row in rows:
        lines.setdefault(series_name(row, series_keys), []).append(row)
    labels = [str(r["job"]) for r in rows]
    for label, members in sorted(lines.items()):
        if x_key is not None:
            members = sorted(members, key=lambda r: numeric(r[x_key]) or 0.0)
            xs = [numeric(r[x_key]) for r in members]
        else:
            xs = [labels.index(str(r["job"])) for r in members]
        rates = [rate(r) for r in members]
        errors = [(r.get(SPREAD) or 0.0) * (rate(r) or 0.0) for r in members]
        drawn = top.errorbar(xs, rates, yerr=errors, marker="o", capsize=3, label=label)
        colour = drawn.lines[0].get_color()
        ceilings = [numeric(r.get(CEILING_IMAGES_PER_S)) for r in members]
        if any(c is not None for c in ceilings):
            top.plot(xs, ceilings, linestyle="--", color=colour, label=f"{label}: ceiling")
        cpu = [numeric(r.get(CPU_S_PER_1K_IMAGES)) for r in members]
        bottom.plot(xs, cpu, marker="o", color=colour)
        waits = [numeric(r.get(DATA_WAIT_FRAC)) for r in members]
        wait_axis.plot(xs, waits, marker="x", linestyle=":", color=colour)
    _axes(top, bottom, wait_axis, ranking, x_key, labels)
    for i, (text, colour) in enumerate(notes):
        fig.text(
            0.01,
            0.01 + 0.22 * (len(notes) - 1 - i) / fig.get_figheight(),
            text,
            color=colour,
            fontsize=8,
        )
    fig.tight_layout(rect=(0, 0.3 * len(notes) / fig.get_figheight(), 1, 1))
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _axes(top, bottom, wait_axis, ranking: Ranking, x_key: str | None, labels: list[str]) -> None:
    rates = [rate(r) or 0.0 for r in ranking.ranked]
    if rates and min(rates) > 0 and max(rates) > 20 * min(rates):  # orders of magnitude apart
        top.set_yscale("log")
        top.set_ylabel("images / s (log)")
    else:
        top.set_ylabel("images / s")
        top.set_ylim(bottom=0)
    jobs = len(ranking.rows)
    top.set_title(
        f"sweep over {', '.join(ranking.keys) or 'jobs'}: {len(ranking.ranked)} of {jobs} "
        "jobs with a rate"
    )
    top.grid(alpha=0.3)
    if ranking.ranked:
        top.legend(title="loader (bars: spread; dashed: ceiling)", fontsize=8)
    bottom.set_ylabel("CPU ms / image (solid)")
    bottom.set_ylim(bottom=0)
    wait_axis.set_ylabel("data wait (dotted)")
    wait_axis.set_ylim(0, 1.05)
    bottom.grid(alpha=0.3)
    if x_key is not None:
        bottom.set_xlabel(x_key)
    else:
        names = {
            str(r["job"]): job_name([f"{k}={r.get(k)}" for k in ranking.keys], ranking.keys)
            for r in ranking.ranked
        }
        ticks = [names.get(n) or f"job {n}" for n in labels]
        bottom.set_xticks(range(len(labels)), ticks, rotation=20, ha="right")
