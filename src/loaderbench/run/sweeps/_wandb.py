"""The sweep's W&B summary run: the lead table, the jobs apart, the worker choice, the plot,
and native charts of the charted metrics against the swept key, one series a loader."""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig

from loaderbench.measure.metrics import (
    CPU_S_PER_1K_IMAGES,
    IMAGES_PER_S,
    NULL_REASON,
    PEAK_RSS_MB,
    SPREAD,
    charted,
)
from loaderbench.run.sweeps._identity import sweep_group
from loaderbench.run.sweeps._plot import numeric, series_name, x_axis
from loaderbench.run.sweeps._summary import SweepSummary
from loaderbench.run.sweeps._table import lead_columns


def log_summary_run(config: DictConfig, sweep_dir: Path, summary: SweepSummary) -> None:
    from loaderbench.run._tracking import WandbLogger

    ranking = summary.ranking
    logger = WandbLogger.start(
        project=config.logger.project,
        entity=config.logger.entity,
        mode=config.logger.mode,
        run_dir=sweep_dir,
        config={"sweep_dir": str(sweep_dir), "swept_keys": ranking.keys},
        job_type="summary",
        group=sweep_group(config.hydra.job.name, sweep_dir),
        name="summary",
        tags=list(config.logger.tags),
        init_timeout_s=config.logger.init_timeout_s,
    )
    if not isinstance(logger, WandbLogger):
        return
    import wandb

    def wandb_table(columns: list[str], rows: list[dict]) -> wandb.Table:
        return wandb.Table(columns=columns, data=[[_cell(r.get(c)) for c in columns] for r in rows])

    lead = [key for key, _, _ in lead_columns(ranking)]
    apart = ["job", *ranking.keys, "status", NULL_REASON, "error"]
    tables = {
        "summary_table": wandb_table(lead, ranking.ranked),
        "summary_table_full": wandb_table(summary.columns, ranking.rows),
        **({"unrated_table": wandb_table(apart, ranking.unrated)} if ranking.unrated else {}),
        **({"failed_table": wandb_table(apart, ranking.failed)} if ranking.failed else {}),
        **({"stopped_table": wandb_table(apart, ranking.stopped)} if ranking.stopped else {}),
    }
    for choice in ranking.workers:
        columns = [
            "num_workers",
            IMAGES_PER_S,
            SPREAD,
            CPU_S_PER_1K_IMAGES,
            PEAK_RSS_MB,
            "workers_choice",
        ]
        name = f"workers_table/{choice.group}" if choice.group else "workers_table"
        tables[name] = wandb_table(columns, choice.rows)
    plot = wandb.Image(str(sweep_dir / "summary.png"))
    charts = native_charts(ranking.keys, ranking.ranked)
    logger.log({**tables, "summary_plot": plot, **charts})
    logger.summary(summary_values(ranking))
    logger.finish()


def summary_values(ranking) -> dict[str, object]:
    """The W&B summary run's own summary: the best job, each loader's lead, the workers."""
    values: dict[str, object] = {
        "jobs": len(ranking.rows),
        "jobs_with_a_rate": len(ranking.ranked),
        "jobs_without_a_rate": len(ranking.unrated),
        "jobs_failed": len(ranking.failed),
        "jobs_unfinished": len(ranking.stopped),
    }
    if ranking.ranked:
        best = ranking.ranked[0]
        values.update(best_job=str(best["job"]), best_images_per_s=best.get(IMAGES_PER_S))
    for a, b, ratio in ranking.loader_leads():
        values[f"lead/{a.get('loader')}_over_{b.get('loader')}"] = ratio
    for choice in ranking.workers:
        key = f"use_num_workers/{choice.group}" if choice.group else "use_num_workers"
        values[key] = choice.chosen.get("num_workers")
    return values


def native_charts(keys: list[str], rows: list[dict]) -> dict[str, object]:
    """W&B charts built from the sweep's ranked rows: each charted metric against the numeric
    swept key, one series a loader (and value of any other swept key), or one bar a job where
    no swept key is numeric. The group's page compares loaders with them without a panel
    built by hand."""
    import wandb

    if not rows:
        return {}
    x_key, series_keys = x_axis(keys, rows)
    chart_labels = charted()  # declared in loaderbench.measure.metrics
    columns = ["job", "series", "x", *chart_labels]
    data = [
        [
            str(r["job"]),
            series_name(r, series_keys),
            numeric(r.get(x_key)) if x_key else None,
            *(numeric(r.get(metric)) for metric in chart_labels),
        ]
        for r in rows
    ]
    table = wandb.Table(columns=columns, data=data)
    charts: dict[str, object] = {}
    for metric, label in chart_labels.items():
        title = f"{label} against {x_key}, by loader" if x_key else f"{label} by job"
        charts[f"chart/{metric}"] = (
            wandb.plot.line(table, "x", metric, stroke="series", title=title)
            if x_key
            else wandb.plot.bar(table, "job", metric, title=title)
        )
    return charts


def _cell(value: object) -> object:
    return value if value is None or isinstance(value, int | float | bool) else str(value)
