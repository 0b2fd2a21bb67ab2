"""The sweep's rows: one a job, read from the files the jobs left (jobs may have run in other
processes or on other machines, so nothing is kept in memory), with the ceilings the sweep's
own ``loader=resident`` jobs measured."""

from __future__ import annotations

from pathlib import Path

from loaderbench.imaging.decoded_by import summary_text
from loaderbench.measure.metrics import DECODED_BY, IMAGES_PER_S, ceiling_fraction, summary_keys
from loaderbench.run.folders import read_jobs
from loaderbench.run.sweeps._identity import swept_keys


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
            metrics.setdefault(
                "error", "the job's process ended before it said how (status: running)"
            )
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
