"""``loader.num_workers=auto``: the ladder, the climb and the choice, on given figures (a slow
and a fast decode, with a slow model and without: decisions, not speeds, which are the
benchmark's); the probe on a real loader; a run with ``auto`` trains what the chosen count
trains; the remembered choice; two gloo ranks. Bad values: tests/test_autotune_config.py."""

from __future__ import annotations

import json
import random
import re
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from loaderbench.autotune import ProbeRow, Workload, model_step, probe
from loaderbench.autotune._policy import (
    Measure,
    choose,
    climb,
    fed_wait,
    keep_climbing,
    to_confirm,
    worker_ladder,
)
from loaderbench.autotune._rung import pooled
from loaderbench.config.loader import AutotuneSettings
from loaderbench.measure.process_tree import ProcessTreeMonitor
from loaderbench.platform.runtime import PRECISIONS, cpus_allowed
from tests.conftest import (
    cpu_spec,
    folder_index,
    read_metrics,
    run_dirs,
    run_entry,
    single_run,
    torchrun,
)
from tests.in_process import run_here

FP32 = PRECISIONS["fp32"][0]
# A short window: the sleeping decode and model make every rate regular.
QUICK_PROBE = AutotuneSettings(window_s=0.3, min_batches=4)
QUICK_OVERRIDES = ["loader.autotune.window_s=0.3", "loader.autotune.min_batches=4"]


def row(workers: int, rate: float, wait: float = 0.5) -> ProbeRow:
    return ProbeRow(workers, rate, wait, 1.0, 100, 10, 1.0)


# ---------------------------------------------------------------------------------------------
# The ladder and the choice.


def test_the_ladder_climbs_by_about_half_up_to_the_cpus_allowed() -> None:
    assert worker_ladder(0) == worker_ladder(1) == [1]
    assert worker_ladder(2) == [1, 2]
    assert worker_ladder(5) == [1, 2, 3, 4, 5]
    assert worker_ladder(16) == [1, 2, 3, 4, 6, 8, 12, 16]
    assert worker_ladder(20) == [1, 2, 3, 4, 6, 8, 12, 16, 20]
    assert worker_ladder(64)[-4:] == [24, 32, 48, 64]


def test_the_cpus_allowed_are_the_slurm_or_torchrun_share_else_the_affinity() -> None:
    import os

    assert cpus_allowed({}) == len(os.sched_getaffinity(0))
    assert cpus_allowed({"SLURM_CPUS_PER_TASK": "12"}) == 12
    node = {"SLURM_JOB_ID": "1", "SLURM_CPUS_ON_NODE": "64", "SLURM_NTASKS_PER_NODE": "8"}
    assert cpus_allowed(node) == 8
    assert cpus_allowed({"LOCAL_WORLD_SIZE": "1000"}) == 1  # at least one


def test_every_count_of_cpus_is_the_allotment(monkeypatch: pytest.MonkeyPatch) -> None:
    """One count for everything sized by the CPUs: the bench's decode limits count a SLURM
    task's allotment as the probe's ladder does (they counted the affinity mask apart), and
    a system without affinity masks (not Linux) falls back to the machine's count."""
    import os

    from tools.bench.limits import usable_cores

    monkeypatch.setenv("SLURM_CPUS_PER_TASK", "1")
    assert usable_cores() == cpus_allowed() == 1
    monkeypatch.delenv("SLURM_CPUS_PER_TASK")
    monkeypatch.delattr(os, "sched_getaffinity")
    assert cpus_allowed({}) == (os.cpu_count() or 1)


def test_choose_takes_the_fewest_workers_within_tolerance_of_the_best() -> None:
    table = [row(1, 100.0), row(2, 190.0), row(3, 196.0), row(4, 200.0)]
    assert choose(table, 0.05) == 2  # 190 >= 0.95 x 200
    assert choose(table, 0.0) == 4
    assert choose(table, 0.5) == 1
    # A count past the best that lost rate (workers taking the model's cores) is never picked
    # over a smaller one as good.
    assert choose([row(1, 100.0), row(2, 150.0), row(3, 120.0)], 0.05) == 2
    with pytest.raises(ValueError, match="no worker count"):
        choose([], 0.05)


