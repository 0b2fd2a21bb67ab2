"""A metric declared once (``loaderbench.measure.metrics``) drives the rank reduction, the sweep
summary, its charts and W&B's per-epoch summaries; a new metric needs its declaration and its
meter."""

from __future__ import annotations

import json
import multiprocessing
import os
import re
from pathlib import Path

import pytest

from loaderbench import loaders
from loaderbench.measure import metrics
from loaderbench.measure.meters import LoopMeter, loop_metrics
from loaderbench.measure.ranks import reduce_loop_metrics
from loaderbench.platform import distributed
from loaderbench.run import sweeps
from tests.conftest import REPO, free_ports

# What each of two ranks measured (rank 1 twice as fast, waiting less, started later).
RANK_METRICS = [
    {"loader": "memmap", "images": 64, "images_per_s": 100.0, "images_per_s_end_to_end": 80.0,
     "steady_batches": 6, "ttfb_s": 0.5, "data_wait_frac": 0.4, "loop_s": 1.0, "cpu_s": 2.0,
     "cpu_s_per_1k_images": 31.25, "wall_s": 9.0},
    {"loader": "memmap", "images": 64, "images_per_s": 200.0, "images_per_s_end_to_end": 150.0,
     "steady_batches": 7, "ttfb_s": 1.5, "data_wait_frac": 0.2, "loop_s": 3.0, "cpu_s": 6.0,
     "cpu_s_per_1k_images": 93.75, "wall_s": 9.5},
]  # fmt: skip


def combine_on_rank(rank: int, port: int, out: str) -> None:
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE="2"
    )
    info = distributed.dist_info()
    import torch

    distributed.init(info, torch.device("cpu"), timeout_s=60)
    try:
        combined = reduce_loop_metrics(RANK_METRICS[rank], 2)
        (Path(out) / f"rank{rank}.json").write_text(json.dumps(combined))
    finally:
        distributed.shutdown(failed=False)


@pytest.mark.slow
def test_two_ranks_combine_each_metric_as_declared(tmp_path: Path) -> None:
    context = multiprocessing.get_context("spawn")
    port = free_ports(1)
    ranks = [context.Process(target=combine_on_rank, args=(r, port, str(tmp_path))) for r in (0, 1)]
    for process in ranks:
        process.start()
    for process in ranks:
        process.join(120)
        assert process.exitcode == 0, process.exitcode
    first, second = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1))
    combined = [m.key for m in metrics.METRICS if m.over_ranks != "same" and m.key in first]
    assert {k: first[k] for k in combined} == {k: second[k] for k in combined}
    assert first["images"] == 128 and isinstance(first["images"], int)
    assert first["images_per_s"] == 300.0 and first["images_per_s_end_to_end"] == 230.0
    assert first["ttfb_s"] == 1.5  # the slowest rank's start
    assert first["data_wait_frac"] == pytest.approx(0.3) and first["loop_s"] == 2.0
    assert first["cpu_s"] == 8.0 and first["cpu_s_per_1k_images"] == 1000 * 8.0 / 128
    assert first["rank_images_per_s"] == [100.0, 200.0]
    assert first["rank_data_wait_frac"] == [0.4, 0.2] and first["slowest_rank"] == 0
    assert first["rank_cpu_s_per_1k_images"] == [31.25, 93.75]
    # Not declared as combined: each rank's own (rank 0's goes to metrics.json).
    assert (first["steady_batches"], second["steady_batches"]) == (6, 7)
    assert (first["wall_s"], second["wall_s"]) == (9.0, 9.5)


def test_every_loop_metric_is_declared_and_the_summary_follows_the_declarations() -> None:
    meter = LoopMeter(warmup_batches=0)
    produced = loop_metrics(meter, cpu_s=0.0)
    assert set(produced) <= set(metrics.BY_KEY), set(produced) - set(metrics.BY_KEY)
    columns = metrics.summary_keys()
    assert {"images_per_s", "data_wait_frac", "cpu_s_per_1k_images", "top1"} <= set(columns)
    assert set(metrics.charted()) <= set(columns)
    assert metrics.epoch_summaries()["epoch/images_per_s"] == "mean,last"


