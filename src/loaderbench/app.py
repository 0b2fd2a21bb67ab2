"""What train.py and eval.py run: a session (``loaderbench.run.session``), a loader, a model, and
the loop that ties them; every step returns its numbers and the task records them."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig
from torch import nn

from loaderbench.autotune import evaluation_workload, settle_num_workers, training_workload
from loaderbench.config.schema import ModelConfig
from loaderbench.loaders import Loader
from loaderbench.measure.metrics import TOP1
from loaderbench.measure.process_tree import CpuWindow
from loaderbench.measure.record import CeilingFacts
from loaderbench.platform.stopping import Preempted, requeue
from loaderbench.run.autorange import WindowRule, run_passes
from loaderbench.run.ceiling import job_ceiling
from loaderbench.run.checkpoint import load_checkpoint
from loaderbench.run.fitting import evaluation_pass
from loaderbench.run.fitting import fit as fit_epochs
from loaderbench.run.session import Session, open_session
from loaderbench.training.loops import consume, evaluate
from loaderbench.training.models import NO_MODEL, build_model, maybe_compile

log = logging.getLogger(__name__)

# eval.py's image size with model=none and no image_size given.
DEFAULT_IMAGE_SIZE = 64


def run_job(task: Callable[[DictConfig], dict[str, Any]], cfg: DictConfig) -> float | None:
    """Run a job; in a sweep a failed job is logged (and its metrics.json says so) but does
    not abort the jobs after it, so the sweep summary can report it as a failed row."""
    try:
        return task(cfg).get(TOP1)
    except Preempted:
        # State saved: the scheduler requeues the job (submitit's handler exits here), or,
        # outside SLURM, the same command in the same run directory continues it.
        if not requeue():
            log.warning("preempted outside a requeueing job: run again to continue")
        raise
    except Exception:
        if HydraConfig.get().mode != RunMode.MULTIRUN:
            raise
        log.exception("job %s failed; the sweep goes on", HydraConfig.get().job.num)
        return None


def batches_a_pass(loader: Loader, max_batches: int | None) -> int:
    """Batches one pass over ``loader`` makes (``bench.max_batches`` cuts it)."""
    return len(loader) if max_batches is None else min(len(loader), max_batches)


def measure_loader(session: Session, loader: Loader) -> dict[str, Any]:
    """model=none: the loader alone, over ``bench.epochs`` passes (auto: until the steady
    window is a measurement, ``run.autorange``)."""
    meter, window = session.meter(), CpuWindow(session.monitor)
    name, bench = session.loader.name, session.config.bench

    def one_pass(epoch: int, next_epoch: bool) -> None:
        loader.set_epoch(epoch, next_epoch=next_epoch)
        consume(loader, meter, max_batches=bench.max_batches, desc=f"{name} pass {epoch}")

    per_pass = batches_a_pass(loader, bench.max_batches)
    # One CPU window over every pass: the work between passes (a loader reading ahead) counts.
    with session.keep_partial(meter, window), window:
        passes = run_passes(meter, one_pass, WindowRule.of(bench), per_pass)
    return {**session.loop_metrics(meter, window), **passes.metrics()}


def evaluate_model(session: Session, model: nn.Module, loader: Loader) -> dict[str, Any]:
    """Accuracy from one pass over the val set; its throughput over as many passes as
    ``bench.epochs`` says (auto: until the steady window is a measurement)."""
    meter, window = session.meter(), CpuWindow(session.monitor)
    bench = session.config.bench
    accuracy: dict[str, Any] = {}

    def one_pass(epoch: int, next_epoch: bool) -> None:
        loader.set_epoch(epoch, next_epoch=next_epoch)
        if epoch == 0:
            counts = evaluation_pass(session, model, loader, meter, max_batches=bench.max_batches)
            accuracy.update(counts.metrics())
        else:  # throughput only: the accuracy is the first pass's
            evaluate(
                model,
                loader,
                session.precision,
                session.device,
                meter,
                max_batches=bench.max_batches,
                desc=f"val pass {epoch}",
            )

    per_pass = batches_a_pass(loader, bench.max_batches)
    with session.keep_partial(meter, window), window:
        passes = run_passes(meter, one_pass, WindowRule.of(bench), per_pass)
    return {**session.loop_metrics(meter, window), **passes.metrics(), **accuracy}


def train(cfg: DictConfig) -> dict[str, Any]:
    """train.py's task on the composed ``cfg`` (converted once, by ``open_session``)."""
    with open_session(cfg, "train") as session:
        config = session.config
        image_size = config.image_size
        model = build_model(config.model, session.dataset.num_classes, session.device)
        settle_num_workers(session, training_workload(session, model, image_size))
        with session.open_loader("train", train=True, image_size=image_size) as loader:
            if model is None:
                measured = measure_loader(session, loader)
                session.record(measured, epochs=measured["passes"])
            else:
                val = session.open_loader("val", train=False, image_size=image_size)
                with val as val_loader:
                    for epoch_metrics in fit_epochs(session, model, loader, val_loader):
                        session.record(epoch_metrics)
        session.record_.ceiling = CeilingFacts(
            **job_ceiling(session, model, image_size, train=True)
        )
    return session.metrics


