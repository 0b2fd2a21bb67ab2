"""Run logging: W&B (offline unless told otherwise) or nothing.

W&B must never cost a run: no prompt, no wait past ``logger.init_timeout_s``, and any failure
turns into a warning and a run that goes on without it (metrics.json is written regardless).
"""

from __future__ import annotations

import logging
import os
import re
import warnings
from pathlib import Path
from typing import Any, Protocol

from loaderbench.config.schema import LoggerConfig
from loaderbench.measure.metrics import epoch_summaries

log = logging.getLogger(__name__)

WANDB_MODES = ("online", "offline", "disabled")


class RunLogger(Protocol):
    def log(self, metrics: dict[str, Any], step: int | None = None) -> None: ...
    def summary(self, metrics: dict[str, Any]) -> None: ...
    def log_checkpoint(self, path: Path, epoch: int) -> None: ...
    def log_table(self, key: str, rows: list[dict[str, Any]]) -> None: ...
    def finish(self, exit_code: int = 0) -> None: ...

    @property
    def run_id(self) -> str | None: ...


class NullLogger:
    run_id = None

    def log(self, metrics: dict[str, Any], step: int | None = None) -> None:
        pass

    def log_checkpoint(self, path: Path, epoch: int) -> None:
        pass

    def log_table(self, key: str, rows: list[dict[str, Any]]) -> None:
        pass

    def summary(self, metrics: dict[str, Any]) -> None:
        pass

    def finish(self, exit_code: int = 0) -> None:
        pass


def _has_api_key() -> bool:
    if os.environ.get("WANDB_API_KEY"):
        return True
    try:
        import netrc

        path = Path(os.environ.get("NETRC", Path.home() / ".netrc"))
        hosts = netrc.netrc(path).hosts if path.is_file() else {}
    except (OSError, netrc.NetrcParseError):
        return False
    return any("wandb" in host for host in hosts)


def wandb_mode(configured: str | None) -> str:
    """The mode to run in: the config, else WANDB_MODE, else offline; online needs a key."""
    mode = configured or os.environ.get("WANDB_MODE") or "offline"
    if mode == "dryrun":
        mode = "offline"
    if mode not in WANDB_MODES:
        raise ValueError(
            f"logger.mode / WANDB_MODE={mode!r} is unknown; choose one of {WANDB_MODES}"
        )
    if mode == "online" and not _has_api_key():
        warnings.warn(
            "W&B: WANDB_MODE=online but no API key (WANDB_API_KEY or `wandb login`); "
            "logging offline instead. Upload later with `wandb sync`.",
            stacklevel=2,
        )
        mode = "offline"
    return mode


def _define_metrics(run: Any) -> None:
    """Each curve on its own axis: the training loop's log points (``train/*``, every
    ``logger.log_every_n_steps`` steps) against ``trainer/global_step``, evaluation's
    (``eval/*``) against ``eval/step``, the epochs' numbers (``epoch/*``, ``val/*``) against
    ``epoch``; throughput and accuracy as summary columns (the best epoch's accuracy, the
    epochs' throughput), so sweep tables compare them directly."""
    try:
        for step, patterns in (
            ("trainer/global_step", ["train/*"]),
            ("eval/step", ["eval/*"]),
            ("epoch", ["epoch/*", "val/*"]),
        ):
            run.define_metric(step, hidden=step != "epoch")
            for pattern in patterns:
                run.define_metric(pattern, step_metric=step)
        run.define_metric("val/top1", step_metric="epoch", summary="max,last")
        for key, rule in epoch_summaries().items():  # declared in loaderbench.measure.metrics
            run.define_metric(key, step_metric="epoch", summary=rule)
    except Exception as error:  # an old server or SDK: curves still log, only less tidy
        log.debug("W&B define_metric failed: %s", error)


