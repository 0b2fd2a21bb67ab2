"""The GPU check's report (``python -m tools.gpu_check report --runs DIR --plan PLAN ...``): the
check's sweep folders as one markdown file, a row a job (its metrics by their catalog names,
``loaderbench.measure.metrics``: images/s and its share of the model's ceiling, the steady batches
it rests on, data wait, CPU per image, time to first batch, peak memory), failed and missing jobs
included, with the phases' times, the tests, the decode phases' figures and the machine.

Only the standard library, tabulate (its tables: ``loaderbench.platform.tables``) and PyYAML where
present are needed to write it, so it is written even where the kit did not install (gpu_check.sh
then imports tabulate from the kit's wheel itself): the job folders are read by
``loaderbench.run.folders``, which imports neither torch nor hydra.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from loaderbench.measure.metrics import (
    BY_KEY,
    CEILING_FRAC,
    CEILING_IMAGES_PER_S,
    CPU_S_PER_1K_IMAGES,
    DATA_WAIT_FRAC,
    GIL_FRAC,
    IMAGES_PER_S,
    PEAK_RSS_MB,
    SKIPPED_FILES,
    TTFB_S,
)
from loaderbench.platform.tables import markdown_table
from loaderbench.run.folders import read_jobs
from tools.gpu_check.decode_table import decode_lines
from tools.gpu_check.machine import PACKAGES
from tools.gpu_check.markdown import fmt, short
from tools.gpu_check.sharing import sharing_lines

# The figures a row shows, from each job's metrics.json, in this order, by their names in the
# metric catalog: what ran, the rate and its share of the ceiling with what they rest on, then
# the costs. ceiling_frac: the job's own (over its own resident pass, or its sweep's resident
# job), else its images/s over this check's ``loader=resident`` rate with the same model.
# cpu_s_per_1k_images is CPU ms per image. skipped_files: a decoder that fails on every image
# (a library that loads but cannot decode here) shows up there.
CEILING = CEILING_FRAC
ROW_METRICS = (
    "model",
    IMAGES_PER_S,
    CEILING,
    CEILING_IMAGES_PER_S,
    "steady_batches",
    "steady_window_s",
    "images_per_s_end_to_end",
    DATA_WAIT_FRAC,
    CPU_S_PER_1K_IMAGES,
    GIL_FRAC,
    TTFB_S,
    PEAK_RSS_MB,
    SKIPPED_FILES,
)
# The decimals of the figures shown as fixed-point numbers, thousands apart; the others as
# they are (``markdown.fmt``).
DECIMALS = {
    IMAGES_PER_S: 1,
    CEILING: 3,
    CEILING_IMAGES_PER_S: 1,
    DATA_WAIT_FRAC: 3,
    CPU_S_PER_1K_IMAGES: 2,
    GIL_FRAC: 3,
    TTFB_S: 2,
}
assert set(DECIMALS) <= set(ROW_METRICS) <= set(BY_KEY), "a GPU check column not in the catalog"
RESIDENT = "resident"  # the loader whose rate is the model's ceiling (its rows' ceiling is 1)
# The overrides that tell the jobs of one sweep apart.
VARIANT_KEYS = ("loader.store", "loader.val_store", "loader.decoder")


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


def _loader_label(values: dict[str, str], metrics: dict[str, Any]) -> str:
    loader = values.get("loader") or metrics.get("loader") or "?"
    variant = [values[k] for k in VARIANT_KEYS if values.get(k)]
    return f"{loader} ({', '.join(variant)})" if variant else loader


def _workers(values: dict[str, str], metrics: dict[str, Any]) -> str:
    """The job's count; for ``loader.num_workers=auto``, the count its probe chose."""
    given = values.get("loader.num_workers", str(metrics.get("num_workers", "")))
    if given != "auto":
        return given
    chosen = metrics.get("num_workers")
    return f"auto: {chosen}" if isinstance(chosen, int) else "auto"


def collect(sweep_dir: Path, name: str) -> list[Row]:
    """A row a job of the sweep: its metrics, or why there are none."""
    rows = []
    for job in read_jobs(sweep_dir):
        metrics = dict(job.metrics)
        status = str(metrics.get("status", "failed"))
        if status == "running":  # the process ended before the job could say how
            status = "killed"
            metrics.setdefault("error", "the job never finished (killed, crashed or timed out)")
        rows.append(
            Row(
                sweep=name,
                job=job.name,
                loader=_loader_label(job.overrides, metrics),
                workers=_workers(job.overrides, metrics),
                status=status,
                metrics=metrics,
                error=str(metrics.get("error") or ""),
            )
        )
    return rows


def _details(row: Row) -> str:
    """What a row's number rests on: the JPEG decoder a memmap jpeg store used, and so on."""
    if row.status == "interrupted" and not row.error:
        return "stopped by the phase's time limit"
    if row.status != "ok":
        return fmt(short(row.error))
    found = [
        f"{key.removeprefix('loader_')}: {value}"
        for key, value in sorted(row.metrics.items())
        if key.endswith("_jpeg_backend") and value
    ]
    for key in (IMAGES_PER_S, CEILING):  # a null figure says why (the run's own reason)
        reason = row.metrics.get(f"{key}_null_reason")
        if row.metrics.get(key) is None and reason:
            found.append(f"{key} null: {reason}")
    if probe := row.metrics.get("autotune_probe"):
        rungs = ", ".join(
            f"{rung['workers']}: {rung[IMAGES_PER_S]:,.0f}/s wait {rung[DATA_WAIT_FRAC]:.0%}"
            for rung in probe
        )
        found.append(f"probe {row.metrics.get('autotune_s', 0):.1f} s ({rungs})")
    return fmt(", ".join(found))