def test_climbing_goes_on_while_a_count_gains_and_the_loop_still_waits() -> None:
    assert keep_climbing([row(1, 100.0)], 0.05, 0.05)
    assert keep_climbing([row(1, 100.0), row(2, 106.0)], 0.05, 0.05)
    assert not keep_climbing([row(1, 100.0), row(2, 104.0)], 0.05, 0.05)
    # Measured against the best so far, not the count before.
    rows = [row(1, 100.0), row(2, 150.0), row(3, 120.0), row(4, 155.0)]
    assert not keep_climbing(rows, 0.05, 0.05)
    # A fed loop (waiting 4.8% or less of its time at a 5% tolerance) stops the climb: more
    # workers could make it at most 5% faster, and would take CPU from the model.
    assert fed_wait(0.05) == pytest.approx(0.05 / 1.05)
    assert not keep_climbing([row(1, 100.0, wait=0.0)], 0.05, 0.05)
    assert not keep_climbing([row(1, 100.0, wait=0.5), row(2, 190.0, wait=0.04)], 0.05, 0.05)
    assert keep_climbing([row(1, 100.0, wait=0.06)], 0.05, 0.05)
    assert keep_climbing([row(1, 100.0, wait=0.04)], 0.05, 0.02)  # a tighter tolerance


def test_the_fewest_fed_count_is_chosen_whatever_a_higher_one_measured() -> None:
    # Fed at 1: 2 workers' 10% better window is noise (or the process warming up), not theirs.
    assert choose([row(1, 100.0, wait=0.01), row(2, 110.0, wait=0.0)], 0.05) == 1
    # Fed only at 3; 2 waits and is 20% short.
    table = [row(1, 50.0, wait=0.6), row(2, 80.0, wait=0.3), row(3, 100.0, wait=0.02)]
    assert choose(table, 0.05) == 3
    # A count within the tolerance of the best still wins over a fed higher one.
    assert choose([row(1, 96.0, wait=0.2), row(2, 100.0, wait=0.0)], 0.05) == 1
    # Without a model the loop always waits: the rates alone decide.
    assert choose([row(1, 100.0, wait=1.0), row(2, 190.0, wait=1.0)], 0.05) == 2


def test_counts_near_the_best_are_measured_again_and_chosen_on_both_windows() -> None:
    assert to_confirm([row(1, 90.0), row(2, 108.0), row(3, 111.0)], 0.10, 0.05) == [2, 3]
    assert to_confirm([row(1, 100.0), row(2, 108.0)], 0.10, 0.05) == [1, 2]
    assert to_confirm([row(1, 100.0), row(2, 150.0)], 0.10, 0.05) == []  # one stands clear
    assert to_confirm([row(1, 100.0), row(2, 108.0)], 0.0, 0.05) == []  # confirming is off
    assert to_confirm([row(1, 100.0)], 0.10, 0.05) == []
    # The fewest close count was fed: it is the choice whatever a second window says.
    assert to_confirm([row(1, 100.0, wait=0.01), row(2, 108.0)], 0.10, 0.05) == []
    # 100 images in 1 s, then 100 in 2 s: 200 in 3 s; wait by seconds, CPU by images.
    first = ProbeRow(2, 100.0, 0.1, 2.0, 100, 4, 1.5)
    second = ProbeRow(2, 50.0, 0.4, 4.0, 100, 4, 2.5)
    both = pooled(first, second)
    assert both.images_per_s == pytest.approx(200 / 3)
    assert both.data_wait_frac == pytest.approx(0.3)
    assert both.cpu_s_per_1k_images == pytest.approx(3.0)
    assert (both.images, both.batches, both.seconds, both.windows) == (200, 8, 4.0, 2)
    # One lucky window put 2 workers 7% ahead; measured again, they are not.
    lucky = [row(1, 100.0), row(2, 107.0)]
    assert choose(lucky, 0.05) == 2
    again = [pooled(lucky[0], row(1, 101.0)), pooled(lucky[1], row(2, 96.0))]
    assert choose(again, 0.05) == 1