class WandbLogger:
    """One W&B run per job, finished at the job's end."""

    def __init__(self, run: Any) -> None:
        self.run = run

    @property
    def run_id(self) -> str | None:
        return str(self.run.id)

    @classmethod
    def start(
        cls,
        *,
        project: str,
        entity: str | None,
        mode: str | None,
        run_dir: Path,
        config: dict[str, Any],
        job_type: str,
        group: str | None,
        name: str | None,
        tags: list[str],
        init_timeout_s: float,
        run_id: str | None = None,
    ) -> RunLogger:
        """A W&B run; with ``run_id`` the run of that id, continued (a requeued job)."""
        try:
            import wandb
        except ImportError:  # pragma: no cover - wandb is in requirements.txt
            warnings.warn("W&B: wandb is not installed; not logging to W&B", stacklevel=2)
            return NullLogger()
        resolved_mode = wandb_mode(mode)
        if resolved_mode == "disabled":
            return NullLogger()
        os.environ.setdefault("WANDB_SILENT", "true")
        os.environ.setdefault("WANDB_CONSOLE", "off")
        for attempt_mode in dict.fromkeys([resolved_mode, "offline"]):
            try:
                run = wandb.init(
                    project=project,
                    entity=entity,
                    dir=str(run_dir),
                    config=config,
                    job_type=job_type,
                    group=group,
                    name=name,
                    tags=tags or None,
                    mode=attempt_mode,
                    id=run_id,
                    resume="allow" if run_id else None,
                    reinit="finish_previous",
                    settings=wandb.Settings(
                        init_timeout=init_timeout_s,
                        silent=True,
                        console="off",
                        x_stats_track_process_tree=True,
                    ),
                )
            except Exception as error:
                warnings.warn(
                    f"W&B: could not start a {attempt_mode} run ({type(error).__name__}: "
                    f"{error}); trying offline"
                    if attempt_mode != "offline"
                    else f"W&B: could not start an offline run ({error}); not logging to W&B",
                    stacklevel=2,
                )
                continue
            log.info("W&B run %s (%s) in %s", run.id, attempt_mode, run.dir)
            _define_metrics(run)
            return cls(run)
        return NullLogger()

    def log(self, metrics: dict[str, Any], step: int | None = None) -> None:
        try:
            self.run.log(metrics, step=step)
        except Exception as error:
            log.warning("W&B: log failed: %s", error)

    def log_checkpoint(self, path: Path, epoch: int) -> None:
        """The checkpoint as an artifact of type ``model`` named after the run (aliases
        ``latest`` and ``epoch-N``); a failure is a warning, never the run's end."""
        try:
            import wandb

            artifact = wandb.Artifact(
                artifact_name(self.run.name or self.run.id, "checkpoint"),
                type="model",
                metadata={"epoch": epoch},
            )
            artifact.add_file(str(path))
            self.run.log_artifact(artifact, aliases=["latest", f"epoch-{epoch}"])
        except Exception as error:
            log.warning("W&B: logging the checkpoint failed: %s", error)

    def log_table(self, key: str, rows: list[dict[str, Any]]) -> None:
        """``rows`` (dicts with the same keys) as a W&B table under ``key``."""
        if not rows:
            return
        try:
            import wandb

            columns = list(rows[0])
            table = wandb.Table(columns=columns, data=[[row[c] for c in columns] for row in rows])
            self.run.log({key: table})
        except Exception as error:
            log.warning("W&B: logging table %s failed: %s", key, error)

    def summary(self, metrics: dict[str, Any]) -> None:
        try:
            for key, value in metrics.items():
                self.run.summary[key] = value
        except Exception as error:
            log.warning("W&B: summary update failed: %s", error)

    def finish(self, exit_code: int = 0) -> None:
        try:
            self.run.finish(exit_code=exit_code)
        except Exception as error:
            log.warning("W&B: finish failed: %s", error)


def artifact_name(run_name: str, kind: str) -> str:
    """``<run name>-<kind>`` in the characters W&B allows in an artifact name (a sweep job's
    name holds ``=`` and ``,``)."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", f"{run_name}-{kind}").strip("-")


def build_logger(
    logger_config: LoggerConfig,
    *,
    run_dir: Path,
    config: dict[str, Any],
    job_type: str,
    group: str | None,
    name: str | None,
    run_id: str | None = None,
) -> RunLogger:
    if logger_config.name == "none":
        return NullLogger()
    if logger_config.name != "wandb":
        raise ValueError(f"logger.name={logger_config.name!r} is unknown; choose wandb or none")
    return WandbLogger.start(
        project=logger_config.project,
        entity=logger_config.entity,
        mode=logger_config.mode,
        run_dir=run_dir,
        config=config,
        job_type=job_type,
        group=group,
        name=name,
        tags=list(logger_config.tags),
        init_timeout_s=logger_config.init_timeout_s,
        run_id=run_id,
    )
