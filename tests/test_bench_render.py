"""The benchmark's report is drawn from report.json alone: the committed report.md is exactly what
the committed report.json draws, the file reads back as it was written, a file of another schema
or missing a key is refused naming it, and what a row is held to comes from the bounds declared
in the file, not from a loader's name (a loader the renderer has never heard of is drawn too)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from loaderbench.bench import render
from loaderbench.bench.schema import SCHEMA_VERSION, DecodeLimit, DecodeRate, Report, Row
from tests.conftest import REPO

COMMITTED = REPO / "bench" / "report.json"
RENDER = [sys.executable, "-m", "loaderbench.bench.render"]


def test_the_committed_report_is_drawn_from_the_committed_json(tmp_path: Path) -> None:
    """`make report`: report.md byte for byte, and a PNG, from report.json without measuring."""
    proc = subprocess.run(
        [*RENDER, "--json", str(COMMITTED), "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "report.md").read_bytes() == (REPO / "bench" / "report.md").read_bytes()
    assert (tmp_path / "report.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_report_json_reads_back_as_written() -> None:
    saved = json.loads(COMMITTED.read_text())
    assert saved["schema_version"] == SCHEMA_VERSION
    assert Report.load(COMMITTED).to_json() == saved


def test_another_schema_or_a_missing_key_is_refused_naming_it(tmp_path: Path) -> None:
    saved = json.loads(COMMITTED.read_text())
    path = tmp_path / "report.json"
    path.write_text(json.dumps({**saved, "schema_version": 0}))
    with pytest.raises(ValueError, match=r"report\.json: .*schema_version is 0"):
        Report.load(path)
    del saved["wall_s"]
    path.write_text(json.dumps(saved))
    with pytest.raises(ValueError, match=r"report\.json: no key 'wall_s'"):
        Report.load(path)
    proc = subprocess.run(
        [*RENDER, "--json", str(tmp_path / "none.json")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2 and "none.json: no such file" in proc.stderr


def a_report(rows: list[Row]) -> Report:
    """The committed report with other rows."""
    report = Report.load(COMMITTED)
    report.rows = rows
    report.auto, report.stores = [], []
    return report


def test_a_loader_is_held_to_what_it_declares_not_to_its_name() -> None:
    """A loader the renderer never heard of ("shelf", a reader of stored pixels) is named as
    one, compared with the tutorial's stored loader and FFCV's raw store, and coloured; a
    decoding loader with yardsticks gets their lines; peers never count as the answer."""
    decode = Report.load(COMMITTED).decode_limit
    rows = [
        Row(
            "val",
            "shelf",
            2,
            9000.0,
            0.1,
            kind="loader",
            bounds=("copy",),
            limit_name="memory copy",
            limit_images_per_s=1e5,
        ),
        Row(
            "val",
            "decoder",
            2,
            900.0,
            1.0,
            kind="loader",
            bounds=("decode", "pool"),
            limit_name="CPU decode",
            limit_images_per_s=decode.images_per_s,
        ),
        Row("val", "torchvision", 2, 450.0, 2.0, kind="loader", bounds=("decode",)),
        Row("val", "tutorial tensorclass", 0, 3000.0, 0.5),
        Row(
            "val",
            "ffcv (raw)",
            2,
            6000.0,
            0.2,
            bounds=("copy",),
            extra={"store": "raw", "write_mode": "raw"},
        ),
        Row(
            "val",
            "ffcv (jpg)",
            2,
            1800.0,
            0.7,
            bounds=("decode",),
            extra={"store": "jpeg", "write_mode": "jpg"},
        ),
        Row("val", "fast peer", 2, 1e6, 0.01, bounds=("decode",)),
    ]
    text = render.markdown(a_report(rows))
    assert "for the shelf reader memory copy in val)" in text
    assert "on its raw store for the readers of stored pixels (shelf)" in text
    assert "- val: shelf (best) vs the tutorial's tensorclass loader: 3.0x" in text
    pool = decode.pool_ratio(900.0)
    assert (
        f"- val, decoder at 2 workers: {100 * decode.ratio(900.0):.1f}% of the CPU decode "
        f"limit, {100 * pool:.1f}% of the plain thread pool"
    ) in text
    assert "- val, shelf at 2 workers:" not in text  # no yardstick declared
    # The answer: the fastest loader (not the faster peer), against FFCV's raw store.
    assert "- **val**: `loader=shelf loader.num_workers=2`, 9,000 images/s" in text
    assert "1.50x FFCV on its raw store" in text
    assert "- val, 2 workers, vs torchvision: shelf 20.0x, decoder 2.0x" in text
    colours = render_colours(rows)
    assert len(set(colours.values())) == len({r.name.split(" (")[0] for r in rows})
    assert colours["ffcv (raw)"] == colours["ffcv (jpg)"]


def render_colours(rows: list[Row]) -> dict[str, str]:
    from loaderbench.bench.plot import colours

    return colours(rows)


def test_a_limit_reads_back_with_its_figures() -> None:
    limit = DecodeLimit(2, 64, (DecodeRate("a", 10, 0.5, 0.4), DecodeRate("b", 10, 0.25, 0.3)))
    again = DecodeLimit.from_json(json.loads(json.dumps(limit.to_json())))
    assert again == limit and again.images_per_s == 80.0 and again.best.name == "b"
