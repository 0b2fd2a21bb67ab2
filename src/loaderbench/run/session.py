"""A run's set-up and finish, around whatever train.py or eval.py does in between.

``open_session`` converts the composed config once (``validate_config``: the typed
``RunConfig``; a plain dict of it as composed, for W&B, the checkpoint and resume's rule), runs
the set-up steps in order, each a small function that takes the typed piece it needs and
returns what it makes (``start_process``, ``find_dataset``, ``prepare_page_cache``,
``start_logger``), hands the ``Session`` to the task, and whatever happens, finishes:
``metrics.json`` and ``run_config.json`` written (rank 0, ``records``), W&B finished, the
process group shut down. metrics.json is the session's typed record (``measure.record``): the
set-up fills its sections, and the task's steps return their figures, which the task records
with ``Session.record``.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import torch
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from loaderbench.config.loader import AUTO
from loaderbench.config.schema import BenchConfig, DatasetConfig, LoggerConfig, RunConfig
from loaderbench.data.discovery import DatasetIndex, discover, resolve_path
from loaderbench.data.resumed import ResumedEpoch
from loaderbench.imaging.crops import CROP_STREAM
from loaderbench.imaging.decoded_by import fallback_warning
from loaderbench.imaging.files import set_max_pixels
from loaderbench.loaders import Loader, LoaderSettings, LoaderSpec, build_loader
from loaderbench.measure.meters import IntervalRates, LoopMeter, loop_metrics
from loaderbench.measure.metrics import (
    DECODED_BY,
    PEAK_RSS_MB,
    SKIPPED_FILES,
    loop_rates,
    rank_rows,
    straggler_note,
)
from loaderbench.measure.process_tree import CpuWindow, ProcessTreeMonitor
from loaderbench.measure.ranks import reduce_loop_metrics
from loaderbench.measure.record import DataSetFacts, RunRecord, WhatRan
from loaderbench.platform import distributed
from loaderbench.platform.distributed import DistInfo
from loaderbench.platform.pagecache import evict, files_under
from loaderbench.platform.runtime import (
    Precision,
    resolve_device,
    resolve_precision,
    seed_everything,
    set_intra_op_threads,
    synchronizer,
)
from loaderbench.platform.stopping import (
    Preempted,
    preemption_noted,
    raise_if_stop_requested,
    stop_signals_as_interrupt,
)
from loaderbench.platform.version import VERSION
from loaderbench.run._elastic import Continued, fit_to_checkpoint
from loaderbench.run._records import (
    pinned_host_peak_bytes,
    skipped_counts,
    tree_totals,
    write_metrics,
    write_run_config,
)
from loaderbench.run._resume_rules import Resumable, find_resumable, note_fresh_start
from loaderbench.run._tracking import NullLogger, RunLogger, build_logger
from loaderbench.run._validation import validate_against_dataset, validate_config
from loaderbench.run.sweeps import job_name, sweep_group, swept_keys

log = logging.getLogger(__name__)


@dataclass
class Session:
    """What the set-up made, for the task's steps to take from."""

    # The whole run's typed config as validated; never rewritten (the loader's settings as the
    # run settles them are ``loader``, and ``num_workers=auto``'s count is the probe's return).
    config: RunConfig
    task: str
    run_dir: Path
    dist: DistInfo
    device: torch.device
    precision: Precision
    dataset: DatasetIndex
    logger: RunLogger
    monitor: ProcessTreeMonitor
    # The config as composed (resolved; ``num_workers`` as asked), a plain dict converted
    # once: W&B's config, the checkpoint's, and what resume's "same run?" rule compares.
    composed: dict[str, Any]
    # The run's one set of loader settings, settled: ``config.loader`` with the per-rank batch
    # of a resume on another number of ranks (``fit_to_checkpoint``), and the count
    # ``num_workers=auto`` settles on (``autotune.settle_num_workers``) once it has. What every
    # loader is built with, and what ``run_config.json`` records.
    loader: LoaderSettings
    # metrics.json, typed (``measure.record``); built from ``composed`` where not given.
    run_record: RunRecord | None = None
    eval_steps: int = 0  # batches over every evaluation pass so far: the eval curves' axis
    resumable: Resumable | None = None  # the run directory's own checkpoint, to continue
    # Per split, what ``Loader.prepare`` did before its loader was built (memmap: built the
    # cache), over the loader's own numbers: ``loader.num_workers=auto`` prepares first.
    prepared: dict[str, dict[str, Any]] = field(default_factory=dict)
    # Per split, the files (indices) its loaders skipped on this rank, each once.
    skipped: dict[str, set[int]] = field(default_factory=dict)
    # A resume on another number of ranks: the interrupted epoch, as these ranks continue it.
    resumed_epoch: ResumedEpoch | None = None

    def __post_init__(self) -> None:
        if self.run_record is None:
            self.run_record = RunRecord(what_ran(self.composed, self.task))

    @property
    def record_(self) -> RunRecord:
        assert self.run_record is not None  # __post_init__ makes one
        return self.run_record

    @property
    def metrics(self) -> dict[str, Any]:
        """The run's record as metrics.json's keys (a copy: write through ``record``)."""
        return self.record_.as_dict()

    def record(self, values: dict[str, Any] | None = None, **more: Any) -> None:
        """Add a step's figures (the metric catalog's keys) to the run's record."""
        self.record_.add(values, **more)

    def loader_spec(
        self,
        split: str,
        *,
        train: bool,
        image_size: int,
        settings: LoaderSettings | None = None,
    ) -> LoaderSpec:
        """``split``'s loader spec, with ``settings`` (default: the run's, ``loader``)."""
        config = self.config
        return LoaderSpec(
            split=self.dataset.split(split),
            train=train,
            image_size=image_size,
            device=self.device,
            settings=settings or self.loader,
            seed=config.seed,
            rrc_scale=tuple(config.augment.scale),
            rrc_ratio=tuple(config.augment.ratio),
            on_error=config.dataset.on_error,
            rank=self.dist.rank,
            world_size=self.dist.world_size,
            resumed=self.resumed_epoch if train else None,
        )

    @contextmanager
    def open_loader(self, split: str, *, train: bool, image_size: int) -> Iterator[Loader]:
        """The loader for ``split`` with the run's settled settings (``loader``); closed, and
        its numbers recorded, at the end."""
        loader = build_loader(self.loader_spec(split, train=train, image_size=image_size))
        try:
            yield loader
        finally:
            loader.close()
            self.skipped.setdefault(split, set()).update(loader.skipped_indices())
            stats = {**loader.stats(), **self.prepared.get(split, {})}
            self.record_.add_loader(split, stats)
            # Pillow decodes where a loader names no other library (torchvision, memmap raw).
            primary = stats.get("jpeg_backend", "pil")
            if warning := fallback_warning(split, stats.get(DECODED_BY) or {}, primary):
                log.warning(warning)

    def meter(self) -> LoopMeter:
        """A meter for the next loop. The first one marks the end of start-up: ``startup_s``
        is the time from the process's start (interpreter and imports included) to here, so
        ``startup_s + ttfb_s`` is what a user waits for the first batch."""
        if "startup_s" not in self.record_.figures:
            self.record(startup_s=time.time() - psutil.Process().create_time())
        edges = synchronizer(self.device)
        bench = self.config.bench
        sync = edges if bench.sync_cuda else None
        return LoopMeter(bench.warmup_batches, sync=sync, window_sync=edges)

    def eval_curve(self, meter: LoopMeter) -> Callable[[int], None]:
        """``evaluate``'s log points as W&B rows: throughput and data wait since the last one,
        against ``eval/step`` (batches over every evaluation pass of the run; ``end_eval``
        adds a finished pass's)."""
        rates, start = IntervalRates(meter), self.eval_steps

        def on_log(batches: int) -> None:
            rows = {f"eval/{key}": value for key, value in rates.take().items()}
            self.logger.log({"eval/step": start + batches, **rows})

        return on_log

    def end_eval(self, meter: LoopMeter) -> None:
        self.eval_steps += meter.batches

    def loop_metrics(
        self, meter: LoopMeter, window: CpuWindow, since: tuple[int, float] = (0, 0.0)
    ) -> dict[str, Any]:
        """A loop's numbers over every rank (images and throughput summed); ``since``: from
        that (``meter.batches``, ``window.cpu_s``) on, an epoch's (rates None where it had
        no batch). With each rank's own (``rank_<key>``) and its tree's peak memory so far."""
        batches, cpu_s = since
        mine = loop_metrics(meter, window.cpu_s - cpu_s, since=batches)
        mine[PEAK_RSS_MB] = self.monitor.peak_rss_bytes / 2**20
        metrics = reduce_loop_metrics(mine, self.dist.world_size)
        if not metrics["images"]:
            metrics.update(dict.fromkeys(loop_rates()))
        return metrics

    @contextmanager
    def keep_partial(self, meter: LoopMeter, window: CpuWindow) -> Iterator[None]:
        """If the loop inside fails or is stopped, record what it measured (this rank's)."""
        try:
            yield
        except BaseException:
            if meter.batches:
                self.record(loop_metrics(meter, window.cpu_s))
            raise


