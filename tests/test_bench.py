"""`make bench` in its quick mode: the report holds a measured row for every loader, worker count
and peer, its tables agree with the runs they come from (report.json, each sweep's summary.csv),
its shares and ratios are computed from those rows, and it writes nothing into the repository."""

from __future__ import annotations

import csv
import json
import math
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from loaderbench.bench.dali import dali_version
from loaderbench.bench.ffcv import ffcv_unavailable
from tests.conftest import REPO

# One worker runs the module: its quick bench (a module fixture) is built once, not per worker.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("bench")]

LOADERS = ("torchvision", "memmap", "spdl")
CLASSIC, TUTORIAL = "classic (float in workers)", "tutorial tensorclass"
DALI = "dali (cpu)"
# DALI is installed by `make bench`, not by `make install`: its rows are there where it is.
HAS_DALI = dali_version() is not None
# FFCV likewise (its own tests: test_bench_ffcv.py).
FFCV_RAW, FFCV_JPG = "ffcv (raw)", "ffcv (jpg)"
HAS_FFCV = ffcv_unavailable() is None
FFCV = {FFCV_RAW, FFCV_JPG} if HAS_FFCV else set()
TASKS = ("val", "train")
WORKERS = 1
# Half a unit of the last digit the report prints (images/s and shares: one decimal).
ROUNDING = 0.05 + 1e-9


def run_quick_bench(out: Path) -> None:
    args = ["--quick", "--out", str(out), "--workers", str(WORKERS), "--epochs", "2,1"]
    proc = subprocess.run(
        [sys.executable, "-m", "loaderbench.bench", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]


@pytest.fixture(scope="module")
def bench(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One quick run: its folder, report.md's text and tables, report.json."""
    out = tmp_path_factory.mktemp("bench")
    repo_cache = REPO / "cache"
    cache_before = repo_cache.exists()
    run_quick_bench(out)
    markdown = (out / "report.md").read_text()
    return {
        "out": out,
        "repo_cache_appeared": repo_cache.exists() and not cache_before,
        "md": markdown,
        "limits": dict(table_rows(markdown, "| limit |")),
        "rows": {
            (r["pipeline"], r["loader"], int(r["workers"])): r
            for r in map(dict, table_rows(markdown, "| pipeline |", named=True))
        },
        "json": json.loads((out / "report.json").read_text()),
    }


def table_rows(markdown: str, header_start: str, named: bool = False) -> list[Any]:
    """The rows of the markdown table whose header line starts with ``header_start``: cell
    lists, or (with ``named``) (column, cell) pairs."""
    lines = markdown.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header_start))
    header = cells(lines[start])
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        rows.append(list(zip(header, cells(line), strict=True)) if named else cells(line))
    return rows


def cells(line: str) -> list[str]:
    return [cell.strip() for cell in line.strip().strip("|").split("|")]


def number(cell: str) -> float:
    """A figure as the report prints it: '1,234.5', '12.3%', '998.1 images/s'."""
    match = re.fullmatch(r"([\d,]+(?:\.\d+)?)%?(?: images/s)?", cell)
    assert match, f"not a number: {cell!r}"
    return float(match.group(1).replace(",", ""))


def search(pattern: str, text: str) -> str:
    """The first group of ``pattern`` in ``text``, which must hold it."""
    match = re.search(pattern, text)
    assert match, f"{pattern!r} not in {text!r}"
    return match.group(1)


def ips(bench: dict[str, Any], task: str, name: str, workers: int) -> float:
    return number(bench["rows"][(task, name, workers)]["images/s"])


def expected_limit(task: str, name: str) -> str:
    """The limit of the same work: memmap's val rows copy stored crops, its train rows crop,
    resize and flip stored rows; everything else decodes."""
    if name != "memmap":
        return "CPU decode"
    return "crop + resize" if task == "train" else "memory copy"


