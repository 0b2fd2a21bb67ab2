"""Draw ``report.md`` and ``report.png`` from ``report.json`` alone: nothing is measured here.

``python -m tools.bench.render [--json bench/report.json] [--out DIR]`` (``make report``)
re-draws the committed report; ``python -m tools.bench`` measures, writes report.json, then
calls ``render``. Every figure is computed from the rows, limits and stores in the file; what a
row is held to comes from the bounds table (``tools.bench.work_bounds``), the one place the
benchmark names a loader.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from loaderbench.platform.tables import markdown_table
from tools.bench import render_cores
from tools.bench.columns import COLUMNS, cell
from tools.bench.render_stores import ffcv_store_lines, store_lines
from tools.bench.render_stores import fmt as _fmt
from tools.bench.render_stores import rate as _rate
from tools.bench.schema import (
    DALI_NAMES,
    FFCV_NAMES,
    LIMIT_NAMES,
    PIPELINES,
    STORED_PIXELS,
    TUTORIAL,
    DecodeLimit,
    Report,
    Row,
)

REPO = Path(__file__).resolve().parents[2]
# The FFCV store a row is held against: stored pixels for the readers of stored pixels, the
# JPEG store for everything that decodes JPEGs.
PEER_STORE = {bound: "raw" for bound in STORED_PIXELS}


def header_lines(report: Report) -> list[str]:
    """The title and what was measured, on what."""
    opts, machine = report.options, report.machine
    return [
        "# Benchmark report",
        "",
        f"Machine: {machine.arch}, {machine.cores} usable cores, Python {machine.python}, "
        f"torch {machine.torch}. Data: "
        f"{'your images' if opts.own_data else 'quick ' if opts.quick else ''}"
        f"{'' if opts.own_data else 'synthetic ImageNet-like JPEGs'} at {opts.root}; "
        f"image_size {opts.image_size}, batch_size {opts.batch_size}, "
        f"{opts.epochs['val']} passes over val and {opts.epochs['train']} over train, "
        f"page cache: {'cold (evicted before each run)' if opts.drop_page_cache else 'warm'}. "
        f"All runs `model=none` on the CPU, one after another; every figure is the best of "
        f"{opts.repeats} run(s); {report.wall_s:.0f} s in all.",
        "",
    ]


def limit_lines(report: Report) -> list[str]:
    """The limits table: every decode candidate, the CPU decode limit, the pool, memory copy,
    then each train job's limit (``job_limit_rows``)."""
    rows = [
        *limit_rows(report.decode_limit, report.memory_copy_bytes_per_s, report.image_bytes),
        *job_limit_rows(report.crop_limit, "crop + resize + flip"),
        *job_limit_rows(report.region_decode_limit, "train job"),
    ]
    return ["## Limits", "", *markdown_table(["limit", "value"], rows).splitlines()]


def limit_rows(decode: DecodeLimit, copy_bps: float, image_bytes: int) -> list[list[str]]:
    """Every decode candidate, the CPU decode limit, the pool and memory copy: (limit, value)."""
    rows = [
        [f"single-core {rate.name} decode + resize", f"{rate.images_per_s:,.1f} images/s"]
        for rate in sorted(decode.rates, key=lambda r: -r.images_per_s)
    ]
    rows.append(
        [
            f"CPU decode limit ({decode.cores} cores x {decode.best.name})",
            f"{decode.images_per_s:,.1f} images/s",
        ]
    )
    if decode.pool is not None:
        rows.append(
            [
                f"plain thread pool ({decode.pool.name}, no pipeline)",
                f"{decode.pool.images_per_s:,.1f} images/s = "
                f"{100 * decode.ratio(decode.pool.images_per_s):.1f}% of the CPU decode limit",
            ]
        )
    rows.append(
        [
            "memory-copy bandwidth",
            f"{copy_bps / 1e9:,.2f} GB/s = "
            f"{copy_bps / image_bytes:,.0f} images/s of {image_bytes:,} bytes",
        ]
    )
    return rows


def job_limit_rows(limit: DecodeLimit | None, job: str) -> list[list[str]]:
    """A train job's limit in the limits table (the crop-and-resize limit of the readers of
    stored rows, the region decode limit of the loaders that decode their crops): each way's
    single-core rate, the limit, the plain pool's share of it, and what the flips cost."""
    if limit is None:
        return []
    rows = [
        [f"single-core {rate.name} {job}", f"{rate.images_per_s:,.1f} images/s"]
        for rate in sorted(limit.rates, key=lambda r: -r.images_per_s)
    ]
    rows.append(
        [
            f"{limit.title} ({limit.cores} cores x {limit.best.name})",
            f"{limit.images_per_s:,.1f} images/s",
        ]
    )
    if limit.pool is not None:
        rows.append(
            [
                f"plain thread pool ({limit.pool.name}, {job})",
                f"{limit.pool.images_per_s:,.1f} images/s = "
                f"{100 * limit.ratio(limit.pool.images_per_s):.1f}% of the {limit.title}",
            ]
        )
    if limit.without_flips is not None:
        alone = limit.without_flips.images_per_s
        rows.append(
            [
                f"single-core {limit.without_flips.name} (the resize alone)",
                f"{alone:,.1f} images/s: the flips cost "
                f"{100 * (1 - limit.best.images_per_s / alone):.1f}%",
            ]
        )
    return rows


