"""`make bench` in its quick mode, asserted on its report.json: a measured row for every loader,
worker count and peer, each row the figures of the run it comes from (each sweep's summary.csv),
held to the limit of the work its loader declares, the limits computed from their measurements;
and the bench writes nothing into the repository (it runs from a copy of the working tree, whose
every file is compared before and after). The report's drawing: tests/test_bench_render.py."""

from __future__ import annotations

import csv
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from loaderbench.loaders import file_loader_names, settings_class
from tests.conftest import REPO
from tools.bench.dali import dali_version
from tools.bench.ffcv import ffcv_unavailable
from tools.bench.schema import CLASSIC, DALI_NAMES, FFCV_NAMES, LIMIT_NAMES, TUTORIAL
from tools.bench.work_bounds import work_bounds

# One worker runs the module: its quick bench (a module fixture) is built once, not per worker.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("bench")]

LOADERS = file_loader_names()  # the benchmark sweeps the loaders that read files
DALI = DALI_NAMES["cpu"]
# DALI is installed by `make peers` (make bench, make test-peers), not by `make install`: its
# rows are there where it is.
HAS_DALI = dali_version() is not None
# FFCV likewise (its own tests: test_bench_ffcv.py).
FFCV_RAW, FFCV_JPG = FFCV_NAMES["raw"], FFCV_NAMES["jpeg"]
HAS_FFCV = ffcv_unavailable() is None
FFCV = {FFCV_RAW, FFCV_JPG} if HAS_FFCV else set()
TASKS = ("val", "train")
WORKERS = 1


def working_tree_copy(dest: Path) -> Path:
    """The repository's working tree as git sees it (tracked files, and untracked ones it does
    not ignore), copied into ``dest``: what a fresh clone with local edits holds."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        check=True,
    ).stdout.decode()
    for name in filter(None, listed.split("\0")):
        source = REPO / name
        if source.is_file():  # a tracked file deleted in the working tree is not copied
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / name)
    return dest


def tree_state(root: Path) -> dict[str, tuple[int, int]]:
    """Every file under ``root`` -> (size, mtime in ns); bytecode caches left out (Python
    writes them wherever it may, the bench or not)."""
    return {
        str(path.relative_to(root)): (path.stat().st_size, path.stat().st_mtime_ns)
        for path in root.rglob("*")
        if path.is_file() and "__pycache__" not in path.parts
    }


def changed(before: dict[str, tuple[int, int]], after: dict[str, tuple[int, int]]) -> list[str]:
    """The files added, removed or rewritten between two ``tree_state``s."""
    return sorted(
        name for name in before.keys() | after.keys() if before.get(name) != after.get(name)
    )


def run_quick_bench(repo: Path, out: Path) -> None:
    """The quick bench of the working tree copied to ``repo`` (its sources imported, its scripts
    run), its report written to ``out``."""
    args = ["--quick", "--out", str(out), "--workers", str(WORKERS), "--epochs", "2,1"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(repo / "src"), str(repo)])}
    proc = subprocess.run(
        [sys.executable, "-m", "tools.bench", *args],
        cwd=repo,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]


@pytest.fixture(scope="module")
def bench(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One quick run from a copy of the working tree: its folder, its report.json (rows by
    (pipeline, name, workers)), and the files it changed in that copy."""
    repo = working_tree_copy(tmp_path_factory.mktemp("repo"))
    out = tmp_path_factory.mktemp("bench")
    before = tree_state(repo)
    run_quick_bench(repo, out)
    report = json.loads((out / "report.json").read_text())
    return {
        "out": out,
        "json": report,
        "rows": {(r["pipeline"], r["name"], r["workers"]): r for r in report["rows"]},
        "repo_changes": changed(before, tree_state(repo)),
    }


def declared_bounds(task: str, name: str) -> list[str]:
    """What bounds a loader's work on ``task`` at its defaults (as the sweeps run it)."""
    return list(work_bounds(settings_class(name)(name=name), task == "train"))


