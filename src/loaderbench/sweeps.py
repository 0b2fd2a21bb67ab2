"""What a sweep varies: read from the sweep directory, so every job (in any process) agrees."""

from __future__ import annotations

from pathlib import Path

from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import OmegaConf


def swept_keys(sweep_dir: str | Path) -> list[str]:
    """Keys given several values on the multirun's command line (from its multirun.yaml)."""
    path = Path(sweep_dir) / "multirun.yaml"
    if not path.is_file():
        return []
    task_overrides = OmegaConf.load(path).hydra.overrides.task
    parsed = OverridesParser.create().parse_overrides(list(task_overrides))
    return [o.get_key_element() for o in parsed if o.is_sweep_override()]


def job_name(job_overrides: list[str], keys: list[str]) -> str | None:
    """``key=value`` of this job for the swept keys, e.g. ``loader=memmap,loader.num_workers=8``."""
    if not keys:
        return None
    values = {}
    for override in job_overrides:
        key, _, value = override.partition("=")
        values[key.lstrip("+~")] = value
    return ",".join(f"{key}={values[key]}" for key in keys if key in values) or None
