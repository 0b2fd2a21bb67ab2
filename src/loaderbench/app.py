"""What train.py and eval.py run: compose a dataset, a loader, a model, a device and a
precision from the config, run the loop, and leave metrics.json (and W&B) behind."""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf
from torch import nn

from loaderbench import __version__, distributed
from loaderbench.checkpoint import load_checkpoint, rng_state, save_checkpoint, set_rng_state
from loaderbench.data import DatasetIndex, discover, resolve_path
from loaderbench.distributed import DistInfo
from loaderbench.engine import EvalCounts, TrainStep, consume, evaluate, train_one_epoch
from loaderbench.images import set_max_pixels
from loaderbench.loaders import Loader, build_loader, loader_spec
from loaderbench.locking import atomic_write_text
from loaderbench.meters import CpuWindow, LoopMeter, ProcessTreeMonitor
from loaderbench.models import NO_MODEL, build_model, maybe_compile
from loaderbench.optim import build_optimizer, build_scheduler
from loaderbench.pagecache import evict, files_under
from loaderbench.runtime import (
    Precision,
    resolve_device,
    resolve_precision,
    seed_everything,
    synchronizer,
)
from loaderbench.stopping import raise_if_stop_requested, stop_signals_as_interrupt
from loaderbench.sweeps import job_name, sweep_group, swept_keys
from loaderbench.tracking import NullLogger, RunLogger, build_logger
from loaderbench.validation import validate_against_dataset, validate_config

log = logging.getLogger(__name__)

METRICS_FILE = "metrics.json"
CHECKPOINT_FILE = "checkpoint.pt"
DEFAULT_IMAGE_SIZE = 64


@dataclass
class Run:
    """Everything a job shares between its steps."""

    cfg: DictConfig
    task: str
    run_dir: Path
    device: torch.device
    precision: Precision
    dataset: DatasetIndex
    logger: RunLogger
    monitor: ProcessTreeMonitor
    started: float
    metrics: dict[str, Any] = field(default_factory=dict)
    dist: DistInfo = field(default_factory=DistInfo)

    def loader(self, split: str, *, train: bool) -> Loader:
        spec = loader_spec(
            self.cfg,
            self.dataset.split(split),
            train=train,
            device=self.device,
            rank=self.dist.rank,
            world_size=self.dist.world_size,
        )
        spec.options.setdefault("on_error", self.cfg.dataset.on_error)
        return build_loader(self.cfg.loader.name, spec)

    def meter(self) -> LoopMeter:
        sync = synchronizer(self.device) if self.cfg.bench.sync_cuda else None
        return LoopMeter(warmup_batches=self.cfg.bench.warmup_batches, sync=sync)


def hydra_run_dir() -> Path:
    return Path(HydraConfig.get().runtime.output_dir)


def sweep_identity() -> tuple[str | None, str | None]:
    """W&B group (the sweep) and run name (its overrides); both None for a single run."""
    hydra_cfg = HydraConfig.get()
    if hydra_cfg.mode != RunMode.MULTIRUN:
        return None, None
    sweep_dir = Path(hydra_cfg.sweep.dir)
    group = sweep_group(hydra_cfg.job.name, sweep_dir)
    name = job_name(list(hydra_cfg.overrides.task), swept_keys(sweep_dir))
    return group, name or hydra_cfg.job.override_dirname or f"job{hydra_cfg.job.num}"


def run_job(task: Callable[[DictConfig], dict[str, Any]], cfg: DictConfig) -> float | None:
    """Run a job; in a sweep a failed job is logged (and its metrics.json says so) but does
    not abort the jobs after it, so the sweep summary can report it as a failed row."""
    try:
        return task(cfg).get("top1")
    except Exception:
        if HydraConfig.get().mode != RunMode.MULTIRUN:
            raise
        log.exception("job %s failed; the sweep goes on", HydraConfig.get().job.num)
        return None


