"""The decoder table's report section, from the decode phase's JSON (``decode_bench``): a row a
decoder and what it decoded, rows a crash cut short shown as not run. Only the standard library
is needed (the report is written where the kit did not install)."""

from __future__ import annotations

from typing import Any

from loaderbench.measure.metrics import DECODED_BY, IMAGES_PER_S
from loaderbench.platform.tables import markdown_table
from tools.gpu_check.decode_rows import CHOICE, DECODE_BASELINE, cases_for
from tools.gpu_check.markdown import fmt, short

HEADER = [
    "decoder",
    "decode",
    "status",
    "images/s",
    "CPU ms / image",
    f"vs {DECODE_BASELINE}",
    "max / mean diff vs Pillow",
    "note",
]


def _note(case: dict[str, Any]) -> str:
    if case.get("status") != "ok":
        return case.get("error") or case.get("first_failure") or ""
    parts = []
    if case["kind"] == "region":
        parts.append("only the box decoded" if case.get("region_decoded") else "whole, then cut")
    counts = case.get(DECODED_BY)
    if counts:
        ranked = sorted(counts.items(), key=lambda item: -item[1])
        parts.append("decoded by " + ", ".join(f"{key} {n}" for key, n in ranked))
    return "; ".join(parts)


def _cells(case: dict[str, Any], base: dict[str, float]) -> list[str]:
    rate, ref = case.get(IMAGES_PER_S), base.get(case["kind"])
    ratio = f"{rate / ref:.2f}x" if rate and ref else ""
    worst, mean = case.get("max_abs_vs_pillow"), case.get("mean_abs_vs_pillow")
    diff = f"{worst} / {fmt(mean)}" if worst is not None else case.get("pillow_error", "")
    return [
        case["library"],
        case["kind"],
        case.get("status", ""),
        fmt(rate),
        fmt(case.get("cpu_ms_per_image")),
        ratio,
        fmt(diff),
        fmt(short(str(_note(case)))),
    ]


def decode_lines(result: dict[str, Any]) -> list[str]:
    """The section's lines."""
    lines = ["", "## The decoder table: batched JPEG decode, each decoder alone", ""]
    if result.get("skipped"):
        return [*lines, f"skipped: {result['skipped']}"]
    where = result.get("gpu") or f"the CPU, {result.get('threads')} threads (not GPU figures)"
    order = ", ".join(result.get("engine_order") or []) or "none"
    lines.append(
        f"{result.get('images')} train JPEGs of the check's set "
        f"({fmt(result.get('mean_megapixels'))} Mpx on average), batches of "
        f"{result.get('batch')}, on {where}; train crop boxes from `seeded_crops` (keeping "
        f"{fmt(result.get('mean_kept_fraction'))} of the pixels on average). Each row: one "
        f"warm-up batch, then the set's batches round and round for "
        f"{fmt(result.get('seconds'))} s or more, each batch waited for. **{CHOICE}**: what "
        f"every loader calls (`{result.get('loaders_choose')}`, engines in the measured order: "
        f"{order}); **split**: the hardware engine takes that share of each batch, the CUDA "
        "decoder (GPU Huffman) the rest. diff: absolute difference from Pillow's pixels in grey "
        "levels, on the first 64 images."
    )
    cases = result.get("cases", [])
    base = {
        c["kind"]: c[IMAGES_PER_S]
        for c in cases
        if c["library"] == DECODE_BASELINE and c.get("status") == "ok"
    }
    done = {(case["library"], case["kind"]) for case in cases}
    missing = [
        {"library": name, "kind": kind, "status": "not run", "error": "the phase ended before it"}
        for name, kind in cases_for(str(result.get("device")))
        if (name, kind) not in done
    ]
    rows = markdown_table(HEADER, [_cells(c, base) for c in [*cases, *missing]]).splitlines()
    return [*lines, "", *rows, *choice_against_engines(cases)]


def choice_against_engines(cases: list[dict[str, Any]]) -> list[str]:
    """A line per kind: the loaders' choice's rate against the fastest engine alone (with the
    loaders' fancy upsampling), which it should match on a GPU with a hardware engine."""
    lines = []
    for kind in ("full", "region"):
        rates = {
            c["library"]: c[IMAGES_PER_S]
            for c in cases
            if c["kind"] == kind and c.get("status") == "ok" and c.get(IMAGES_PER_S)
        }
        engines = {
            label: rate
            for label, rate in rates.items()
            if label.startswith("nvimgcodec ") and "(no fancy)" not in label
        }
        if CHOICE in rates and engines:
            best = max(engines, key=engines.__getitem__)
            share = rates[CHOICE] / engines[best]
            lines.append(
                f"- {kind}: the {CHOICE} decodes at {share:.2f} of the fastest engine alone "
                f"({best}, {fmt(engines[best])} images/s)"
            )
    return ["", *lines] if lines else []
