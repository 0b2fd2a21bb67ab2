"""The sweep summary: summary.csv, summary.md and summary.png in the sweep directory."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from loaderbench.measure.metrics import summary_keys
from loaderbench.run.sweeps._plot import plot_summary
from loaderbench.run.sweeps._ranking import Ranking, rank_rows
from loaderbench.run.sweeps._rows import collect_rows
from loaderbench.run.sweeps._table import summary_markdown, write_csv


@dataclass(frozen=True)
class SweepSummary:
    """What the summary files hold: summary.csv's columns and the ranked rows."""

    columns: list[str]
    ranking: Ranking

    @property
    def rows(self) -> list[dict]:
        return self.ranking.rows


def write_summary(sweep_dir: str | Path) -> SweepSummary:
    """summary.csv (every column), summary.md and summary.png in the sweep directory."""
    sweep_dir = Path(sweep_dir)
    keys, rows = collect_rows(sweep_dir)
    ranking = rank_rows(keys, rows)
    rows = ranking.rows
    metric_columns = [
        c for c in summary_keys() if c not in keys and any(r.get(c) is not None for r in rows)
    ]
    ours = [c for c in ("lead", "workers_choice") if any(r.get(c) is not None for r in rows)]
    # A swept key that is also a metric: once.
    columns = ["job", "rank", *keys, *metric_columns, *ours]
    write_csv(sweep_dir / "summary.csv", columns, rows)
    (sweep_dir / "summary.md").write_text(summary_markdown(str(sweep_dir), ranking))
    plot_summary(sweep_dir / "summary.png", ranking)
    return SweepSummary(columns, ranking)