# A loop of batches of 4 ImageNet-sized JPEGs as this machine runs it (measured once, given
# here as numbers): a decode takes ~30 ms a batch, one slowed by a 50 ms sleep an image 230 ms
# (sleeping, it takes no CPU: every worker adds its batches, whatever the cores); the slow
# model's step 85 ms; two real cores, six CPUs said allowed.
FAST_DECODE_S, SLEEPING_DECODE_S, MODEL_STEP_S, CORES = 0.030, 0.230, 0.085, 2


def loop(decode_s: float, step_s: float | None, sleeping: bool) -> tuple[Measure, list[int]]:
    """What a probe measures of that loop at each count (a ``policy.Measure``, always in
    time), and the list of counts measured, in order: ``workers`` decode side by side (no
    more than the cores, unless the decode sleeps); the loop runs at the workers' rate or the
    model's, whichever is lower, and waits for data the rest of its time (always, without a
    model)."""
    measured: list[int] = []

    def measure(workers: int) -> tuple[ProbeRow, bool]:
        measured.append(workers)
        side_by_side = workers if sleeping else min(workers, CORES)
        batches_per_s = side_by_side / decode_s
        if step_s is not None:
            batches_per_s = min(batches_per_s, 1 / step_s)
        wait = 1.0 if step_s is None else 1 - batches_per_s * step_s
        return row(workers, 4 * batches_per_s, wait), True

    return measure, measured


@pytest.mark.parametrize("model_step_s", [MODEL_STEP_S, None], ids=["slow-model", "no-model"])
def test_auto_gives_a_slow_decode_more_workers_than_a_fast_one(
    model_step_s: float | None,
) -> None:
    """The climb and the choice on the loop's figures (``loop``), six CPUs allowed (ladder 1,
    2, 3, 4, 6). With the slow model one full-speed worker feeds it (30 ms < 85 ms a batch):
    the climb stops there; sleeping workers feed it at 3 (230 / 3 < 85 ms), where it stops.
    Without a model every sleeping worker adds its batches: the climb goes to the top; at full
    speed the two cores bound it (2 and 3 workers alike), so those two are measured again, in
    reverse order, and 2 is chosen."""
    options = AutotuneSettings()
    fast, fast_measured = loop(FAST_DECODE_S, model_step_s, sleeping=False)
    slow, slow_measured = loop(SLEEPING_DECODE_S, model_step_s, sleeping=True)
    fast_rows = climb(worker_ladder(6), fast, options)
    slow_rows = climb(worker_ladder(6), slow, options)
    fast_choice, slow_choice = choose(fast_rows, 0.05), choose(slow_rows, 0.05)
    if model_step_s is not None:
        assert (fast_measured, fast_choice) == ([1], 1)
        assert (slow_measured, slow_choice) == ([1, 2, 3], 3)
        assert slow_rows[0].data_wait_frac > 0.5 >= fed_wait(0.05) >= slow_rows[2].data_wait_frac
    else:
        assert (fast_measured, fast_choice) == ([1, 2, 3, 3, 2], 2)
        assert [r.windows for r in fast_rows] == [1, 2, 2]
        assert (slow_measured, slow_choice) == ([1, 2, 3, 4, 6], 6)
    assert slow_choice > fast_choice


