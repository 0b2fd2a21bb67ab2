"""The sweep summary: summary.csv, summary.md and summary.png in the sweep directory, and at
the end of a multirun a W&B run (job_type ``summary``) in the sweep's group that shows the same."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from loaderbench.measure.metrics import summary_keys
from loaderbench.run.sweeps._plot import plot_summary
from loaderbench.run.sweeps._ranking import Ranking, rank_rows
from loaderbench.run.sweeps._rows import collect_rows
from loaderbench.run.sweeps._table import summary_markdown, write_csv

log = logging.getLogger(__name__)


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


class SweepSummaryCallback(Callback):
    """At the end of a multirun: the summary files, and the W&B summary run."""

    def on_multirun_end(self, config: DictConfig, **kwargs: object) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        try:
            summary = write_summary(sweep_dir)
        except Exception as error:  # a summary must never hide the jobs' own results
            log.warning("sweep summary failed: %s", error, exc_info=True)
            return
        log.info("sweep summary: %s", sweep_dir / "summary.md")
        logger_cfg = config.get("logger")
        if logger_cfg is not None and logger_cfg.name == "wandb":
            from loaderbench.run.sweeps._wandb import log_summary_run

            log_summary_run(config, sweep_dir, summary)
        ranking = summary.ranking
        for choice in ranking.workers:
            where = f" for {choice.group}" if choice.group else ""
            log.info("workers to use%s: %s", where, choice.chosen.get("num_workers"))
        if ranking.unrated:
            jobs = ", ".join(str(r["job"]) for r in ranking.unrated)
            log.warning(
                "%d of %d jobs have no rate (see summary.md): %s",
                len(ranking.unrated),
                len(ranking.rows),
                jobs,
            )
        if ranking.stopped:
            jobs = ", ".join(f"{r['job']} ({r.get('status')})" for r in ranking.stopped)
            log.warning(
                "%d of %d jobs did not finish: %s", len(ranking.stopped), len(ranking.rows), jobs
            )
        if ranking.failed:
            jobs = ", ".join(str(r["job"]) for r in ranking.failed)
            log.error("%d of %d jobs failed: %s", len(ranking.failed), len(ranking.rows), jobs)
