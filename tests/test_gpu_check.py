"""The GPU check (tools/gpu_check/, run as scripts/gpu_check.sh): refuses without CUDA, and its
--dry-run does everything a CPU can; gpu_kit.sh: what the kit holds and its limits; the check's
decode phase."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.conftest import REPO
from tests.markdown_rows import unpadded
from tools.gpu_check import cli, decode_bench, decode_rows, decode_table, sharing
from tools.gpu_check import plan as gpu_plan
from tools.gpu_check import report as gpu_report

# The check as README and the contract name it (it forwards to tools/gpu_check/gpu_check.sh).
SCRIPT = REPO / "scripts" / "gpu_check.sh"
KIT_SCRIPT = REPO / "tools" / "gpu_check" / "gpu_kit.sh"
MiB = 1 << 20


def run_check(out: Path, *args: str, timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(SCRIPT), str(out), *args],
        env={**os.environ, "PYTHON": sys.executable},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal where there is no GPU")
def test_without_cuda_it_says_so_and_fails(tmp_path: Path) -> None:
    proc = run_check(tmp_path / "out", timeout=120)
    assert proc.returncode == 3
    assert "no CUDA here" in proc.stdout + proc.stderr and "--dry-run" in proc.stdout + proc.stderr


def phases(report: str) -> dict[str, str]:
    """The report's phase table: phase -> exit code."""
    rows = report.split("## Phases", 1)[1].split("\n## ", 1)[0].splitlines()
    cells = [[c.strip() for c in row.strip("|").split("|")] for row in rows if row.startswith("|")]
    return {c[0]: c[3] for c in cells[2:]}


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="the dry run is for machines without CUDA")
def test_the_dry_run_runs_every_cpu_phase_and_writes_the_report(tmp_path: Path) -> None:
    out = tmp_path / "out"
    kit_made = any((REPO / ".gpu-kit").glob("*.whl"))  # by `make gpu-kit`
    proc = run_check(out, "--dry-run", timeout=900)
    log = proc.stdout[-3000:] + proc.stderr[-3000:]
    assert {p.name for p in out.iterdir()} >= {"report.md", "check.log", "runs.tar.gz"}, log
    report = unpadded((out / "report.md").read_text())
    table = phases(report)
    # The kit phase needs `make gpu-kit` (PyPI); every other phase must pass.
    others = {name: rc for name, rc in table.items() if name != "kit"}
    assert {
        "env",
        "data",
        "decode",
        "sharing",
        "tests",
        "ceiling-resident",
        "model-memmap",
        "model-torchvision",
        "model-spdl-turbo",
        "ladder-spdl-turbo",
        "ladder-torchvision",
    } <= set(others)
    assert set(others.values()) == {"0"}, (table, log)
    assert "| failed |" not in report and "DRY RUN" in report
    # The GPU plan's projection, printed before the first run; env.json written first.
    check_log = (out / "check.log").read_text()
    assert "projected time on the GPU machine" in check_log and "fits with" in check_log
    assert table["projection"] == "0" and next(iter(table)) == "env-quick"
    assert check_log.index("[env-quick]") < check_log.index("[kit]")
    # The decode phase ran its CPU equivalent: a row a case, in the report and in decode.json.
    assert "## The decoder table" in report and "| nvimgcodec cpu | region |" in report
    assert json.loads((out / "decode.json").read_text())["device"] == "cpu"
    # Every row states its steady batches and its share of the resident row's rate: the
    # resident rows 1, the others a fraction (the metric catalog's names head the columns).
    header = next(line for line in report.splitlines() if line.startswith("| loader |"))
    assert "| images_per_s | ceiling_frac | ceiling_images_per_s | steady_batches |" in header, (
        header
    )
    resident = [line for line in report.splitlines() if line.startswith("| resident |")]
    assert resident and all(re.search(r"\| 1(\.0+)? \|", line) for line in resident), resident
    ladder = [line for line in report.splitlines() if line.startswith("| spdl (turbo) | 2 |")]
    assert ladder, report
    assert "## Driving the JPEG decoder" in report
    assert json.loads((out / "sharing.json").read_text())["device"] == "cpu"
    if kit_made:  # the check passes whole
        assert table["kit"] == "0" and proc.returncode == 0, log
    else:  # a fresh checkout: the kit phase says what is missing, and the check fails
        assert table["kit"] != "0" and proc.returncode != 0
        assert "make gpu-kit" in (out / "check.log").read_text()


