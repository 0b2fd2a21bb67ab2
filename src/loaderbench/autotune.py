"""``loader.num_workers=auto``: the fewest workers that keep this run fed on this machine.

Before the first epoch a probe runs the run's own loop at a ladder of worker counts (1, 2, 3,
4, 6, 8, 12, 16, ... up to the CPUs this process may use) and keeps the fewest workers whose
images/s is within ``loader.autotune.tolerance`` of the best it saw, or, if fewer, the fewest
whose loop was fed: a loop that waited ``w`` of its time for data could run at most
``1 / (1 - w)`` times faster with more workers, so at ``w <= tolerance / (1 + tolerance)``
(``fed_wait``) no count can beat it by more than the tolerance, and a higher count's better
rate in a window of a few batches is the machine's noise (or the probe's first steps warming
the process up), not the workers'. The loop is the real one: the configured loader, rebuilt
for each count, and the model's forward and backward on the run's device in its precision (the
optimizer does not step; ``model=none``: the loader alone, which always waits; eval.py: the
forward pass). It stops at the first fed count; otherwise it always measures a second count
(where the CPUs allow one), then climbs while a count beats the best before it by more than
``loader.autotune.gain``, and starts no count after ``loader.autotune.max_probe_s``. Where two
or more counts came out within ``loader.autotune.confirm_within`` of the best, and the fewest
of them was not fed, those are measured once more, in reverse order, and chosen on both
windows pooled: one window of a few batches does not resolve a few percent on a busy machine,
and the counts near the tolerance's edge are the ones its noise can swap.

The probe changes nothing the run computes: it reads probe epochs (``PROBE_EPOCH`` on), far
from the run's, so epoch 1's images, order and crops are untouched; it restores the model's
buffers (BatchNorm statistics) and mode and drops its gradients; and it runs inside saved and
restored random states (torch's, the CUDA device's, Python's, numpy's). A run with ``auto``
trains the same weights as one given the chosen count.

Under DDP every rank probes at the same time (they share the node's CPUs); each count's figures
are combined over the ranks (images/s summed, the job's rate; data wait the largest, since a
rank that waits holds every rank at the next all-reduce), so every rank climbs and stops alike,
and rank 0's choice is broadcast.

The choice is remembered in a small JSON file in the cache folder, keyed by what it depends on
(``decision_key``); the next run with the same key starts at once, and
``loader.autotune.refresh=true`` probes again.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import os
import platform
import random
import socket
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from omegaconf import OmegaConf
from torch import nn

from loaderbench import distributed
from loaderbench.data import resolve_path
from loaderbench.loaders import Batch, Loader, LoaderSpec, build_loader, prepare_loader
from loaderbench.loaders.settings import AutotuneSettings
from loaderbench.locking import atomic_write_text
from loaderbench.meters import LoopMeter, ProcessTreeMonitor
from loaderbench.runtime import Precision, allotted_cpus, set_intra_op_threads, synchronizer
from loaderbench.session import Session

log = logging.getLogger(__name__)

# The first epoch the probe reads: far from any run's, so the run's own epochs (their order and
# crops come from (seed, epoch)) are never the probe's.
PROBE_EPOCH = 10**6
# Each count's window holds whole rounds of its workers, at least this many.
MIN_ROUNDS = 2
KEY_VERSION = 1
FILE_PREFIX = "autotune-"


# ---------------------------------------------------------------------------------------------
# The ladder, a rung's figures and the choice.


def worker_ladder(max_workers: int) -> list[int]:
    """1, 2, 3, 4, 6, 8, 12, 16, 24, 32, ... below ``max_workers``, then ``max_workers``
    itself (at least 1): steps of about 1.5x, so a 64-core node needs 12 rungs, not 64."""
    top = max(1, max_workers)
    ladder, step = [1, 2, 3], 4
    while step < top:
        ladder += [step, step + step // 2]
        step *= 2
    return [n for n in ladder if n < top] + [top]


def cpus_allowed(env: os._Environ | dict[str, str] = os.environ) -> int:
    """The CPUs this process may use: its SLURM allotment or torchrun's share per local rank
    (``runtime.allotted_cpus``), else its affinity mask."""
    allotment = allotted_cpus(env)
    return max(1, allotment[0] if allotment else len(os.sched_getaffinity(0)))


@dataclass(frozen=True)
class ProbeRow:
    """One worker count's figures, over its measured window (every rank's, under DDP)."""

    workers: int
    images_per_s: float
    data_wait_frac: float
    cpu_s_per_1k_images: float | None
    images: int  # measured
    batches: int  # measured
    seconds: float  # the whole rung: loader built, filled, measured, closed
    windows: int = 1  # 2: measured again and pooled (``pooled``)

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @property
    def measured_s(self) -> float:
        return self.images / self.images_per_s if self.images_per_s > 0 else 0.0


def pooled(first: ProbeRow, second: ProbeRow) -> ProbeRow:
    """One count's two windows as one: images over the seconds both took, data wait weighted
    by those seconds, CPU by the images."""
    images = first.images + second.images
    seconds = first.measured_s + second.measured_s
    wait = (
        (first.data_wait_frac * first.measured_s + second.data_wait_frac * second.measured_s)
        / seconds
        if seconds
        else max(first.data_wait_frac, second.data_wait_frac)
    )
    cpu = [
        row.cpu_s_per_1k_images * row.images
        for row in (first, second)
        if row.cpu_s_per_1k_images is not None
    ]
    return ProbeRow(
        workers=first.workers,
        images_per_s=images / seconds if seconds else 0.0,
        data_wait_frac=wait,
        cpu_s_per_1k_images=sum(cpu) / images if cpu and images else None,
        images=images,
        batches=first.batches + second.batches,
        seconds=first.seconds + second.seconds,
        windows=first.windows + second.windows,
    )


def near_best(rows: list[ProbeRow], fraction: float) -> list[int]:
    """The counts whose images/s is at least ``(1 - fraction)`` x the best seen."""
    best = max(row.images_per_s for row in rows)
    return [row.workers for row in rows if row.images_per_s >= (1 - fraction) * best]


def fed_wait(tolerance: float) -> float:
    """The data wait at or below which a loop is fed: removing a wait ``w`` speeds it up at
    most ``1 / (1 - w)`` times, within ``1 + tolerance`` for ``w <= tolerance / (1 +
    tolerance)`` (4.8% at the default 5%)."""
    return tolerance / (1 + tolerance)


def fed(rows: list[ProbeRow], tolerance: float) -> list[int]:
    """The counts whose loop was fed (``fed_wait``): none without a model, whose loop waits
    for nothing else."""
    return [row.workers for row in rows if row.data_wait_frac <= fed_wait(tolerance)]


def choose(rows: list[ProbeRow], tolerance: float) -> int:
    """The fewest workers whose images/s is at least ``(1 - tolerance)`` x the best seen, or
    whose loop was fed (no more workers could make it faster by more than the tolerance)."""
    if not rows:
        raise ValueError("no worker count was measured")
    return min(near_best(rows, tolerance) + fed(rows, tolerance))


def to_confirm(rows: list[ProbeRow], within: float, tolerance: float) -> list[int]:
    """The counts to measure a second time: every one within ``within`` of the best rate,
    when there are two or more (``within`` is about twice the tolerance: the counts a window's
    noise could move across the tolerance's edge). None when one count stands clear, or when
    the fewest of them was fed (then the rates do not decide)."""
    if within <= 0 or len(rows) < 2:
        return []
    close = near_best(rows, within)
    if len(close) < 2 or min(close) in fed(rows, tolerance):
        return []
    return close


def keep_climbing(rows: list[ProbeRow], gain: float, tolerance: float) -> bool:
    """Try the next count: not once the loop is fed (more workers could only take CPU from
    it); else always after the first, then while the last one beat the best before it by more
    than ``gain``."""
    if rows[-1].data_wait_frac <= fed_wait(tolerance):
        return False
    if len(rows) == 1:
        return True
    before = max(row.images_per_s for row in rows[:-1])
    return rows[-1].images_per_s > (1 + gain) * before


# ---------------------------------------------------------------------------------------------
# What runs per batch, and what the probe must leave as it found it.


@dataclass
class ModelStep:
    """The run's step without its optimizer: forward and backward (``train``), or the forward
    pass alone (eval.py), on the bare model (no DDP wrapper: the probe has no collectives), in
    the run's precision. Eager even with ``model.compile=true``: compiling for a probe of
    seconds would cost more than the probe (README: when to pin a count)."""

    model: nn.Module
    precision: Precision
    device: torch.device
    train: bool
    label_smoothing: float = 0.0

    def __post_init__(self) -> None:
        self.criterion = nn.CrossEntropyLoss(label_smoothing=self.label_smoothing)

    def __call__(self, batch: Batch) -> None:
        if not len(batch.labels):
            return
        if not self.train:
            with torch.no_grad(), self.precision.autocast(self.device):
                self.model(batch.images)
            return
        self.model.zero_grad(set_to_none=True)  # as the optimizer's zero_grad does each step
        with self.precision.autocast(self.device):
            loss = self.criterion(self.model(batch.images), batch.labels)
        loss.backward()

    @contextlib.contextmanager
    def untouched(self) -> Iterator[None]:
        """The model's buffers (BatchNorm running statistics and counts) and mode restored,
        its gradients dropped, whatever happens inside."""
        model, was_training = self.model, self.model.training
        saved = [buffer.detach().clone() for buffer in model.buffers()]
        model.train(self.train)
        try:
            yield
        finally:
            with torch.no_grad():
                for buffer, value in zip(model.buffers(), saved, strict=True):
                    buffer.copy_(value)
            model.zero_grad(set_to_none=True)
            model.train(was_training)


@contextlib.contextmanager
def random_states_untouched(device: torch.device) -> Iterator[None]:
    """torch's generators (the CPU's and the run's CUDA device's), Python's and numpy's as
    they were, whatever happens inside."""
    python, numpy = random.getstate(), np.random.get_state()
    devices = [device.index or 0] if device.type == "cuda" else []
    try:
        with torch.random.fork_rng(devices=devices):
            yield
    finally:
        random.setstate(python)
        np.random.set_state(numpy)


# ---------------------------------------------------------------------------------------------
# One rung.


def with_workers(spec: LoaderSpec, workers: int) -> LoaderSpec:
    return dataclasses.replace(
        spec, settings=dataclasses.replace(spec.settings, num_workers=workers)
    )


def probe_batches(loader: Loader, done: Callable[[], bool]) -> Iterator[Batch]:
    """The loader's batches over probe epochs ``PROBE_EPOCH``, +1, ... (a small split runs
    out), until ``done()``, asked before each batch is pulled (so the window's last interval
    holds no batch it did not use). Iterators are left to ``loader.close()``: shutting a
    pool down here would land in the measured window."""
    epoch = PROBE_EPOCH
    while True:
        loader.set_epoch(epoch)
        batches, pulled = iter(loader), 0
        while not done():
            batch = next(batches, None)
            if batch is None:
                break
            pulled += 1
            yield batch
        else:
            return
        if not pulled:  # an epoch of nothing (every file unreadable): no rate to measure
            return
        epoch += 1


@dataclass(frozen=True)
class Window:
    """How long each count is measured, after its pipeline's fill."""

    seconds: float
    min_batches: int
    deadline: float  # perf_counter time past which a window ends as soon as it may

    def batches_for(self, workers: int) -> int:
        return max(self.min_batches, MIN_ROUNDS * workers)


