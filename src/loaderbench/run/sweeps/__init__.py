"""Sweeps: what a sweep varies, and the summary that answers "which loader, how many workers".

Everything is read from the sweep directory (its multirun.yaml and each job's files), so every
job, in any process or on any machine, agrees, and the summary holds every job: ranked by its
rate, without a rate (and why), or failed (and its error).
"""

from loaderbench.run.sweeps._callback import SweepSummaryCallback
from loaderbench.run.sweeps._identity import job_name, sweep_group, swept_keys
from loaderbench.run.sweeps._ranking import Ranking, WorkersChoice, rank_rows, within_spread
from loaderbench.run.sweeps._rows import apply_sweep_ceilings, ceiling_settings, collect_rows
from loaderbench.run.sweeps._summary import SweepSummary, write_summary

__all__ = [
    "Ranking",
    "SweepSummary",
    "SweepSummaryCallback",
    "WorkersChoice",
    "apply_sweep_ceilings",
    "ceiling_settings",
    "collect_rows",
    "job_name",
    "rank_rows",
    "sweep_group",
    "swept_keys",
    "within_spread",
    "write_summary",
]