def base_metrics(cfg: DictConfig, task: str, device: torch.device | None) -> dict[str, Any]:
    return {
        "task": task,
        "status": "running",
        "loader": cfg.loader.name,
        "model": cfg.model.name,
        "device": str(device) if device is not None else cfg.device.type,
        "precision": cfg.precision.name,
        "batch_size": cfg.loader.batch_size,
        "num_workers": cfg.loader.num_workers,
        "prefetch": cfg.loader.prefetch,
        "image_size": cfg.image_size,
        "seed": cfg.seed,
        "skipped_files": 0,
        "version": __version__,
    }


def write_metrics(run_dir: Path, metrics: dict[str, Any]) -> None:
    def clean(value: Any) -> Any:
        if isinstance(value, float) and not math.isfinite(value):
            return None
        return value

    payload = {key: clean(value) for key, value in metrics.items()}
    atomic_write_text(run_dir / METRICS_FILE, json.dumps(payload, indent=2, sort_keys=True) + "\n")


@contextmanager
def open_run(cfg: DictConfig, task: str) -> Iterator[Run]:
    """Set up a job; whatever happens inside, metrics.json is written and W&B finished."""
    with stop_signals_as_interrupt():
        yield from _open_run(cfg, task)


def _open_run(cfg: DictConfig, task: str) -> Iterator[Run]:
    started = time.perf_counter()
    run_dir = hydra_run_dir()
    metrics = base_metrics(cfg, task, None)
    logger: RunLogger | None = None
    monitor = ProcessTreeMonitor()
    info = distributed.dist_info()
    try:
        validate_config(cfg)
        seed_everything(cfg.seed)
        device = resolve_device(cfg.device, info.local_rank if info.enabled else None)
        distributed.init(info, device)
        metrics["world_size"] = info.world_size
        if not info.is_main:  # one rank speaks for the job
            logging.getLogger("loaderbench").setLevel(logging.WARNING)
        precision = resolve_precision(cfg.precision.name, device)
        metrics["device"] = str(device)
        # Before any loader forks a worker, so every worker process inherits the limit.
        set_max_pixels(cfg.dataset.max_image_pixels)
        dataset = discover(cfg.dataset)
        validate_against_dataset(cfg, len(dataset.train), task, info.world_size)
        metrics.update(
            num_classes=dataset.num_classes,
            train_size=len(dataset.train),
            val_size=len(dataset.val),
            dataset_root=str(dataset.root),
        )
        metrics["page_cache"] = prepare_page_cache(cfg, dataset)
        group, name = sweep_identity()
        logger = (
            NullLogger()
            if not info.is_main
            else build_logger(
                cfg.logger,
                run_dir=run_dir,
                config=OmegaConf.to_container(cfg, resolve=True),
                job_type=task,
                group=group,
                name=name,
            )
        )
        monitor.start()
        run = Run(
            cfg, task, run_dir, device, precision, dataset, logger, monitor, started, metrics, info
        )
        yield run
        raise_if_stop_requested()  # a signal whose KeyboardInterrupt Python swallowed
        monitor.sample()
        peak, skipped = distributed.all_reduce(
            [float(monitor.peak_rss_bytes), float(metrics.get("skipped_files", 0))]
        )
        monitor.peak_rss_bytes, metrics["skipped_files"] = int(peak), int(skipped)
        metrics["status"] = "ok"
    except KeyboardInterrupt:
        metrics["status"] = "interrupted"
        raise
    except BaseException as error:
        metrics["status"] = "failed"
        metrics["error"] = f"{type(error).__name__}: {error}"
        raise
    finally:
        monitor.stop()
        metrics["peak_rss_mb"] = monitor.peak_rss_bytes / 2**20
        metrics["wall_s"] = time.perf_counter() - started
        if info.is_main:
            write_metrics(run_dir, metrics)
        distributed.shutdown()
        if logger is not None:
            logger.summary({k: v for k, v in metrics.items() if v is not None})
            logger.finish(exit_code=0 if metrics["status"] == "ok" else 1)
        log.info("metrics: %s", json.dumps(metrics, sort_keys=True))


