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
from tools.gpu_check import cli, decode_bench
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
    proc = run_check(out, "--dry-run", timeout=600)
    log = proc.stdout[-3000:] + proc.stderr[-3000:]
    assert {p.name for p in out.iterdir()} >= {"report.md", "check.log", "runs.tar.gz"}, log
    report = (out / "report.md").read_text()
    table = phases(report)
    # The kit phase needs `make gpu-kit` (PyPI); every other phase must pass.
    others = {name: rc for name, rc in table.items() if name != "kit"}
    assert {
        "env",
        "data",
        "decode",
        "tests",
        "train-model-memmap",
        "eval-none-spdl-turbo",
        "train-model-auto-spdl-turbo",
    } <= set(others)
    assert set(others.values()) == {"0"}, (table, log)
    assert "| failed |" not in report and "DRY RUN" in report
    # The GPU plan's projection, printed before the first run; env.json written first.
    check_log = (out / "check.log").read_text()
    assert "projected time on the GPU machine" in check_log and "fits with" in check_log
    assert table["projection"] == "0" and next(iter(table)) == "env-quick"
    assert check_log.index("[env-quick]") < check_log.index("[kit]")
    # The decode phase ran its CPU equivalent: a row a case, in the report and in decode.json.
    assert "## Batched JPEG decode" in report and "| nvimgcodec | region |" in report
    assert json.loads((out / "decode.json").read_text())["device"] == "cpu"
    # num_workers=auto's row: the count its probe chose (ladder 1, 2 here) and the probe.
    assert re.search(r"\| spdl[^|]* \| auto: [12] \| ok \|.*probe [\d.]+ s \(1: ", report), report
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
    that matter most (spdl nvjpeg and memmap on CUDA, with the model) before the tests and
    the rest; summed against the 440 s budget with room; and the size that travels."""
    proc = plan()
    assert proc.returncode == 0, proc.stderr
    rows = projected_rows(proc.stdout)
    names = [row[1] for row in rows]
    assert names[0] == "env-quick" and names.index("env-quick") < names.index("kit")
    runs = [row for row in rows if row[2] != "-"]
    assert [row[1] for row in runs[:2]] == ["train-model-spdl-nvjpeg", "train-model-memmap"]
    assert names.index("train-model-memmap") < names.index("tests") < names.index("decode")
    assert names[-1] == "eval-none-spdl-turbo" and "train-model-auto-spdl-turbo" in names
    # One worker count where a second adds nothing: only spdl turbo with the model has two.
    assert {row[1]: int(row[2]) for row in runs}["train-model-spdl-turbo"] == 2
    assert all(int(row[2]) == 1 for row in runs if "nvjpeg" in row[1])
    total = int(rows[-1][4])
    assert abs(total - sum(int(row[3]) for row in rows)) <= len(rows)  # rounding apart
    assert total <= 0.9 * (440 - 25)
    assert "budget 440 s" in proc.stdout and "fits with" in proc.stdout
    assert re.search(r"travels: kit [\d.]+ MiB .* = [\d.]+ MiB \(limit 60 MiB\)", proc.stdout)

    over = plan(GPU_CHECK_BUDGET_S=str(total))  # the reserve no longer fits
    assert over.returncode == 1 and "exceeds" in over.stderr
    assert projected_rows(over.stdout) == rows


def test_the_projection_counts_each_cache_build_once_and_refuses_unknown_phases(
    tmp_path: Path,
) -> None:
    path = tmp_path / "plan.tsv"
    line = "sweep\t{}\t2\tloader=memmap\tloader.store=raw,jpeg\tloader.num_workers=8\n"
    path.write_text(line.format("train-model-memmap") + line.format("train-none-memmap"))
    first, second = gpu_plan.read_plan(path)
    assert first.seconds - second.seconds == pytest.approx(
        2 * (gpu_plan.JOB_S["train-model"] - gpu_plan.JOB_S["train-none"])
        + 2 * gpu_plan.CACHE_BUILD_S
    )
    path.write_text("phase\tsurprise\n")
    with pytest.raises(ValueError, match="surprise"):
        gpu_plan.read_plan(path)


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
# The decode phase (python -m tools.gpu_check decode)


def decode_phase(root: Path, out: Path, device: str) -> tuple[int, dict]:
    args = ["--device", device, "--batch", "4", "--images", "12", "--seconds", "0.05"]
    rc = cli.main(["decode", str(root), "--out", str(out), *args])
    return rc, json.loads(out.read_text())


def test_the_decode_phase_times_every_case_and_its_pixels_agree(
    tiny_root: Path, tmp_path: Path
) -> None:
    rc, result = decode_phase(tiny_root, tmp_path / "decode.json", "cpu")
    assert rc == 0, result
    cases = {(case["library"], case["kind"]): case for case in result["cases"]}
    assert set(cases) == set(decode_bench.DECODE_CASES)
    installed = {"nvimgcodec": importlib.util.find_spec("nvidia.nvimgcodec") is not None}
    for (library, kind), case in cases.items():
        if not installed.get(library, True):
            assert case["status"] == "unavailable" and case["error"], case
            continue
        assert case["status"] == "ok", case
        assert case["images"] >= 12 and case["images_per_s"] > 0 and case["cpu_ms_per_image"] > 0
        # Only nvImageCodec decodes the box alone; the others cut it from the whole image.
        assert case["region_decoded"] == (kind == "region" and library == "nvimgcodec")
    assert 0 < result["mean_kept_fraction"] < 1
    agree = {a["what"]: a for a in result["agreement"]}
    assert agree["torchvision whole vs torchcodec whole"]["max_abs"] == 0
    if installed["nvimgcodec"]:  # libjpeg-turbo both ways on the CPU: the same pixels
        assert agree["nvimgcodec whole vs torchcodec whole"]["max_abs"] == 0
        assert agree["nvimgcodec region vs its whole decode, cut"]["max_abs"] == 0

    section = "\n".join(gpu_report.decode_lines(result))
    assert "| torchcodec | full | ok | " in section and "whole, then cut" in section
    assert "not GPU figures" in section


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the answer where there is no GPU")
def test_the_decode_phase_on_cuda_without_a_gpu_is_skipped_not_failed(
    tiny_root: Path, tmp_path: Path
) -> None:
    rc, result = decode_phase(tiny_root, tmp_path / "decode.json", "cuda")
    assert rc == 0 and result["skipped"] == "no CUDA"
    assert gpu_report.decode_lines(result)[-1] == "skipped: no CUDA"


def test_a_missing_library_fails_the_decode_phase_on_a_gpu_only() -> None:
    rows = [
        {"library": name, "kind": kind, "status": "ok"} for name, kind in decode_bench.DECODE_CASES
    ]
    missing = [*rows[:-1], {**rows[-1], "status": "unavailable"}]
    failed = [*rows[:-1], {**rows[-1], "status": "failed"}]
    assert decode_bench.decode_exit_code({"device": "cuda", "cases": rows}) == 0
    assert decode_bench.decode_exit_code({"device": "cuda", "cases": missing}) == 1
    assert decode_bench.decode_exit_code({"device": "cpu", "cases": missing}) == 0
    assert decode_bench.decode_exit_code({"device": "cpu", "cases": failed}) == 1


def test_cases_a_crash_cut_short_fail_the_phase_and_show_as_not_run() -> None:
    """decode.json is saved after every case: a library that takes the process down leaves
    the rows before it, and the report names the ones that never ran."""
    rows = [
        {"library": name, "kind": kind, "status": "ok"} for name, kind in decode_bench.DECODE_CASES
    ]
    partial = {"device": "cuda", "cases": rows[:2], "gpu": "H200"}
    assert decode_bench.decode_exit_code(partial) == 1
    section = "\n".join(gpu_report.decode_lines(partial))
    last_name, last_kind = decode_bench.DECODE_CASES[-1]
    assert f"| {last_name} | {last_kind} | not run |" in section
    assert section.count("| not run |") == len(decode_bench.DECODE_CASES) - 2
