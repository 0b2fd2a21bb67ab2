"""Sweeps: what a sweep varies, and the summary that answers "which loader, how many workers".

Everything is read from the sweep directory (its multirun.yaml and each job's files), so every
job, in any process or on any machine, agrees, and the summary holds jobs that failed.
"""

from __future__ import annotations

import csv
import logging
from pathlib import Path

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from loaderbench.decoded_by import summary_text
from loaderbench.metrics import (
    CPU_S_PER_1K_IMAGES,
    DATA_WAIT_FRAC,
    DECODED_BY,
    IMAGES_PER_S,
    TOP1,
    ceiling_fraction,
    charted,
    format_value,
    summary_keys,
)
from loaderbench.run_folders import override_values, read_jobs

log = logging.getLogger(__name__)


def swept_keys(sweep_dir: str | Path) -> list[str]:
    """Keys given several values on the multirun's command line (from its multirun.yaml)."""
    path = Path(sweep_dir) / "multirun.yaml"
    if not path.is_file():
        return []
    task_overrides = OmegaConf.load(path).hydra.overrides.task
    parsed = OverridesParser.create().parse_overrides([str(o) for o in task_overrides])
    return [o.get_key_element() for o in parsed if o.is_sweep_override()]


def job_name(job_overrides: list[str], keys: list[str]) -> str | None:
    """``key=value`` of this job for the swept keys, e.g. ``loader=memmap,loader.num_workers=8``."""
    if not keys:
        return None
    values = override_values(job_overrides)
    return ",".join(f"{key}={values[key]}" for key in keys if key in values) or None


def sweep_group(task_name: str, sweep_dir: str | Path) -> str:
    """The W&B group of every job of a sweep (and of its summary run)."""
    sweep_dir = Path(sweep_dir)
    return f"{task_name}-{sweep_dir.parent.name}_{sweep_dir.name}"


# ---------------------------------------------------------------------------------------------
# The sweep summary: one row a job, read from the files the jobs left (jobs may have run in
# other processes or on other machines, so nothing is kept in memory).


def collect_rows(sweep_dir: str | Path) -> tuple[list[str], list[dict]]:
    """Swept keys and one row a job; a job without a readable metrics.json is a failed row."""
    sweep_dir = Path(sweep_dir)
    keys = swept_keys(sweep_dir)
    rows, settings = [], []
    for job in read_jobs(sweep_dir):
        row: dict = {"job": job.name, **{k: job.overrides.get(k) for k in keys}}
        metrics = dict(job.metrics)
        if metrics.get("status") == "running":
            metrics["status"] = "failed"  # the job died before it could say how it ended
        row.update({k: metrics.get(k) for k in summary_keys()})
        row[DECODED_BY] = summary_text(metrics)
        rows.append(row)
        settings.append(ceiling_settings(metrics))
    apply_sweep_ceilings(rows, settings)
    return keys, rows


# What a ceiling is the same for: a loader=resident job's rate is another job's ceiling where
# these match (the task too: a training step is not an evaluation's forward pass).
CEILING_SETTINGS = ("task", "model", "image_size", "batch_size", "precision", "device")


def ceiling_settings(metrics: dict) -> tuple:
    return tuple(metrics.get(key) for key in CEILING_SETTINGS)


def apply_sweep_ceilings(rows: list[dict], settings: list[tuple]) -> None:
    """Each row with a model takes its ceiling from the sweep's ``loader=resident`` job at the
    same settings, where the sweep ran one (measured in the same sweep, over the whole run
    like the row's own rate); the others keep the ceiling their job measured itself."""
    resident = {
        setting: row
        for row, setting in zip(rows, settings, strict=True)
        if row.get("loader") == "resident"
        and row.get("status") == "ok"
        and row.get(IMAGES_PER_S) is not None
    }
    for row, setting in zip(rows, settings, strict=True):
        source = resident.get(setting)
        if source is None or source is row or row.get("model") in (None, "none"):
            continue
        frac = ceiling_fraction(row.get(IMAGES_PER_S), source[IMAGES_PER_S])
        row.update(
            ceiling_images_per_s=source[IMAGES_PER_S],
            ceiling_frac=frac,
            ceiling_from=f"sweep job {source['job']} (loader=resident)",
            ceiling_frac_null_reason=None if frac is not None else "images_per_s is null",
        )


