"""The spdl loader: SPDL's thread pipeline, as in its imagenet_classification example, all in
this process (no worker processes):

    source     this rank's share of an epoch's shuffled order, as batches of ``Sample``
    decode     ``loader.num_workers`` batches at once in as many threads, each decoded straight
               into one uint8 NCHW batch from a bounded pool of (pinned) buffers, by
               ``loader.decoder`` (``loaderbench.imaging.spdl.decoders``)
    device     CUDA runs: the batch copied (nvjpeg: decoded) on a side stream
    sink       the batches ready for the main loop: ``loader.prefetch`` less those decoding

Batches are formed by the source, before decoding, since every item SPDL moves costs Python on
its event loop (docs/decoding.md, "The spdl decoders"). The decode stage keeps input order, so a
batch holds the torchvision loader's images for the same seed and epoch. The pipeline lives for
the run (``loader.persistent``) and is stopped by ``close()``; SPDL's per-stage statistics are
``stats()``'s ``spdl_*`` keys (docs/metrics.md).
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from spdl.pipeline import (
    Pipeline,
    PipelineBuilder,
)

from loaderbench.imaging.decode import hand_over
from loaderbench.imaging.decoded_by import add as add_counts
from loaderbench.imaging.decoded_by import counting
from loaderbench.imaging.spdl.decoders import ImageDecoder, build_decoder
from loaderbench.imaging.spdl.geometry import Geometry
from loaderbench.imaging.spdl.records import (
    DecodedBatch,
    Failure,
    Sample,
    delivered,
    row_indices,
)
from loaderbench.loaders.base import (
    Batch,
    Loader,
    LoaderSpec,
    register_loader,
)
from loaderbench.loaders.spdl._stats import (
    PipelineStats,
    recording_hooks,
    recording_queue_class,
)
from loaderbench.loaders.spdl.settings import Settings
from loaderbench.measure.metrics import DECODED_BY
from loaderbench.platform.buffers import BatchBuffers
from loaderbench.platform.threads import serial_torch_in_this_thread

log = logging.getLogger(__name__)


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


def epoch_samples(spec: LoaderSpec, epoch: int) -> Iterator[Sample]:
    """This rank's images of an epoch, in the order every loader shares."""
    for batch in epoch_batches(spec, epoch):
        yield from batch


def epoch_batches(spec: LoaderSpec, epoch: int, start_batch: int = 0) -> Iterator[list[Sample]]:
    """This rank's batches of an epoch: the source of the pipeline.

    A generator (SPDL iterates it on its source thread), so an ImageNet-sized epoch is never
    held as a million Python objects at once. Batches are formed here rather than by an SPDL
    ``aggregate`` stage, which moves every image through the event loop's queues on its own.
    """
    split = spec.split
    for chunk in spec.epoch_batches(epoch, start_batch):
        yield [Sample(i, split.paths[i], split.labels[i], epoch) for i in chunk.tolist()]


class EpochSource:
    """The source of a pipeline that lives across epochs: each pass over it is the next epoch.

    SPDL re-iterates a continuous source as soon as a pass ends (to keep its queues full), so
    the epoch cannot come from ``set_epoch``, which the consumer calls later: the source counts
    epochs itself, from the one the pipeline was built for.
    """

    def __init__(self, spec: LoaderSpec, first_epoch: int, start_batch: int = 0) -> None:
        self.spec = spec
        self.next_epoch = first_epoch
        self.start_batch = start_batch  # of the first epoch only (a resumed job)

    def __iter__(self) -> Iterator[list[Sample]]:
        epoch, self.next_epoch = self.next_epoch, self.next_epoch + 1
        start, self.start_batch = self.start_batch, 0
        return epoch_batches(self.spec, epoch, start)


