"""The spdl loader: SPDL's thread pipeline, the approach of its imagenet_classification example.

One SPDL pipeline per epoch, all in this process (no worker processes):

    source     this epoch's shuffled order, this rank's share: Sample(index, path, label, seed)
    aggregate  ``loader.batch_size`` samples (the last partial batch dropped when training)
    decode     ``loader.num_workers`` batches at once in SPDL's thread pool, each decoded image
               by image straight into one contiguous uint8 NCHW tensor (pinned on CUDA runs;
               nvjpeg: read by the thread, decoded on the GPU) plus int64 labels
    transfer   CUDA runs with a CPU decoder: copy on a side stream and wait for it, so the copy
               overlaps the main loop's compute
    sink       ``loader.prefetch`` batches ready for the main loop

Batches are formed before decoding, as in SPDL's imagenet_classification example, because
SPDL's per-task cost (source-thread hand-off, asyncio task, trip to the pool thread and back,
stats hooks) was measured here at ~1 ms of CPU per task, half a 224 px turbo decode (~1.9 ms):
one task per image cut the images per CPU second from ~420 (a bare 2-thread pool) to ~290;
one task per batch matches the bare pool. The decode stage
keeps input order (``output_order="input"``), so a batch holds the same images as the
torchvision loader's for the same seed and epoch: runs are reproducible and the loaders
comparable. The decoders (``loader.decoder``) live in ``loaderbench.decoders``.

A pipeline is started per epoch and stopped when the epoch ends, when the consumer stops early,
on an error, on Ctrl-C (``Pipeline.auto_stop``) and by ``close()``, so no SPDL thread outlives
its epoch. A file no decoder can read is counted in ``stats()["skipped_files"]`` and left out
of its batch (``dataset.on_error=skip``), or raised as ``OSError`` naming it (``raise``).

SPDL's own per-stage statistics (task times, queue put/get waits and occupancy) are recorded
by subclasses of its ``TaskStatsHook`` and ``StatsQueue``, logged at the end of every epoch
(and every ``loader.stats_interval_s`` seconds if set) and summed over epochs in ``stats()``
under ``spdl_*`` keys: a sink occupancy near 1 means the loader keeps ahead of the main loop,
near 0 that the main loop starves; the decode queue's put wait is time decoders were blocked
by the stages after them.
"""

from __future__ import annotations

import functools
import logging
import re
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
from spdl.pipeline import (
    Pipeline,
    PipelineBuilder,
    QueuePerfStats,
    StageInfo,
    StatsQueue,
    TaskHook,
    TaskPerfStats,
    TaskStatsHook,
)

from loaderbench.decoders import (
    DecodedBatch,
    Failure,
    Geometry,
    ImageDecoder,
    Sample,
    build_decoder,
    image_seed,
    serial_torch_in_this_thread,
)
from loaderbench.loaders.base import (
    Batch,
    Loader,
    LoaderSpec,
    batches_per_epoch,
    epoch_permutation,
    register_loader,
    shard_indices,
)

log = logging.getLogger(__name__)

ON_ERROR = ("skip", "raise")


