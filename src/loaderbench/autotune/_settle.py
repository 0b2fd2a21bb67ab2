"""The entry point train.py and eval.py call: ``settle_num_workers`` turns
``loader.num_workers=auto`` into a count, remembered (``decisions``) or probed (``probe``),
and returns the loader's settings with it (the run's config is not rewritten)."""

from __future__ import annotations

import dataclasses
import logging
import time
from pathlib import Path

from loaderbench.autotune._decisions import (
    FILE_PREFIX,
    Decision,
    decision_folder,
    decision_key,
    key_hash,
    load_decision,
    save_decision,
)
from loaderbench.autotune._memory import memory_apart
from loaderbench.autotune._policy import choose
from loaderbench.autotune._probe import prepare_splits, probe
from loaderbench.autotune._workload import Workload
from loaderbench.measure.metrics import IMAGES_PER_S
from loaderbench.platform import distributed
from loaderbench.platform.runtime import cpus_allowed, set_intra_op_threads
from loaderbench.run.session import Session, evict_page_cache

log = logging.getLogger(__name__)


def job_cpus(own: int) -> int:
    """The CPUs every rank of the job may use: the fewest any rank was given (``own``: this
    rank's ``runtime.cpus_allowed``). Ranks on nodes of different sizes, a SLURM job spread
    unevenly, ranks pinned to NUMA nodes of their own: each would build its own ladder, and
    the rank with the shorter one would leave the climb for the choice's broadcast while
    another is still in the next count's all-reduce. Probing with the job's figure, every
    rank climbs the same ladder and calls the same collectives, in the same order, by
    construction. One collective, whatever the ranks were given; the identity in a single
    process."""
    (fewest,) = distributed.all_reduce([float(own)], op="min")
    return max(1, int(fewest))


def settle_num_workers(session: Session, workload: Workload) -> None:
    """Settle the run's loader settings (``session.loader``): as they are for a count given as
    a number; for ``loader.num_workers=auto``, with the count remembered for this key, or
    probed (and then remembered), torch's intra-op threads set for it and the probe's figures
    recorded. Then, with ``bench.drop_page_cache=true``, the files the probe
    read are evicted (``session.prepare_page_cache`` left that to here), so the run starts as
    cold as a pinned count's."""
    settings = session.loader
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
    facts = session.record_.autotune
    facts.autotune_s, facts.autotune_key = time.perf_counter() - started, key_hash(key)
    log_decision(decision, reused, path)
    if session.config.bench.drop_page_cache:
        evict_page_cache(session.dataset, settings.folders())
    session.loader = dataclasses.replace(settings, num_workers=decision.num_workers)


def probe_and_choose(session: Session, workload: Workload, cpus: int, started: float) -> Decision:
    """The probe on every rank, rank 0's choice broadcast; the probe's peak memory recorded
    apart from the run's (``autotune_peak_rss_mb``, summed over ranks as ``peak_rss_mb``)."""
    options = session.loader.autotune
    with memory_apart(session.monitor) as probe_peak:
        rows = probe(workload, options, cpus, session.monitor, session.config.runtime.threads)
    (count,) = distributed.broadcast_values([choose(rows, options.tolerance)])
    (peak,) = distributed.all_reduce(probe_peak)
    session.record_.autotune.autotune_peak_rss_mb = peak / 2**20
    probe_s = time.perf_counter() - started
    return Decision(int(count), [row.as_dict() for row in rows], probe_s)


def adopt(session: Session, decision: Decision, reused: bool) -> None:
    """The count's intra-op threads set; the count and the probe recorded (once)."""
    placement, facts = session.record_.placement, session.record_.autotune
    threads = set_intra_op_threads(session.config.runtime.threads, decision.num_workers)
    placement.intra_op_threads, placement.intra_op_threads_source = threads
    placement.num_workers = decision.num_workers
    facts.autotune_reused, facts.autotune_probe = reused, decision.probe
    # What each rank adopted (one count, broadcast from rank 0).
    facts.autotune_rank_workers = distributed.gather_objects(decision.num_workers)
    session.logger.log_table("autotune/probe", decision.probe)


def log_decision(decision: Decision, reused: bool, path: Path | None) -> None:
    rows = decision.probe
    chosen = next((row for row in rows if row["workers"] == decision.num_workers), None)
    rate = f"{chosen[IMAGES_PER_S]:,.1f} images/s" if chosen else "images/s not measured"
    rungs = ", ".join(str(row["workers"]) for row in rows) or "none"
    if reused:
        how = f"reused from {path}: probed {decision.probe_s:.1f} s over rungs {rungs} then"
    else:
        how = f"probe {decision.probe_s:.1f} s over rungs {rungs}"
    log.info("num_workers=auto: chose %d (%s, %s)", decision.num_workers, rate, how)