class BatchFlow:
    """Batches the pipeline started, made and handed to the loop: what ``batches_ahead``
    tells the meter. Counted from the decode threads and the loop's, under a lock."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.started = self.made = self.handed = 0

    def count(self, what: str) -> None:
        with self._lock:
            setattr(self, what, getattr(self, what) + 1)

    def ahead(self) -> tuple[int, int]:
        """(made and not yet handed over, started and not yet made)."""
        with self._lock:
            return self.made - self.handed, self.started - self.made


@register_loader("spdl")
class SpdlLoader(Loader):
    def __init__(self, spec: LoaderSpec) -> None:
        super().__init__(spec)
        self.settings: Settings = spec.settings  # type: ignore[assignment]
        # Fails here, before any thread starts, for nvjpeg without CUDA.
        geometry = Geometry(spec.image_size, spec.train, spec.seed, spec.rrc_scale, spec.rrc_ratio)
        self.decoder: ImageDecoder = build_decoder(self.settings.decoder, geometry, spec.device)
        # SPDL needs a thread to decode in: num_workers=0 decodes in one.
        self.decode_threads = max(1, spec.num_workers)
        self.recorder = PipelineStats()
        self._decoded_by: dict[str, int] = {}  # the delivered batches' images, by library
        self._pipeline: Pipeline[DecodedBatch] | None = None
        self._executor: ThreadPoolExecutor | None = None
        self.flow = BatchFlow()
        self._pipeline_epoch = -1  # the epoch the running pipeline serves next
        size = spec.image_size
        self.buffers = BatchBuffers(
            spec.batch_size, (3, size, size), self._buffers_needed(), pin=spec.use_pinned_memory
        )

    def _buffers_needed(self) -> int:
        """Batches alive at once: SPDL's ordered stage keeps up to threads + 2 in flight, the
        sink holds its batches, a queue and the device stage one or two more, the main loop
        one, and one spare."""
        return self.decode_threads + 2 + self.settings.ready_batches() + 3 + 1

    def queue_depth(self) -> int:
        """The batches alive at once but the main loop's and the spare (``_buffers_needed``):
        in the decode stage, its queues and the sink, all decoded ahead of the loop."""
        return self._buffers_needed() - 2

    def batches_ahead(self) -> tuple[int, int] | None:
        """The pipeline's batches made and waiting for the loop, and those being made."""
        return self.flow.ahead() if self._pipeline is not None else None

    def queued_at_start(self) -> int:
        """A persistent pipeline runs on into the next epoch as soon as one ends (through
        validation): its queues may be full when that epoch is iterated."""
        return self.queue_depth() if self._running_serves(self.epoch) else 0

    # -- building ------------------------------------------------------------------------------

    def _decode(self, samples: Sequence[Sample]) -> DecodedBatch:
        self.flow.count("started")
        with counting() as counts:  # in the pool thread: the batch carries its counts
            batch = self.decoder.decode_batch(samples, self.buffers)
        if self.spec.device.type != "cuda":  # else made once on the device (``_to_device``)
            self.flow.count("made")
        return batch._replace(decoded_by=counts, indices=row_indices(samples, batch))

    def _to_device(self, batch: Any) -> DecodedBatch:
        with counting() as counts:  # nvjpeg decodes here
            moved = self.decoder.to_device(batch, self.buffers)
        decoded_by = add_counts(dict(batch.decoded_by or {}), counts)
        self.flow.count("made")
        return moved._replace(decoded_by=decoded_by, indices=batch.indices)

    def build_pipeline(self, epoch: int) -> Pipeline[DecodedBatch]:
        """A pipeline serving ``epoch`` and, when persistent, the epochs after it."""
        spec, interval = self.spec, (self.settings.stats_interval_s or -1)
        # Its own pool of exactly num_workers threads: SPDL's ordered stage keeps up to
        # concurrency + 2 tasks in flight, which on the shared pool would decode on more
        # threads than the run asked for (and make 1 worker look like 2 next to torchvision).
        self._executor = ThreadPoolExecutor(self.decode_threads, "loaderbench_spdl_decode")
        self.flow = BatchFlow()  # a new pipeline has made nothing yet
        builder = (
            PipelineBuilder()
            .add_source(
                EpochSource(spec, epoch, self.start_batch), continuous=self.settings.persistent
            )
            .pipe(
                in_pool_thread(self._decode),
                concurrency=self.decode_threads,
                executor=self._executor,
                name="decode",
                output_order="input",
            )
        )
        if spec.device.type == "cuda":
            builder = builder.pipe(in_pool_thread(self._to_device), name="device")
        return builder.add_sink(self.settings.ready_batches()).build(
            num_threads=1,  # the device stage's; decoding has its own pool
            # A stage that raises (bad files do not: they come back as Failures) halts the
            # pipeline and the consumer gets the error; SPDL's default drops the batch and
            # carries on, which would be an epoch silently short of images.
            max_failures=0,
            queue_class=recording_queue_class(self.recorder, interval),
            task_hook_factory=recording_hooks(self.recorder, interval),
        )

    def _running_serves(self, epoch: int) -> bool:
        """Whether the running pipeline serves ``epoch`` next (persistent, carried on)."""
        # Val batches do not depend on the epoch (no shuffle, no augmentation): any will do.
        running = self._pipeline is not None and not self.start_batch
        return running and (self._pipeline_epoch == epoch or not self.spec.train)

    def _pipeline_for(self, epoch: int) -> Pipeline[DecodedBatch]:
        """The running pipeline if it serves ``epoch`` next, else a new one, started."""
        if self._running_serves(epoch):
            return self._pipeline  # type: ignore[return-value]
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
            if not self.spec.skip_errors:
                raise OSError(f"cannot decode image {failure.path}: {failure.error}")
            self.skip_unreadable(failure.index, failure.error)

    def _batches(self, pipeline: Pipeline[DecodedBatch], epoch: int) -> Iterator[DecodedBatch]:
        timeout = self.settings.timeout_s
        iterator = pipeline.get_iterator(timeout=timeout)
        while True:
            try:
                yield next(iterator)
            except StopIteration:
                return
            except TimeoutError as error:
                raise TimeoutError(
                    f"spdl loader: no batch for loader.timeout_s={timeout:g} s in epoch {epoch} "
                    f"(decoder {self.settings.decoder}); is the file system stuck?"
                ) from error
            except BaseExceptionGroup as failure:  # SPDL's PipelineFailure: say what failed
                cause = root_cause(failure)
                raise RuntimeError(
                    f"spdl loader: the pipeline failed in epoch {epoch} (decoder "
                    f"{self.settings.decoder}): {type(cause).__name__}: {cause}"
                ) from cause

    def _hand_over(self, batch: DecodedBatch) -> Batch:
        hand_over(batch.ready, batch.images, batch.labels)  # made on a side stream
        assert batch.indices is not None, "every batch passes ``_decode``"
        return Batch(batch.images, batch.labels, delivered(batch.indices, batch.failures))

    def __iter__(self) -> Iterator[Batch]:
        epoch = self.epoch
        self.position = self.start_batch
        pipeline = self._pipeline_for(epoch)
        finished = False
        try:
            # One item a batch of the order (``epoch_batches``), in order ("input").
            for batch in self._batches(pipeline, epoch):
                self._account(batch.failures)
                add_counts(self._decoded_by, batch.decoded_by)
                self.position += 1
                self.flow.count("handed")
                if len(batch.labels):
                    yield self._hand_over(batch)
            finished = True
        finally:
            # An epoch left early (break, an error, Ctrl-C) stops the pipeline: its threads are
            # gone before the exception travels on. A finished one keeps running into the next
            # epoch when persistent, as DataLoader's persistent workers do.
            if finished and self.settings.persistent:
                self._pipeline_epoch = epoch + 1
            else:
                self.close()

    def stats(self) -> dict[str, Any]:
        return {
            **super().stats(),
            "spdl_decoder": self.settings.decoder,
            "spdl_decode_threads": self.decode_threads,
            "jpeg_backend": self.decoder.jpeg_backend(),
            "region_decode": self.decoder.decodes_regions(),
            DECODED_BY: dict(self._decoded_by),
            **self.buffers.stats(),
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