def _sort_key(row: dict) -> tuple:
    ok = row.get("status") == "ok"
    score = row.get(TOP1) if row.get(TOP1) is not None else row.get(IMAGES_PER_S)
    return (not ok, -(score or 0.0))


def write_csv(path: Path, columns: list[str], rows: list[dict]) -> None:
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)


def markdown_table(columns: list[str], rows: list[dict]) -> str:
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for row in rows:
        lines.append("| " + " | ".join(format_value(c, row.get(c)) for c in columns) + " |")
    return "\n".join(lines) + "\n"


def _numeric(value: object) -> float | None:
    try:
        return float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None


def plot_summary(path: Path, keys: list[str], rows: list[dict]) -> None:
    """images/s against the swept key, one line a loader; data wait and CPU cost below."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    x_keys = [k for k in keys if k not in ("loader", "loader.name")]
    x_key = next((k for k in x_keys if all(_numeric(r.get(k)) is not None for r in rows)), None)
    ok_rows = [r for r in rows if r.get("status") == "ok" and r.get(IMAGES_PER_S)]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 7), sharex=True)
    cpu_axis = bottom.twinx()
    labels_for_x: list[str] = []
    # One line a loader and a value of every other swept key that is not on the x axis.
    series_keys = [k for k in x_keys if k != x_key]
    lines: dict[str, list[dict]] = {}
    for row in ok_rows:
        extra = job_name([f"{k}={row.get(k)}" for k in series_keys], series_keys)
        lines.setdefault(f"{row.get('loader')}{f' ({extra})' if extra else ''}", []).append(row)
    for label, line_rows in sorted(lines.items()):
        if x_key is not None:
            line_rows = sorted(line_rows, key=lambda r: _numeric(r[x_key]) or 0.0)
            xs = [_numeric(r[x_key]) for r in line_rows]
        else:
            names = [str(r["job"]) for r in line_rows]
            for name in names:
                if name not in labels_for_x:
                    labels_for_x.append(name)
            xs = [labels_for_x.index(n) for n in names]
        top.plot(xs, [r[IMAGES_PER_S] for r in line_rows], marker="o", label=label)
        bottom.plot(xs, [r.get(DATA_WAIT_FRAC) or 0.0 for r in line_rows], marker="o")
        cpu_axis.plot(
            xs, [r.get(CPU_S_PER_1K_IMAGES) or 0.0 for r in line_rows], marker="x", linestyle="--"
        )
    rates = [r[IMAGES_PER_S] for r in ok_rows]
    if rates and max(rates) > 20 * min(rates):  # loaders orders of magnitude apart
        top.set_yscale("log")
        top.set_ylabel("images / s (log)")
    else:
        top.set_ylabel("images / s")
        top.set_ylim(bottom=0)
    top.set_title(f"sweep over {', '.join(keys) or 'jobs'}")
    top.grid(alpha=0.3)
    if lines:
        top.legend(title="loader")
    bottom.set_ylabel("data_wait_frac (solid)")
    cpu_axis.set_ylabel("CPU s per 1000 images (dashed)")
    bottom.set_ylim(0, 1.05)
    bottom.grid(alpha=0.3)
    if x_key is not None:
        bottom.set_xlabel(x_key)
    else:
        bottom.set_xticks(range(len(labels_for_x)), labels_for_x, rotation=20, ha="right")
    failed = len(rows) - len(ok_rows)
    if failed:
        fig.text(0.01, 0.01, f"{failed} job(s) failed: see summary.md", color="red")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def write_summary(sweep_dir: str | Path) -> tuple[list[str], list[dict]]:
    """summary.csv, summary.md and summary.png in the sweep directory."""
    sweep_dir = Path(sweep_dir)
    keys, rows = collect_rows(sweep_dir)
    rows.sort(key=_sort_key)
    metric_columns = [
        c for c in summary_keys() if c not in keys and any(r.get(c) is not None for r in rows)
    ]
    columns = ["job", *keys, *metric_columns]  # a swept key that is also a metric: once
    write_csv(sweep_dir / "summary.csv", columns, rows)
    failed = sum(r.get("status") != "ok" for r in rows)
    header = (
        f"# Sweep {sweep_dir}\n\n{len(rows)} jobs over {', '.join(keys) or '-'}"
        f"{f', {failed} failed' if failed else ''}; best first.\n\n"
    )
    (sweep_dir / "summary.md").write_text(header + markdown_table(columns, rows))
    plot_summary(sweep_dir / "summary.png", keys, rows)
    return columns, rows


class SweepSummaryCallback(Callback):
    """At the end of a multirun: the summary files, and a W&B run (job_type ``summary``) in the
    sweep's group holding the table and the plot."""

    def on_multirun_end(self, config: DictConfig, **kwargs: object) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        try:
            columns, rows = write_summary(sweep_dir)
        except Exception as error:  # a summary must never hide the jobs' own results
            log.warning("sweep summary failed: %s", error, exc_info=True)
            return
        log.info("sweep summary: %s", sweep_dir / "summary.md")
        logger_cfg = config.get("logger")
        if logger_cfg is not None and logger_cfg.name == "wandb":
            log_summary_run(config, sweep_dir, columns, rows)
        failed = [r["job"] for r in rows if r.get("status") != "ok"]
        if failed:
            log.error("%d of %d jobs failed: %s", len(failed), len(rows), ", ".join(failed))


