"""The GPU check's helpers (``scripts/gpu_check.sh``): the machine, the data, the report.

``python -m loaderbench.bench.gpu env OUT.json`` records the machine: Python, torch, CUDA, the
GPU (and ``nvidia-smi``), the kit's packages, and whether torchcodec and ``spdl.io`` load (each
tried in a subprocess, so a library that crashes on load cannot take the check with it).

``python -m loaderbench.bench.gpu data PARENT --classes N --train N --val N`` generates the
synthetic set (ImageNet's image sizes) and prints its root.

``python -m loaderbench.bench.gpu report --runs DIR --plan PLAN --phases PHASES ...`` turns the
check's sweep directories into one markdown table: a row a job (images/s, data wait, CPU s per
1000 images, time to first batch, peak memory), failed and missing jobs included.

Only the standard library (and PyYAML where present) is needed to write the report, so it is
written even when the kit did not install.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import platform
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# The figures a row shows, from each job's metrics.json, in this order. skipped_files: a decoder
# that fails on every image (a library that loads but cannot decode here) shows up there.
ROW_METRICS = (
    "images_per_s",
    "data_wait_frac",
    "cpu_s_per_1k_images",
    "ttfb_s",
    "peak_rss_mb",
    "skipped_files",
)
# The overrides that tell the jobs of one sweep apart.
VARIANT_KEYS = ("loader.store", "loader.val_store", "loader.decoder")
PACKAGES = (
    "torch",
    "torchvision",
    "timm",
    "numpy",
    "pillow",
    "hydra-core",
    "omegaconf",
    "antlr4-python3-runtime",
    "tensordict",
    "pyvers",
    "spdl",
    "spdl_core",
    "spdl_io",
    "torchcodec",
    "pytest",
    "pytest-timeout",
    "psutil",
)
PROBES = {
    "torchcodec": "import torchcodec, torchcodec.decoders; print(torchcodec.__version__)",
    "spdl.io": "import spdl.io; print('imported')",
    "tensordict": "import tensordict; print(tensordict.__version__)",
    "hydra": "import hydra, omegaconf; print(hydra.__version__, omegaconf.__version__)",
}


# ---------------------------------------------------------------------------------------------
# The machine.


def _run(command: list[str], timeout: float = 60) -> tuple[int, str]:
    try:
        proc = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as error:
        return -1, f"{type(error).__name__}: {error}"
    return proc.returncode, (proc.stdout + proc.stderr).strip()


def _probe(code: str) -> dict[str, Any]:
    """Run ``code`` in a fresh interpreter: loaded or not, and the last line it printed."""
    rc, output = _run([sys.executable, "-c", code], timeout=120)
    lines = [line for line in output.splitlines() if line.strip()]
    return {"loaded": rc == 0, "detail": lines[-1] if lines else f"exit code {rc}"}


def machine_info() -> dict[str, Any]:
    info: dict[str, Any] = {
        "python": sys.version.split()[0],
        "executable": sys.executable,
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "packages": {},
    }
    for name in PACKAGES:
        try:
            info["packages"][name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            info["packages"][name] = None
    try:
        import torch

        info["torch"] = torch.__version__
        info["torch_cuda_build"] = torch.version.cuda
        info["cuda_available"] = torch.cuda.is_available()
        if torch.cuda.is_available():
            props = torch.cuda.get_device_properties(0)
            info["gpu"] = torch.cuda.get_device_name(0)
            info["gpu_count"] = torch.cuda.device_count()
            info["gpu_memory_gb"] = round(props.total_memory / 1e9, 1)
            info["gpu_capability"] = ".".join(map(str, torch.cuda.get_device_capability(0)))
            info["cudnn"] = torch.backends.cudnn.version()
            info["bf16_supported"] = torch.cuda.is_bf16_supported()
    except Exception as error:  # the report says what is wrong instead of failing
        info["torch_error"] = f"{type(error).__name__}: {error}"
    info["probes"] = {name: _probe(code) for name, code in PROBES.items()}
    if shutil.which("nvidia-smi"):
        _, info["nvidia_smi"] = _run(["nvidia-smi"])
        _, info["nvidia_smi_query"] = _run(
            [
                "nvidia-smi",
                "--query-gpu=name,driver_version,memory.total,power.limit,clocks.max.sm",
                "--format=csv",
            ]
        )
    else:
        info["nvidia_smi"] = "nvidia-smi not found"
    return info


# ---------------------------------------------------------------------------------------------
# The report.


@dataclass
class Sweep:
    """One ``--multirun`` of the check: what it ran and how its process ended."""

    name: str
    title: str
    expected_jobs: int
    rc: str = "not run"
    seconds: str = ""


@dataclass
class Row:
    sweep: str
    job: str
    loader: str
    workers: str
    status: str
    metrics: dict[str, Any] = field(default_factory=dict)
    error: str = ""


def _read_table(path: Path | None) -> list[list[str]]:
    if path is None or not path.is_file():
        return []
    return [line.split("\t") for line in path.read_text().splitlines() if line.strip()]


def _read_overrides(path: Path) -> dict[str, str]:
    """``key=value`` overrides of a Hydra job (its .hydra/overrides.yaml, a list of strings)."""
    try:
        import yaml

        items = yaml.safe_load(path.read_text()) or []
    except ImportError:
        items = [
            line[2:].strip().strip("'\"")
            for line in path.read_text().splitlines()
            if line.startswith("- ")
        ]
    values = {}
    for item in items:
        key, _, value = str(item).partition("=")
        values[key.lstrip("+~")] = value
    return values


def _loader_label(values: dict[str, str], metrics: dict[str, Any]) -> str:
    loader = values.get("loader") or metrics.get("loader") or "?"
    variant = [values[k] for k in VARIANT_KEYS if values.get(k)]
    return f"{loader} ({', '.join(variant)})" if variant else loader


def _job_dirs(sweep_dir: Path) -> list[Path]:
    jobs = [p.parent.parent for p in sweep_dir.glob("*/.hydra/overrides.yaml")]
    return sorted(jobs, key=lambda p: (len(p.name), p.name))


def collect(sweep_dir: Path, name: str) -> list[Row]:
    """A row a job of the sweep: its metrics, or why there are none."""
    rows = []
    for job_dir in _job_dirs(sweep_dir):
        values = _read_overrides(job_dir / ".hydra" / "overrides.yaml")
        try:
            metrics = json.loads((job_dir / "metrics.json").read_text())
        except (OSError, ValueError) as error:
            metrics = {"status": "failed", "error": f"no readable metrics.json ({error})"}
        status = str(metrics.get("status", "failed"))
        if status == "running":  # the process ended before the job could say how
            status = "killed"
            metrics.setdefault("error", "the job never finished (killed, crashed or timed out)")
        rows.append(
            Row(
                sweep=name,
                job=job_dir.name,
                loader=_loader_label(values, metrics),
                workers=str(values.get("loader.num_workers", metrics.get("num_workers", ""))),
                status=status,
                metrics=metrics,
                error=str(metrics.get("error") or ""),
            )
        )
    return rows


def _fmt(value: Any, digits: int = 3) -> str:
    if value is None or value == "":
        return ""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, int | float):
        if abs(value) >= 100:
            return f"{value:,.0f}"
        return f"{value:.{digits}g}"
    return str(value).replace("|", "\\|").replace("\n", " ")


def _short(text: str, limit: int = 160) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _details(row: Row) -> str:
    """What a row's number rests on: the JPEG decoder a memmap jpeg store used, and so on."""
    if row.status == "interrupted" and not row.error:
        return "stopped by the phase's time limit"
    if row.status != "ok":
        return _fmt(_short(row.error))
    found = [
        f"{key.removeprefix('loader_')}: {value}"
        for key, value in sorted(row.metrics.items())
        if key.endswith("_jpeg_backend") and value
    ]
    return _fmt(", ".join(found))