# ---------------------------------------------------------------------------------------------
# SPDL's per-stage statistics, kept instead of only logged.


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
    """Collects the final QueuePerfStats / TaskPerfStats of every stage of every epoch.

    SPDL reports them once per stage when the stage ends (and per interval if asked); the last
    report of a stage in an epoch is the whole-epoch figure, so each epoch keeps the latest and
    ``end_epoch`` folds them into the totals.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._queues: dict[str, QueuePerfStats] = {}
        self._tasks: dict[str, TaskPerfStats] = {}
        self.totals: dict[str, StageTotals] = {}
        self.epochs = 0

    def record_queue(self, info: StageInfo, stats: QueuePerfStats) -> None:
        with self._lock:
            self._queues[stage_key(info)] = stats

    def record_task(self, info: StageInfo, stats: TaskPerfStats) -> None:
        with self._lock:
            self._tasks[stage_key(info)] = stats

    def end_epoch(self) -> dict[str, float]:
        """Fold this epoch's stage reports into the totals; return the epoch's summary."""
        with self._lock:
            queues, tasks = self._queues, self._tasks
            self._queues, self._tasks = {}, {}
        if not queues and not tasks:
            return {}
        epoch: dict[str, StageTotals] = {}
        for key, q in queues.items():
            t = epoch.setdefault(key, StageTotals())
            t.items, t.elapsed_s = q.num_items, q.elapsed
            t.empty_s = q.elapsed * (1.0 - q.occupancy_rate)
            t.put_wait_s, t.get_wait_s = q.ave_put_time * q.num_items, q.ave_get_time * q.num_items
        for key, k in tasks.items():
            t = epoch.setdefault(key, StageTotals())
            t.tasks, t.failures = k.num_tasks, k.num_failures
            t.task_s = k.ave_time * (k.num_tasks - k.num_failures)
        for key, t in epoch.items():
            total = self.totals.setdefault(key, StageTotals())
            for name in StageTotals.__dataclass_fields__:
                setattr(total, name, getattr(total, name) + getattr(t, name))
        self.epochs += 1
        return summarize(epoch)

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


# ---------------------------------------------------------------------------------------------
# Stages.

T = TypeVar("T")
U = TypeVar("U")


def in_pool_thread(fn: Callable[[T], U]) -> Callable[[T], U]:
    """A stage function that first makes its pool thread's torch ops serial."""

    @functools.wraps(fn)
    def stage(item: T) -> U:
        serial_torch_in_this_thread()
        return fn(item)

    return stage