def test_every_loader_worker_count_and_peer_is_a_measured_row(bench: dict[str, Any]) -> None:
    expected = {(task, name, WORKERS) for task in TASKS for name in (*LOADERS, CLASSIC)}
    expected |= {(task, TUTORIAL, 0) for task in TASKS}
    if HAS_DALI:
        expected |= {(task, DALI, WORKERS) for task in TASKS}
    expected |= {(task, name, WORKERS) for task in TASKS for name in FFCV}
    assert set(bench["rows"]) == expected
    for key, row in bench["rows"].items():
        assert row["images_per_s"] > 0, key
        assert row["cpu_s_per_1k_images"] >= 0, key
        assert 0 <= row["data_wait_frac"] <= 1, key
        assert not row["note"].startswith("failed"), (key, row["note"])
        assert row["kind"] == ("loader" if key[1] in LOADERS else "peer"), key
        if key[1] in LOADERS:  # the loader alone (model=none): no ceiling, and it says why
            assert row["ceiling_frac"] is None, key
            assert row["ceiling_frac_null_reason"].startswith("model=none"), key


def test_each_row_is_held_to_the_limit_of_the_work_it_declares(bench: dict[str, Any]) -> None:
    """A loader's row: the bounds its settings declare, the first one's limit; a peer's: the
    same work's (FFCV's raw store reads stored pixels as memmap does); the tutorial: none."""
    limits = {
        "decode": bench["json"]["decode_limit"]["limit_images_per_s"],
        "copy": bench["json"]["memory_copy_bytes_per_s"] / (3 * 224 * 224),
        "crop": bench["json"]["crop_limit"]["limit_images_per_s"],
    }
    peers = {CLASSIC: ["decode"], DALI: ["decode"], FFCV_JPG: ["decode"], TUTORIAL: []}
    for (task, name, _), row in bench["rows"].items():
        if name in LOADERS:
            bounds = declared_bounds(task, name)
        elif name == FFCV_RAW:
            bounds = ["crop" if task == "train" else "copy"]
        else:
            bounds = peers[name]
        assert row["bounds"] == bounds, (task, name)
        if not bounds:  # no limit: nothing it could be a share of
            assert (row["limit_name"], row["limit_images_per_s"], row["share"]) == ("", None, None)
            continue
        assert row["limit_name"] == LIMIT_NAMES[bounds[0]], (task, name)
        assert row["limit_images_per_s"] == pytest.approx(limits[bounds[0]], rel=1e-12)
        assert row["share"] == pytest.approx(row["images_per_s"] / limits[bounds[0]])
    # memmap's raw stores decode nothing: val copies, train crops and resizes stored rows.
    assert bench["rows"][("val", "memmap", WORKERS)]["limit_name"] == "memory copy"
    assert bench["rows"][("train", "memmap", WORKERS)]["limit_name"] == "crop + resize"


def test_loader_rows_are_the_sweeps_figures(bench: dict[str, Any]) -> None:
    for task in TASKS:
        # --quick runs every sweep once, so each loader row is its one run's figures.
        with open(bench["out"] / "work" / task / "repeat0" / "summary.csv") as f:
            runs = list(csv.DictReader(f))
        assert {(r["loader"], int(r["num_workers"])) for r in runs} == {
            (name, WORKERS) for name in LOADERS
        }
        for run in runs:
            row = bench["rows"][(task, run["loader"], WORKERS)]
            assert run["status"] == "ok", run
            for key in ("images_per_s", "cpu_s_per_1k_images", "data_wait_frac", "ttfb_s"):
                assert row[key] == pytest.approx(float(run[key]), rel=1e-9), (task, key)


def test_the_decode_limit_is_computed_from_its_measurements(bench: dict[str, Any]) -> None:
    limit = bench["json"]["decode_limit"]
    # Measured over every val image the loaders read (4 classes x 48 in quick mode).
    assert {r["images"] for r in limit["rates"]} == {192} and limit["pool"]["images"] == 192
    for rate in [*limit["rates"], limit["pool"]]:
        assert rate["images_per_s"] == pytest.approx(rate["images"] / rate["wall_s"])
    best = max(limit["rates"], key=lambda r: r["images_per_s"])
    assert limit["best"] == best["name"] and best["images_per_s"] > 0
    assert limit["limit_images_per_s"] == pytest.approx(limit["cores"] * best["images_per_s"])
    assert limit["pool"]["name"] == f"{best['name']} x {limit['cores']} threads"
    assert bench["json"]["memory_copy_bytes_per_s"] > 0


