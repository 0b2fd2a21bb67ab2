"""FFCV as a peer in the benchmark report: where it does not import, the report is built without
its rows and says so; where it does (``make bench`` installs it, ``make install`` does not),
its stores are written at memmap's stored side and quality and a small run gives its rows."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from loaderbench.data.discovery import Split, scan_image_folder
from tools.bench import peer_rows, render
from tools.bench.ffcv import (
    ffcv_loader,
    ffcv_unavailable,
    ffcv_version,
    memmap_train_store,
    write_store,
)
from tools.bench.limits import measure_decode_limit
from tools.bench.schema import FFCV_NAMES as FFCV_BY_STORE
from tools.bench.schema import Machine, Options, Report, Row

# Skipped where FFCV does not import, as the report leaves its rows out there.
HAS_FFCV = ffcv_unavailable() is None
needs_ffcv = pytest.mark.skipif(
    not HAS_FFCV, reason="FFCV is not installed (make test-peers installs it)"
)
SIZE, BATCH = 64, 8
FFCV_NAMES = set(FFCV_BY_STORE.values())


def folder_split(root: Path, name: str) -> Split:
    _, paths, labels = scan_image_folder(root / name)
    return Split(name, tuple(paths), labels)


def options(out: Path, root: Path) -> Options:
    return Options(
        out=out,
        quick=True,
        image_size=SIZE,
        batch_size=BATCH,
        workers=(1,),
        epochs={"val": 1, "train": 1},
        repeats=1,
        root=root,
    )


def test_without_ffcv_the_report_is_built_without_its_rows_and_says_so(
    tiny_root: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # FFCV made unimportable as where it is not installed (None in sys.modules: ImportError).
    for module in [m for m in sys.modules if m == "ffcv" or m.startswith("ffcv.")] + ["ffcv"]:
        monkeypatch.setitem(sys.modules, module, None)
    assert "ffcv" in (ffcv_unavailable() or "") and ffcv_version() is None
    opts = options(tmp_path, tiny_root)
    _, val_paths, _ = scan_image_folder(tiny_root / "val")
    decode = measure_decode_limit(val_paths, SIZE, repeats=1)
    rows = peer_rows.peer_rows(opts, tiny_root, {"decode": decode.images_per_s})
    [line] = [line for line in capsys.readouterr().out.splitlines() if "FFCV" in line]
    assert line.startswith("make bench: no FFCV rows: it does not import here (")
    assert {row.name for row in rows} & FFCV_NAMES == set()
    assert {row.name for row in rows} >= {"classic (float in workers)", "tutorial tensorclass"}
    # The project's own rows come from sweeps (test_bench runs them); here one row a pipeline.
    ours = [
        Row(task, "memmap", 1, 1000.0, 0.5, 0.1, 0.01, kind="loader") for task in ("val", "train")
    ]
    machine = Machine("x86_64", 2, "3", "2")
    saved = Report(opts, machine, 1.0, rows + ours, decode, 1e9, ffcv_version=ffcv_version())
    saved.write(tmp_path / "report.json")
    saved = Report.load(tmp_path / "report.json")
    assert saved.ffcv_version is None
    assert len(saved.rows) == len(rows) + len(ours)
    # Drawn, the report says FFCV was not measured and why, and compares nothing with it.
    markdown = render.markdown(saved)
    assert markdown.count("FFCV not measured (it does not import here") == 2  # val, train
    assert "## FFCV's stores beside memmap's" not in markdown
    assert all(render.ffcv_rate(saved.rows, r.pipeline, r, r.workers) is None for r in saved.rows)
    saved = json.loads((tmp_path / "report.json").read_text())
    assert {row["name"] for row in saved["rows"]} & FFCV_NAMES == set()


@needs_ffcv
@pytest.mark.slow  # numba compiles each loader's pipeline: seconds
def test_stores_are_written_at_memmaps_side_and_quality(tiny_root: Path, tmp_path: Path) -> None:
    split = folder_split(tiny_root, "train")
    policy = memmap_train_store(SIZE)
    # FFCV shrinks (never enlarges) to a long side of at most the memmap store's.
    expected = 0
    for path in split.paths:
        with Image.open(path) as image:
            size = np.array(image.size)
        ratio = policy.stored_size / size.max()
        width, height = (ratio * size).astype(int) if ratio < 1 else size
        expected += 3 * int(width) * int(height)
    side, quality = policy.stored_size, policy.quality
    stores = {
        store: write_store(split, tmp_path / f"{store}.beton", store, side, quality, workers=2)
        for store in ("raw", "jpeg")
    }
    raw, jpeg = stores["raw"], stores["jpeg"]
    assert raw.images == jpeg.images == len(split)
    assert raw.payload_bytes == expected
    assert jpeg.payload_bytes < raw.payload_bytes / 3  # JPEG at quality 95, not pixels
    for store in stores.values():
        assert store.file_bytes == store.path.stat().st_size >= store.payload_bytes
        assert store.as_dict()["write_images_per_s_per_core"] > 0


@needs_ffcv
@pytest.mark.slow  # numba compiles each loader's pipeline: seconds
def test_loaders_yield_uint8_batches_of_every_image(tiny_root: Path, tmp_path: Path) -> None:
    policy = memmap_train_store(SIZE)
    for task in ("train", "val"):
        split = folder_split(tiny_root, task)
        path = tmp_path / f"{task}.beton"
        write_store(split, path, "jpeg", policy.stored_size, policy.quality, workers=1)
        loader = ffcv_loader(path, SIZE, task == "train", BATCH, workers=1)
        batches = list(loader)
        images = [b[0] for b in batches]
        labels = np.concatenate([b[1].numpy() for b in batches])
        for batch in images:
            assert batch.dtype.is_floating_point is False and batch.shape[1:] == (3, SIZE, SIZE)
            assert 0 < int(batch.float().std()) and batch.max() > 100  # images, not zeros
        assert labels.dtype == np.int64
        if task == "val":  # in order, the last partial batch kept
            assert labels.tolist() == list(split.labels)
        else:  # shuffled, the last partial batch dropped
            kept = len(split) // BATCH * BATCH
            assert len(labels) == kept and labels.tolist() != list(split.labels)[:kept]
            assert set(labels) <= set(split.labels)


@needs_ffcv
@pytest.mark.slow  # numba compiles each loader's pipeline: seconds
def test_a_small_run_gives_rows_for_both_stores(tiny_root: Path, tmp_path: Path) -> None:
    opts = options(tmp_path, tiny_root)
    _, val_paths, _ = scan_image_folder(tiny_root / "val")
    decode = measure_decode_limit(val_paths, SIZE, repeats=1)
    limits = {"decode": decode.images_per_s, "copy": 9e4, "crop": 8e3}
    rows = []
    for task in ("val", "train"):
        rows += peer_rows.ffcv_rows(opts, folder_split(tiny_root, task), task, limits)
    assert {(r.pipeline, r.name, r.workers) for r in rows} == {
        (task, name, 1) for task in ("val", "train") for name in FFCV_NAMES
    }
    for row in rows:
        assert row.images_per_s > 0 and row.cpu_s_per_1k_images >= 0
        assert row.extra["warm_up_s"] > 0 and "warm-up" in row.note
        assert row.extra["payload_bytes_per_image"] <= row.extra["bytes_per_image"]
        if row.name == FFCV_BY_STORE["jpeg"]:  # decodes every pixel
            assert (row.limit_name, row.limit_images_per_s) == ("CPU decode", decode.images_per_s)
        else:  # reads stored pixels, as memmap's raw store: val copies them, train crops them
            assert row.bounds == (("crop",) if row.pipeline == "train" else ("copy",))
            expected = ("crop + resize", 8e3) if row.pipeline == "train" else ("memory copy", 9e4)
            assert (row.limit_name, row.limit_images_per_s) == expected
    assert not list((tmp_path / "work" / "ffcv").glob("*.beton"))  # removed once measured