class CudaTransfer:
    """Copy a pinned CPU batch to the GPU on a side stream (one per thread) and wait for it.

    The stage runs in a pool thread, so the copy overlaps the main loop's compute; waiting here
    means the batch the sink holds is complete. The main loop then records its own stream on
    the tensors (``Tensor.record_stream``) so the allocator never reuses them early.
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._local = threading.local()

    def __call__(self, batch: DecodedBatch) -> DecodedBatch:
        if batch.images.device == self.device:
            return batch
        if not hasattr(self._local, "stream"):
            self._local.stream = torch.cuda.Stream(self.device)
        stream = self._local.stream
        with torch.cuda.stream(stream):
            images = batch.images.to(self.device, non_blocking=True)
            labels = batch.labels.to(self.device, non_blocking=True)
        stream.synchronize()
        return DecodedBatch(images, labels, batch.failures)


def epoch_samples(spec: LoaderSpec, epoch: int) -> Iterator[Sample]:
    """This rank's images of an epoch, in the order every loader shares.

    A generator (SPDL iterates it on its source thread), so an ImageNet-sized epoch is never
    held as a million Python objects at once.
    """
    split = spec.split
    order = epoch_permutation(len(split), spec.seed, epoch, shuffle=spec.train)
    mine = shard_indices(order, spec.batch_size, spec.drop_last, spec.rank, spec.world_size)
    for chunk in torch.split(mine, 4096):
        for i in chunk.tolist():
            yield Sample(i, split.paths[i], split.labels[i], image_seed(spec.seed, epoch, i))


@dataclass(frozen=True)
class SpdlOptions:
    decoder: str
    on_error: str
    timeout_s: float | None
    stats_interval_s: float

    @classmethod
    def from_spec(cls, spec: LoaderSpec) -> SpdlOptions:
        options = spec.options
        on_error = str(options.get("on_error", "skip"))
        if on_error not in ON_ERROR:
            raise ValueError(f"dataset.on_error must be one of {ON_ERROR}, got {on_error!r}")
        timeout = options.get("timeout_s")
        if timeout is not None and timeout <= 0:
            raise ValueError(f"loader.timeout_s must be > 0 or null, got {timeout!r}")
        return cls(
            decoder=str(options.get("decoder", "turbo")),
            on_error=on_error,
            timeout_s=None if timeout is None else float(timeout),
            stats_interval_s=float(options.get("stats_interval_s") or -1),
        )


@register_loader("spdl")
class SpdlLoader(Loader):
    def __init__(self, spec: LoaderSpec) -> None:
        super().__init__(spec)
        self.options = SpdlOptions.from_spec(spec)
        # Fails here, before any thread starts, for an unknown decoder or nvjpeg without CUDA.
        geometry = Geometry(spec.image_size, spec.train, spec.rrc_scale, spec.rrc_ratio)
        self.decoder: ImageDecoder = build_decoder(self.options.decoder, geometry, spec.device)
        self.decode_threads = max(1, spec.num_workers)
        self.recorder = PipelineStats()
        self.skipped_files = 0
        self._pipeline: Pipeline[DecodedBatch] | None = None

    def __len__(self) -> int:
        return batches_per_epoch(self.spec)

    # -- building ------------------------------------------------------------------------------

    def _decode(self, samples: Sequence[Sample]) -> DecodedBatch:
        return self.decoder.decode_batch(samples, pin=self.spec.use_pinned_memory)

    def build_pipeline(self, epoch: int) -> Pipeline[DecodedBatch]:
        spec, interval = self.spec, self.options.stats_interval_s
        builder = (
            PipelineBuilder()
            .add_source(epoch_samples(spec, epoch))
            .aggregate(spec.batch_size, drop_last=spec.drop_last)
            .pipe(
                in_pool_thread(self._decode),
                concurrency=self.decode_threads,
                name="decode",
                output_order="input",
            )
        )
        if spec.device.type == "cuda":
            builder = builder.pipe(in_pool_thread(CudaTransfer(spec.device)), name="transfer")
        return builder.add_sink(spec.prefetch).build(
            # The decode threads, plus one for the transfer so it never waits for a decode slot.
            num_threads=self.decode_threads + 1,
            queue_class=recording_queue_class(self.recorder, interval),
            task_hook_factory=recording_hooks(self.recorder, interval),
        )

    # -- iterating -----------------------------------------------------------------------------

    def _account(self, failures: list[Failure]) -> None:
        for failure in failures:
            if self.options.on_error == "raise":
                raise OSError(f"cannot decode image {failure.path}: {failure.error}")
            self.skipped_files += 1
            log.warning("skipping unreadable image %s: %s", failure.path, failure.error)

    def _batches(self, pipeline: Pipeline[DecodedBatch], epoch: int) -> Iterator[DecodedBatch]:
        timeout = self.options.timeout_s
        iterator = pipeline.get_iterator(timeout=timeout)
        while True:
            try:
                yield next(iterator)
            except StopIteration:
                return
            except TimeoutError as error:
                raise TimeoutError(
                    f"spdl loader: no batch for loader.timeout_s={timeout:g} s in epoch {epoch} "
                    f"(decoder {self.options.decoder}); is the file system stuck?"
                ) from error

    def _hand_over(self, batch: DecodedBatch) -> Batch:
        if batch.images.is_cuda:
            # Made on a side stream: tell the allocator the main loop's stream uses them now.
            stream = torch.cuda.current_stream(batch.images.device)
            batch.images.record_stream(stream)
            batch.labels.record_stream(stream)
        return Batch(batch.images, batch.labels)

    def __iter__(self) -> Iterator[Batch]:
        epoch = self.epoch
        self.close()  # an earlier epoch's iterator left unfinished
        pipeline = self._pipeline = self.build_pipeline(epoch)
        try:
            with pipeline.auto_stop():
                for batch in self._batches(pipeline, epoch):
                    self._account(batch.failures)
                    if len(batch.labels):
                        yield self._hand_over(batch)
        finally:
            if self._pipeline is pipeline:
                self._pipeline = None
            summary = self.recorder.end_epoch()
            if summary:
                log.info(
                    "spdl %s epoch %d: %s",
                    "train" if self.spec.train else "val",
                    epoch,
                    ", ".join(f"{k[5:]}={v:g}" for k, v in summary.items()),
                )

    def stats(self) -> dict[str, Any]:
        return {
            "skipped_files": self.skipped_files,
            "spdl_decoder": self.options.decoder,
            "spdl_decode_threads": self.decode_threads,
            **self.recorder.summary(),
        }

    def close(self) -> None:
        """Stop a pipeline still running (an epoch left early); safe to call twice."""
        pipeline, self._pipeline = self._pipeline, None
        if pipeline is not None:
            try:
                pipeline.stop()
            except Exception:  # a stage's failure, already raised to the consumer or moot now
                log.warning("spdl pipeline failed while stopping", exc_info=True)