def peer_rate(rows: list[Row], task: str, name: str, workers: int | None = None) -> Row | None:
    """Peer ``name``'s row for ``task`` at ``workers`` threads (the fastest, without
    ``workers``)."""
    peer = [
        r
        for r in rows
        if r.pipeline == task
        and r.name == name
        and r.images_per_s
        and (workers is None or r.workers == workers)
    ]
    return max(peer, key=_rate) if peer else None


def dali_rate(rows: list[Row], task: str, workers: int | None = None) -> Row | None:
    """DALI's CPU row for ``task`` at ``workers`` threads (the fastest, without ``workers``)."""
    return peer_rate(rows, task, DALI_NAMES["cpu"], workers)


def ffcv_rate(rows: list[Row], task: str, against: Row, workers: int | None = None) -> Row | None:
    """The FFCV row that row ``against`` is held to (``PEER_STORE`` of its first bound)."""
    store = PEER_STORE.get(against.bounds[0] if against.bounds else "", "jpeg")
    return peer_rate(rows, task, FFCV_NAMES[store], workers)


def versus(row: Row, peer: Row, label: str) -> str:
    """'; 1.23x <label> (its best, 2 threads: 1,000 images/s, 0.50 CPU ms an image)'."""
    return (
        f"; {_rate(row) / _rate(peer):.2f}x {label} (its best, {peer.workers} threads: "
        f"{_rate(peer):,.0f} images/s, {_fmt(peer.cpu_s_per_1k_images, 2)} CPU ms an image)"
    )


def answer_lines(rows: list[Row]) -> list[str]:
    """The report's first lines: for this machine and data, the loader and worker count with
    the most images/s per pipeline, by how much over the next best loader and over DALI, and
    at what CPU cost per image."""
    lines = ["## The answer", ""]
    for task in ("train", "val"):
        ours = [r for r in rows if r.pipeline == task and r.kind == "loader" and r.images_per_s]
        if not ours:
            continue
        best = max(ours, key=_rate)
        others = [r for r in ours if r.name != best.name]
        line = (
            f"- **{task}**: `loader={best.name} loader.num_workers={best.workers}`, "
            f"{_rate(best):,.0f} images/s at {_fmt(best.cpu_s_per_1k_images, 2)} CPU ms an "
            f"image"
        )
        if others:
            runner = max(others, key=_rate)
            line += (
                f"; {_rate(best) / _rate(runner):.2f}x the next best loader ({runner.name} at "
                f"{runner.workers} workers: {_rate(runner):,.0f} images/s, "
                f"{_fmt(runner.cpu_s_per_1k_images, 2)} CPU ms an image)"
            )
        dali = dali_rate(rows, task)
        if dali is not None:
            line += versus(best, dali, "DALI's CPU pipeline")
        else:
            line += "; DALI not measured (not installed: `make bench` installs it)"
        ffcv = ffcv_rate(rows, task, best)
        if ffcv is not None:
            line += versus(best, ffcv, f"FFCV on its {ffcv.extra['write_mode']} store")
        else:
            line += "; FFCV not measured (it does not import here: `make bench` installs it)"
        lines.append(line + ".")
    return [*lines, ""]


def stored_readers(rows: list[Row]) -> dict[str, dict[str, str]]:
    """The loaders that read stored pixels, in the rows' order: per pipeline they do so on,
    the limit their rows are held to there."""
    readers: dict[str, dict[str, str]] = {}
    for row in rows:
        if row.kind == "loader" and row.bounds and row.bounds[0] in STORED_PIXELS:
            readers.setdefault(row.name, {})[row.pipeline] = row.bounds[0]
    return readers


def share_text(rows: list[Row]) -> str:
    """What each row's share is of, naming the readers of stored pixels and their limits."""
    readers = stored_readers(rows)
    parts = [
        f"for the {name} reader "
        + ", ".join(
            f"{LIMIT_NAMES[by_task[task]]} in {task}" for task in PIPELINES if task in by_task
        )
        for name, by_task in readers.items()
    ]
    if any("crop" in by_task.values() for by_task in readers.values()):
        parts[-1] += (
            ": its train work is cutting, resizing and flipping each image's box from its "
            "stored row"
        )
    named = f" ({', '.join(readers)})" if readers else ""
    limits = "; ".join(["CPU decode for decoding loaders", *parts])
    return (
        f"Share = images/s over the pipeline's limit ({limits}). vs DALI = images/s over "
        "DALI's CPU pipeline with as many "
        "threads as the row has workers. vs FFCV = the same over FFCV's pipeline at as many "
        f"threads, on its raw store for the readers of stored pixels{named}, on its jpg store "
        "for the loaders that decode JPEGs."
    )