def measure_rung(
    spec: LoaderSpec,
    step: Callable[[Batch], None] | None,
    window: Window,
    monitor: ProcessTreeMonitor,
) -> ProbeRow:
    """Build ``spec``'s loader, run the loop on it past its fill, measure a window, close it.

    The first ``workers + 1`` batches are the pipeline filling (worker start-up, the model's
    first steps): the first round of the workers arrives together, after their start-up, so
    it is not the steady rate and is not measured. The window then holds at least
    ``window.seconds`` and ``window.batches_for(workers)`` batches, and ends on a whole round of
    the workers (its batches a multiple of the count): each worker makes whole batches, and
    workers started together keep delivering them in bursts of ``workers`` batches, so a window
    cut inside a burst could be off by up to a burst; one of whole rounds is not, whatever the
    workers' phases.
    """
    started = time.perf_counter()
    workers = spec.num_workers
    fill = workers + 1
    need = window.batches_for(workers)
    sync = synchronizer(spec.device)
    meter = LoopMeter(warmup_batches=fill, window_sync=sync)
    cpu_start: float | None = None

    def done() -> bool:
        nonlocal cpu_start
        measured = meter.batches - fill
        if measured == 0 and cpu_start is None:
            cpu_start = monitor.snapshot()  # the window opens (the meter drained the device)
        if measured < need or measured % max(1, workers):
            return False
        elapsed = sum(meter.intervals[fill:])
        return elapsed >= window.seconds or time.perf_counter() >= window.deadline

    loader = build_loader(spec)
    try:
        for batch in meter.iterate(probe_batches(loader, done)):
            if step is not None:
                step(batch)
        cpu_s = monitor.snapshot() - cpu_start if cpu_start is not None else 0.0
    finally:
        loader.close()
    summary = meter.summary()
    measured = max(meter.batches - fill, 0)
    images = sum(meter.sizes[fill : meter.batches]) if measured else 0
    return ProbeRow(
        workers=workers,
        images_per_s=float(summary["images_per_s"] or 0.0) if measured else 0.0,
        data_wait_frac=float(summary["data_wait_frac"] or 0.0) if measured else 1.0,
        cpu_s_per_1k_images=1000 * cpu_s / images if images else None,
        images=images,
        batches=measured,
        seconds=time.perf_counter() - started,
    )