# ---------------------------------------------------------------------------------------------
# Set-up steps.


def start_process(config: RunConfig, info: DistInfo) -> tuple[torch.device, Precision]:
    """Seeds, this rank's device and process group, the log level, the pixel limit."""
    # Each rank its own random streams (dropout, drop-path), as timm's train.py does; the
    # model's initial weights are rank 0's anyway (DDP broadcasts them).
    seed_everything(config.seed + info.rank)
    device = resolve_device(config.device, info.local_rank if info.enabled else None)
    # The typed config says what runs (run_config.json): ``auto`` resolved, and the GPU taken
    # (torchrun's LOCAL_RANK over ``device.index``); the composed dict keeps what was asked.
    config.device.type = device.type
    config.device.index = device.index if device.index is not None else config.device.index
    distributed.init(info, device)
    if not info.is_main:  # one rank speaks for the job
        logging.getLogger("loaderbench").setLevel(logging.WARNING)
    precision = resolve_precision(config.precision.name, device)
    # Before any loader forks a worker, so every worker process inherits the limit.
    set_max_pixels(config.dataset.max_image_pixels)
    return device, precision


def find_dataset(
    dataset_config: DatasetConfig, settings: LoaderSettings, task: str, ranks: int
) -> DatasetIndex:
    """The dataset, discovered and checked against the settings that depend on its size."""
    dataset = discover(dataset_config)
    validate_against_dataset(settings, len(dataset.train), task, ranks)
    return dataset