def log_summary_run(
    config: DictConfig, sweep_dir: Path, columns: list[str], rows: list[dict]
) -> None:
    from loaderbench.tracking import WandbLogger

    logger = WandbLogger.start(
        project=config.logger.project,
        entity=config.logger.entity,
        mode=config.logger.mode,
        run_dir=sweep_dir,
        config={"sweep_dir": str(sweep_dir), "swept_keys": swept_keys(sweep_dir)},
        job_type="summary",
        group=sweep_group(config.hydra.job.name, sweep_dir),
        name="summary",
        tags=list(config.logger.tags),
        init_timeout_s=config.logger.init_timeout_s,
    )
    if not isinstance(logger, WandbLogger):
        return
    import wandb

    table = wandb.Table(columns=columns, data=[[_cell(r.get(c)) for c in columns] for r in rows])
    plot = wandb.Image(str(sweep_dir / "summary.png"))
    charts = native_charts(swept_keys(sweep_dir), rows)
    logger.log({"summary_table": table, "summary_plot": plot, **charts})
    logger.finish()


def native_charts(keys: list[str], rows: list[dict]) -> dict[str, object]:
    """W&B charts built from the sweep's rows (the jobs that ran): each charted metric against
    the numeric swept key, one series per loader (and value of any other swept key), or one
    bar per job where no swept key is numeric. The group's page compares loaders with them
    without a panel built by hand."""
    import wandb

    x_keys = [k for k in keys if k not in ("loader", "loader.name")]
    x_key = next((k for k in x_keys if all(_numeric(r.get(k)) is not None for r in rows)), None)
    series_keys = [k for k in x_keys if k != x_key]
    ok = [r for r in rows if r.get("status") == "ok" and r.get(IMAGES_PER_S) is not None]
    if not ok:
        return {}
    chart_labels = charted()  # declared in loaderbench.metrics
    columns = ["job", "series", "x", *chart_labels]
    data = [
        [
            str(r["job"]),
            _series(r, series_keys),
            _numeric(r.get(x_key)) if x_key else None,
            *(_numeric(r.get(metric)) for metric in chart_labels),
        ]
        for r in ok
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


def _series(row: dict, keys: list[str]) -> str:
    """A chart series: the loader, and the row's values of ``keys``."""
    extra = job_name([f"{k}={row.get(k)}" for k in keys], keys)
    return f"{row.get('loader')}{f' ({extra})' if extra else ''}"


def _cell(value: object) -> object:
    return value if value is None or isinstance(value, int | float | bool) else str(value)