def over_ranks(row: ProbeRow) -> ProbeRow:
    """A count's figures over every rank: images/s, images and CPU summed (the job's), data
    wait and seconds the largest (the rank every other waits for)."""
    cpu_s = (row.cpu_s_per_1k_images or 0.0) * row.images / 1000
    rate, images, batches, cpu = distributed.all_reduce(
        [row.images_per_s, row.images, row.batches, cpu_s]
    )
    wait, seconds = distributed.all_reduce([row.data_wait_frac, row.seconds], op="max")
    return ProbeRow(
        row.workers,
        rate,
        wait,
        1000 * cpu / images if images else None,
        int(images),
        int(batches),
        seconds,
        row.windows,
    )


# ---------------------------------------------------------------------------------------------
# What the probe runs, for each task.


@dataclass(frozen=True)
class Workload:
    """The loop a run's main phase runs: on ``spec``'s split, ``step`` per batch (None: the
    loader alone). ``model`` names the model for the remembered choice's key; ``also_opens``:
    the run's other splits, prepared alike (memmap: their caches built with every CPU)."""

    spec: LoaderSpec
    step: ModelStep | None
    model: dict[str, Any]
    also_opens: tuple[LoaderSpec, ...] = ()


def model_description(session: Session, name: str | None = None) -> dict[str, Any]:
    model = OmegaConf.to_container(session.cfg.model, resolve=True)
    assert isinstance(model, dict)
    return {**model, "name": name or model["name"]}