def plan(**env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(SCRIPT), "--plan"],
        env={**os.environ, "PYTHON": sys.executable, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


def projected_rows(stdout: str) -> list[list[str]]:
    """The projection's rows: number, phase, jobs, estimate, running total, basis."""
    return [
        line.split(None, 5)
        for line in stdout.splitlines()
        if re.match(r"^\s*\d+\s+\S+\s+(\d+|-)\s+\d+\s+\d+\s", line)
    ]


@pytest.mark.slow
def test_the_plan_projects_the_gpu_runs_most_valuable_first_within_the_budget() -> None:
    """``--plan`` (and the dry run, in its projection phase) prints the GPU plan's projected
    time, a row a phase and multirun in the order they run: env.json at once, then the runs
    that matter most (the resident ceiling, spdl nvjpeg and memmap on CUDA, with the models)
    before the tests and the rest; summed against the 460 s budget with room, start-up
    apart; and the size that travels."""
    proc = plan()
    assert proc.returncode == 0, proc.stderr
    rows = projected_rows(proc.stdout)
    names = [row[1] for row in rows]
    assert names[0] == "env-quick" and names.index("env-quick") < names.index("kit")
    runs = [row for row in rows if row[2] != "-"]
    assert [row[1] for row in runs[:3]] == [
        "ceiling-resident",
        "model-spdl-nvjpeg",
        "model-memmap",
    ]
    assert names.index("model-memmap") < names.index("tests") < names.index("decode")
    assert names.index("decode") < names.index("sharing")
    # Two models a loader setting (memmap: two stores), the ladder's four counts.
    jobs = {row[1]: int(row[2]) for row in runs}
    assert jobs == {
        "ceiling-resident": 2,
        "model-spdl-nvjpeg": 2,
        "model-memmap": 4,
        "model-torchvision": 2,
        "model-spdl-turbo": 2,
        "ladder-spdl-turbo": 4,
        "ladder-torchvision": 4,
    }
    total = int(rows[-1][4])
    assert abs(total - sum(int(row[3]) for row in rows)) <= len(rows)  # rounding apart
    assert total <= 0.9 * (460 - 25) and total + 25 <= 8 * 60
    assert "budget 460 s" in proc.stdout and "fits with" in proc.stdout
    start = re.search(r"of the projected (\d+) s, (\d+) s is start-up", proc.stdout)
    assert start and int(start[1]) == total and 0 < int(start[2]) < total
    assert re.search(r"travels: kit [\d.]+ MiB .* = [\d.]+ MiB \(limit 60 MiB\)", proc.stdout)

    over = plan(GPU_CHECK_BUDGET_S=str(total))  # the reserve no longer fits
    assert over.returncode == 1 and "exceeds" in over.stderr
    assert projected_rows(over.stdout) == rows


def test_the_projection_counts_each_cache_build_once_and_refuses_unknown_phases(
    tmp_path: Path,
) -> None:
    path = tmp_path / "plan.tsv"
    line = "sweep\t{}\t2\tloader=memmap\tloader.store=raw,jpeg\tloader.num_workers=8\t{}\n"
    alone = "model=none\tbench.max_batches=6"
    path.write_text(line.format("model-memmap", "model=resnet50") + line.format("ladder-x", alone))
    first, second = gpu_plan.read_plan(path)
    # The cache builds once; the model jobs measure their own ceiling too.
    assert first.start_s - second.start_s == pytest.approx(
        2 * gpu_plan.CACHE_BUILD_S + 2 * gpu_plan.CEILING_PASS_S
    )
    # The model's ceiling bounds a loader faster than the model: 8,000 train + 300 val images.
    images = 7936 + 300
    ceiling = gpu_plan.CEILINGS["resnet50"]
    measured = images / ceiling + images / min(ceiling, gpu_plan.RATES["memmap-jpeg"])
    assert first.seconds - first.start_s == pytest.approx(measured)
    path.write_text("phase\tsurprise\n")
    with pytest.raises(ValueError, match="surprise"):
        gpu_plan.read_plan(path)


def test_the_report_states_each_rows_share_of_its_models_ceiling(tmp_path: Path) -> None:
    rows = [
        gpu_report.Row("s", "0", "resident", "0", "ok", {"model": "r50", "images_per_s": 4000.0}),
        gpu_report.Row("s", "1", "spdl", "8", "ok", {"model": "r50", "images_per_s": 3000.0}),
        gpu_report.Row("s", "2", "spdl", "8", "ok", {"model": "r18", "images_per_s": 3000.0}),
        gpu_report.Row(
            "s",
            "3",
            "memmap",
            "8",
            "ok",
            {"model": "r50", "images_per_s": 1000.0, "ceiling_frac": 0.5},  # its own pass's
        ),
        gpu_report.Row(
            "s",
            "4",
            "memmap",
            "8",
            "ok",
            {"model": "r18", "images_per_s": 1.0, "ceiling_frac": 0.5},
        ),
    ]
    gpu_report.with_ceiling(rows, gpu_report.ceilings(rows))
    fracs = [row.metrics.get("ceiling_frac") for row in rows]
    # The check's resident job (a whole run) before a job's own short pass; with no resnet18
    # ceiling measured, a job's own figure is kept, and none where neither is.
    assert fracs == [1.0, 0.75, None, 0.25, 0.5]
    unsteady = {"model": "r50", "images_per_s": None, "images_per_s_null_reason": "no window"}
    rows.append(gpu_report.Row("s", "4", "spdl", "8", "ok", unsteady))
    lines = unpadded("\n".join(gpu_report.rows_table(rows))).splitlines()
    assert "images_per_s null: no window" in lines[-1]
    assert lines[0].startswith(
        "| loader | workers | status | model | images_per_s | ceiling_frac | ceiling_images_per_s"
    )


# ---------------------------------------------------------------------------------------------
# tools/gpu_check/gpu_kit.sh (make gpu-kit)


def kit(*args: str, **env: str | Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(KIT_SCRIPT), *args],
        env={**os.environ, **{k: str(v) for k, v in env.items()}},
        capture_output=True,
        text=True,
        timeout=120,
    )