def prepare_page_cache(bench: BenchConfig, dataset: DatasetIndex, settings: LoaderSettings) -> str:
    """``cold`` after evicting the images and the loader's folders; ``warm`` (as found) else.
    With ``loader.num_workers=auto`` the eviction is left to after the worker probe
    (``autotune.settle_num_workers``), which reads the files and would warm them again."""
    if not bench.drop_page_cache:
        return "warm"
    if not settings.auto_workers:
        evict_page_cache(dataset, settings.folders())
    return "cold"


def evict_page_cache(dataset: DatasetIndex, folders: Iterable[str]) -> None:
    """The images of both splits and every file of the loader's folders (``folders()`` of
    its settings: memmap's cache) out of the page cache."""
    paths = [*dataset.train.paths, *dataset.val.paths]
    for folder in folders:
        paths += files_under(resolve_path(folder))
    files, nbytes = evict(paths)
    log.info("evicted %d files (%.1f MB) from the page cache", files, nbytes / 2**20)


def sweep_identity() -> tuple[str | None, str | None]:
    """W&B group (the sweep) and run name (its overrides); both None for a single run."""
    hydra_cfg = HydraConfig.get()
    if hydra_cfg.mode != RunMode.MULTIRUN:
        return None, None
    sweep_dir = Path(hydra_cfg.sweep.dir)
    group = sweep_group(hydra_cfg.job.name, sweep_dir)
    name = job_name(list(hydra_cfg.overrides.task), swept_keys(sweep_dir))
    return group, name or hydra_cfg.job.override_dirname or f"job{hydra_cfg.job.num}"


