"""SPDL's own per-stage statistics, kept instead of only logged.

SPDL reports, per stage, task times and its output queue's put/get waits and occupancy when a
pipeline stops (and every ``loader.stats_interval_s`` seconds if asked). ``PipelineStats``
collects the last report of every stage of every pipeline, so ``stats()`` can sum them over a
run under ``spdl_<stage>_<figure>`` keys.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from dataclasses import dataclass

from spdl.pipeline import (
    QueuePerfStats,
    StageInfo,
    StatsQueue,
    TaskHook,
    TaskPerfStats,
    TaskStatsHook,
)


def stage_key(info: StageInfo) -> str:
    """A metric-friendly stage name: src, aggregate, decode, transfer, sink."""
    name = info.stage_name
    if name.startswith("aggregate"):  # SPDL names it after its op: "aggregate(op=...)"
        return "aggregate"
    return re.sub(r"\W+", "_", name).strip("_").lower() or f"stage{info.stage_id}"


@dataclass
class StageTotals:
    """Sums over epochs, so averages weight every item and second equally."""

    items: int = 0
    elapsed_s: float = 0.0
    empty_s: float = 0.0
    put_wait_s: float = 0.0
    get_wait_s: float = 0.0
    tasks: int = 0
    failures: int = 0
    task_s: float = 0.0


class PipelineStats:
    """Collects the final QueuePerfStats / TaskPerfStats of every stage of every pipeline.

    SPDL reports them once per stage when the pipeline stops (and per interval if asked); the
    last report of a stage is the whole-pipeline figure, so each pipeline keeps the latest and
    ``fold`` adds them to the totals when it has stopped.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._queues: dict[str, QueuePerfStats] = {}
        self._tasks: dict[str, TaskPerfStats] = {}
        self.totals: dict[str, StageTotals] = {}

    def record_queue(self, info: StageInfo, stats: QueuePerfStats) -> None:
        with self._lock:
            self._queues[stage_key(info)] = stats

    def record_task(self, info: StageInfo, stats: TaskPerfStats) -> None:
        with self._lock:
            self._tasks[stage_key(info)] = stats

    def fold(self) -> dict[str, float]:
        """Add a stopped pipeline's stage reports to the totals; return its own summary."""
        with self._lock:
            queues, tasks = self._queues, self._tasks
            self._queues, self._tasks = {}, {}
        if not queues and not tasks:
            return {}
        run: dict[str, StageTotals] = {}
        for key, q in queues.items():
            t = run.setdefault(key, StageTotals())
            t.items, t.elapsed_s = q.num_items, q.elapsed
            t.empty_s = q.elapsed * (1.0 - q.occupancy_rate)
            t.put_wait_s, t.get_wait_s = q.ave_put_time * q.num_items, q.ave_get_time * q.num_items
        for key, k in tasks.items():
            t = run.setdefault(key, StageTotals())
            t.tasks, t.failures = k.num_tasks, k.num_failures
            t.task_s = k.ave_time * (k.num_tasks - k.num_failures)
        for key, t in run.items():
            total = self.totals.setdefault(key, StageTotals())
            for name in StageTotals.__dataclass_fields__:
                setattr(total, name, getattr(total, name) + getattr(t, name))
        return summarize(run)

    def summary(self) -> dict[str, float]:
        return summarize(self.totals)


def summarize(totals: dict[str, StageTotals]) -> dict[str, float]:
    """``spdl_<stage>_<figure>`` keys: occupancy and waits of each stage's output queue, and
    the mean task time of each processing stage."""
    out: dict[str, float] = {}
    for key, t in sorted(totals.items()):
        prefix = f"spdl_{key}"
        if t.elapsed_s > 0:
            out[f"{prefix}_occupancy"] = round(1.0 - t.empty_s / t.elapsed_s, 4)
        if t.items:
            out[f"{prefix}_put_wait_ms"] = round(1e3 * t.put_wait_s / t.items, 4)
            out[f"{prefix}_get_wait_ms"] = round(1e3 * t.get_wait_s / t.items, 4)
        if t.tasks:
            ok = t.tasks - t.failures
            out[f"{prefix}_task_ms"] = round(1e3 * t.task_s / ok, 4) if ok else 0.0
            out[f"{prefix}_task_failures"] = t.failures
    return out


class RecordingQueue(StatsQueue):
    """SPDL's StatsQueue, also handing its reports to a PipelineStats."""

    def __init__(
        self,
        info: StageInfo,
        *,
        buffer_size: int = 1,
        interval: float = -1,
        recorder: PipelineStats,
    ) -> None:
        super().__init__(info, buffer_size=buffer_size, interval=interval)
        self._recorder = recorder

    def _log_stats(self, stats: QueuePerfStats) -> None:
        # Called with each interval report and, last, with the whole-stage figures.
        self._recorder.record_queue(self.info, stats)
        super()._log_stats(stats)


class RecordingTaskHook(TaskStatsHook):
    """SPDL's TaskStatsHook, also handing its reports to a PipelineStats."""

    def __init__(self, info: StageInfo, interval: float, recorder: PipelineStats) -> None:
        super().__init__(info, interval=interval)
        self._recorder = recorder

    def _log_stats(self, stats: TaskPerfStats) -> None:
        self._recorder.record_task(self.info, stats)
        super()._log_stats(stats)


def recording_queue_class(recorder: PipelineStats, interval: float) -> type[StatsQueue]:
    """A queue class for ``PipelineBuilder.build(queue_class=...)`` bound to ``recorder``."""

    class _Queue(RecordingQueue):
        def __init__(self, info: StageInfo, *, buffer_size: int = 1) -> None:
            super().__init__(info, buffer_size=buffer_size, interval=interval, recorder=recorder)

    return _Queue


def recording_hooks(
    recorder: PipelineStats, interval: float
) -> Callable[[StageInfo], list[TaskHook]]:
    def factory(info: StageInfo) -> list[TaskHook]:
        return [RecordingTaskHook(info, interval, recorder)]

    return factory