def test_every_loader_worker_count_and_peer_is_a_measured_row(bench: dict[str, Any]) -> None:
    expected = {(task, name, WORKERS) for task in TASKS for name in (*LOADERS, CLASSIC)}
    expected |= {(task, TUTORIAL, 0) for task in TASKS}
    if HAS_DALI:
        expected |= {(task, DALI, WORKERS) for task in TASKS}
    expected |= {(task, name, WORKERS) for task in TASKS for name in FFCV}
    assert set(bench["rows"]) == expected
    for key, row in bench["rows"].items():
        assert number(row["images/s"]) > 0, key
        assert float(row["CPU s / 1k images"]) >= 0, key
        assert 0 <= float(row["data wait"]) <= 1, key
        assert not row["note"].startswith("failed"), (key, row["note"])
        if key[1] == TUTORIAL:  # no limit: nothing it could be a share of
            assert (row["share of limit"], row["limit"]) == ("-", "-"), key
            continue
        if key[1] == FFCV_RAW:  # the same work as memmap's: its limit
            assert row["limit"] == bench["rows"][(key[0], "memmap", key[2])]["limit"], key
        else:
            assert row["limit"] == expected_limit(key[0], key[1]), key
        assert row["share of limit"].endswith("%") and number(row["share of limit"]) > 0, key


def test_loader_rows_are_the_sweeps_figures(bench: dict[str, Any]) -> None:
    by_key = {(r["pipeline"], r["name"], r["workers"]): r for r in bench["json"]["rows"]}
    assert set(by_key) == set(bench["rows"])
    for task in TASKS:
        # --quick runs every sweep once, so each loader row is its one run's figures.
        with open(bench["out"] / "work" / task / "repeat0" / "summary.csv") as f:
            runs = list(csv.DictReader(f))
        assert {(r["loader"], int(r["num_workers"])) for r in runs} == {
            (name, WORKERS) for name in LOADERS
        }
        for run in runs:
            key = (task, run["loader"], WORKERS)
            assert run["status"] == "ok", run
            measured = float(run["images_per_s"])
            assert by_key[key]["images_per_s"] == pytest.approx(measured, rel=1e-9)
            assert by_key[key]["cpu_s_per_1k_images"] == pytest.approx(
                float(run["cpu_s_per_1k_images"]), rel=1e-9
            )
            assert abs(ips(bench, *key) - measured) <= ROUNDING, key


def test_limits_and_shares_are_computed_from_the_measurements(bench: dict[str, Any]) -> None:
    limit = bench["json"]["decode_limit"]
    # Measured over every val image the loaders read (4 classes x 24 in quick mode).
    assert {r["images"] for r in limit["rates"]} == {96} and limit["pool"]["images"] == 96
    best = max(limit["rates"], key=lambda r: r["images_per_s"])
    assert limit["best"] == best["name"] and best["images_per_s"] > 0
    assert limit["limit_images_per_s"] == pytest.approx(limit["cores"] * best["images_per_s"])
    assert limit["pool"]["images_per_s"] > 0
    # The markdown limits table says the same.
    decode_label = f"CPU decode limit ({limit['cores']} cores x {limit['best']})"
    decode = number(bench["limits"][decode_label])
    assert abs(decode - limit["limit_images_per_s"]) <= ROUNDING
    single_core = [
        number(value)
        for label, value in bench["limits"].items()
        if label.startswith("single") and label.endswith(" decode + resize")
    ]
    assert len(single_core) == len(limit["rates"])
    assert abs(decode - limit["cores"] * max(single_core)) <= (limit["cores"] + 1) * ROUNDING
    copy_cell = bench["limits"]["memory-copy bandwidth"]
    crop = bench["json"]["crop_limit"]
    by_name = {
        "memory copy": number(search(r"= ([\d,]+) images/s", copy_cell)),
        "crop + resize": number(
            bench["limits"][f"crop-and-resize limit ({crop['cores']} cores x {crop['best']})"]
        ),
        "CPU decode": decode,
    }
    for (task, name, workers), row in bench["rows"].items():
        if name == TUTORIAL:
            continue
        limit_ips = by_name[row["limit"]]
        share = 100 * ips(bench, task, name, workers) / limit_ips
        assert math.isclose(number(row["share of limit"]), share, rel_tol=1e-2, abs_tol=0.06)