def cell(key: str, value: Any) -> str:
    """A metric's cell: its decimals (``DECIMALS``) for a float, else as it is."""
    if key in DECIMALS and isinstance(value, float):
        return f"{value:,.{DECIMALS[key]}f}"
    return fmt(value)


def ceilings(rows: list[Row]) -> dict[str, float]:
    """The resident (ceiling) rate of each model that this check measured."""
    return {
        str(row.metrics.get("model")): row.metrics[IMAGES_PER_S]
        for row in rows
        if row.status == "ok"
        and row.loader.startswith(RESIDENT)
        and isinstance(row.metrics.get(IMAGES_PER_S), int | float)
    }


def with_ceiling(rows: list[Row], ceiling: dict[str, float]) -> None:
    """Each row's ``ceiling_frac``: images/s over the check's resident rate with the same
    model (a whole job of steady batches) where the check measured one, else the job's own
    (its short closing pass: noisier, a few percent at 10 batches); none where both miss."""
    for row in rows:
        rate, top = row.metrics.get(IMAGES_PER_S), ceiling.get(str(row.metrics.get("model")))
        if isinstance(rate, int | float) and top:
            row.metrics[CEILING] = rate / top
            row.metrics["ceiling_images_per_s"] = top


def rows_table(rows: list[Row]) -> list[str]:
    header = ["loader", "workers", "status", *ROW_METRICS, "note"]
    cells = [
        [row.loader, row.workers, row.status]
        + [cell(k, row.metrics.get(k)) for k in ROW_METRICS]
        + [_details(row)]
        for row in rows
    ]
    return markdown_table(header, cells).splitlines()


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
    rows = [
        [
            "GPU",
            f"{fmt(env.get('gpu', 'none'))} "
            f"({env.get('gpu_count', 0)} device(s), {env.get('gpu_memory_gb', '-')} GB, "
            f"capability {env.get('gpu_capability', '-')}, bf16 {env.get('bf16_supported', '-')})",
        ],
        ["Python", f"{env.get('python')} ({env.get('executable')})"],
        ["platform", f"{env.get('platform')}, {env.get('cpus')} CPUs"],
        [
            "torch",
            f"{env.get('torch', env.get('torch_error', '-'))}, CUDA build "
            f"{env.get('torch_cuda_build')}, cuDNN {env.get('cudnn', '-')}",
        ],
    ]
    rows += [
        [name, str(packages.get(name) or "not installed")] for name in PACKAGES if name != "torch"
    ]
    for name, probe in env.get("probes", {}).items():
        state = "loads" if probe.get("loaded") else "**does not load**"
        rows.append([f"import {name}", f"{state}: {fmt(short(str(probe.get('detail'))))}"])
    return markdown_table(["what", "value"], rows).splitlines()


def _benchmark_lines(runs: Path, sweeps: list[Sweep]) -> tuple[list[str], int, int]:
    """A table a sweep; the jobs that ran ok and the rows in all, missing jobs included."""
    ok = total = 0
    lines = ["", "## Benchmark", ""]
    lines += [f"- {key}: {BY_KEY[key].meaning}" for key in ROW_METRICS if key in BY_KEY]
    lines.append(
        f"- {CEILING}, where a job did not write its own: its images_per_s over this check's "
        "`loader=resident` row with the same model (the model's ceiling on this GPU)"
    )
    collected = {sweep.name: collect(runs / sweep.name, sweep.name) for sweep in sweeps}
    ceiling = ceilings([row for rows in collected.values() for row in rows])
    for sweep in sweeps:
        rows = collected[sweep.name]
        with_ceiling(rows, ceiling)
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
    return lines, ok, total


def _machine_lines(env: dict[str, Any]) -> list[str]:
    lines = ["", "## Machine", ""]
    lines += _env_lines(env) if env else ["(no machine record: the env phase did not run)"]
    if env.get("nvidia_smi_query"):
        lines += ["", "```", env["nvidia_smi_query"], "```"]
    if env.get("nvidia_smi"):
        lines += ["", "<details><summary>nvidia-smi</summary>", "", "```", env["nvidia_smi"]]
        lines += ["```", "", "</details>"]
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
    decode_path: Path | None = None,
    sharing_path: Path | None = None,
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
    lines += ["", "## Phases", ""]
    phase_cells = [[*phase, "", "", "", ""][:4] for phase in phase_rows]
    lines += markdown_table(["phase", "seconds", "budget s", "exit code"], phase_cells).splitlines()

    summary, test_notes = _pytest_summary(pytest_log)
    lines += ["", "## Tests (`pytest -m cuda`)", "", f"`{summary}`", ""]
    lines += [f"    {note}" for note in test_notes]

    bench, ok, total = _benchmark_lines(runs, sweeps)
    lines += bench
    if decode_path is not None:
        try:
            lines += decode_lines(json.loads(decode_path.read_text()))
        except (OSError, ValueError) as error:
            lines += ["", "## The decoder table", "", f"no figures: {short(str(error))}"]
    if sharing_path is not None:
        try:
            lines += sharing_lines(json.loads(sharing_path.read_text()))
        except (OSError, ValueError) as error:
            lines += ["", "## Driving the JPEG decoder", "", f"no figures: {short(str(error))}"]
    lines += _machine_lines(env)
    out.write_text("\n".join(lines) + "\n")
    return ok, total
