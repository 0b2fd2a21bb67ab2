"""What a sweep varies and what its jobs are called: from its multirun.yaml and overrides."""

from __future__ import annotations

from pathlib import Path

from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import OmegaConf

from loaderbench.run.folders import override_values


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