def test_the_crop_limit_is_the_train_crop_of_stored_rows(bench: dict[str, Any]) -> None:
    """memmap's train rows are held to cores x the fastest single-core crop, resize and flip
    of the train images as its raw store keeps them (4 classes x 24 in quick mode)."""
    crop = bench["json"]["crop_limit"]
    assert crop["job"] == "train crop + resize + flip"
    assert {r["name"] for r in crop["rates"]} == {"torch-into-batch", "torch-new-tensor"}
    assert {r["images"] for r in crop["rates"]} == {96} and crop["pool"]["images"] == 96
    best = max(crop["rates"], key=lambda r: r["images_per_s"])
    assert crop["best"] == best["name"] and best["images_per_s"] > 0
    assert crop["limit_images_per_s"] == pytest.approx(crop["cores"] * best["images_per_s"])
    assert crop["without_flips"]["name"] == f"{best['name']}, no flips"
    assert crop["without_flips"]["images_per_s"] > 0
    label = f"crop-and-resize limit ({crop['cores']} cores x {crop['best']})"
    assert abs(number(bench["limits"][label]) - crop["limit_images_per_s"]) <= ROUNDING
    for name in ("memmap", *({FFCV_RAW} & FFCV)):
        row = bench["rows"][("train", name, WORKERS)]
        share = 100 * ips(bench, "train", name, WORKERS) / crop["limit_images_per_s"]
        assert row["limit"] == "crop + resize"
        assert math.isclose(number(row["share of limit"]), share, rel_tol=1e-2, abs_tol=0.06)


