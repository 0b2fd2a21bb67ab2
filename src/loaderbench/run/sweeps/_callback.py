"""At the end of a Hydra multirun: the sweep summary written, and, with ``logger=wandb``, a W&B
run (job_type ``summary``) in the sweep's group that shows the same (``conf/hydra/default.yaml``
names the callback)."""

from __future__ import annotations

import logging
from pathlib import Path

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from loaderbench.run.sweeps._summary import write_summary
from loaderbench.run.sweeps._wandb import log_summary_run

log = logging.getLogger(__name__)


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
