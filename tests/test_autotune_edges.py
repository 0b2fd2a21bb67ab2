"""``loader.num_workers=auto`` at its edges (issue 29): ranks given different CPUs agree on one
ladder (two real gloo processes); a cold run is evicted after the probe, whose memory is
reported apart; the remembered choice's key holds the probe's settings and the split's
fingerprint; a foreign decision file is probed over with a warning; a rung's window opens only
once the loader's head start is consumed. All on real JPEGs, real loaders, a real ``Session``
and ``settle_num_workers``, the entry point train.py and eval.py call."""

from __future__ import annotations

import json
import logging
import multiprocessing
import os
import shutil
import time
import traceback
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf
from torch import nn

from loaderbench.autotune import (
    Workload,
    model_step,
    probe,
    settle_num_workers,
    training_workload,
)
from loaderbench.config.loader import AutotuneSettings
from loaderbench.data.discovery import discover
from loaderbench.loaders import build_loader
from loaderbench.measure.process_tree import ProcessTreeMonitor
from loaderbench.platform import distributed
from loaderbench.platform.distributed import DistInfo
from loaderbench.platform.runtime import PRECISIONS
from loaderbench.run._tracking import NullLogger
from loaderbench.run._validation import validate_config
from loaderbench.run.session import Session
from tests.conftest import (
    cpu_spec,
    folder_index,
    free_ports,
    read_metrics,
    rewrite_in_place,
    run_dirs,
    run_entry,
)
from tests.helpers import slow_decode
from tests.test_config import compose_cfg

FP32 = PRECISIONS["fp32"][0]
QUICK = ["loader.autotune.window_s=0.3", "loader.autotune.min_batches=4"]


def make_session(
    root: Path,
    run_dir: Path,
    *overrides: str,
    dist: DistInfo | None = None,
    loader: str = "torchvision",
) -> Session:
    """A train.py session on ``root`` as ``session._set_up`` makes one (no W&B, no process
    group of its own), with ``loader.num_workers=auto`` and ``model=none``; the data set
    scanned afresh (no dataset index)."""
    cfg = compose_cfg(
        "train",
        [
            f"dataset.root={root}",
            "dataset.index_dir=null",
            "device=cpu",
            "logger=none",
            "model=none",
            f"loader={loader}",
            "loader.num_workers=auto",
            "loader.batch_size=4",
            *QUICK,
            *overrides,
        ],
    )
    config = validate_config(cfg)
    # Memory sampled at every tick of a quick monitor: a rung of a second is seen.
    monitor = ProcessTreeMonitor(interval_s=0.05, memory_every=1)
    return Session(
        config,
        "train",
        run_dir,
        dist or DistInfo(),
        torch.device("cpu"),
        FP32,
        discover(config.dataset),
        NullLogger(),
        monitor,
        OmegaConf.to_container(cfg, resolve=True),
        config.loader,
    )


def settle(session: Session, image_size: int = 32) -> dict:
    with session.monitor:
        settle_num_workers(session, training_workload(session, None, image_size))
    return session.metrics


# ---------------------------------------------------------------------------------------------
# A2: ranks given different CPUs.


def settle_on_rank(rank: int, port: int, cpus: int, root: str, out: str) -> None:
    """One rank of two (gloo), given ``cpus`` CPUs by SLURM_CPUS_PER_TASK (what
    ``cpus_allowed`` reads first): settle ``auto`` and write what it adopted."""
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        WORLD_SIZE="2",
        LOCAL_RANK="0",
        SLURM_CPUS_PER_TASK=str(cpus),
    )
    torch.set_num_threads(1)
    # A spawned process inherits spawn as its start method: DataLoader's workers fork, as in
    # a run, and inherit the sleeping decode.
    multiprocessing.set_start_method("fork", force=True)
    slow_decode(0.2)
    info = distributed.dist_info()
    distributed.init(info, torch.device("cpu"), timeout_s=90)
    failed = True
    try:
        session = make_session(
            Path(root),
            Path(out),
            "loader.prefetch=1",
            "loader.autotune.gain=0",  # climb while a count is faster at all
            "loader.autotune.confirm_within=0",
            dist=info,
        )
        metrics = settle(session)
        table = [row["workers"] for row in metrics["autotune_probe"]]
        result = {"num_workers": metrics["num_workers"], "rungs": table}
        result["rank_workers"] = metrics["autotune_rank_workers"]
        (Path(out) / f"rank{rank}.json").write_text(json.dumps(result))
        failed = False
    except BaseException:
        (Path(out) / f"rank{rank}.error").write_text(traceback.format_exc())
        raise
    finally:
        distributed.shutdown(failed=failed)