def test_the_crop_limits_ways_do_the_same_work(tmp_path: Path) -> None:
    """Each candidate of the crop limit makes the same pixels for the same image: the train
    pipeline's box, resize and flip (the limit compares ways of doing one job)."""
    from PIL import Image

    from loaderbench.bench.limits import crop_candidates, stored_crops

    generator = torch.Generator().manual_seed(0)
    paths = []
    for i, (w, h) in enumerate([(500, 375), (333, 500), (120, 90), (640, 480), (300, 300)]):
        coarse = torch.rand(1, 3, h // 10, w // 10, generator=generator) * 255
        pixels = torch.nn.functional.interpolate(coarse, size=(h, w), mode="bilinear")
        path = tmp_path / f"{i}.jpg"
        Image.fromarray(pixels[0].permute(1, 2, 0).round().byte().numpy()).save(path)
        paths.append(str(path))
    crops = stored_crops(paths, 64, scale=(0.08, 1.0))
    assert crops.rows.shape == (5, 192, 192, 3)  # the store's default side at 64 px
    assert 0 < sum(crops.flips) < 5
    ways = crop_candidates(crops, paths, 64)
    unflipped = crop_candidates(crops, paths, 64, flips=False)
    for path, flip in zip(paths, crops.flips, strict=True):
        made = {name: fn(path).clone() for name, fn in ways.items()}
        assert made["torch-into-batch"].shape[-3:] == (3, 64, 64)
        assert torch.equal(made["torch-into-batch"].squeeze(0), made["torch-new-tensor"])
        plain = unflipped["torch-into-batch"](path).squeeze(0)
        assert torch.equal(plain.flip(-1) if flip else plain, made["torch-new-tensor"])


def ratio_parts(line: str) -> dict[str, float]:
    """'- val, 1 workers, vs torchvision: memmap 80.1x, spdl 2.0x' -> {'memmap': 80.1, ...}."""
    parts = line.split(": ", 1)[1].split(", ")
    return {name: float(value[:-1]) for name, value in (p.rsplit(" ", 1) for p in parts)}


def close_ratio(printed: float, numerator: float, denominator: float, digits: int = 1) -> bool:
    """``printed`` (to ``digits`` decimals) is numerator / denominator, both read from the
    table (to one decimal)."""
    ratio = numerator / denominator
    table_error = ratio * (ROUNDING / numerator + ROUNDING / denominator)
    return abs(printed - ratio) <= 0.5 * 10**-digits + 1e-9 + table_error


def test_ratios_are_computed_from_the_rows(bench: dict[str, Any]) -> None:
    lines = bench["md"].split("## Ratios at the same worker count", 1)[1].splitlines()
    for task in TASKS:
        prefix = f"- {task}, {WORKERS} workers, vs torchvision: "
        [line] = [line for line in lines if line.startswith(prefix)]
        parts = ratio_parts(line)
        assert set(parts) == {"memmap", "spdl", CLASSIC} | ({DALI} if HAS_DALI else set()) | FFCV
        base = ips(bench, task, "torchvision", WORKERS)
        for name, printed in parts.items():
            assert close_ratio(printed, ips(bench, task, name, WORKERS), base), (line, name)
        [line] = [line for line in lines if line.startswith(f"- {task}: memmap (best) vs")]
        printed = float(line.rsplit(" ", 1)[1][:-1])
        memmap, tutorial = ips(bench, task, "memmap", WORKERS), ips(bench, task, TUTORIAL, 0)
        assert close_ratio(printed, memmap, tutorial), line
    [line] = [line for line in lines if line.startswith(f"- val, spdl at {WORKERS} workers: ")]
    share = float(search(r": ([\d.]+)% of the CPU decode limit", line))
    assert share == pytest.approx(number(bench["rows"][("val", "spdl", WORKERS)]["share of limit"]))


def test_the_answer_comes_first_and_is_computed_from_the_rows(bench: dict[str, Any]) -> None:
    """The report's first section names, per pipeline, the loader and worker count with the
    most images/s, its margin over the next best loader and over DALI, and its CPU cost."""
    md = bench["md"]
    assert md.index("## The answer") < md.index("## Limits") < md.index("## Pipelines")
    answer = md.split("## The answer", 1)[1].split("\n## ", 1)[0]
    for task in TASKS:
        [line] = [line for line in answer.splitlines() if line.startswith(f"- **{task}**")]
        ours = {name: ips(bench, task, name, WORKERS) for name in LOADERS}
        best, runner = sorted(ours, key=ours.get, reverse=True)[:2]
        assert f"`loader={best} loader.num_workers={WORKERS}`" in line
        cpu = bench["rows"][(task, best, WORKERS)]["CPU s / 1k images"]
        assert f"at {cpu} CPU ms an image" in line
        margin = float(search(r"; ([\d.]+)x the next best loader \((\w+)", line))
        assert search(r"the next best loader \((\w+) at", line) == runner
        assert close_ratio(margin, ours[best], ours[runner], digits=2), line
        if HAS_DALI:
            printed = float(search(r"; ([\d.]+)x DALI's CPU pipeline", line))
            assert close_ratio(printed, ours[best], ips(bench, task, DALI, WORKERS), digits=2)
        else:
            assert "DALI not measured" in line
        if HAS_FFCV:  # against FFCV on the store of the same kind: raw for memmap
            store = "raw" if best == "memmap" else "jpg"
            printed = float(search(rf"; ([\d.]+)x FFCV on its {store} store", line))
            peer = ips(bench, task, FFCV_RAW if store == "raw" else FFCV_JPG, WORKERS)
            assert close_ratio(printed, ours[best], peer, digits=2), line
        else:
            assert "FFCV not measured" in line


def test_every_row_has_its_ratio_against_dali(bench: dict[str, Any]) -> None:
    if not HAS_DALI:
        pytest.skip("DALI is not installed here (make bench installs it)")
    for (task, name, workers), row in bench["rows"].items():
        if workers != WORKERS:
            continue
        printed = float(row["vs DALI"].rstrip("x"))
        dali = ips(bench, task, DALI, WORKERS)
        assert close_ratio(printed, ips(bench, task, name, workers), dali, digits=2), (task, name)


def test_every_row_has_its_ratio_against_ffcv(bench: dict[str, Any]) -> None:
    """Readers of stored pixels against FFCV's raw store, decoders of JPEGs against its jpg
    store, at the same worker count."""
    if not HAS_FFCV:
        pytest.skip("FFCV is not installed here (make bench installs it)")
    for (task, name, workers), row in bench["rows"].items():
        if workers != WORKERS:
            assert row["vs FFCV"] == "-", (task, name)
            continue
        peer = FFCV_RAW if name in ("memmap", FFCV_RAW) else FFCV_JPG
        printed = float(row["vs FFCV"].rstrip("x"))
        assert close_ratio(
            printed, ips(bench, task, name, workers), ips(bench, task, peer, workers), digits=2
        ), (task, name)


def test_ffcv_stores_are_beside_memmaps(bench: dict[str, Any]) -> None:
    """Each memmap store beside FFCV's of its kind: bytes per image from both, images/s and
    CPU from the same runs as the other tables, the ratio computed from them."""
    if not HAS_FFCV:
        assert "## FFCV's stores beside memmap's" not in bench["md"]
        return
    table = table_rows(bench["md"], "| split | store | bytes / image: memmap |")
    memmap = {(r["pipeline"], r["store"]): r for r in bench["json"]["stores"]}
    ffcv = {
        (r["pipeline"], r["extra"]["store"]): r
        for r in bench["json"]["rows"]
        if r["name"] in (FFCV_RAW, FFCV_JPG)
    }
    assert {(row[0], row[1]) for row in table} == {
        (task, f"{store} / {mode}")
        for task in TASKS
        for store, mode in (("raw", "raw"), ("jpeg", "jpg"))
    }
    for split, kinds, ours_bytes, peer_bytes, file_bytes, ours_ips, peer_ips, ratio, *_ in table:
        key = (split, kinds.split(" / ")[0])
        ours, peer = memmap[key], ffcv[key]
        assert number(ours_bytes) == pytest.approx(ours["bytes_per_image"], abs=0.5)
        assert number(peer_bytes) == pytest.approx(
            peer["extra"]["payload_bytes_per_image"], abs=0.5
        )
        assert number(file_bytes) >= number(peer_bytes)
        assert abs(number(peer_ips) - ips(bench, split, peer["name"], WORKERS)) <= ROUNDING
        assert close_ratio(float(ratio.rstrip("x")), number(ours_ips), number(peer_ips), digits=2)
    # FFCV's raw train store holds each image shrunk to memmap's stored long side: fewer bytes
    # than memmap's square canvas of that side.
    assert (
        ffcv[("train", "raw")]["extra"]["payload_bytes_per_image"]
        < memmap[("train", "raw")]["bytes_per_image"]
    )


def test_stores_are_projected_to_imagenet_from_their_runs(bench: dict[str, Any]) -> None:
    table = {
        (r["split"], r["store"]): r
        for r in map(dict, table_rows(bench["md"], "| split | store |", named=True))
    }
    assert set(table) == {(task, store) for task in TASKS for store in ("raw", "jpeg")}
    imagenet = {"train": 1_281_167, "val": 50_000}
    by_json = {(r["pipeline"], r["store"]): r for r in bench["json"]["stores"]}
    for (task, store), row in table.items():
        saved = by_json[(task, store)]
        # The projection is the measured bytes per image times ImageNet's images.
        assert saved["imagenet_gb"] == pytest.approx(
            saved["bytes_per_image"] * imagenet[task] / 1e9
        )
        assert number(row["ImageNet store"].removesuffix(" GB")) == pytest.approx(
            saved["imagenet_gb"], abs=0.05
        )
        # Four times the cores: a quarter of the build time.
        sixteen = number(row["build at 16 cores"].removesuffix(" min"))
        sixty_four = number(row["build at 64 cores"].removesuffix(" min"))
        assert sixty_four == pytest.approx(sixteen / 4, abs=0.1)
        assert saved["images_per_s"] > 0
    for task in TASKS:  # JPEG keeps a fraction of the raw bytes
        raw, jpeg = by_json[(task, "raw")], by_json[(task, "jpeg")]
        assert jpeg["bytes_per_image"] < 0.5 * raw["bytes_per_image"]
    size = int(search(r"image_size (\d+)", bench["md"]))
    assert by_json[("val", "raw")]["bytes_per_image"] == 3 * size * size  # exact crops


def test_auto_has_a_line_per_pipeline_from_its_runs(bench: dict[str, Any]) -> None:
    """Each loader once more with loader.num_workers=auto: the count its probe chose (on the
    ladder of this machine's CPUs), that run's images/s against the sweep's best count (one
    in quick mode), the fewest swept counts within 5% of it, the probe's seconds."""
    from loaderbench.autotune import cpus_allowed, worker_ladder

    section = bench["md"].split("## num_workers=auto", 1)[1].split("\n## ", 1)[0]
    lines = [line for line in section.splitlines() if line.startswith("- ")]
    assert len(lines) == len(TASKS) * len(LOADERS)
    auto = {(r["pipeline"], r["name"]): r for r in bench["json"]["auto"]}
    for task in TASKS:
        with open(bench["out"] / "work" / task / "auto0" / "summary.csv") as f:
            runs = list(csv.DictReader(f))
        assert {r["loader"] for r in runs} == set(LOADERS)
        for run in runs:
            name, row = run["loader"], auto[(task, run["loader"])]
            assert run["status"] == "ok", run
            assert row["workers"] == int(run["num_workers"])
            assert row["workers"] in worker_ladder(cpus_allowed())
            assert row["images_per_s"] == pytest.approx(float(run["images_per_s"]), rel=1e-9)
            assert 0 < row["autotune_s"] == pytest.approx(float(run["autotune_s"]), rel=1e-9)
            assert row["autotune_s"] < row["wall_s"]
            [line] = [line for line in lines if line.startswith(f"- {task}, {name}: ")]
            assert f"chose {row['workers']} workers" in line
            swept = ips(bench, task, name, WORKERS)
            share = float(search(r"= ([\d.]+)% of the best swept count", line))
            assert close_ratio(share, 100 * row["images_per_s"], swept), line
            assert f"({WORKERS} workers: " in line and f"within 5%: {WORKERS}" in line
            probe_s = float(search(r"; probe ([\d.]+) s of the run", line))
            assert probe_s == pytest.approx(row["autotune_s"], abs=0.006)


def test_charts_are_written(bench: dict[str, Any]) -> None:
    for name in ("report.png", "sweep_val.png", "sweep_train.png"):
        assert (bench["out"] / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name


def test_everything_is_written_under_the_output_folder(bench: dict[str, Any]) -> None:
    assert not bench["repo_cache_appeared"], "the bench built a memmap cache in the repository"
    # The memmap runs built their caches in the report's work folder instead ...
    assert any((bench["out"] / "work" / "cache").iterdir())
    # ... and the tutorial loader's files went there too, removed once measured.
    assert not any((bench["out"] / "work" / "tutorial").rglob("*.memmap"))


def test_bench_scale_quick_measures_start_up_and_worker_memory(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "loaderbench.bench.scale", "--quick", "--out", str(tmp_path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    result = json.loads((tmp_path / "scale.json").read_text())
    assert result["files"] == 20 * 15 and result["train_files"] == 20 * 12
    assert result["first_scan_s"] > 0 and result["index_load_s"] > 0
    assert result["reopen_cache_built"] is False  # the second memmap run reopened its cache
    for key in ("scan_run_first_batch_s", "index_run_first_batch_s", "reopen_first_batch_s"):
        assert 0 < result[key] < 600
    for layout in ("worker_growth_mb_index", "worker_growth_mb_strings"):
        assert result[layout]["workers"] == 8
    assert result["jpeg_build_images_per_s"] > 0
    text = (tmp_path / "scale.md").read_text()
    assert f"{result['files']:,} files" in text and "projected to ImageNet" in text
    assert list((tmp_path / "work" / "scale-quick" / "index").glob("dataset-*.npz"))
