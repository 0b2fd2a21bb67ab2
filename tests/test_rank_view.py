"""Every rank in view (issue 31, item 1): each rank's images/s, data wait, CPU cost and peak
memory by rank in metrics.json (the run's and each epoch's), the slowest rank named with its
data wait beside the mean, a log line naming a rank that waits markedly more (and whether its
CPUs or unreadable files differ), and W&B's per-rank table and curve. End to end: a real
two-rank torchrun job of train.py whose rank 1 decodes with a sleep."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from loaderbench.measure.metrics import rank_rows, straggler_note, summary_keys, with_epoch_ranks
from loaderbench.run import sweeps
from tests.conftest import REPO, finish, single_run, start_torchrun
from tests.markdown_rows import unpadded


def test_a_rank_waiting_markedly_more_is_named_with_what_differs() -> None:
    metrics = {
        "rank_data_wait_frac": [0.05, 0.06, 0.52, 0.04],
        "rank_cpus": [8, 8, 4, 8],
        "rank_skipped_files": [0, 0, 0, 0],
    }
    note = straggler_note(metrics)
    assert note is not None and note.startswith("rank 2 waits markedly more for data")
    assert "52.0% of its loop against 5.0% (the others' median)" in note
    assert "its CPUs 4 against 8: differ" in note
    assert "its unreadable files 0 against 0: the same" in note
    metrics["rank_cpus"] = [8] * 4
    assert "(look at its node" in straggler_note(metrics)


@pytest.mark.parametrize(
    "waits",
    [
        [0.30, 0.38],  # above the other by less than 10 points of the loop
        [0.001, 0.09],  # 90 times the other's, but 9 points: noise at this level
        [0.5, None],  # a rank without a measured loop names nobody
        [0.7],  # one process
    ],
)
def test_no_rank_is_named_where_none_waits_markedly_more(waits: list) -> None:
    assert straggler_note({"rank_data_wait_frac": waits}) is None


def test_each_epoch_appends_its_lists_by_rank_and_a_single_process_none() -> None:
    first = {"rank_data_wait_frac": [0.1, 0.4], "slowest_rank": 1, "images_per_s": 9.0}
    second = {"rank_data_wait_frac": [0.3, 0.2], "slowest_rank": 0}
    run = with_epoch_ranks({}, first)
    run.update(with_epoch_ranks(run, second))
    assert run == {
        "epoch_rank_data_wait_frac": [[0.1, 0.4], [0.3, 0.2]],
        "epoch_slowest_rank": [1, 0],
    }
    assert with_epoch_ranks(run, {"data_wait_frac": 0.2}) == {}
    assert rank_rows({"data_wait_frac": 0.2}) == []


def test_the_sweep_summary_has_the_slowest_ranks_wait_beside_the_mean(tmp_path: Path) -> None:
    at = summary_keys().index("data_wait_frac")
    assert summary_keys()[at + 1] == "slowest_rank_data_wait_frac"
    for job, ranks in (("0", 2), ("1", 1)):
        folder = tmp_path / "sweep" / job
        (folder / ".hydra").mkdir(parents=True)
        (folder / ".hydra" / "overrides.yaml").write_text("- loader=memmap\n")
        metrics = {"status": "ok", "images_per_s": 10.0 * ranks, "data_wait_frac": 0.25}
        if ranks > 1:  # what a two-rank job's metrics.json holds
            metrics.update(slowest_rank=1, slowest_rank_data_wait_frac=0.4)
        (folder / "metrics.json").write_text(json.dumps(metrics))
    summary = sweeps.write_summary(tmp_path / "sweep")
    columns, rows = summary.columns, summary.rows
    at = columns.index("data_wait_frac")
    assert columns[at + 1 : at + 2] == ["slowest_rank_data_wait_frac"]
    assert [r["slowest_rank_data_wait_frac"] for r in rows] == [0.4, None]
    lines = unpadded((tmp_path / "sweep" / "summary.md").read_text()).splitlines()
    (header,) = [line for line in lines if line.startswith("| rank |")]
    assert "| data wait | slowest rank's wait |" in header
    assert "| 25% | 40% |" in lines[lines.index(header) + 2]


@pytest.fixture
def session_config(tiny_root: Path, tmp_path: Path):
    """train.py's composed config (its run directory ``tmp_path``) as Hydra hands it to the
    task, with Hydra's own config in place for ``open_session``; removed afterwards."""
    from hydra import compose, initialize_config_dir
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import OmegaConf, open_dict

    import loaderbench.run.compose  # noqa: F401  (registers the config schemas)

    overrides = [f"dataset.root={tiny_root}", "logger=none", "device=cpu", "loader.batch_size=4"]
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        full = compose("train", overrides=overrides, return_hydra_config=True)
    with open_dict(full):
        full.hydra.runtime.output_dir = str(tmp_path)
    HydraConfig.instance().set_config(full)
    yield OmegaConf.masked_copy(full, [key for key in full if key != "hydra"])
    HydraConfig.instance().cfg = None