def prepare_page_cache(cfg: DictConfig, dataset: DatasetIndex) -> str:
    """``cold`` after evicting the images and the loader's cache; ``warm`` (as found) else."""
    if not cfg.bench.drop_page_cache:
        return "warm"
    paths = [*dataset.train.paths, *dataset.val.paths]
    cache_dir = cfg.loader.get("cache_dir")
    if cache_dir:
        paths += files_under(resolve_path(cache_dir))
    files, nbytes = evict(paths)
    log.info("evicted %d files (%.1f MB) from the page cache", files, nbytes / 2**20)
    return "cold"


def record_loader_stats(metrics: dict[str, Any], loader: Loader, split: str) -> None:
    """The loader's own numbers (``loader_<split>_*``) and its skipped files, into metrics."""
    stats = loader.stats()
    metrics["skipped_files"] = metrics.get("skipped_files", 0) + int(stats.get("skipped_files", 0))
    metrics.update({f"loader_{split}_{k}": v for k, v in stats.items() if k != "skipped_files"})


def loop_metrics(meter: LoopMeter, cpu_s: float) -> dict[str, Any]:
    summary = meter.summary()
    images = summary["images"]
    return {
        "images": images,
        "images_per_s": summary["images_per_s"],
        "ttfb_s": summary["ttfb_s"],
        "data_wait_frac": summary["data_wait_frac"],
        "loop_s": summary["loop_s"],
        "cpu_s": cpu_s,
        "cpu_s_per_1k_images": 1000 * cpu_s / images if images else None,
    }


def benchmark_loader(run: Run, loader: Loader, epochs: int) -> dict[str, Any]:
    """model=none: the loader alone, over ``epochs`` passes."""
    meter = run.meter()
    window = CpuWindow(run.monitor)
    try:
        for epoch in range(epochs):
            loader.set_epoch(epoch)
            with window:
                consume(
                    loader,
                    meter,
                    max_batches=run.cfg.bench.max_batches,
                    desc=f"{run.cfg.loader.name} epoch {epoch}",
                )
    except BaseException:
        if meter.batches:  # interrupted or failed: what was measured (this rank's) still counts
            run.metrics.update(loop_metrics(meter, window.cpu_s))
        raise
    return distributed.reduce_loop_metrics(loop_metrics(meter, window.cpu_s), run.dist.world_size)


def _resume(
    run: Run,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
) -> int:
    """Load checkpoint=PATH into the training state; returns the epoch to continue from."""
    cfg = run.cfg
    if cfg.checkpoint is None:
        raise ValueError("train.resume=true needs checkpoint=PATH (a train.py checkpoint.pt)")
    state = load_checkpoint(cfg.checkpoint, map_location=run.device)
    if list(state["classes"]) != list(run.dataset.classes):
        raise ValueError(f"checkpoint {cfg.checkpoint} was trained on other classes")
    trained = state["config"]
    for key in ("image_size", "seed"):
        if trained[key] != cfg[key]:
            raise ValueError(
                f"{key}={cfg[key]} but checkpoint {cfg.checkpoint} was trained with "
                f"{trained[key]}; a resumed run must keep it"
            )
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    set_rng_state(state["rng"])
    run.metrics["resumed_from"] = str(Path(cfg.checkpoint).absolute())
    log.info("resuming from %s at epoch %d of %d", cfg.checkpoint, state["epoch"], cfg.epochs)
    return int(state["epoch"])


def reduce_counts(counts: EvalCounts) -> EvalCounts:
    """Accuracy over the whole val set: every rank's sums added up."""
    images, top1, top5, loss_sum = distributed.all_reduce(
        [counts.images, counts.correct_top1, counts.correct_top5, counts.loss_sum]
    )
    return EvalCounts(int(images), int(top1), int(top5), loss_sum)