def pipeline_lines(rows: list[Row]) -> list[str]:
    """The pipelines table, one line a row."""
    return [
        "",
        "## Pipelines",
        "",
        share_text(rows),
        "",
        *markdown_table(
            pipeline_header(),
            [
                pipeline_cells(
                    row,
                    dali_rate(rows, row.pipeline, row.workers),
                    ffcv_rate(rows, row.pipeline, row, row.workers),
                )
                for row in rows
            ],
        ).splitlines(),
        *ceiling_lines(rows),
    ]


def pipeline_header() -> list[str]:
    """The pipelines table's titles: the report's columns (``columns.COLUMNS``), the rate's
    share of its limit and the ratios to the peers after the rate."""
    rate, *costs = (column.title for column in COLUMNS.values())
    titles = ["pipeline", "loader", "workers", rate, "share of limit", "limit", "vs DALI"]
    return [*titles, "vs FFCV", *costs, "note"]


# The benchmark runs every pipeline, the project's and the peers', alone (model=none).
NO_MODEL = "the pipeline ran alone (model=none): with no model there is no ceiling to hold it to"


def ceiling_lines(rows: list[Row]) -> list[str]:
    """Why rows state no ``ceiling_frac``: each reason once, with how many rows give it."""
    reasons: dict[str, int] = {}
    for row in rows:
        if row.ceiling_frac is None:
            reason = row.ceiling_frac_null_reason or NO_MODEL
            reasons[reason] = reasons.get(reason, 0) + 1
    return ["", *(f"ceiling_frac null in {n} rows: {why}." for why, n in reasons.items())]


def pipeline_cells(row: Row, dali: Row | None = None, ffcv: Row | None = None) -> list[str]:
    """A row's cells in the pipelines table, under ``pipeline_header``."""
    vs_dali = f"{_rate(row) / _rate(dali):.2f}x" if dali and row.images_per_s else "-"
    vs_ffcv = f"{_rate(row) / _rate(ffcv):.2f}x" if ffcv and row.images_per_s else "-"
    rate, *costs = (cell(key, getattr(row, key)) for key in COLUMNS)
    share = f"{_fmt(row.share and 100 * row.share)}{'%' if row.share else ''}"
    cells = [row.pipeline, row.name, _fmt(row.workers), rate, share, row.limit_name or "-"]
    return [*cells, vs_dali, vs_ffcv, *costs, row.note]


def ratio_lines(report: Report) -> list[str]:
    """The ratios section, every figure computed from the rows."""
    rows = report.rows
    return [
        "",
        "## Ratios at the same worker count",
        "",
        *vs_baseline_lines(report),
        *yardstick_lines(report, "val"),
        *stored_vs_tutorial_lines(rows),
        *yardstick_lines(report, "train"),
    ]


def vs_baseline_lines(report: Report) -> list[str]:
    """Each pipeline's images/s over the baseline loader's, per task and worker count."""
    baseline, lines = report.options.baseline, []
    for task in PIPELINES:
        for workers in report.options.workers:
            by_name = {r.name: r for r in report.rows if (r.pipeline, r.workers) == (task, workers)}
            base = by_name.get(baseline)
            if not base or not base.images_per_s:
                continue
            parts = [
                f"{name} {r.images_per_s / base.images_per_s:.1f}x"
                for name, r in by_name.items()
                if name != baseline and r.images_per_s
            ]
            lines.append(f"- {task}, {workers} workers, vs {baseline}: {', '.join(parts)}")
    return lines


def yardstick_lines(report: Report, task: str) -> list[str]:
    """``task``'s rows against the further yardsticks their loaders declared (the bounds after
    the first): "pool", the CPU decode limit and its plain thread pool (a pipeline of threads
    running the limit's own decode); "region", the region decode limit (decoding each train
    crop's region)."""
    decode, region = report.decode_limit, report.region_decode_limit
    lines = []
    for row in report.rows:
        if row.pipeline != task or not row.images_per_s:
            continue
        parts = []
        for bound in row.bounds[1:]:
            if bound == "pool":
                pool = decode.pool_ratio(row.images_per_s)
                parts.append(
                    f"{100 * decode.ratio(row.images_per_s):.1f}% of the CPU decode limit"
                    + (f", {100 * pool:.1f}% of the plain thread pool" if pool else "")
                )
            elif bound == "region" and region is not None:
                share = region.ratio(row.images_per_s)
                parts.append(f"{100 * share:.1f}% of the region decode limit")
        if parts:
            lines.append(f"- {task}, {row.name} at {row.workers} workers: {', '.join(parts)}")
    return lines