def kit_specs() -> list[str]:
    proc = kit("--list")
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.split()


@pytest.mark.slow
def test_the_kit_carries_nvimagecodec_and_the_nvjpeg_it_loads() -> None:
    specs = kit_specs()
    names = [spec.split("==")[0] for spec in specs]
    assert len(names) == len(set(names))  # one version of each
    # nvImageCodec's nvJPEG extension dlopens libnvjpeg.so.13 beside it (torch 2.11 has none).
    assert {"nvidia-nvimgcodec-cu13", "nvidia-nvjpeg", "torchcodec", "spdl_io"} <= set(names)
    assert "nvidia-nvjpeg==13.0.1.86" in specs


def fake_kit(folder: Path, specs: list[str], size: int) -> None:
    """A wheel-named file of ``size`` bytes (sparse) per spec: --check reads names and sizes."""
    folder.mkdir()
    for spec in specs:
        name, version = spec.split("==")
        wheel = folder / f"{name.replace('-', '_')}-{version}-py3-none-any.whl"
        with wheel.open("wb") as file:
            file.truncate(size)


@pytest.mark.slow
def test_check_names_every_missing_wheel(tmp_path: Path) -> None:
    proc = kit("--check", KIT_DIR=tmp_path / "empty")
    assert proc.returncode == 1
    for spec in kit_specs():
        assert f"missing {spec}" in proc.stderr
    assert "make gpu-kit" in proc.stderr


