"""The spdl loader: SPDL's thread pipeline, the approach of its imagenet_classification example.

One SPDL pipeline, all in this process (no worker processes):

    source     this rank's share of an epoch's shuffled order, as batches of
               ``loader.batch_size`` Sample(index, path, label, seed) (the last partial batch
               dropped when training); re-iterated for each epoch
    decode     ``loader.num_workers`` batches at once in a pool of as many threads, each
               decoded image by image straight into one contiguous uint8 NCHW tensor (pinned
               on CUDA runs; nvjpeg: read by the thread, decoded on the GPU) plus int64 labels
    transfer   CUDA runs with a CPU decoder: copy on a side stream and wait for it, so the copy
               overlaps the main loop's compute
    sink       ``loader.prefetch`` batches ready for the main loop

Batches are formed before decoding, as in SPDL's imagenet_classification example, and by the
source rather than an ``aggregate`` stage, because every item SPDL moves costs Python work on
its event loop (queue hand-offs, asyncio tasks, stats hooks): measured here, one task per image
made the decode threads wait for the GIL and cut throughput by a third, and an ``aggregate``
stage alone took ~0.3 ms of CPU per image; one item per batch makes both vanish. The decode
stage keeps input order (``output_order="input"``), so a batch holds the same images as the
torchvision loader's for the same seed and epoch: runs are reproducible and the loaders
comparable. The decoders (``loader.decoder``) live in ``loaderbench.decoders``.

The pipeline lives for the run (``loader.persistent=true``, like DataLoader's persistent
workers): its source is continuous, so building and starting threads is paid once and the next
epoch's first batches are decoded while the current one ends. It is stopped, its threads
joined, by ``close()``, when the consumer leaves an epoch early, on an error and on Ctrl-C; and
rebuilt when ``set_epoch`` asks a train loader for another epoch than the one it would serve
next (resume). ``loader.persistent=false`` builds and stops one per epoch. A file
no decoder can read is counted once in ``stats()["skipped_files"]`` and left out of its batch
(``dataset.on_error=skip``), or raised as ``OSError`` naming it (``raise``).

SPDL's own per-stage statistics (task times, queue put/get waits and occupancy) are recorded
by subclasses of its ``TaskStatsHook`` and ``StatsQueue``, logged when a pipeline stops (and
every ``loader.stats_interval_s`` seconds if set) and summed over pipelines in ``stats()``
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
from concurrent.futures import ThreadPoolExecutor
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


def root_cause(error: BaseException) -> BaseException:
    """The first exception a stage raised, out of SPDL's exception group and wrappers."""
    while True:
        if isinstance(error, BaseExceptionGroup) and error.exceptions:
            error = error.exceptions[0]
        elif error.__cause__ is not None:
            error = error.__cause__
        else:
            return error


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
    """This rank's images of an epoch, in the order every loader shares."""
    for batch in epoch_batches(spec, epoch):
        yield from batch


def epoch_batches(spec: LoaderSpec, epoch: int) -> Iterator[list[Sample]]:
    """This rank's batches of an epoch: the source of the pipeline.

    A generator (SPDL iterates it on its source thread), so an ImageNet-sized epoch is never
    held as a million Python objects at once. Batches are formed here rather than by an SPDL
    ``aggregate`` stage because that stage moves every image through the event loop's queues
    on its own (~0.3 ms of CPU per image measured here, on the thread that also hands work to
    the decoders, which then wait for the GIL); one item per batch makes that cost vanish.
    """
    split = spec.split
    order = epoch_permutation(len(split), spec.seed, epoch, shuffle=spec.train)
    mine = shard_indices(order, spec.batch_size, spec.drop_last, spec.rank, spec.world_size)
    for chunk in torch.split(mine, spec.batch_size):
        yield [
            Sample(i, split.paths[i], split.labels[i], image_seed(spec.seed, epoch, i))
            for i in chunk.tolist()
        ]


class EpochSource:
    """The source of a pipeline that lives across epochs: each pass over it is the next epoch.

    SPDL re-iterates a continuous source as soon as a pass ends (to keep its queues full), so
    the epoch cannot come from ``set_epoch``, which the consumer calls later: the source counts
    epochs itself, from the one the pipeline was built for.
    """

    def __init__(self, spec: LoaderSpec, first_epoch: int) -> None:
        self.spec = spec
        self.next_epoch = first_epoch

    def __iter__(self) -> Iterator[list[Sample]]:
        epoch, self.next_epoch = self.next_epoch, self.next_epoch + 1
        return epoch_batches(self.spec, epoch)