@pytest.mark.slow
def test_ranks_given_4_and_8_cpus_probe_one_ladder_and_adopt_one_count(
    small_root: Path, tmp_path: Path
) -> None:
    """Rank 0 is given 4 CPUs, rank 1 8. Sleeping decodes make every count faster than the
    one before (the climb goes on while one gains at all), so on its own ladder rank 1 would
    go on to 6 workers after 4, in an all-reduce, while rank 0, its ladder done, waits in the
    choice's broadcast: both hang. Agreeing on the fewest CPUs first, both climb 1, 2, 3, 4
    and adopt one count, in seconds."""
    context = multiprocessing.get_context("spawn")
    port = free_ports(1)
    ranks = [
        context.Process(target=settle_on_rank, args=(r, port, c, str(small_root), str(tmp_path)))
        for r, c in ((0, 4), (1, 8))
    ]
    for process in ranks:
        process.start()
    deadline = time.monotonic() + 150
    for process in ranks:
        process.join(max(1.0, deadline - time.monotonic()))
    hung = [r for r, process in enumerate(ranks) if process.is_alive()]
    for process in ranks:
        if process.is_alive():
            process.kill()
            process.join()
    errors = {p.name: p.read_text()[-3000:] for p in tmp_path.glob("rank*.error")}
    assert not hung and not errors, f"ranks still running: {hung}; errors: {errors}"
    first, second = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1))
    assert first == second, (first, second)
    assert first["rungs"] == [1, 2, 3, 4], first  # the 4-CPU rank's ladder, for both
    assert first["rank_workers"] == [first["num_workers"]] * 2


# ---------------------------------------------------------------------------------------------
# A4: a cold run, and the probe's memory.


class HeavyNet(nn.Module):
    """A tiny classifier whose forward holds ``mb`` MB of touched memory for ``hold_s``: a
    probe rung that needs far more memory than the run after it."""

    def __init__(self, mb: int, hold_s: float) -> None:
        super().__init__()
        self.mb, self.hold_s = mb, hold_s
        self.head = nn.Linear(3, 4)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        ballast = torch.ones(self.mb * 2**20, dtype=torch.uint8)  # written: resident
        time.sleep(self.hold_s)
        del ballast
        return self.head(images.float().mean((2, 3)))