def test_the_crop_limit_is_the_train_crop_of_stored_rows(bench: dict[str, Any]) -> None:
    """Readers of stored train rows are held to cores x the fastest single-core crop, resize
    and flip of the train images as memmap's raw store keeps them (4 classes x 48 here)."""
    crop = bench["json"]["crop_limit"]
    assert crop["job"] == "train crop + resize + flip"
    assert crop["title"] == "crop-and-resize limit"
    ways = {"batch-loop", "torch-into-batch", "torch-new-tensor"}
    assert {r["name"] for r in crop["rates"]} == ways
    assert {r["images"] for r in crop["rates"]} == {192} and crop["pool"]["images"] == 192
    # The pool: the faster of the best way's and the loader's own (a batch a call, no GIL).
    pools = {f"{way} x {crop['cores']} threads" for way in (crop["best"], "batch-loop")}
    assert crop["pool"]["name"] in pools
    best = max(crop["rates"], key=lambda r: r["images_per_s"])
    assert crop["best"] == best["name"] and best["images_per_s"] > 0
    assert crop["limit_images_per_s"] == pytest.approx(crop["cores"] * best["images_per_s"])
    assert crop["without_flips"]["name"] == f"{best['name']}, no flips"
    assert crop["without_flips"]["images_per_s"] > 0


def test_the_crop_limits_ways_do_the_same_work(tmp_path: Path) -> None:
    """Each candidate of the crop limit makes the same pixels for the same image: the train
    pipeline's box, resize and flip (the limit compares ways of doing one job)."""
    from PIL import Image

    from tools.bench.crop_limit import crop_candidates, stored_crops

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
    assert getattr(ways["batch-loop"], "batched", False)  # a batch of paths a call
    batch = ways["batch-loop"](paths).clone()
    assert batch.shape == (5, 3, 64, 64)
    for i, (path, flip) in enumerate(zip(paths, crops.flips, strict=True)):
        made = {name: fn(path).clone() for name, fn in ways.items() if name != "batch-loop"}
        assert made["torch-into-batch"].shape[-3:] == (3, 64, 64)
        assert torch.equal(made["torch-into-batch"].squeeze(0), made["torch-new-tensor"])
        assert torch.equal(batch[i], made["torch-new-tensor"])
        plain = unflipped["torch-into-batch"](path).squeeze(0)
        assert torch.equal(plain.flip(-1) if flip else plain, made["torch-new-tensor"])


def test_stores_are_measured_and_projected_to_imagenet(bench: dict[str, Any]) -> None:
    stores = {(r["pipeline"], r["store"]): r for r in bench["json"]["stores"]}
    assert set(stores) == {(task, store) for task in TASKS for store in ("raw", "jpeg")}
    imagenet = {"train": 1_281_167, "val": 50_000}
    for (task, _), row in stores.items():
        # The projection is the measured bytes per image times ImageNet's images ...
        assert row["imagenet_gb"] == pytest.approx(row["bytes_per_image"] * imagenet[task] / 1e9)
        # ... and four times the cores take a quarter of the build time.
        assert row["build_minutes_64_cores"] == pytest.approx(row["build_minutes_16_cores"] / 4)
        assert row["images_per_s"] > 0
    for task in TASKS:  # JPEG keeps a fraction of the raw bytes
        assert (
            stores[(task, "jpeg")]["bytes_per_image"]
            < 0.5 * stores[(task, "raw")]["bytes_per_image"]
        )
    size = bench["json"]["options"]["image_size"]
    assert stores[("val", "raw")]["bytes_per_image"] == 3 * size * size  # exact crops


def test_ffcv_rows_say_what_their_stores_hold(bench: dict[str, Any]) -> None:
    """FFCV's raw train store holds each image shrunk to memmap's stored long side: fewer bytes
    than memmap's square canvas of that side."""
    if not HAS_FFCV:
        assert bench["json"]["ffcv_version"] is None
        return
    ffcv = {
        (r["pipeline"], r["extra"]["store"]): r
        for r in bench["json"]["rows"]
        if r["name"] in (FFCV_RAW, FFCV_JPG)
    }
    memmap = {(r["pipeline"], r["store"]): r for r in bench["json"]["stores"]}
    for row in ffcv.values():
        assert row["extra"]["bytes_per_image"] >= row["extra"]["payload_bytes_per_image"] > 0
    assert (
        ffcv[("train", "raw")]["extra"]["payload_bytes_per_image"]
        < memmap[("train", "raw")]["bytes_per_image"]
    )