@pytest.mark.parametrize("end", ["ok", "preempted", "interrupted"])
def test_the_straggler_line_is_written_once_however_the_run_ends(
    end: str, session_config, caplog: pytest.LogCaptureFixture
) -> None:
    """A run preempted or interrupted (the usual end on a cluster) names its straggler too,
    from the per-rank figures of its epochs so far; once per run, as an ok run does."""
    from loaderbench.platform.stopping import Preempted
    from loaderbench.run.session import open_session

    stop = {"preempted": Preempted, "interrupted": KeyboardInterrupt}.get(end)
    with caplog.at_level("WARNING"):
        try:
            with open_session(session_config, "train") as session:
                session.record({"rank_data_wait_frac": [0.05, 0.6]})  # an epoch's, 2 ranks
                if stop is not None:
                    raise stop("stopped")
        except (Preempted, KeyboardInterrupt):
            assert stop is not None
    assert json.loads((session.run_dir / "metrics.json").read_text())["status"] == end
    assert caplog.text.count("rank 1 waits markedly more for data") == 1, caplog.text


@pytest.mark.slow
def test_a_rank_with_a_sleeping_decode_is_named_the_slowest(
    small_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two ranks (torchrun, gloo), rank 1's decode sleeping 30 ms an image: metrics.json's
    lists by rank (run and epochs) have two entries, rank 1 is the slowest and its data wait
    above rank 0's, the log names it (its CPUs and unreadable files the same as rank 0's), and
    the W&B run holds the rank table and the slowest rank's data wait per epoch."""
    from tests.wandb_offline import offline_runs

    monkeypatch.setenv("SLOW_RANK", "1")
    monkeypatch.setenv("SLOW_DECODE_S", "0.03")
    proc = start_torchrun(
        "device=cpu",
        "loader=torchvision",
        "loader.num_workers=1",
        "loader.batch_size=16",
        f"dataset.root={small_root}",
        "epochs=2",
        "model.name=test_resnet",
        "logger=wandb",
        cwd=tmp_path,
        script=REPO / "tests" / "slow_rank.py",
    )
    output = finish(proc, timeout=300)
    assert proc.returncode == 0, output[-6000:]
    run_dir, metrics = single_run(tmp_path, "train")
    assert metrics["status"] == "ok" and metrics["world_size"] == 2
    for key in ("images_per_s", "data_wait_frac", "cpu_s_per_1k_images", "peak_rss_mb"):
        values = metrics[f"rank_{key}"]
        assert len(values) == 2 and all(v is not None and v > 0 for v in values), (key, values)
        epochs = metrics[f"epoch_rank_{key}"]
        assert len(epochs) == 2 and all(len(epoch) == 2 for epoch in epochs), (key, epochs)
    waits = metrics["rank_data_wait_frac"]
    assert metrics["slowest_rank"] == 1 and waits[1] > waits[0] + 0.1, waits
    assert metrics["slowest_rank_data_wait_frac"] == waits[1]
    assert metrics["data_wait_frac"] == pytest.approx(sum(waits) / 2)
    assert metrics["epoch_slowest_rank"] == [1, 1]
    assert metrics["rank_cpus"] == [metrics["cpus"]] * 2 and isinstance(metrics["cpus"], int)
    assert metrics["rank_skipped_files"] == [0, 0]
    assert all(isinstance(v, int) for v in metrics["rank_cpus"] + metrics["rank_skipped_files"])
    assert metrics["peak_rss_mb"] == pytest.approx(sum(metrics["rank_peak_rss_mb"]), rel=1e-6)
    log_text = (run_dir / "train.log").read_text()
    (line,) = [x for x in log_text.splitlines() if "waits markedly more for data" in x]
    cpus = metrics["cpus"]
    assert "rank 1 waits markedly more" in line and f"CPUs {cpus} against {cpus}: the same" in line
    assert "(slowest rank 1: " in log_text  # the epoch's line

    (wandb_run,) = offline_runs(run_dir)
    curve = [r["epoch/slowest_rank_data_wait_frac"] for r in wandb_run.history if "epoch" in r]
    assert curve == [pytest.approx(w[1]) for w in metrics["epoch_rank_data_wait_frac"]]
    (logged,) = [row for row in wandb_run.history if "rank_table._type" in row]
    assert logged["rank_table._type"] == "table-file"
    (table_file,) = run_dir.rglob("media/table/rank_table_*.table.json")
    table = json.loads(table_file.read_text())
    assert table["columns"][:4] == ["rank", "images_per_s", "data_wait_frac", "cpu_s_per_1k_images"]
    assert {"peak_rss_mb", "cpus", "skipped_files"} <= set(table["columns"])
    assert [row[0] for row in table["data"]] == [0, 1]
    assert [row[2] for row in table["data"]] == pytest.approx(waits)