def test_the_probes_memory_is_reported_apart_from_the_runs(
    tiny_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The probe's loop holds 400 MB at each step; the run after it does not. ``peak_rss_mb``
    (the monitor's peak once the probe is over) stays below the probe's peak by about that;
    ``autotune_peak_rss_mb`` holds it."""
    monkeypatch.setenv("SLURM_CPUS_PER_TASK", "1")
    session = make_session(tiny_root, tmp_path)
    model = HeavyNet(mb=400, hold_s=0.15)
    spec = session.loader_spec("train", train=True, image_size=32)
    workload = Workload(spec, model_step(model, FP32, torch.device("cpu"), train=True), {})
    with session.monitor as monitor:
        monitor.sample()
        before = monitor.peak_rss_bytes
        settle_num_workers(session, workload)
        monitor.sample()
        run_peak = monitor.peak_rss_bytes
    probe_peak = session.metrics["autotune_peak_rss_mb"] * 2**20
    assert probe_peak > before + 350 * 2**20, (probe_peak, before)
    assert run_peak < probe_peak - 300 * 2**20, (run_peak, probe_peak)
    assert run_peak < before + 200 * 2**20, (run_peak, before)  # the probe's 400 MB left out


@pytest.mark.slow
def test_a_cold_run_with_auto_evicts_after_the_probe(tiny_root: Path, tmp_path: Path) -> None:
    """train.py model=none, ``bench.drop_page_cache=true``, auto, one batch: the probe reads
    every train image (it runs over whole probe epochs of the 24); the run reads only epoch
    0's first batches. Evicted after the probe, the files of epoch 0's last two batches are
    out of the page cache when the run ends (evicted before it, the probe read them all back
    in)."""
    from loaderbench.data.order import epoch_permutation
    from loaderbench.platform.pagecache import resident_fraction

    # A copy of its own: another test reading the shared set meanwhile would bring it back.
    root = shutil.copytree(tiny_root, tmp_path / "data")
    split = folder_index(root).train
    order = epoch_permutation(len(split), 0, 0, shuffle=True).tolist()
    unread = [split.paths[i] for i in order[16:]]  # batches 4 and 5 of 4 images
    run_entry(
        "train.py",
        "model=none",
        f"dataset.root={root}",
        "dataset.index_dir=null",
        "logger=none",
        "loader=torchvision",
        "loader.batch_size=4",
        "loader.prefetch=1",
        "loader.num_workers=auto",
        *QUICK,
        "bench.drop_page_cache=true",
        "bench.epochs=1",
        "bench.max_batches=1",
        cwd=tmp_path,
        env={"SLURM_CPUS_PER_TASK": "1"},
    )
    (run_dir,) = run_dirs(tmp_path, "train")
    metrics = read_metrics(run_dir)
    assert metrics["page_cache"] == "cold" and metrics["autotune_probe"]
    assert metrics["autotune_peak_rss_mb"] > 0 and metrics["peak_rss_mb"] > 0
    resident = {Path(p).name: resident_fraction(p) for p in unread}
    assert max(resident.values()) < 0.1, resident


# ---------------------------------------------------------------------------------------------
# A5, A6: the remembered choice.


def test_a_changed_probe_setting_or_an_image_replaced_in_place_probes_again(
    tiny_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """memmap remembers choices in its cache folder, the dataset index on as by default. The
    same run again reuses the choice; ``loader.autotune.tolerance=0.01`` (the default 0.05
    before) probes again, and so does a train image rewritten in place with another photo's
    pixels at the same size (same name, folder mtime and image count): the index's per-file
    check sees it, and the split's fingerprint changes."""
    monkeypatch.setenv("SLURM_CPUS_PER_TASK", "1")
    root = shutil.copytree(tiny_root, tmp_path / "data")
    remembered = [f"loader.cache_dir={tmp_path / 'cache'}"]
    indexed = f"dataset.index_dir={tmp_path / 'index'}"

    def run(*overrides: str) -> dict:
        session = make_session(root, tmp_path, *remembered, indexed, *overrides, loader="memmap")
        return settle(session)

    first = run()
    assert first["autotune_reused"] is False
    again = run("loader.autotune.refresh=false")
    assert again["autotune_reused"] is True and again["autotune_key"] == first["autotune_key"]
    tighter = run("loader.autotune.tolerance=0.01")
    assert tighter["autotune_reused"] is False
    assert tighter["autotune_key"] != first["autotune_key"]
    rewrite_in_place(Path(folder_index(root).train.paths[0]), (20, 20, 250), same_size=True)
    replaced = run()
    assert replaced["autotune_reused"] is False
    assert replaced["autotune_key"] != first["autotune_key"]
    assert run()["autotune_reused"] is True  # and that choice is remembered in its turn


@pytest.mark.parametrize(
    "content", ["[1, 2]", '"auto"', "{}", '{"num_workers": "3"}', "{not json", b"\xff\xfe"]
)
def test_a_foreign_decision_file_is_probed_over_with_a_warning_naming_it(
    tiny_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog, content
) -> None:
    """A decision file holding a JSON list (or anything but what the run writes) at the
    key's name: a warning naming it, a fresh probe, and the file written over."""
    monkeypatch.setenv("SLURM_CPUS_PER_TASK", "1")
    remembered = f"dataset.index_dir={tmp_path / 'index'}"
    first = settle(make_session(tiny_root, tmp_path, remembered))
    (path,) = (tmp_path / "index").glob("autotune-*.json")
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)
    with caplog.at_level(logging.WARNING, logger="loaderbench"):
        again = settle(make_session(tiny_root, tmp_path, remembered))
    assert again["autotune_reused"] is False and again["autotune_probe"]
    assert again["autotune_key"] == first["autotune_key"]
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any(str(path) in message for message in warned), warned
    assert json.loads(path.read_text())["num_workers"] == again["num_workers"]


# ---------------------------------------------------------------------------------------------
# A9: a rung's head start.


class SlowStart(nn.Module):
    """A model whose first steps are slow (``slow_steps`` of ``slow_s``), then fast: while
    it starts, the workers fill the loader's queue."""

    def __init__(self, slow_steps: int, slow_s: float) -> None:
        super().__init__()
        self.steps, self.slow_steps, self.slow_s = 0, slow_steps, slow_s
        self.head = nn.Linear(3, 4)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        self.steps += 1
        if self.steps <= self.slow_steps:
            time.sleep(self.slow_s)
        return self.head(images.float().mean((2, 3)))


def test_a_deep_queue_is_consumed_before_the_window_opens(
    small_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One worker whose decode sleeps 20 ms an image (batches of 4: a batch per 80 ms at
    most), a queue of 16 batches, and a model whose first two steps take 1 s each (the first
    steps' warm-up): by the end of them the worker has filled the queue. Measured from the
    third batch on (``workers + 1``), the window would take those ready batches at the model's
    speed, several times the worker's; the probe leaves them out: every batch the model
    stepped that is not in the window is the first round's or the head start's, exactly
    ``workers + 1 + queue_depth()``. Counted, not timed: a busy machine cannot move it (the
    rates are the benchmark's)."""
    monkeypatch.setattr("loaderbench.loaders.torchvision.loader.load_rgb", sleeping(0.02))
    split = folder_index(small_root).train  # 40 batches an epoch: room for a full queue
    spec = cpu_spec(split, True, loader="torchvision", batch_size=4, prefetch=16)
    with build_loader(spec) as built:
        head_start = built.queue_depth()
    assert head_start >= 16  # the batches the worker may have ready when the loop returns
    model = SlowStart(slow_steps=2, slow_s=1.0)
    step = model_step(model, FP32, torch.device("cpu"), train=True)
    options = AutotuneSettings(window_s=0.5, min_batches=4)
    with ProcessTreeMonitor() as monitor:
        (row,) = probe(Workload(spec, step, {}), options, 1, monitor)
    assert model.steps - row.batches == 1 + 1 + head_start, (model.steps, row)
    assert row.batches >= 4 and row.images == 4 * row.batches, row


def sleeping(seconds: float):
    from loaderbench.loaders.torchvision import loader as module

    decode = module.load_rgb

    def slow(path):  # load_rgb's signature
        time.sleep(seconds)
        return decode(path)

    return slow