def test_a_new_metric_is_its_declaration(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A metric declared summed over ranks and shown in the summary: the reduction sums it and
    a sweep's summary.csv has its column, with nothing else changed."""
    new = metrics.Metric("frames_dropped", "frames a loader dropped", "sum", summary=True)
    monkeypatch.setattr(metrics, "METRICS", (*metrics.METRICS, new))
    reduced = metrics.combine_over_ranks(
        {"frames_dropped": 3, "images": 4}, 0, 2, lambda values, op: [2 * v for v in values]
    )
    assert reduced["frames_dropped"] == 6.0
    job = tmp_path / "sweep" / "0"
    (job / ".hydra").mkdir(parents=True)
    (job / ".hydra" / "overrides.yaml").write_text("- loader=memmap\n")
    (job / "metrics.json").write_text(json.dumps({"status": "ok", "frames_dropped": 5}))
    summary = sweeps.write_summary(tmp_path / "sweep")
    columns, rows = summary.columns, summary.rows
    assert "frames_dropped" in columns and rows[0]["frames_dropped"] == 5
    assert "frames_dropped" in (tmp_path / "sweep" / "summary.csv").read_text().splitlines()[0]


def test_the_report_and_the_gpu_check_take_their_columns_from_the_catalog() -> None:
    """The report's columns (tools/bench/columns.py) and the GPU check's (its report.py) are
    metrics of the catalog, the rate first, each report column titled in the pipelines table;
    the epoch curves are W&B's ``epoch/<key>``."""
    from dataclasses import fields

    from loaderbench.measure.metrics import BY_KEY, epoch_curves
    from tools.bench.columns import COLUMNS
    from tools.bench.render import pipeline_header
    from tools.bench.schema import Row
    from tools.gpu_check.report import DECIMALS, ROW_METRICS

    assert next(iter(COLUMNS)) == "images_per_s" and set(COLUMNS) <= set(BY_KEY)
    assert set(COLUMNS) <= {field.name for field in fields(Row)}  # a row holds every column
    header = pipeline_header()
    assert all(column.title in header for column in COLUMNS.values())
    assert header.index("images/s") < header.index("vs FFCV")
    assert {"images_per_s", "data_wait_frac"} <= set(ROW_METRICS)
    assert set(DECIMALS) <= set(ROW_METRICS) <= set(BY_KEY)
    curves = epoch_curves({"images_per_s": 10.0, "data_wait_frac": 0.5})
    assert curves["epoch/data_wait_frac"] == 0.5 and curves["epoch/images_per_s"] == 10.0


def _config_keys() -> set[str]:
    """Every key of the composed train config, the loaders' settings included: names the
    config owns (``num_workers``, ``batch_size``), which a metric may repeat."""
    from omegaconf import OmegaConf

    from tests.helpers import compose_cfg

    def keys(node: object) -> set[str]:
        if isinstance(node, dict):
            return set(node) | {k for value in node.values() for k in keys(value)}
        return set()

    found: set[str] = set()
    for loader in loaders.loader_names():
        cfg = compose_cfg("train", [f"loader={loader}"])
        found |= keys(OmegaConf.to_container(cfg, resolve=False))
    return found


def test_a_metric_is_named_in_at_most_three_modules() -> None:
    """A metric's name is written once (its ``Metric`` line, or a constant beside it, which
    other modules import): renaming it is one edit. Counted over the product's modules (src/,
    tools/, the entry points), as a quoted string; a metric named by a plain word (``images``,
    ``status``) or by a config key (``num_workers``) is left out, since those words name other
    things too (a decode table's column, a checkpoint's field)."""
    modules = [p for d in ("src", "tools") for p in (REPO / d).rglob("*.py")]
    modules += [REPO / "train.py", REPO / "eval.py"]
    texts = {p.relative_to(REPO): p.read_text() for p in modules}
    config_keys = _config_keys()
    named = [m.key for m in metrics.METRICS if not m.key.isalpha() and m.key not in config_keys]
    assert "data_wait_frac" in named and "num_workers" not in named
    over = {}
    for key in named:
        quoted = re.compile(rf"""(["']){re.escape(key)}\1""")
        where = sorted(str(path) for path, text in texts.items() if quoted.search(text))
        if len(where) > 3:
            over[key] = where
    assert not over, f"metrics named in more than 3 modules (import its constant): {over}"