def stored_vs_tutorial_lines(rows: list[Row]) -> list[str]:
    """The fastest row of each reader of stored pixels over the tutorial's tensorclass loader
    (which reads stored pixels too), per task."""
    lines = []
    tutorial = {r.pipeline: r for r in rows if r.name == TUTORIAL}
    for task in PIPELINES:
        if not (tutorial.get(task) and tutorial[task].images_per_s):
            continue
        for name in stored_readers(rows):
            ours = [r for r in rows if (r.pipeline, r.name) == (task, name) and r.images_per_s]
            if ours:
                best = max(_rate(r) for r in ours)
                lines.append(
                    f"- {task}: {name} (best) vs the tutorial's tensorclass loader: "
                    f"{best / _rate(tutorial[task]):.1f}x"
                )
    return lines


def auto_lines(report: Report, tolerance: float = 0.05) -> list[str]:
    """A line per pipeline run with ``loader.num_workers=auto``: the count chosen, its images/s
    against the best count of the sweep, the fewest swept workers within ``tolerance`` of
    that best, and the probe's seconds."""
    if not report.auto:
        return []
    lines = [
        "",
        "## num_workers=auto",
        "",
        "Each loader once more with `loader.num_workers=auto` (probing afresh every time: "
        "`loader.autotune.refresh=true`; best of the repeats, like the sweeps): the count its "
        "probe chose, that run's images/s against the best count of the sweep above, the "
        f"fewest swept workers within {100 * tolerance:.0f}% of that best, and the probe's "
        "seconds in the run's wall time.",
        "",
    ]
    for row in report.auto:
        line = f"- {row.pipeline}, {row.name}: "
        if row.note or row.workers is None:
            lines.append(line + (row.note or "no count chosen"))
            continue
        swept = [
            r for r in report.rows if (r.pipeline, r.name) == (row.pipeline, row.name) and _rate(r)
        ]
        line += f"chose {row.workers} workers, {_fmt(row.images_per_s)} images/s"
        if swept:
            best = max(swept, key=_rate)
            enough = min(r.workers or 0 for r in swept if _rate(r) >= (1 - tolerance) * _rate(best))
            line += (
                f" = {100 * (row.images_per_s or 0.0) / _rate(best):.1f}% of the best swept count "
                f"({best.workers} workers: {_fmt(best.images_per_s)} images/s); fewest swept "
                f"within {100 * tolerance:.0f}%: {enough}"
            )
        line += f"; probe {_fmt(row.autotune_s, 2)} s of the run's {_fmt(row.wall_s)} s"
        lines.append(line)
    return lines


def bench_args(report: Report) -> str:
    """What ``make bench`` was given for this report (the data set and the quick mode)."""
    opts = report.options
    args = [
        *(["--quick"] if opts.quick else []),
        *([f"--root {opts.root}"] if opts.own_data else []),
    ]
    return f' BENCH_ARGS="{" ".join(args)}"' if args else ""


def markdown(report: Report) -> str:
    """report.md's text."""
    lines = [
        *header_lines(report),
        *answer_lines(report.rows),
        *limit_lines(report),
        *pipeline_lines(report.rows),
        *ratio_lines(report),
        *auto_lines(report),
        *render_cores.cores_lines(report),
        "",
        *store_lines(report.stores),
        *ffcv_store_lines(report.rows, report.stores, max(report.options.workers)),
        "",
        f"Command: `make bench{bench_args(report)}`",
        "",
    ]
    return "\n".join(lines)


def render(report: Report, out: Path) -> None:
    """report.md and report.png in ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.md").write_text(markdown(report))
    from tools.bench.plot import plot_report  # matplotlib: imported only to draw

    plot_report(out / "report.png", report.rows, render_cores.cores_answer(report))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, default=REPO / "bench" / "report.json")
    parser.add_argument("--out", type=Path, default=None, help="default: the json's folder")
    render_cores.add_gpu_options(parser, defaults=False)  # not given: what report.json stored
    args = parser.parse_args(argv)
    if not args.json.is_file():
        parser.error(f"--json {args.json}: no such file (make bench measures and writes it)")
    try:
        report = Report.load(args.json)
    except ValueError as error:
        parser.error(str(error))
    render_cores.apply_gpu_options(parser, args, report)  # for another GPU or node
    out = args.out or args.json.parent
    render(report, out)
    print(f"wrote {out / 'report.md'} and {out / 'report.png'} from {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