@dataclass(frozen=True)
class SpdlOptions:
    decoder: str
    on_error: str
    timeout_s: float | None
    stats_interval_s: float
    persistent: bool

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
            persistent=bool(options.get("persistent", True)),
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
        self.skipped: set[str] = set()  # paths, each counted and logged once
        self._pipeline: Pipeline[DecodedBatch] | None = None
        self._executor: ThreadPoolExecutor | None = None
        self._pipeline_epoch = -1  # the epoch the running pipeline serves next

    def __len__(self) -> int:
        return batches_per_epoch(self.spec)

    # -- building ------------------------------------------------------------------------------

    def _decode(self, samples: Sequence[Sample]) -> DecodedBatch:
        return self.decoder.decode_batch(samples, pin=self.spec.use_pinned_memory)

    def build_pipeline(self, epoch: int) -> Pipeline[DecodedBatch]:
        """A pipeline serving ``epoch`` and, when persistent, the epochs after it."""
        spec, interval = self.spec, self.options.stats_interval_s
        # Its own pool of exactly num_workers threads: SPDL's ordered stage keeps up to
        # concurrency + 2 tasks in flight, which on the shared pool would decode on more
        # threads than the run asked for (and make 1 worker look like 2 next to torchvision).
        self._executor = ThreadPoolExecutor(self.decode_threads, "loaderbench_spdl_decode")
        builder = (
            PipelineBuilder()
            .add_source(EpochSource(spec, epoch), continuous=self.options.persistent)
            .pipe(
                in_pool_thread(self._decode),
                concurrency=self.decode_threads,
                executor=self._executor,
                name="decode",
                output_order="input",
            )
        )
        if spec.device.type == "cuda":
            builder = builder.pipe(in_pool_thread(CudaTransfer(spec.device)), name="transfer")
        return builder.add_sink(spec.prefetch).build(
            num_threads=1,  # the transfer stage's; decoding has its own pool
            # A stage that raises (bad files do not: they come back as Failures) halts the
            # pipeline and the consumer gets the error; SPDL's default drops the batch and
            # carries on, which would be an epoch silently short of images.
            max_failures=0,
            queue_class=recording_queue_class(self.recorder, interval),
            task_hook_factory=recording_hooks(self.recorder, interval),
        )

    def _pipeline_for(self, epoch: int) -> Pipeline[DecodedBatch]:
        """The running pipeline if it serves ``epoch`` next, else a new one, started."""
        # Val batches do not depend on the epoch (no shuffle, no augmentation): any will do.
        if self._pipeline is not None and (self._pipeline_epoch == epoch or not self.spec.train):
            return self._pipeline
        self.close()  # an earlier epoch left unfinished, or set_epoch jumped
        pipeline = self.build_pipeline(epoch)
        self._pipeline, self._pipeline_epoch = pipeline, epoch
        try:
            pipeline.start()
        except BaseException:
            self.close()
            raise
        return pipeline

    # -- iterating -----------------------------------------------------------------------------

    def _account(self, failures: list[Failure]) -> None:
        for failure in failures:
            if self.options.on_error == "raise":
                raise OSError(f"cannot decode image {failure.path}: {failure.error}")
            if failure.path not in self.skipped:
                self.skipped.add(failure.path)
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
            except BaseExceptionGroup as failure:  # SPDL's PipelineFailure: say what failed
                cause = root_cause(failure)
                raise RuntimeError(
                    f"spdl loader: the pipeline failed in epoch {epoch} (decoder "
                    f"{self.options.decoder}): {type(cause).__name__}: {cause}"
                ) from cause

    def _hand_over(self, batch: DecodedBatch) -> Batch:
        if batch.images.is_cuda:
            # Made on a side stream: tell the allocator the main loop's stream uses them now.
            stream = torch.cuda.current_stream(batch.images.device)
            batch.images.record_stream(stream)
            batch.labels.record_stream(stream)
        return Batch(batch.images, batch.labels)

    def __iter__(self) -> Iterator[Batch]:
        epoch = self.epoch
        pipeline = self._pipeline_for(epoch)
        finished = False
        try:
            for batch in self._batches(pipeline, epoch):
                self._account(batch.failures)
                if len(batch.labels):
                    yield self._hand_over(batch)
            finished = True
        finally:
            # An epoch left early (break, an error, Ctrl-C) stops the pipeline: its threads are
            # gone before the exception travels on. A finished one keeps running into the next
            # epoch when persistent, as DataLoader's persistent workers do.
            if finished and self.options.persistent:
                self._pipeline_epoch = epoch + 1
            else:
                self.close()

    def stats(self) -> dict[str, Any]:
        return {
            "skipped_files": len(self.skipped),
            "spdl_decoder": self.options.decoder,
            "spdl_decode_threads": self.decode_threads,
            **self.recorder.summary(),
        }

    def close(self) -> None:
        """Stop the pipeline and its threads, if running; safe to call twice."""
        pipeline, self._pipeline = self._pipeline, None
        executor, self._executor = self._executor, None
        self._pipeline_epoch = -1
        if pipeline is not None:
            try:
                pipeline.stop()
            except Exception:  # a stage's failure, already raised to the consumer or moot now
                log.warning("spdl pipeline failed while stopping", exc_info=True)
        if executor is not None:
            executor.shutdown(wait=True, cancel_futures=True)
        summary = self.recorder.fold()
        if summary:
            log.info(
                "spdl %s pipeline: %s",
                "train" if self.spec.train else "val",
                ", ".join(f"{k[5:]}={v:g}" for k, v in summary.items()),
            )