def _parallel_models(run: Run, model: nn.Module) -> tuple[nn.Module, nn.Module]:
    """(the model to train, the model to evaluate): DDP around the first in a torchrun job."""
    if not run.dist.enabled:
        compiled = maybe_compile(model, run.cfg.model)
        return compiled, compiled
    from torch.nn.parallel import DistributedDataParallel

    device_ids = [run.device.index] if run.device.type == "cuda" else None
    return maybe_compile(
        DistributedDataParallel(model, device_ids=device_ids), run.cfg.model
    ), model


def _unwrap(model: nn.Module) -> nn.Module:
    return getattr(model, "_orig_mod", model)


def train(cfg: DictConfig) -> dict[str, Any]:
    with open_run(cfg, "train") as run:
        metrics = run.metrics
        model = build_model(cfg.model, run.dataset.num_classes, run.device)
        train_loader = run.loader("train", train=True)
        try:
            if model is None:
                metrics.update(benchmark_loader(run, train_loader, cfg.bench.epochs))
                metrics["epochs"] = cfg.bench.epochs
            else:
                _fit(run, model, train_loader)
        finally:
            train_loader.close()
            record_loader_stats(metrics, train_loader, "train")
    return metrics


def _fit(run: Run, model: nn.Module, train_loader: Loader) -> None:
    cfg, metrics = run.cfg, run.metrics
    steps_per_epoch = (
        len(train_loader)
        if cfg.bench.max_batches is None
        else min(len(train_loader), cfg.bench.max_batches)
    )
    optimizer = build_optimizer(cfg.optim, model)
    scheduler = build_scheduler(cfg.scheduler, optimizer, steps_per_epoch, cfg.epochs)
    train_model, eval_model = _parallel_models(run, model)
    step = TrainStep(
        model=train_model,
        optimizer=optimizer,
        scheduler=scheduler,
        criterion=nn.CrossEntropyLoss(label_smoothing=cfg.train.label_smoothing),
        precision=run.precision,
        scaler=run.precision.grad_scaler(run.device),
        device=run.device,
        grad_clip=cfg.train.grad_clip,
    )
    start_epoch = _resume(run, model, optimizer, scheduler) if cfg.train.resume else 0
    end_epoch = cfg.epochs
    if cfg.train.stop_after_epochs is not None:
        end_epoch = min(end_epoch, start_epoch + cfg.train.stop_after_epochs)
    meter = run.meter()
    window = CpuWindow(run.monitor)
    val_loader = run.loader("val", train=False)
    checkpoint_path = run.run_dir / CHECKPOINT_FILE
    try:
        for epoch in range(start_epoch, end_epoch):
            train_loader.set_epoch(epoch)
            with window:
                loss = train_one_epoch(
                    step,
                    train_loader,
                    meter,
                    max_batches=cfg.bench.max_batches,
                    desc=f"epoch {epoch + 1}/{cfg.epochs}",
                )
            counts = evaluate(
                eval_model,
                val_loader,
                run.precision,
                run.device,
                run.meter(),
                desc=f"val {epoch + 1}/{cfg.epochs}",
            )
            val = reduce_counts(counts).metrics()
            (loss,) = distributed.all_reduce([loss])
            loss /= run.dist.world_size
            so_far = distributed.reduce_loop_metrics(
                loop_metrics(meter, window.cpu_s), run.dist.world_size
            )
            metrics.update(so_far, loss=loss, epochs=epoch + 1, **val)
            lr = optimizer.param_groups[0]["lr"]
            log.info(
                "epoch %d/%d: loss %.4f, top1 %.4f, top5 %.4f, %.1f images/s, data wait %.1f%%",
                epoch + 1,
                cfg.epochs,
                loss,
                val["top1"],
                val["top5"],
                so_far["images_per_s"] or 0.0,
                100 * (so_far["data_wait_frac"] or 0.0),
            )
            run.logger.log(
                {
                    "epoch": epoch + 1,
                    "train/loss": loss,
                    "train/lr": lr,
                    "train/images_per_s": so_far["images_per_s"],
                    "train/data_wait_frac": so_far["data_wait_frac"],
                    "val/top1": val["top1"],
                    "val/top5": val["top5"],
                    "val/loss": val["val_loss"],
                },
                step=epoch + 1,
            )
            if not run.dist.is_main:
                continue
            save_checkpoint(
                checkpoint_path,
                {
                    "model": _unwrap(model).state_dict(),
                    "optimizer": optimizer.state_dict(),
                    "scheduler": scheduler.state_dict(),
                    "epoch": epoch + 1,
                    "config": OmegaConf.to_container(cfg, resolve=True),
                    "classes": list(run.dataset.classes),
                    "metrics": {
                        k: v
                        for k, v in metrics.items()
                        if isinstance(v, int | float | str) or v is None
                    },
                    "rng": rng_state(),
                },
            )
    finally:
        val_loader.close()
        record_loader_stats(metrics, val_loader, "val")


