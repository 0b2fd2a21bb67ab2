"""The benchmark's report is drawn from report.json alone: the committed report.md is exactly what
the committed report.json draws, the file reads back as it was written, a file of another schema
or missing a key is refused naming it, and what a row is held to comes from the bounds declared
in the file, not from a loader's name (a loader the renderer has never heard of is drawn too)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.markdown_rows import cells
from tools.bench import render, render_cores
from tools.bench.schema import SCHEMA_VERSION, DecodeLimit, DecodeRate, Report, Row

COMMITTED = REPO / "bench" / "report.json"
RENDER = [sys.executable, "-m", "tools.bench.render"]


@pytest.mark.slow
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


@pytest.mark.slow
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
    from tools.bench.plot import colours

    return colours(rows)


def test_a_limit_reads_back_with_its_figures() -> None:
    limit = DecodeLimit(2, 64, (DecodeRate("a", 10, 0.5, 0.4), DecodeRate("b", 10, 0.25, 0.3)))
    again = DecodeLimit.from_json(json.loads(json.dumps(limit.to_json())))
    assert again == limit and again.images_per_s == 80.0 and again.best.name == "b"


def costed(task: str, name: str, workers: int, cpu_s_per_1k: float) -> Row:
    return Row(task, name, workers, 1000.0, cpu_s_per_1k, kind="loader", bounds=("decode",))


def cores_table(text: str) -> dict[tuple[str, str], list[str]]:
    """The cores-per-GPU table's cells by (pipeline, loader)."""
    section = text.split("## How many cores feed my GPUs?")[1]
    rows = [cells(line) for line in section.splitlines() if line.startswith("| ")][1:]
    return {(row[0], row[1]): row[2:] for row in rows}


def test_cores_per_gpu_from_the_measured_cpu_cost() -> None:
    """2.0 CPU s a 1000 images at 3,000 images/s a GPU: 6 cores a GPU, 48 for 8 GPUs, fed on 112
    cores with 64 to spare; 10.0 CPU s: 240 cores, not fed, its cores feed 112/240 of the rate;
    each loader at the most workers it was measured with; the rate's source said."""
    report = a_report(
        [
            costed("train", "fits", 1, 1.0),
            costed("train", "fits", 2, 2.0),
            costed("train", "hungry", 2, 10.0),
            costed("val", "fits", 2, 2.0),
            Row("val", "unmeasured", 2, 1000.0, None),
        ]
    )
    report.options.gpu_rate = 3000.0  # as `--gpu-rate 3000` stores it
    text = render.markdown(report)
    table = cores_table(text)
    assert table[("train", "fits")] == ["2", "2.00", "6.00", "48.0", "yes", "64.0", "100%", "18"]
    assert table[("train", "hungry")] == ["2", "10.00", "30.00", "240.0", "no", "-", "47%", "3"]
    assert ("val", "unmeasured") not in table  # no CPU cost measured: nothing to answer from
    assert "Per-GPU rate: 3,000 images/s, given with `--gpu-rate` (not measured here)" in text
    assert "Node: 8 GPUs and 112 cores" in text
    assert (
        "- **train**: 1 of 2 pipelines keep 8 GPUs fed on 112 cores; the most to spare: fits "
        "(64.0 cores); not fed: hungry (47% of the GPU rate: 1,400 images/s a GPU)."
    ) in text
    assert "- **val**: 1 of 1 pipelines keep 8 GPUs fed on 112 cores" in text


