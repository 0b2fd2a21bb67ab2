"""summary.md and summary.csv: the ranking read at a glance, and every column kept.

summary.md leads with what answers the sweep's question (the swept keys, images/s and its
spread, the lead over the next job, ``ceiling_frac`` where there is a model, CPU ms an image,
data wait, top-1 where it applies), then the jobs without a rate and why, the failed ones and
their errors, and the worker count to use where the workers were swept. summary.csv keeps every
metric of every job.
"""

from __future__ import annotations

import csv
from collections.abc import Callable
from pathlib import Path

from loaderbench.measure.metrics import (
    CEILING_FRAC,
    CPU_S_PER_1K_IMAGES,
    DATA_WAIT_FRAC,
    IMAGES_PER_S,
    NULL_REASON,
    PEAK_RSS_MB,
    SLOWEST_RANK_WAIT,
    SPREAD,
    TOP1,
)
from loaderbench.platform.tables import markdown_table
from loaderbench.run.sweeps._ranking import Ranking, WorkersChoice, rate

Column = tuple[str, str, Callable[[object], str]]  # key, heading, cell


def _number(digits: int) -> Callable[[object], str]:
    def cell(value: object) -> str:
        if not isinstance(value, int | float):
            return "" if value is None else str(value)
        return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.{digits}g}"

    return cell


def _share(value: object) -> str:
    return f"{100 * value:.0f}%" if isinstance(value, int | float) else ""


def _spread(value: object) -> str:
    return f"± {100 * value:.0f}%" if isinstance(value, int | float) else ""


def _lead(value: object) -> str:
    return f"{value:.2f}x" if isinstance(value, int | float) else ""


def _text(value: object) -> str:
    return "" if value is None else str(value)


def lead_columns(ranking: Ranking) -> list[Column]:
    """The columns summary.md (and the W&B summary table) lead with, for this sweep."""
    rows = ranking.rows
    with_model = any(r.get("model") not in (None, "none") for r in rows)
    columns: list[Column] = [("rank", "rank", _text), ("job", "job", _text)]
    columns += [(key, key, _text) for key in ranking.keys]
    columns += [
        (IMAGES_PER_S, "images/s", _number(4)),
        (SPREAD, "spread", _spread),
        ("lead", "lead over the next", _lead),
    ]
    if with_model:
        columns.append((CEILING_FRAC, "ceiling_frac", _number(3)))
    columns += [
        (CPU_S_PER_1K_IMAGES, "CPU ms / image", _number(3)),
        (DATA_WAIT_FRAC, "data wait", _share),
    ]
    if any(r.get(SLOWEST_RANK_WAIT) is not None for r in rows):  # data-parallel jobs
        columns.append((SLOWEST_RANK_WAIT, "slowest rank's wait", _share))
    if any(r.get(TOP1) is not None for r in rows):
        columns.append((TOP1, "top-1", _number(3)))
    return columns


def table(columns: list[Column], rows: list[dict]) -> str:
    cells = [[c[2](r.get(c[0])) for c in columns] for r in rows]
    return markdown_table([c[1] for c in columns], cells) + "\n"


def summary_markdown(title: str, ranking: Ranking) -> str:
    """The whole of summary.md."""
    keys = ", ".join(ranking.keys) or "-"
    counts = [f"{len(ranking.ranked)} with a rate, best first (images/s)"]
    if ranking.unrated:
        counts.append(f"{len(ranking.unrated)} without a rate (listed below, with why)")
    if ranking.failed:
        counts.append(f"{len(ranking.failed)} failed")
    if ranking.stopped:
        counts.append(f"{len(ranking.stopped)} did not finish (interrupted or preempted)")
    text = f"# Sweep {title}\n\n{len(ranking.rows)} jobs over {keys}: {'; '.join(counts)}.\n\n"
    text += "".join(f"{line}\n" for line in lead_lines(ranking))
    text += "\n" + table(lead_columns(ranking), ranking.ranked)
    for choice in ranking.workers:
        text += workers_section(choice)
    if ranking.unrated:
        text += "\n## Jobs without a rate\n\nNot failures: the meter found no steady window.\n\n"
        text += table(_apart_columns(ranking, NULL_REASON, "why"), ranking.unrated)
    if ranking.failed:
        text += "\n## Failed jobs\n\n"
        text += table(_apart_columns(ranking, "error", "error"), ranking.failed)
    if ranking.stopped:
        text += "\n## Jobs that did not finish\n\nStopped by a signal (their status): run again to "
        text += "continue them.\n\n" + table(
            _apart_columns(ranking, "error", "error"), ranking.stopped
        )
    text += "\nEvery column of every job: summary.csv. The spread: docs/metrics.md.\n"
    return text


def lead_lines(ranking: Ranking) -> list[str]:
    """Each loader's best against the next loader's best, in words."""
    return [
        f"- {a.get('loader')} leads {b.get('loader')} by {ratio:.2f}x "
        f"({rate(a):,.0f} against {rate(b):,.0f} images/s, each loader's best job)"
        for a, b, ratio in ranking.loader_leads()
    ]


def workers_section(choice: WorkersChoice) -> str:
    """The worker count to use for one group, with what each count costs."""
    where = f" for {choice.group}" if choice.group else ""
    best, chosen = choice.best, choice.chosen
    said = (
        f"\n## Workers to use{where}: loader.num_workers={chosen.get('num_workers')}\n\n"
        f"The fewest within the spread of the best ({best.get('num_workers')} workers: "
        f"{rate(best):,.0f} images/s {_spread(best.get(SPREAD))}).\n\n"
    )
    headings = ["workers", "images/s", "spread", "of the best", "CPU ms / image", "peak RSS MB"]
    cells = [
        [
            f"{row.get('num_workers')}{' (use)' if row is chosen else ''}",
            _number(4)(rate(row)),
            _spread(row.get(SPREAD)),
            _share(rate(row) / rate(best)),
            _number(3)(row.get(CPU_S_PER_1K_IMAGES)),
            _number(4)(row.get(PEAK_RSS_MB)),
        ]
        for row in choice.rows
    ]
    return said + markdown_table(headings, cells) + "\n"


def _apart_columns(ranking: Ranking, key: str, heading: str) -> list[Column]:
    swept = [(k, k, _text) for k in ranking.keys]
    return [("job", "job", _text), *swept, ("status", "status", _text), (key, heading, _text)]


def write_csv(path: Path, columns: list[str], rows: list[dict]) -> None:
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