def evaluate_checkpoint(cfg: DictConfig) -> dict[str, Any]:
    with open_run(cfg, "eval") as run:
        metrics = run.metrics
        model = None
        if cfg.model.name != NO_MODEL:
            model = _model_from_checkpoint(run)
        if cfg.image_size is None:
            cfg.image_size = DEFAULT_IMAGE_SIZE
        metrics["image_size"] = cfg.image_size
        val_loader = run.loader("val", train=False)
        try:
            if model is None:
                metrics.update(benchmark_loader(run, val_loader, cfg.bench.epochs))
            else:
                meter = run.meter()
                window = CpuWindow(run.monitor)
                with window:
                    counts = evaluate(
                        maybe_compile(model, cfg.model),
                        val_loader,
                        run.precision,
                        run.device,
                        meter,
                        max_batches=cfg.bench.max_batches,
                    )
                metrics.update(
                    distributed.reduce_loop_metrics(
                        loop_metrics(meter, window.cpu_s), run.dist.world_size
                    ),
                    **reduce_counts(counts).metrics(),
                )
        finally:
            val_loader.close()
            record_loader_stats(metrics, val_loader, "val")
    return metrics


def _model_from_checkpoint(run: Run) -> nn.Module:
    cfg = run.cfg
    if cfg.checkpoint is None:
        raise ValueError(
            "eval.py needs checkpoint=PATH (or model=none to measure the loader alone)"
        )
    state = load_checkpoint(cfg.checkpoint)
    trained = OmegaConf.create(state["config"])
    if list(state["classes"]) != list(run.dataset.classes):
        raise ValueError(
            f"checkpoint {cfg.checkpoint} was trained on {len(state['classes'])} classes "
            f"that differ from the {run.dataset.num_classes} classes of {run.dataset.root}"
        )
    model_cfg = trained.model
    if cfg.model.name != "from_checkpoint":
        if cfg.model.name != trained.model.name:
            raise ValueError(
                f"model.name={cfg.model.name!r} but checkpoint {cfg.checkpoint} holds "
                f"{trained.model.name!r}; leave model unset to use the checkpoint's"
            )
        model_cfg = cfg.model
    if cfg.image_size is None:
        cfg.image_size = trained.image_size
    elif cfg.image_size != trained.image_size:
        log.warning(
            "evaluating at image_size=%d; the checkpoint was trained at %d",
            cfg.image_size,
            trained.image_size,
        )
    model = build_model(
        OmegaConf.merge(model_cfg, {"pretrained": False}), len(state["classes"]), run.device
    )
    assert model is not None
    model.load_state_dict(state["model"])
    run.metrics["model"] = trained.model.name
    run.metrics["checkpoint"] = str(Path(cfg.checkpoint).absolute())
    return model
