"""Run folders: what each job of a Hydra multirun left behind (its overrides, its metrics.json),
read in one place by the sweep summary (``loaderbench.run.sweeps``) and the GPU check's report
(``tools/gpu_check``).

Standard library only (PyYAML where present): the GPU check writes its report with this module
even where its kit (omegaconf, hydra) did not install.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

OVERRIDES_FILE = Path(".hydra") / "overrides.yaml"
METRICS_FILE = "metrics.json"


@dataclass(frozen=True)
class Job:
    """One job folder: its ``key=value`` overrides and its metrics as written, or a stand-in
    ``{"status": "failed", "error": ...}`` where it left no readable metrics.json (a job that
    crashed before writing one). A ``status`` of ``running`` is left as written: the job's
    process ended before it could say how; each reader names that its own way."""

    dir: Path
    overrides: dict[str, str]
    metrics: dict[str, Any]

    @property
    def name(self) -> str:
        return self.dir.name


def override_values(overrides: list[str]) -> dict[str, str]:
    """``key=value`` overrides as a dict; ``+key`` and ``~key`` count as ``key``."""
    values = {}
    for item in overrides:
        key, _, value = str(item).partition("=")
        values[key.lstrip("+~")] = value
    return values


def job_dirs(sweep_dir: str | Path) -> list[Path]:
    """The sweep's job folders (those Hydra wrote overrides into), in job order: 0, 1, ..., 10."""
    jobs = [p.parent.parent for p in Path(sweep_dir).glob(f"*/{OVERRIDES_FILE}")]
    return sorted(jobs, key=lambda p: (len(p.name), p.name))


def read_overrides(job_dir: str | Path) -> dict[str, str]:
    """A job's overrides (its .hydra/overrides.yaml, a YAML list of strings)."""
    path = Path(job_dir) / OVERRIDES_FILE
    text = path.read_text()
    try:
        import yaml
    except ImportError:  # a list of plain strings needs no YAML parser
        items: Any = [
            line[2:].strip().strip("'\"") for line in text.splitlines() if line.startswith("- ")
        ]
    else:
        try:
            items = yaml.safe_load(text) or []
        except yaml.YAMLError as error:
            raise ValueError(f"{path}: not readable as YAML: {error}") from error
    if not isinstance(items, list):
        raise ValueError(f"{path}: expected a list of key=value overrides, got {items!r}")
    return override_values(items)


def read_metrics(job_dir: str | Path) -> dict[str, Any]:
    """A job's metrics.json, or a failed stand-in saying why there is none."""
    try:
        return json.loads((Path(job_dir) / METRICS_FILE).read_text())
    except (OSError, ValueError) as error:
        return {"status": "failed", "error": f"no readable metrics.json ({error})"}


def read_jobs(sweep_dir: str | Path) -> list[Job]:
    """Every job of the sweep, in job order."""
    return [Job(path, read_overrides(path), read_metrics(path)) for path in job_dirs(sweep_dir)]