def training_workload(session: Session, model: nn.Module | None, image_size: int) -> Workload:
    """train.py: the train split with the training step (or alone, ``model=none``); the val
    split is opened later with the same count."""
    spec = session.loader_spec("train", train=True, image_size=image_size)
    if model is None:
        return Workload(spec, None, model_description(session))
    step = ModelStep(
        model,
        session.precision,
        session.device,
        train=True,
        label_smoothing=session.cfg.train.label_smoothing,
    )
    val = session.loader_spec("val", train=False, image_size=image_size)
    return Workload(spec, step, model_description(session), also_opens=(val,))


def evaluation_workload(
    session: Session, model: nn.Module | None, image_size: int, model_name: str | None = None
) -> Workload:
    """eval.py: the val split with the forward pass (or alone, ``model=none``)."""
    spec = session.loader_spec("val", train=False, image_size=image_size)
    step = None
    if model is not None:
        step = ModelStep(model, session.precision, session.device, train=False)
    return Workload(spec, step, model_description(session, model_name))


# ---------------------------------------------------------------------------------------------
# Remembering a choice.


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return f"cuda:{torch.cuda.get_device_name(device)}"
    return device.type


def decision_key(session: Session, workload: Workload, cpus: int) -> dict[str, Any]:
    """Everything the choice depends on: the machine, the loader and all its settings but the
    count, the model, the split and its size, image and batch size, augmentation, device,
    precision, world size and task."""
    spec, cfg = workload.spec, session.cfg
    settings = dataclasses.asdict(session.loader_settings)
    settings.pop("num_workers")
    settings.pop("autotune")
    return {
        "version": KEY_VERSION,
        "machine": {"host": socket.gethostname(), "cpu": cpu_model(), "cpus_allowed": cpus},
        "torch": torch.__version__,
        "loader": settings,
        "model": workload.model,
        "task": session.task,
        "split": spec.split.name,
        "train": spec.train,
        "dataset": {"root": str(session.dataset.root), "images": len(spec.split)},
        "image_size": spec.image_size,
        "augment": OmegaConf.to_container(cfg.augment, resolve=True) if spec.train else None,
        "device": device_name(session.device),
        "precision": session.precision.name,
        "world_size": session.dist.world_size,
        "runtime_threads": cfg.runtime.threads,
    }


