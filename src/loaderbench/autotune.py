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

Each count's window opens only once its loader's head start is consumed (``autotune_rung``):
batches made ahead while the loop was busy elsewhere are not the workers' rate.

Under DDP every rank probes at the same time (they share the node's CPUs) and climbs one
ladder: the CPUs of the rank given the fewest (``job_cpus``), so ranks given different numbers
run the same collectives. Each count's figures are combined over the ranks (images/s summed,
the job's rate; data wait the largest, since a rank that waits holds every rank at the next
all-reduce), so every rank climbs and stops alike, and rank 0's choice is broadcast.

The choice is remembered in a small JSON file in the cache folder, keyed by everything it
depends on (``autotune_decisions``); the next run with the same key starts at once,
``loader.autotune.refresh=true`` probes again, and a file that cannot be trusted is named in
a warning and probed over. The probe's peak memory is ``autotune_peak_rss_mb``, kept out of
``peak_rss_mb``; with ``bench.drop_page_cache=true`` the files are evicted after the probe.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import random
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from omegaconf import OmegaConf
from torch import nn

from loaderbench import distributed
from loaderbench.autotune_decisions import (
    FILE_PREFIX,
    Decision,
    decision_folder,
    decision_key,
    key_hash,
    load_decision,
    save_decision,
)
from loaderbench.autotune_rung import (
    ProbeRow,
    Window,
    measure_rung,
    over_ranks,
    pooled,
    with_workers,
)
from loaderbench.loaders import Batch, LoaderSpec, prepare_loader
from loaderbench.loaders.settings import AutotuneSettings
from loaderbench.meters import ProcessTreeMonitor
from loaderbench.runtime import Precision, allotted_cpus, set_intra_op_threads
from loaderbench.session import Session, evict_page_cache

log = logging.getLogger(__name__)

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


def job_cpus(own: int) -> int:
    """The CPUs every rank of the job may use: the fewest any rank was given (``own``: this
    rank's ``cpus_allowed``). Ranks on nodes of different sizes, a SLURM job spread unevenly,
    ranks pinned to NUMA nodes of their own: each would build its own ladder, and the rank with
    the shorter one would leave the climb for the choice's broadcast while another is still
    in the next count's all-reduce. Probing with the job's figure, every rank climbs the same
    ladder and calls the same collectives, in the same order, by construction. One
    collective, whatever the ranks were given; the identity in a single process."""
    (fewest,) = distributed.all_reduce([float(own)], op="min")
    return max(1, int(fewest))


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
    ``threads``). ``cpus``: the same on every rank (``job_cpus``), whose climbs and
    collectives follow one ladder."""
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
    set for it; the probe's figures are recorded. Then, with ``bench.drop_page_cache=true``,
    the files the probe read are evicted (``session.prepare_page_cache`` left that to here), so
    the run starts as cold as a pinned count's. Nothing for a count given as a number."""
    settings = session.loader_settings
    if not settings.auto_workers:
        return
    started = time.perf_counter()
    own = cpus_allowed()
    cpus = job_cpus(own)  # a collective: every rank, before anything that differs by rank
    key = decision_key(session, workload.spec, workload.model, cpus)
    folder = decision_folder(session)
    path = folder / f"{FILE_PREFIX}{key_hash(key)}.json" if folder else None
    remembered = None
    if session.dist.is_main and path is not None and not settings.autotune.refresh:
        remembered = load_decision(path, key)
    (count,) = distributed.broadcast_values([remembered.num_workers if remembered else -1])
    reused = count >= 0  # rank 0 found it: every rank adopts it, none probes
    # Not the probe's cost (the run would build memmap's cache anyway): kept out of autotune_s.
    # Built with this rank's own CPUs: no collective in it, and the ladder is not involved.
    preparing = time.perf_counter()
    session.prepared.update(prepare_splits(workload, own))
    started += time.perf_counter() - preparing
    if reused:
        decision = remembered or Decision(int(count), [], 0.0)  # the table is rank 0's
    else:
        decision = probe_and_choose(session, workload, cpus, started)
        if session.dist.is_main and path is not None:
            save_decision(path, key, decision)
    adopt(session, decision, reused)
    session.record(autotune_s=time.perf_counter() - started, autotune_key=key_hash(key))
    log_decision(decision, reused, path)
    if session.cfg.bench.drop_page_cache:
        evict_page_cache(session.dataset, getattr(settings, "cache_dir", None))


def probe_and_choose(session: Session, workload: Workload, cpus: int, started: float) -> Decision:
    """The probe on every rank, rank 0's choice broadcast; the probe's peak memory recorded
    apart from the run's (``autotune_peak_rss_mb``, summed over ranks as ``peak_rss_mb``)."""
    options = session.loader_settings.autotune
    with memory_apart(session.monitor) as probe_peak:
        rows = probe(workload, options, cpus, session.monitor, session.cfg.runtime.threads)
    (count,) = distributed.broadcast_values([choose(rows, options.tolerance)])
    (peak,) = distributed.all_reduce(probe_peak)
    session.record(autotune_peak_rss_mb=peak / 2**20)
    probe_s = time.perf_counter() - started
    return Decision(int(count), [row.as_dict() for row in rows], probe_s)


@contextlib.contextmanager
def memory_apart(monitor: ProcessTreeMonitor) -> Iterator[list[float]]:
    """The process tree's peak memory inside (the probe's: every rung's workers and buffers)
    kept out of ``monitor``'s peak, which stays the tree's peak outside (metrics.json's
    ``peak_rss_mb``: set-up, cache builds and the run); yields a list that holds the inside's
    peak, in bytes, once it ends. Both are the monitor's samples (memory every second or so),
    so a peak shorter than a sample's interval can be missed, inside as outside; the last
    rung's workers have exited before the window closes (``Loader.close`` joins them)."""
    monitor.sample()  # waits out a sample in flight: every sample so far counts outside
    # Under the monitor's own lock: its thread's next sample lands wholly on one side.
    with monitor._lock:
        outside, monitor.peak_rss_bytes = monitor.peak_rss_bytes, 0
    inside: list[float] = []
    try:
        yield inside
    finally:
        monitor.sample()
        with monitor._lock:
            inside.append(float(monitor.peak_rss_bytes))
            monitor.peak_rss_bytes = outside
        monitor.sample()  # the tree as the run starts


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