def test_the_per_gpu_rate_comes_from_a_gpu_run_first_else_the_published_resnet50_rate(
    tmp_path: Path,
) -> None:
    """No rate given: NVIDIA's published ResNet-50 figure, cited; a GPU run's own model rate
    (read from its metrics.json: images/s over its ranks, the data wait taken out) comes before
    a --gpu-rate; a metrics.json of a CPU run is refused, naming the file."""
    report = a_report([costed("train", "fits", 2, 2.0)])
    text = render.markdown(report)
    assert "Per-GPU rate: 2,470 images/s, ResNet-50 v1.5 training in mixed precision" in text
    assert "DeepLearningExamples" in text and "16,621 on 8" in text
    assert cores_table(text)[("train", "fits")][2] == "4.94"  # 2,470 x 2.0 / 1000
    metrics = tmp_path / "metrics.json"
    metrics.write_text(
        json.dumps(
            {
                "status": "ok",
                "device": "cuda",
                "model": "resnet50",
                "images_per_s": 4000.0,
                "data_wait_frac": 0.2,
                "rank_images_per_s": [2000.0, 2000.0],
            }
        )
    )
    report.options.gpu_rate = 3000.0
    report.gpu_model_rate = render_cores.model_rate_from_metrics(metrics)
    text = render.markdown(report)
    assert (
        "Per-GPU rate: 2,500 images/s, a GPU run's own model rate: model=resnet50 on cuda "
        f"({metrics}: 4,000 images/s on 2 GPU(s), its data wait of 20.0% taken out)" in text
    )
    assert cores_table(text)[("train", "fits")][2] == "5.00"
    # The ranks are metrics.json's world_size (a metrics.json without rank lists included).
    metrics.write_text(
        json.dumps({"device": "cuda", "model": "resnet50", "images_per_s": 8000.0, "world_size": 4})
    )
    assert render_cores.model_rate_from_metrics(metrics).images_per_s == 2000.0
    metrics.write_text(json.dumps({"device": "cpu", "model": "resnet50", "images_per_s": 50.0}))
    refused = f"--gpu-metrics {re.escape(str(metrics))}: device is 'cpu'"
    with pytest.raises(ValueError, match=refused):
        render_cores.model_rate_from_metrics(metrics)


NODE_ARGS = ["--gpu-rate", "3000", "--gpus", "4", "--cores", "16"]


@pytest.mark.slow
def test_gpu_rate_on_the_renderer_redraws_the_table_without_measuring(tmp_path: Path) -> None:
    """`make report ARGS="--gpu-rate 3000 --gpus 4 --cores 16"`: the committed report.json drawn
    for another GPU and node; report.json is left as it was; a count of 0 is refused."""
    before = COMMITTED.read_bytes()
    proc = subprocess.run(
        [*RENDER, "--json", str(COMMITTED), "--out", str(tmp_path), *NODE_ARGS],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert COMMITTED.read_bytes() == before
    text = (tmp_path / "report.md").read_text()
    assert "Per-GPU rate: 3,000 images/s, given with `--gpu-rate`" in text
    table = cores_table(text)
    row = max(
        (
            r
            for r in Report.load(COMMITTED).rows
            if (r.pipeline, r.name) == ("train", "torchvision")
        ),
        key=lambda r: r.workers or 0,
    )
    per_gpu = 3000 * (row.cpu_s_per_1k_images or 0.0) / 1000
    assert table[("train", "torchvision")][2:4] == [f"{per_gpu:,.2f}", f"{4 * per_gpu:,.1f}"]
    assert table[("train", "torchvision")][4] == ("yes" if 4 * per_gpu <= 16 else "no")
    assert "cores for 4 GPUs" in text and "every GPU fed on 16 cores" in text
    proc = subprocess.run(
        [*RENDER, "--json", str(COMMITTED), "--out", str(tmp_path), "--gpus", "0"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2 and "--gpus 0: must be above 0" in proc.stderr


def test_a_report_json_from_before_the_gpu_options_still_loads(tmp_path: Path) -> None:
    """Schema version 1 without gpu_rate, node_gpus, node_cores and gpu_model_rate: the
    defaults (the published rate, 8 GPUs, 112 cores)."""
    saved = json.loads(COMMITTED.read_text())
    for key in ("gpu_rate", "node_gpus", "node_cores"):
        del saved["options"][key]
    del saved["gpu_model_rate"]
    path = tmp_path / "report.json"
    path.write_text(json.dumps(saved))
    report = Report.load(path)
    assert (report.options.gpu_rate, report.options.node_gpus, report.options.node_cores) == (
        None,
        8,
        112,
    )
    assert report.gpu_model_rate is None
    assert "Per-GPU rate: 2,470 images/s" in render.markdown(report)


def test_the_measuring_cli_stores_the_gpu_options(tmp_path: Path) -> None:
    from tools.bench.measure import parse_options

    opts, model_rate = parse_options(["--gpu-rate", "2600", "--gpus", "4", "--cores", "64"])
    assert (opts.gpu_rate, opts.node_gpus, opts.node_cores, model_rate) == (2600.0, 4, 64, None)
    assert opts.to_json()["gpu_rate"] == 2600.0
    with pytest.raises(SystemExit):  # refused before any measuring
        parse_options(["--gpu-metrics", str(tmp_path / "none.json")])