def start_logger(
    logger_config: LoggerConfig,
    composed: dict[str, Any],
    run_dir: Path,
    task: str,
    info: DistInfo,
    run_id: str | None = None,
) -> RunLogger:
    """The run's W&B run (rank 0 only), given the whole config as composed; ``run_id``: the
    one a requeued job continues."""
    if not info.is_main:
        return NullLogger()
    group, name = sweep_identity()
    return build_logger(
        logger_config,
        run_dir=run_dir,
        config=composed,
        job_type=task,
        group=group,
        name=name,
        run_id=run_id,
    )


def what_ran(composed: dict[str, Any], task: str) -> WhatRan:
    """What ran, known before anything starts (from the config as composed: a run whose
    config fails validation records it too)."""
    loader = composed["loader"]
    return WhatRan(
        task=task,
        loader=loader["name"],
        model=composed["model"]["name"],
        device=composed["device"]["type"],
        precision=composed["precision"]["name"],
        num_workers_auto=loader["num_workers"] == AUTO,
        prefetch=loader["prefetch"],
        image_size=composed["image_size"],
        seed=composed["seed"],
        crop_stream=CROP_STREAM,
        version=VERSION,
    )


def dataset_facts(dataset: DatasetIndex) -> DataSetFacts:
    return DataSetFacts(
        num_classes=dataset.num_classes,
        train_size=len(dataset.train),
        val_size=len(dataset.val),
        dataset_root=str(dataset.root),
        dataset_index_check=dataset.checked,
        dataset_files_changed=dataset.files_changed,
    )


def record_totals(record: RunRecord, totals: dict[str, Any]) -> None:
    """The process tree's totals (``tree_totals``, ``skipped_counts``) into their places: the
    distinct skipped files in the ending, each split's with its loader, the rest as figures."""
    figures = dict(totals)
    record.ending.skipped_files = figures.pop(SKIPPED_FILES, record.ending.skipped_files)
    per_split = f"_{SKIPPED_FILES}"
    for key in [key for key in figures if key.startswith("loader_") and key.endswith(per_split)]:
        split = key.removeprefix("loader_").removesuffix(per_split)
        record.add_loader(split, {SKIPPED_FILES: figures.pop(key)})
    record.add(figures)


# ---------------------------------------------------------------------------------------------
# The session itself.


@contextmanager
def open_session(cfg: DictConfig, task: str) -> Iterator[Session]:
    """Set a job up from the composed ``cfg`` (converted here, once); whatever happens
    inside, metrics.json is written and W&B finished."""
    with stop_signals_as_interrupt(), preemption_noted():
        started = time.perf_counter()
        run_dir = Path(HydraConfig.get().runtime.output_dir)
        composed = OmegaConf.to_container(cfg, resolve=True)
        assert isinstance(composed, dict)
        record = RunRecord(what_ran(composed, task))
        ending = record.ending
        monitor = ProcessTreeMonitor()
        info = distributed.dist_info()
        session: Session | None = None
        try:
            session = _set_up(cfg, composed, task, run_dir, info, monitor, record)
            yield session
            raise_if_stop_requested()  # a signal whose KeyboardInterrupt Python swallowed
            totals = tree_totals(monitor, session.dataset, session.skipped, info.world_size)
            record_totals(record, totals)
            ending.status = "ok"
        except KeyboardInterrupt:
            ending.status = "interrupted"
            raise
        except Preempted:
            ending.status = "preempted"
            raise
        except BaseException as error:
            ending.status, ending.error = "failed", f"{type(error).__name__}: {error}"
            raise
        finally:
            monitor.stop()
            record.add({PEAK_RSS_MB: monitor.peak_rss_bytes / 2**20})
            ending.wall_s = time.perf_counter() - started
            # A preempted or interrupted run too (the usual end on a cluster): its epochs'
            # per-rank figures so far (no collective here: the ranks may not all be in it).
            stopped = ending.status in ("ok", "preempted", "interrupted")
            if info.is_main and stopped and (note := straggler_note(record.as_dict())):
                log.warning(note)
            _finish(session, info, run_dir, record)