def test_auto_rows_are_their_runs_figures(bench: dict[str, Any]) -> None:
    """Each loader once more with loader.num_workers=auto: the count its probe chose (on the
    ladder of this machine's CPUs), that run's images/s and the probe's seconds."""
    from loaderbench.autotune import worker_ladder
    from loaderbench.platform.runtime import cpus_allowed

    auto = {(r["pipeline"], r["name"]): r for r in bench["json"]["auto"]}
    assert set(auto) == {(task, name) for task in TASKS for name in LOADERS}
    for task in TASKS:
        with open(bench["out"] / "work" / task / "auto0" / "summary.csv") as f:
            runs = list(csv.DictReader(f))
        assert {r["loader"] for r in runs} == set(LOADERS)
        for run in runs:
            row = auto[(task, run["loader"])]
            assert run["status"] == "ok" and row["note"] == "", run
            assert row["workers"] == int(run["num_workers"])
            assert row["workers"] in worker_ladder(cpus_allowed())
            assert row["images_per_s"] == pytest.approx(float(run["images_per_s"]), rel=1e-9)
            assert 0 < row["autotune_s"] == pytest.approx(float(run["autotune_s"]), rel=1e-9)
            assert row["autotune_s"] < row["wall_s"]


def test_the_report_is_drawn_from_its_json(bench: dict[str, Any], tmp_path: Path) -> None:
    """report.json holds everything report.md shows: drawn again from the file alone, the same
    text; and the charts are written."""
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "tools.bench.render",
            "--json",
            str(bench["out"] / "report.json"),
            "--out",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "report.md").read_text() == (bench["out"] / "report.md").read_text()
    for name in ("report.png", "sweep_val.png", "sweep_train.png"):
        assert (bench["out"] / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name
    assert bench["json"]["machine"]["cores"] >= 1
    assert bench["json"]["options"]["quick"] is True


def test_everything_is_written_under_the_output_folder(bench: dict[str, Any]) -> None:
    assert bench["repo_changes"] == [], "the bench wrote into the repository"
    # The memmap runs built their caches in the report's work folder instead ...
    assert any((bench["out"] / "work" / "cache").iterdir())
    # ... and the tutorial loader's files went there too, removed once measured.
    assert not any((bench["out"] / "work" / "tutorial").rglob("*.memmap"))


def test_the_repository_check_sees_a_file_written_into_it(tmp_path: Path) -> None:
    """The check above can fail: a file written where the bench would wrongly put its memmap
    cache (``cache/``, ignored by git, present or not beforehand) and a source file touched
    are both named."""
    repo = working_tree_copy(tmp_path / "repo")
    (repo / "cache").mkdir(exist_ok=True)  # as in a repository that has been used
    before = tree_state(repo)
    (repo / "cache" / "stray").write_text("x")
    script = repo / "train.py"
    os.utime(script, ns=(script.stat().st_atime_ns, script.stat().st_mtime_ns + 10**9))
    assert changed(before, tree_state(repo)) == ["cache/stray", "train.py"]


def test_bench_scale_quick_measures_start_up_and_worker_memory(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "tools.bench.scale", "--quick", "--out", str(tmp_path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    result = json.loads((tmp_path / "scale.json").read_text())
    assert result["files"] == 20 * 15 and result["train_files"] == 20 * 12
    assert result["first_scan_s"] > 0 and result["index_load_s"] > 0
    assert result["index_load_folders_s"] > 0
    assert result["reopen_cache_built"] is False  # the second memmap run reopened its cache
    for key in ("scan_run_first_batch_s", "index_run_first_batch_s", "reopen_first_batch_s"):
        assert 0 < result[key] < 600
    for layout in ("worker_growth_mb_index", "worker_growth_mb_strings"):
        assert result[layout]["workers"] == 8
    assert result["jpeg_build_images_per_s"] > 0
    text = (tmp_path / "scale.md").read_text()
    assert f"{result['files']:,} files" in text and "projected to ImageNet" in text
    assert list((tmp_path / "work" / "scale-quick" / "index").glob("dataset-*.npz"))
