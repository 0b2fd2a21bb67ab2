"""A ranking that is true (issue 43): best first by the measured rate, a job without a rate
apart and never called failed, a failed job called failed with its error, each loader's lead,
and the worker count to use: the fewest within the spread of the best. From sweep folders
written here, read back through the summary the callback writes."""

from __future__ import annotations

import csv
import json
from pathlib import Path

from loaderbench.run.sweeps import rank_rows, within_spread, write_summary
from tests.markdown_rows import unpadded

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def sweep_folder(root: Path, swept: str, jobs: list[tuple[str, dict]]) -> Path:
    """A sweep directory as Hydra leaves it: multirun.yaml, and a job folder a job."""
    root.mkdir(parents=True)
    (root / "multirun.yaml").write_text(f'hydra:\n  overrides:\n    task: ["{swept}"]\n')
    for num, (overrides, metrics) in enumerate(jobs):
        (root / str(num) / ".hydra").mkdir(parents=True)
        lines = "".join(f"- {o}\n" for o in overrides.split())
        (root / str(num) / ".hydra" / "overrides.yaml").write_text(lines)
        if metrics:
            (root / str(num) / "metrics.json").write_text(json.dumps(metrics))
    return root


def job(loader: str, rate: float | None, **more: object) -> dict:
    reason = None if rate is not None else "no steady window: the loop had 3 batches"
    return {
        "status": "ok",
        "loader": loader,
        "model": "none",
        "images_per_s": rate,
        "images_per_s_null_reason": reason,
        "cpu_s_per_1k_images": 2.0,
        "data_wait_frac": 0.9,
        **more,
    }


def test_best_first_is_the_most_images_per_s_and_no_rate_is_not_a_failure(
    tmp_path: Path,
) -> None:
    sweep = sweep_folder(
        tmp_path / "sweep",
        "loader=torchvision,memmap,spdl",
        [
            ("loader=torchvision", job("torchvision", 900.0)),
            ("loader=memmap", job("memmap", None)),
            ("loader=spdl", job("spdl", 1350.0)),
            ("loader=resident", {}),  # crashed before writing metrics.json
        ],
    )
    summary = write_summary(sweep)
    ranking = summary.ranking
    assert [r["loader"] for r in ranking.ranked] == ["spdl", "torchvision"]
    assert [r["rank"] for r in ranking.ranked] == [1, 2]
    assert ranking.ranked[0]["lead"] == 1.5 and ranking.ranked[1]["lead"] is None
    assert [r["loader"] for r in ranking.unrated] == ["memmap"]
    assert [r["job"] for r in ranking.failed] == ["3"]
    md = unpadded((sweep / "summary.md").read_text())
    assert "4 jobs over loader: 2 with a rate, best first (images/s); 1 without a rate" in md
    assert "1 failed" in md and "spdl leads torchvision by 1.50x" in md
    unrated = md[md.index("## Jobs without a rate") : md.index("## Failed jobs")]
    assert "| 1 | memmap | ok | no steady window: the loop had 3 batches |" in unrated
    assert "no readable metrics.json" in md[md.index("## Failed jobs") :]
    # The lead table: the answer's columns, not every metric (those are in summary.csv).
    header = next(line for line in md.splitlines() if line.startswith("| rank |"))
    assert header == (
        "| rank | job | loader | images/s | spread | lead over the next | CPU ms / image "
        "| data wait |"
    )
    with open(sweep / "summary.csv") as f:
        rows = list(csv.DictReader(f))
    assert [r["loader"] for r in rows] == ["spdl", "torchvision", "memmap", ""]
    assert [r["status"] for r in rows] == ["ok", "ok", "ok", "failed"]
    assert "images_per_s_null_reason" in rows[0] and "cpu_s_per_1k_images" in rows[0]
    assert (sweep / "summary.png").read_bytes()[:8] == PNG_MAGIC


def test_with_a_model_top1_is_a_column_beside_the_rate_and_does_not_rank(tmp_path: Path) -> None:
    """Every worker count gives the same top-1 by design: job order is no ranking."""
    jobs = [
        (
            f"loader.num_workers={n}",
            job(
                "torchvision",
                rate,
                model="test_resnet",
                top1=0.877,
                ceiling_images_per_s=600.0,
                ceiling_frac=rate / 600,
                num_workers=n,
                images_per_s_spread=0.01,
                peak_rss_mb=100.0 * n,
            ),
        )
        for n, rate in ((8, 288.0), (16, 294.0), (32, 304.0))
    ]
    sweep = sweep_folder(tmp_path / "sweep", "loader.num_workers=8,16,32", jobs)
    ranking = write_summary(sweep).ranking
    assert [r["num_workers"] for r in ranking.ranked] == [32, 16, 8]
    md = unpadded((sweep / "summary.md").read_text())
    header = next(line for line in md.splitlines() if line.startswith("| rank |"))
    assert "| ceiling_frac |" in header and header.endswith("| top-1 |")
    # Spreads of 1%: 294 +- 3 and 304 +- 3 do not overlap, so 32 workers it is.
    assert ranking.workers[0].chosen["num_workers"] == 32
    assert "## Workers to use: loader.num_workers=32" in md
    assert "| 8 | 288 | ± 1% | 95% | 2 | 800 |" in md


def test_the_fewest_workers_within_the_spread_of_the_best_are_named() -> None:
    rows = [
        {
            "status": "ok",
            "loader": "spdl",
            "loader.num_workers": str(n),
            "num_workers": n,
            "images_per_s": rate,
            "images_per_s_spread": spread,
        }
        for n, rate, spread in (
            (1, 500.0, 0.02),
            (2, 950.0, 0.03),
            (4, 980.0, 0.02),
            (8, 990.0, 0.01),
        )
    ]
    rows.append({**rows[0], "loader": "torchvision", "images_per_s": 700.0})
    ranking = rank_rows(["loader", "loader.num_workers"], rows)
    chosen = {c.group: c.chosen["num_workers"] for c in ranking.workers}
    # 950 x 1.03 = 978.5 >= 990 x 0.99 = 980.1? No; 980 x 1.02 = 999.6 >= 980.1: 4 workers.
    assert chosen == {"loader=spdl": 4, "loader=torchvision": 1}
    assert within_spread(rows[2], rows[3]) and not within_spread(rows[1], rows[3])
    assert [r.get("workers_choice") for r in rows[:4]] == [None, None, "use", None]


def test_a_job_stopped_by_a_signal_did_not_finish_and_did_not_fail(tmp_path: Path) -> None:
    sweep = sweep_folder(
        tmp_path / "sweep",
        "loader=torchvision,spdl",
        [
            ("loader=torchvision", job("torchvision", 900.0)),
            ("loader=spdl", {**job("spdl", None), "status": "preempted"}),
        ],
    )
    ranking = write_summary(sweep).ranking
    assert not ranking.failed and [r["job"] for r in ranking.stopped] == ["1"]
    md = unpadded((sweep / "summary.md").read_text())
    assert "1 did not finish (interrupted or preempted)" in md and "failed" not in md
    assert "| 1 | spdl | preempted |" in md[md.index("## Jobs that did not finish") :]