def test_the_climb_starts_no_count_once_the_probe_is_out_of_time() -> None:
    """Out of time after a count: nothing more is measured, not even the counts to confirm;
    out of time while confirming: the counts not yet confirmed keep their one window."""
    fast, _ = loop(FAST_DECODE_S, None, sleeping=False)

    def budget(calls: int) -> tuple[Measure, list[int]]:
        measured: list[int] = []

        def measure(workers: int) -> tuple[ProbeRow, bool]:
            measured.append(workers)
            figures, _ = fast(workers)
            return figures, len(measured) < calls

        return measure, measured

    options = AutotuneSettings()
    for calls, order, windows in [
        (2, [1, 2], [1, 1]),
        (3, [1, 2, 3], [1, 1, 1]),
        (4, [1, 2, 3, 3], [1, 1, 2]),
    ]:
        measure, measured = budget(calls)
        rows = climb(worker_ladder(6), measure, options)
        assert measured == order and [r.windows for r in rows] == windows
        assert choose(rows, 0.05) == 2


# ---------------------------------------------------------------------------------------------
# The probe, in this process, on the torchvision loader (worker processes forked from here).


class TinyNet(nn.Module):
    """A real (small) convolutional classifier with BatchNorm."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(3, 8, 3, stride=2), nn.BatchNorm2d(8), nn.ReLU(), nn.AdaptiveAvgPool2d(1)
        )
        self.head = nn.Linear(8, 4)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(images.float() / 255).flatten(1))


@pytest.fixture(autouse=True)
def one_intra_op_thread() -> Iterator[None]:
    """The models here step on one thread: on a busy 2-core machine a team of two waits on a
    descheduled teammate (a tiny step then takes 100 ms one time, 10 ms the next)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def probe_on(
    root: Path,
    model: nn.Module | None,
    cpus: int,
    train: bool = True,
    settings: AutotuneSettings = QUICK_PROBE,
) -> list[ProbeRow]:
    split = folder_index(root).train
    spec = cpu_spec(split, True, loader="torchvision", batch_size=4, prefetch=2)
    step = None if model is None else model_step(model, FP32, torch.device("cpu"), train=train)
    with ProcessTreeMonitor() as monitor:
        return probe(Workload(spec, step, {}), settings, cpus, monitor)


@pytest.mark.parametrize("train", [True, False], ids=["train-step", "eval-step"])
def test_the_probe_leaves_the_model_and_random_streams_as_they_were(
    tiny_root: Path, train: bool
) -> None:
    """BatchNorm statistics, mode, gradients and every random stream are as before the probe,
    which ran the model on real batches (train.py: forward and backward in train mode, moving
    the statistics and drawing dropout's stream; eval.py: the forward pass in eval mode)."""
    torch.manual_seed(3)
    model = nn.Sequential(TinyNet(), nn.Dropout(0.5))
    model.eval()
    norm = model[0].body[1]
    modes: list[bool] = []
    norm.register_forward_hook(lambda module, args, out: modes.append(module.training))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    streams = (torch.get_rng_state(), random.getstate(), np.random.get_state()[1].copy())
    rows = probe_on(tiny_root, model, cpus=1, train=train)
    assert [r.workers for r in rows] == [1] and rows[0].batches >= 4
    assert len(modes) >= 6 and set(modes) == {train}
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert int(norm.num_batches_tracked) == 0
    assert not model.training
    assert all(p.grad is None for p in model.parameters())
    assert torch.equal(torch.get_rng_state(), streams[0])
    assert random.getstate() == streams[1]
    assert np.array_equal(np.random.get_state()[1], streams[2])


def test_the_probe_measures_close_counts_twice_on_real_loaders(tiny_root: Path) -> None:
    """Two counts within ``confirm_within`` of each other are measured again (the tiny set's
    1 and 2 workers always are, within 99%) and their rows pool both windows; with
    confirming off, each count is measured once."""
    close = AutotuneSettings(window_s=0.3, min_batches=4, confirm_within=0.99)
    rows = probe_on(tiny_root, None, cpus=2, settings=close)
    assert [(r.workers, r.windows) for r in rows] == [(1, 2), (2, 2)], rows
    for measured in rows:  # two windows of whole rounds, each of at least min_batches
        assert measured.batches >= 2 * max(4, 2 * measured.workers)
        assert measured.batches % measured.workers == 0 and measured.images == 4 * measured.batches
    off = AutotuneSettings(window_s=0.3, min_batches=4, confirm_within=0.0)
    assert {r.windows for r in probe_on(tiny_root, None, cpus=2, settings=off)} == {1}