def _set_up(
    cfg: DictConfig,
    composed: dict[str, Any],
    task: str,
    run_dir: Path,
    info: DistInfo,
    monitor: ProcessTreeMonitor,
    record: RunRecord,
) -> Session:
    config = validate_config(cfg)  # every key, before anything starts; cfg is not read again
    device, precision = start_process(config, info)
    placement = record.placement
    placement.world_size, record.what.device = info.world_size, str(device)
    resumable = find_resumable(config, composed, run_dir, task)
    note_fresh_start(config, run_dir, task, info.world_size)
    # A resume keeps the checkpoint's global batch: on another number of ranks, another
    # per-rank batch, settled here before anything reads it.
    continued = (
        fit_to_checkpoint(config, resumable, info.world_size)
        if task == "train"
        else Continued(config.loader)
    )
    settings = continued.settings
    placement.batch_size = settings.batch_size
    placement.global_batch = settings.batch_size * info.world_size
    if not settings.auto_workers:  # else recorded where the probe settles the count
        threads = set_intra_op_threads(config.runtime.threads, settings.num_workers)
        placement.num_workers = settings.num_workers
        placement.intra_op_threads, placement.intra_op_threads_source = threads
    dataset = find_dataset(config.dataset, settings, task, info.world_size)
    record.data = dataset_facts(dataset)
    record.data.page_cache = prepare_page_cache(config.bench, dataset, settings)
    if task == "train":
        record.data.requeues = resumable.requeues if resumable else 0
    run_id = resumable and resumable.wandb_run_id
    logger = start_logger(config.logger, composed, run_dir, task, info, run_id)
    monitor.start()
    return Session(
        config,
        task,
        run_dir,
        info,
        device,
        precision,
        dataset,
        logger,
        monitor,
        composed,
        settings,
        record,
        resumable=resumable,
        resumed_epoch=continued.resumed,
    )


def _finish(session: Session | None, info: DistInfo, run_dir: Path, record: RunRecord) -> None:
    ending = record.ending
    if ending.status != "ok" and session is not None:  # not reduced over ranks: this rank's
        record_totals(record, skipped_counts(session.dataset, session.skipped))
    if session is not None and session.device.type == "cuda":
        ending.pinned_host_peak_mb = pinned_host_peak_bytes() / 2**20
    metrics = record.as_dict()
    if info.is_main:
        write_metrics(run_dir, metrics)
        if session is not None:
            write_run_config(run_dir, session.config, session.loader)
    if ending.status == "preempted":
        # Every rank stopped at the same step. They leave together once rank 0's records are
        # written: torchrun stops every rank as soon as one exits with an error.
        _finish_logger(session, metrics)
        distributed.barrier()
        distributed.shutdown()
    else:
        distributed.shutdown(failed=ending.status != "ok")
        _finish_logger(session, metrics)
    log.info("metrics: %s", json.dumps(metrics, sort_keys=True))


def _finish_logger(session: Session | None, metrics: dict[str, Any]) -> None:
    if session is not None:
        session.logger.log_table("rank_table", rank_rows(metrics))  # data-parallel runs
        session.logger.summary({k: v for k, v in metrics.items() if v is not None})
        session.logger.finish(exit_code=0 if metrics["status"] == "ok" else 1)