@pytest.mark.slow
def test_check_holds_the_kit_and_what_travels_with_it_to_their_limits(tmp_path: Path) -> None:
    specs = kit_specs()
    folder = tmp_path / "kit"
    fake_kit(folder, specs, MiB)
    ok = kit("--check", KIT_DIR=folder)
    assert ok.returncode == 0, ok.stderr
    assert f"{len(specs)} wheels, {len(specs)}.00 MiB" in ok.stdout
    assert "travel together" in ok.stdout

    too_big = kit("--check", KIT_DIR=folder, KIT_MAX_MB=len(specs) - 1)
    assert too_big.returncode == 1 and f"over the {len(specs) - 1} MiB limit" in too_big.stderr
    # The working tree travels too: the kit alone fits, kit + tree does not.
    no_room = kit("--check", KIT_DIR=folder, TRAVEL_MAX_MB=len(specs))
    assert no_room.returncode == 1
    assert f"over the {len(specs)} MiB that travel to the GPU machine" in no_room.stderr


# ---------------------------------------------------------------------------------------------
# The decode phases (python -m tools.gpu_check decode, sharing)


def test_the_sharing_phase_times_every_mode_on_cpu_threads(tiny_root: Path, tmp_path: Path) -> None:
    if importlib.util.find_spec("nvidia.nvimgcodec") is None:
        pytest.skip("nvImageCodec is not installed here")
    out = tmp_path / "sharing.json"
    args = ["--device", "cpu", "--images", "8", "--seconds", "0.05"]
    assert cli.main(["sharing", str(tiny_root), "--out", str(out), *args]) == 0
    result = json.loads(out.read_text())
    assert len(result["cases"]) == len(sharing.MODES)
    assert all(c["images"] > 0 and c["cpu_ms_per_image"] > 0 for c in result["cases"])
    section = unpadded("\n".join(sharing.sharing_lines(result)))
    assert "| one decoder behind a lock | 4 | 1 | 256 | ok |" in section


def decode_phase(root: Path, out: Path, device: str, *extra: str) -> tuple[int, dict]:
    args = ["--device", device, "--batch", "4", "--images", "12", "--seconds", "0.05", *extra]
    rc = cli.main(["decode", str(root), "--out", str(out), *args])
    return rc, json.loads(out.read_text())