# ---------------------------------------------------------------------------------------------
# Real runs.


@pytest.mark.slow
def test_a_run_with_auto_trains_what_the_chosen_count_trains(
    tiny_root: Path, tmp_path: Path
) -> None:
    """train.py with auto, then with the count it chose: the same weights, optimizer state,
    random streams and accuracy; metrics.json and W&B hold the probe's table."""
    from tests.wandb_offline import offline_runs

    common = [
        f"dataset.root={tiny_root}",
        "model.name=test_resnet",
        "device=cpu",
        "epochs=1",
        "image_size=32",
        "loader.batch_size=4",
        "loader=spdl",
    ]
    auto_cwd, pinned_cwd = tmp_path / "auto", tmp_path / "pinned"
    auto_cwd.mkdir(), pinned_cwd.mkdir()
    proc = run_entry("train.py", *common, "loader.num_workers=auto", *QUICK_OVERRIDES, cwd=auto_cwd)
    auto_dir, auto = single_run(auto_cwd, "train")
    chosen = auto["num_workers"]
    assert isinstance(chosen, int) and chosen >= 1 and auto["num_workers_auto"] is True
    assert auto["autotune_reused"] is False and auto["autotune_s"] > 0
    assert auto["autotune_rank_workers"] == [chosen]
    table = auto["autotune_probe"]
    assert [r["workers"] for r in table] == worker_ladder(cpus_allowed())[: len(table)]
    assert chosen == choose([ProbeRow(**r) for r in table], 0.05)
    for measured in table:
        assert measured["images_per_s"] > 0 and 0 <= measured["data_wait_frac"] <= 1
        assert measured["cpu_s_per_1k_images"] > 0 and measured["batches"] >= 4
    assert f"num_workers=auto: chose {chosen} (" in proc.stdout + proc.stderr
    (wandb_run,) = offline_runs(auto_dir)
    assert wandb_run.summary["num_workers"] == chosen and wandb_run.summary["num_workers_auto"]
    assert len(wandb_run.summary["autotune_probe"]) == len(table)
    (logged,) = [row for row in wandb_run.history if "autotune/probe._type" in row]
    assert logged["autotune/probe._type"] == "table-file"
    (table_file,) = auto_dir.rglob("media/table/autotune/probe_*.table.json")
    wandb_table = json.loads(table_file.read_text())
    assert wandb_table["columns"][:3] == ["workers", "images_per_s", "data_wait_frac"]
    assert [r[0] for r in wandb_table["data"]] == [r["workers"] for r in table]

    run_here("train.py", *common, f"loader.num_workers={chosen}", "logger=none", cwd=pinned_cwd)
    pinned_dir, pinned = single_run(pinned_cwd, "train")
    assert pinned["num_workers"] == chosen and pinned["num_workers_auto"] is False
    assert "autotune_probe" not in pinned
    ours = torch.load(auto_dir / "checkpoint.pt", weights_only=False)
    theirs = torch.load(pinned_dir / "checkpoint.pt", weights_only=False)
    for part in ("model", "optimizer"):
        assert_same(ours[part], theirs[part])
    assert_same(ours["ranks"], theirs["ranks"])  # every random stream where the run left it
    for key in ("loss", "top1", "top5", "val_loss", "images"):
        assert auto[key] == pinned[key], key


def assert_same(ours: object, theirs: object) -> None:
    """Equal, tensors bit for bit, through dicts and lists."""
    if isinstance(ours, torch.Tensor):
        assert isinstance(theirs, torch.Tensor) and torch.equal(ours, theirs)
    elif isinstance(ours, dict):
        assert isinstance(theirs, dict) and ours.keys() == theirs.keys()
        for key in ours:
            assert_same(ours[key], theirs[key])
    elif isinstance(ours, list | tuple):
        assert isinstance(theirs, list | tuple) and len(ours) == len(theirs)
        for a, b in zip(ours, theirs, strict=True):
            assert_same(a, b)
    else:
        assert ours == theirs