def rows_table(rows: list[Row]) -> list[str]:
    header = ["loader", "workers", "status", *ROW_METRICS, "note"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in rows:
        cells = [row.loader, row.workers, row.status]
        cells += [_fmt(row.metrics.get(k)) for k in ROW_METRICS]
        cells.append(_details(row))
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _pytest_summary(path: Path | None) -> tuple[str, list[str]]:
    """pytest's last summary line and its skip / failure lines."""
    if path is None or not path.is_file():
        return "no pytest log", []
    lines = path.read_text(errors="replace").splitlines()
    summary = next(
        (line.strip("= ").strip() for line in reversed(lines) if line.startswith("=")),
        lines[-1] if lines else "empty log",
    )
    notes = [line for line in lines if line.startswith(("SKIPPED", "FAILED", "ERROR"))]
    return summary, notes


def _env_lines(env: dict[str, Any]) -> list[str]:
    packages = env.get("packages", {})
    lines = [
        "| what | value |",
        "|---|---|",
        f"| GPU | {_fmt(env.get('gpu', 'none'))} "
        f"({env.get('gpu_count', 0)} device(s), {env.get('gpu_memory_gb', '-')} GB, "
        f"capability {env.get('gpu_capability', '-')}, bf16 {env.get('bf16_supported', '-')}) |",
        f"| Python | {env.get('python')} ({env.get('executable')}) |",
        f"| platform | {env.get('platform')}, {env.get('cpus')} CPUs |",
        f"| torch | {env.get('torch', env.get('torch_error', '-'))}, CUDA build "
        f"{env.get('torch_cuda_build')}, cuDNN {env.get('cudnn', '-')} |",
    ]
    for name in PACKAGES:
        if name != "torch":
            lines.append(f"| {name} | {packages.get(name) or 'not installed'} |")
    for name, probe in env.get("probes", {}).items():
        state = "loads" if probe.get("loaded") else "**does not load**"
        lines.append(f"| import {name} | {state}: {_fmt(_short(str(probe.get('detail'))))} |")
    return lines


def write_report(
    out: Path,
    runs: Path,
    plan: Path | None,
    phases: Path | None,
    env_path: Path | None,
    pytest_log: Path | None,
    title: str,
    notes: list[str],
) -> tuple[int, int]:
    """The markdown report; returns (jobs that ran ok, rows in all, missing jobs included)."""
    env: dict[str, Any] = {}
    if env_path is not None and env_path.is_file():
        env = json.loads(env_path.read_text())
    phase_rows = _read_table(phases)
    sweeps = [Sweep(name=r[0], title=r[1], expected_jobs=int(r[2])) for r in _read_table(plan)]
    by_name = {s.name: s for s in sweeps}
    for phase in phase_rows:
        if phase[0] in by_name:
            by_name[phase[0]].seconds, by_name[phase[0]].rc = phase[1], phase[3]

    lines = [f"# {title}", ""]
    lines += [f"- {note}" for note in notes]
    lines += [
        "",
        "## Phases",
        "",
        "| phase | seconds | budget s | exit code |",
        "|---|---|---|---|",
    ]
    for phase in phase_rows:
        name, seconds, budget, rc = [*phase, "", "", "", ""][:4]
        lines.append(f"| {name} | {seconds} | {budget} | {rc} |")

    summary, test_notes = _pytest_summary(pytest_log)
    lines += ["", "## Tests (`pytest -m cuda`)", "", f"`{summary}`", ""]
    lines += [f"    {note}" for note in test_notes]

    ok = total = 0
    lines += ["", "## Benchmark", ""]
    lines.append(
        "images/s: steady state after the warm-up batches; data_wait_frac: share of the loop "
        "blocked on the loader; cpu_s_per_1k_images and peak_rss_mb: the whole process tree."
    )
    for sweep in sweeps:
        rows = collect(runs / sweep.name, sweep.name)
        missing = max(0, sweep.expected_jobs - len(rows))
        total += len(rows) + missing
        ok += sum(r.status == "ok" for r in rows)
        lines += ["", f"### {sweep.title}", ""]
        ran = f"{len(rows)} of {sweep.expected_jobs} jobs ran"
        lines.append(
            f"`{sweep.name}`: {ran}; the multirun took {sweep.seconds or '-'} s, exit {sweep.rc}."
        )
        if missing:
            lines.append(
                f"**{missing} job(s) never started** (the multirun's process ended early, "
                "or the check ran out of time): see check.log."
            )
        lines.append("")
        lines += rows_table(rows) if rows else ["(no jobs)"]

    lines += ["", "## Machine", ""]
    lines += _env_lines(env) if env else ["(no machine record: the env phase did not run)"]
    if env.get("nvidia_smi_query"):
        lines += ["", "```", env["nvidia_smi_query"], "```"]
    if env.get("nvidia_smi"):
        lines += ["", "<details><summary>nvidia-smi</summary>", "", "```", env["nvidia_smi"]]
        lines += ["```", "", "</details>"]
    out.write_text("\n".join(lines) + "\n")
    return ok, total


# ---------------------------------------------------------------------------------------------
# The command line.


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    env = sub.add_parser("env", help="record the machine as JSON")
    env.add_argument("out", type=Path)
    data = sub.add_parser("data", help="generate the synthetic set and print its root")
    data.add_argument("parent", type=Path)
    data.add_argument("--classes", type=int, default=100)
    data.add_argument("--train", type=int, default=40, help="train images a class")
    data.add_argument("--val", type=int, default=10, help="val images a class")
    report = sub.add_parser("report", help="write the markdown report")
    report.add_argument("--out", type=Path, required=True)
    report.add_argument("--runs", type=Path, required=True)
    report.add_argument("--plan", type=Path)
    report.add_argument("--phases", type=Path)
    report.add_argument("--env", type=Path)
    report.add_argument("--pytest-log", type=Path)
    report.add_argument("--title", default="GPU check")
    report.add_argument("--note", action="append", default=[])
    args = parser.parse_args(argv)

    if args.command == "env":
        info = machine_info()
        args.out.write_text(json.dumps(info, indent=2) + "\n")
        for name, probe in info["probes"].items():
            print(f"import {name}: {'ok' if probe['loaded'] else 'FAILED'}: {probe['detail']}")
        print(f"torch {info.get('torch')}, CUDA available: {info.get('cuda_available')}")
        return 0
    if args.command == "data":
        from loaderbench.synthetic import SyntheticSpec, ensure_synthetic

        spec = SyntheticSpec(
            num_classes=args.classes, train_per_class=args.train, val_per_class=args.val
        )
        print(ensure_synthetic(spec, args.parent.absolute()))
        return 0
    ok, total = write_report(
        args.out,
        args.runs,
        args.plan,
        args.phases,
        args.env,
        args.pytest_log,
        args.title,
        args.note,
    )
    print(f"{args.out}: {ok} of {total} benchmark jobs ok")
    return 0 if ok == total and total > 0 else 1


if __name__ == "__main__":
    sys.exit(main())