def test_the_decoder_table_times_every_decoder_against_pillows_pixels(
    tiny_root: Path, tmp_path: Path
) -> None:
    """The dry run of the decoder table (``--dry-run``: on the CPU): every row, the GPU's
    engines absent and saying why, the others timed with Pillow's pixels (fancy upsampling)
    or not (simple upsampling), the loaders' choice counted by engine."""
    rc, result = decode_phase(tiny_root, tmp_path / "decode.json", "cuda", "--dry-run")
    assert rc == 0, result
    assert result["device"] == "cpu" and result["engine_order"] == ["cpu"]
    cases = {(case["library"], case["kind"]): case for case in result["cases"]}
    assert list(cases) == decode_rows.cases_for("cpu")
    for (label, kind), case in cases.items():
        if label.split()[:2] in (["nvimgcodec", "hardware"], ["nvimgcodec", "cuda"]) or (
            label.startswith("nvimgcodec hybrid")
        ):
            assert case["status"] == "absent" and "CUDA" in case["error"], case
            continue
        assert case["status"] == "ok", case
        assert case["images"] >= 12 and case["images_per_s"] > 0 and case["cpu_ms_per_image"] > 0
        # nvImageCodec decodes the box alone; TorchCodec and torchvision cut it from the whole.
        region = kind == "region" and not label.startswith(("torchcodec", "torchvision"))
        assert case["region_decoded"] == region, case
        if "(no fancy)" in label:  # libjpeg's simple upsampling: not Pillow's chroma
            assert case["max_abs_vs_pillow"] > 0, case
        else:
            assert case["max_abs_vs_pillow"] <= 1, case
    for kind in ("full", "region"):  # every timed image, counted by the engine that took it
        choice = cases[(decode_bench.CHOICE, kind)]
        assert choice["decoded_by"] == {"nvimgcodec:cpu": choice["images"]}
    assert 0 < result["mean_kept_fraction"] < 1

    section = unpadded("\n".join(decode_table.decode_lines(result)))
    assert "| nvimgcodec cpu | region | ok | " in section and "whole, then cut" in section
    assert "decoded by nvimgcodec:cpu" in section and "not GPU figures" in section
    assert "| nvimgcodec hardware | full | absent |" in section
    assert re.search(r"full: the loaders' choice decodes at [\d.]+ of the fastest engine", section)
    # The report renders the phase's rows too (its own section).
    assert "| torchcodec | full | ok | " in unpadded("\n".join(gpu_report.decode_lines(result)))


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the answer where there is no GPU")
def test_the_decode_phase_on_cuda_without_a_gpu_is_skipped_not_failed(
    tiny_root: Path, tmp_path: Path
) -> None:
    rc, result = decode_phase(tiny_root, tmp_path / "decode.json", "cuda")
    assert rc == 0 and result["skipped"] == "no CUDA"
    assert decode_table.decode_lines(result)[-1] == "skipped: no CUDA"


def _rows(device: str, status: str = "ok") -> list[dict]:
    return [
        {"library": name, "kind": kind, "status": status}
        for name, kind in decode_rows.cases_for(device)
    ]


def test_an_absent_engine_is_allowed_a_missing_library_only_on_the_cpu() -> None:
    rows = _rows("cuda")
    assert decode_bench.decode_exit_code({"device": "cuda", "cases": rows}) == 0
    no_engine = [*rows[:2], {**rows[2], "status": "absent"}, *rows[3:]]
    assert decode_bench.decode_exit_code({"device": "cuda", "cases": no_engine}) == 0
    missing = [*rows[:-1], {**rows[-1], "status": "unavailable"}]
    assert decode_bench.decode_exit_code({"device": "cuda", "cases": missing}) == 1
    cpu = _rows("cpu")
    missing_cpu = [*cpu[:-1], {**cpu[-1], "status": "unavailable"}]
    assert decode_bench.decode_exit_code({"device": "cpu", "cases": missing_cpu}) == 0
    failed = [*cpu[:-1], {**cpu[-1], "status": "failed"}]
    assert decode_bench.decode_exit_code({"device": "cpu", "cases": failed}) == 1
    # The loaders' own decode must work, wherever the check runs.
    choice_down = [{**cpu[0], "status": "absent"}, *cpu[1:]]
    assert decode_bench.decode_exit_code({"device": "cpu", "cases": choice_down}) == 1


def test_rows_a_crash_cut_short_fail_the_phase_and_show_as_not_run() -> None:
    """decode.json is saved after every row: a library that takes the process down leaves
    the rows before it, and the report names the ones that never ran."""
    rows = _rows("cuda")
    partial = {"device": "cuda", "cases": rows[:2], "gpu": "H200"}
    assert decode_bench.decode_exit_code(partial) == 1
    section = unpadded("\n".join(decode_table.decode_lines(partial)))
    last_name, last_kind = decode_bench.DECODE_CASES[-1]
    assert f"| {last_name} | {last_kind} | not run |" in section
    assert section.count("| not run |") == len(decode_bench.DECODE_CASES) - 2