@pytest.mark.slow
def test_the_choice_is_remembered_and_probed_again_when_its_key_changes(
    tiny_root: Path, tmp_path: Path
) -> None:
    """eval.py model=none on memmap: the first run builds the cache with every CPU allowed
    and probes; the second reuses the choice at once; another batch size, or
    loader.autotune.refresh=true, probes again."""
    cache = tmp_path / "cache"
    base = [
        f"dataset.root={tiny_root}",
        "model=none",
        "device=cpu",
        "logger=none",
        "loader=memmap",
        f"loader.cache_dir={cache}",
        "loader.num_workers=auto",
        *QUICK_OVERRIDES,
    ]

    def run(name: str, *more: str) -> tuple[dict, str]:
        cwd = tmp_path / name
        cwd.mkdir()
        run_here("eval.py", *base, *more, cwd=cwd)
        (run_dir,) = run_dirs(cwd, "eval")
        return read_metrics(run_dir), (run_dir / "eval.log").read_text()

    first, _ = run("first")
    assert first["autotune_reused"] is False and first["autotune_probe"]
    assert first["loader_val_cache_built"] is True
    assert first["loader_val_cache_build_workers"] == cpus_allowed()
    remembered = list(cache.glob("autotune-*.json"))
    assert [p.name for p in remembered] == [f"autotune-{first['autotune_key']}.json"]

    second, log = run("second")
    assert second["autotune_reused"] is True and second["autotune_key"] == first["autotune_key"]
    assert second["num_workers"] == first["num_workers"] and second["num_workers_auto"] is True
    assert second["autotune_probe"] == first["autotune_probe"]  # the remembered table
    assert second["autotune_s"] < 0.5  # a remembered choice: seconds at most, here ~0.01
    assert second["loader_val_cache_built"] is False
    assert not re.search(r"num_workers=auto: \d+ workers:", log)  # no count was tried
    assert f"num_workers=auto: chose {first['num_workers']} (" in log and "reused from" in log

    other, _ = run("batch", "loader.batch_size=4")
    assert other["autotune_reused"] is False and other["autotune_key"] != first["autotune_key"]
    refreshed, _ = run("refresh", "loader.autotune.refresh=true")
    assert refreshed["autotune_reused"] is False
    assert refreshed["autotune_key"] == first["autotune_key"]
    assert len(list(cache.glob("autotune-*.json"))) == 2


@pytest.mark.slow
def test_two_gloo_ranks_probe_together_and_adopt_one_count(
    small_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Three CPUs a task (SLURM_CPUS_PER_TASK): each rank climbs 1, 2, 3 with the others'
    figures, and both adopt rank 0's choice."""
    monkeypatch.setenv("SLURM_CPUS_PER_TASK", "3")
    torchrun(
        "device=cpu",
        "loader=spdl",
        f"dataset.root={small_root}",
        "epochs=1",
        "model.name=test_resnet",
        "image_size=32",
        "loader.batch_size=8",
        "loader.num_workers=auto",
        *QUICK_OVERRIDES,
        "logger=none",
        cwd=tmp_path,
    )
    _, metrics = single_run(tmp_path, "train")
    assert metrics["status"] == "ok" and metrics["world_size"] == 2
    chosen = metrics["num_workers"]
    assert metrics["autotune_rank_workers"] == [chosen, chosen]
    table = metrics["autotune_probe"]
    assert [r["workers"] for r in table] == [1, 2, 3][: len(table)]
    assert chosen == choose([ProbeRow(**r) for r in table], 0.05)
    # 160 images, 80 a rank: the epoch the run trained is whole, the probe's images apart.
    assert metrics["images"] == 160