@dataclass
class Trained:
    """A train.py checkpoint's model, ready to evaluate."""

    model: nn.Module
    name: str
    image_size: int
    checkpoint: str


def load_trained(session: Session) -> Trained:
    """checkpoint=PATH's model, checked against the dataset and the command line."""
    path, asked = session.config.checkpoint, session.config.model
    if path is None:
        raise ValueError(
            "eval.py needs checkpoint=PATH (or model=none to measure the loader alone)"
        )
    state = load_checkpoint(path)
    saved = state["config"]  # the training run's config, as composed
    if list(state["classes"]) != list(session.dataset.classes):
        raise ValueError(
            f"checkpoint {path} was trained on {len(state['classes'])} classes "
            f"that differ from the {session.dataset.num_classes} classes of "
            f"{session.dataset.root}"
        )
    model_config = saved_model_config(saved["model"])
    if asked.name != "from_checkpoint":
        if asked.name != model_config.name:
            raise ValueError(
                f"model.name={asked.name!r} but checkpoint {path} holds "
                f"{model_config.name!r}; leave model unset to use the checkpoint's"
            )
        model_config = asked
    model_config = dataclasses.replace(model_config, pretrained=False)
    model = build_model(model_config, len(state["classes"]), session.device)
    assert model is not None
    model.load_state_dict(state["model"])
    checkpoint = str(Path(path).absolute())
    return Trained(model, saved["model"]["name"], saved["image_size"], checkpoint)


def saved_model_config(saved: dict[str, Any]) -> ModelConfig:
    """A checkpoint's ``model`` config, typed (keys a later version dropped left out)."""
    known = {item.name for item in dataclasses.fields(ModelConfig)}
    return ModelConfig(**{key: value for key, value in saved.items() if key in known})


def eval_image_size(requested: int | None, trained: Trained | None) -> int:
    """image_size=N if given (warning when it is not the checkpoint's), else the checkpoint's,
    else DEFAULT_IMAGE_SIZE."""
    if trained is None:
        return DEFAULT_IMAGE_SIZE if requested is None else requested
    if requested is not None and requested != trained.image_size:
        log.warning(
            "evaluating at image_size=%d; the checkpoint was trained at %d",
            requested,
            trained.image_size,
        )
    return trained.image_size if requested is None else requested


def evaluate_checkpoint(cfg: DictConfig) -> dict[str, Any]:
    """eval.py's task on the composed ``cfg`` (converted once, by ``open_session``)."""
    with open_session(cfg, "eval") as session:
        config = session.config
        trained = load_trained(session) if config.model.name != NO_MODEL else None
        image_size = eval_image_size(config.image_size, trained)
        what = session.record_.what
        what.image_size = image_size
        if trained is not None:
            what.model, what.checkpoint = trained.name, trained.checkpoint
        bare = trained.model if trained is not None else None
        workload = evaluation_workload(session, bare, image_size, trained and trained.name)
        settle_num_workers(session, workload)
        with session.open_loader("val", train=False, image_size=image_size) as loader:
            if trained is None:
                session.record(measure_loader(session, loader))
            else:
                model = maybe_compile(trained.model, config.model)
                session.record(evaluate_model(session, model, loader))
        evaluated = model if trained is not None else None
        ceiling = job_ceiling(session, evaluated, image_size, train=False)
        session.record_.ceiling = CeilingFacts(**ceiling)
    return session.metrics