def key_hash(key: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]


def decision_folder(session: Session) -> Path | None:
    """Where choices are remembered: the loader's cache folder where it has one, else the
    dataset index's (``dataset.index_dir``); None (nothing remembered) when that is null."""
    folder = getattr(session.loader_settings, "cache_dir", None) or session.cfg.dataset.index_dir
    return resolve_path(folder) if folder else None


@dataclass(frozen=True)
class Decision:
    num_workers: int
    probe: list[dict[str, Any]]
    probe_s: float


def load_decision(path: Path, key: dict[str, Any]) -> Decision | None:
    """The choice remembered at ``path`` for exactly ``key``; None if none (or unreadable)."""
    try:
        saved = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as error:
        log.warning("num_workers=auto: %s cannot be read (%s); probing again", path, error)
        return None
    count = saved.get("num_workers") if isinstance(saved, dict) else None
    if saved.get("key") != key or not isinstance(count, int) or count < 0:
        return None
    return Decision(count, list(saved.get("probe", [])), float(saved.get("probe_s", 0.0)))


def save_decision(path: Path, key: dict[str, Any], decision: Decision) -> None:
    payload = {
        "key": key,
        "num_workers": decision.num_workers,
        "probe": decision.probe,
        "probe_s": decision.probe_s,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    try:
        atomic_write_text(path, json.dumps(payload, indent=1, sort_keys=True) + "\n")
    except OSError as error:  # a read-only cache folder: the choice is not remembered
        log.warning("num_workers=auto: cannot remember the choice in %s (%s)", path, error)


# ---------------------------------------------------------------------------------------------
# The probe, and the entry point.


def prepare_splits(workload: Workload, workers: int) -> dict[str, dict[str, Any]]:
    """Every split the run opens prepared once, with ``workers`` (every CPU allowed): memmap's
    cache is built now, not by the first count tried (one process) nor in a measured window.
    Returns what each preparation did, by split."""
    done = {}
    for spec in (workload.spec, *workload.also_opens):
        if numbers := prepare_loader(with_workers(spec, workers)):
            done[spec.split.name] = numbers
    return done


def probe(
    workload: Workload,
    options: AutotuneSettings,
    cpus: int,
    monitor: ProcessTreeMonitor,
    threads: int | None = None,
) -> list[ProbeRow]:
    """Every rung tried (every rank at once), in order, with every rank's figures; torch's
    intra-op threads set for each count as the run would set them (``runtime.threads``:
    ``threads``)."""
    started = time.perf_counter()
    window = Window(options.window_s, options.min_batches, started + options.max_probe_s)
    rows: list[ProbeRow] = []
    step = workload.step
    device = workload.spec.device

    def measure(workers: int) -> tuple[ProbeRow, bool]:
        """The count's row (every rank's), and whether the probe still has time."""
        set_intra_op_threads(threads, workers)
        spec = with_workers(workload.spec, workers)
        row = over_ranks(measure_rung(spec, step, window, monitor))
        (spent,) = distributed.all_reduce([time.perf_counter() - started], op="max")
        return row, spent < options.max_probe_s

    with random_states_untouched(device), step.untouched() if step else _nothing():
        for workers in worker_ladder(cpus):
            row, in_time = measure(workers)
            rows.append(row)
            log_rung(row)
            if not in_time or not keep_climbing(rows, options.gain, options.tolerance):
                break
        # Every rank holds the same rows (over_ranks), so every rank confirms the same counts.
        # In reverse order: a drift of the machine over the probe weighs on both ends alike.
        confirm = to_confirm(rows, options.confirm_within, options.tolerance)
        for workers in reversed(confirm if in_time else []):
            again, in_time = measure(workers)
            at = next(i for i, row in enumerate(rows) if row.workers == workers)
            rows[at] = pooled(rows[at], again)
            log_rung(rows[at])
            if not in_time:
                break
    return rows


@contextlib.contextmanager
def _nothing() -> Iterator[None]:
    yield


def log_rung(row: ProbeRow) -> None:
    log.info(
        "num_workers=auto: %d workers: %.1f images/s, data wait %.1f%%, %s CPU s / 1k images "
        "(%d batches measured%s, %.1f s)",
        row.workers,
        row.images_per_s,
        100 * row.data_wait_frac,
        "-" if row.cpu_s_per_1k_images is None else f"{row.cpu_s_per_1k_images:.2f}",
        row.batches,
        "" if row.windows == 1 else f" in {row.windows} windows",
        row.seconds,
    )


def settle_num_workers(session: Session, workload: Workload) -> None:
    """``loader.num_workers=auto``: the count remembered for this key, or probed (and then
    remembered), becomes the run's (``session.loader_settings``), with torch's intra-op threads
    set for it; the probe's figures are recorded. Nothing for a count given as a number."""
    settings = session.loader_settings
    if not settings.auto_workers:
        return
    started = time.perf_counter()
    cpus = cpus_allowed()
    key = decision_key(session, workload, cpus)
    folder = decision_folder(session)
    path = folder / f"{FILE_PREFIX}{key_hash(key)}.json" if folder else None
    remembered = None
    if session.dist.is_main and path is not None and not settings.autotune.refresh:
        remembered = load_decision(path, key)
    (count,) = distributed.broadcast_values([remembered.num_workers if remembered else -1])
    reused = count >= 0  # rank 0 found it: every rank adopts it, none probes
    # Not the probe's cost (the run would build memmap's cache anyway): kept out of autotune_s.
    preparing = time.perf_counter()
    session.prepared.update(prepare_splits(workload, worker_ladder(cpus)[-1]))
    started += time.perf_counter() - preparing
    if reused:
        decision = remembered or Decision(int(count), [], 0.0)  # the table is rank 0's
    else:
        threads = session.cfg.runtime.threads
        rows = probe(workload, settings.autotune, cpus, session.monitor, threads)
        (count,) = distributed.broadcast_values([choose(rows, settings.autotune.tolerance)])
        probe_s = time.perf_counter() - started
        decision = Decision(int(count), [row.as_dict() for row in rows], probe_s)
        if session.dist.is_main and path is not None:
            save_decision(path, key, decision)
    adopt(session, decision, reused)
    session.record(autotune_s=time.perf_counter() - started, autotune_key=key_hash(key))
    log_decision(decision, reused, path)


def adopt(session: Session, decision: Decision, reused: bool) -> None:
    session.loader_settings = dataclasses.replace(
        session.loader_settings, num_workers=decision.num_workers
    )
    session.record(set_intra_op_threads(session.cfg.runtime.threads, decision.num_workers))
    session.record(
        num_workers=decision.num_workers,
        num_workers_auto=True,
        autotune_reused=reused,
        autotune_probe=decision.probe,
        # What each rank adopted (one count, broadcast from rank 0).
        autotune_rank_workers=distributed.gather_objects(decision.num_workers),
    )
    session.logger.log_table("autotune/probe", decision.probe)


def log_decision(decision: Decision, reused: bool, path: Path | None) -> None:
    rows = decision.probe
    chosen = next((row for row in rows if row["workers"] == decision.num_workers), None)
    rate = f"{chosen['images_per_s']:,.1f} images/s" if chosen else "images/s not measured"
    rungs = ", ".join(str(row["workers"]) for row in rows) or "none"
    if reused:
        how = f"reused from {path}: probed {decision.probe_s:.1f} s over rungs {rungs} then"
    else:
        how = f"probe {decision.probe_s:.1f} s over rungs {rungs}"
    log.info("num_workers=auto: chose %d (%s, %s)", decision.num_workers, rate, how)
