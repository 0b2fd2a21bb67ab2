"""The GPU check's helpers (``scripts/gpu_check.sh``): the machine, the data, the report.

``python -m loaderbench.bench.gpu env OUT.json`` records the machine: Python, torch, CUDA, the
GPU (and ``nvidia-smi``), the kit's packages, and whether torchcodec and ``spdl.io`` load (each
tried in a subprocess, so a library that crashes on load cannot take the check with it).

``python -m loaderbench.bench.gpu data PARENT --classes N --train N --val N`` generates the
synthetic set (ImageNet's image sizes) and prints its root.

``python -m loaderbench.bench.gpu decode ROOT --out JSON --device cuda`` times batched JPEG
decoding of the set's train images through ``loaderbench.decode``'s backends: nvImageCodec
(whole images, and only each image's random-resized-crop box) against TorchCodec's and
torchvision.io's batched decode (whole images; their "region" is the whole image, then cut), and
how far their pixels are apart. ``--device cpu`` runs the same on CPU threads (the dry run).

``python -m loaderbench.bench.gpu report --runs DIR --plan PLAN --phases PHASES ...`` turns the
check's sweep directories into one markdown table: a row a job (images/s, data wait, CPU s per
1000 images, time to first batch, peak memory), failed and missing jobs included, and the
decode phase's figures where ``--decode JSON`` names them.

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
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the report is written with the standard library alone
    import torch

    from loaderbench.decode import Box, Decoded, JpegBackend

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
    "nvidia-nvimgcodec-cu13",
    "nvidia-nvjpeg",
    "pytest",
    "pytest-timeout",
    "psutil",
)
PROBES = {
    "torchcodec": "import torchcodec, torchcodec.decoders; print(torchcodec.__version__)",
    "spdl.io": "import spdl.io; print('imported')",
    "tensordict": "import tensordict; print(tensordict.__version__)",
    "hydra": "import hydra, omegaconf; print(hydra.__version__, omegaconf.__version__)",
    # The libnvjpeg its nvJPEG extension loaded on import (the kit's, found through
    # nvImageCodec's RUNPATH), and whether a GPU decoder can be made.
    "nvimgcodec": """
import os
os.environ.setdefault("PYNVIMGCODEC_VERBOSITY", "0")
import torch
from nvidia import nvimgcodec as nv
gpu = "no GPU"
if torch.cuda.is_available():
    nv.Decoder(device_id=0)
    gpu = "GPU decoder made"
maps = open("/proc/self/maps").read().split()
nvjpeg = next((p for p in maps if "libnvjpeg.so" in p), "libnvjpeg not loaded")
print(f"{nv.__version__}, {gpu}, nvjpeg: {nvjpeg}")
""",
    "loaderbench.decode": """
import torch
from loaderbench import decode
devices = ["cpu", "cuda"] if torch.cuda.is_available() else ["cpu"]
print(", ".join(
    f"{d}: {decode.backend(d)}{' (regions)' if decode.region_decode(d) else ''}" for d in devices
))
""",
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
    """Run ``code`` in a fresh interpreter: loaded or not, and the last line it printed (to
    stdout where it worked: nvImageCodec's notes on optional libraries go to stderr; to
    either where it failed)."""
    try:
        proc = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=120
        )
    except (OSError, subprocess.TimeoutExpired) as error:
        return {"loaded": False, "detail": f"{type(error).__name__}: {error}"}
    output = proc.stdout if proc.returncode == 0 else proc.stdout + proc.stderr
    lines = [line for line in output.splitlines() if line.strip()]
    return {
        "loaded": proc.returncode == 0,
        "detail": lines[-1] if lines else f"exit code {proc.returncode}",
    }


def machine_info(probes: bool = True) -> dict[str, Any]:
    """The machine as JSON; without ``probes`` (the first record, written before the kit is
    installed) no library is imported in a fresh interpreter."""
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
    info["probes"] = {name: _probe(code) for name, code in PROBES.items()} if probes else {}
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
# Batched JPEG decode: nvImageCodec against TorchCodec (and torchvision.io), whole and region.

# (library, what is decoded): each through loaderbench.decode's backend of that name. "region"
# asks each image's train crop box: nvImageCodec decodes only the box, the others the whole
# image, then cut it (a view), as a loader using them must.
DECODE_CASES = (
    ("nvimgcodec", "full"),
    ("nvimgcodec", "region"),
    ("torchcodec", "full"),
    ("torchcodec", "region"),
    ("torchvision", "full"),
    ("torchvision", "region"),
)
# What the other rows are compared with: TorchCodec's batched decode of the same images.
DECODE_BASELINE = "torchcodec"


@dataclass
class DecodeSet:
    """The encoded images (in memory, so no file reads are timed) and their train crop boxes."""

    datas: list[torch.Tensor]  # uint8, 1-D
    boxes: list[Box]
    megapixels: float  # mean image size

    @classmethod
    def load(cls, root: Path, limit: int, seed: int = 0) -> DecodeSet:
        import torch

        from loaderbench.images import jpeg_header
        from loaderbench.transforms import seeded_crops

        paths = sorted((root / "train").rglob("*.JPEG"))[:limit]
        if not paths:
            raise FileNotFoundError(f"no train JPEGs under {root / 'train'}")
        datas, heights, widths = [], [], []
        for path in paths:
            raw = path.read_bytes()
            header = jpeg_header(raw)
            if header is None:
                raise ValueError(f"{path}: no JPEG frame header")
            datas.append(torch.frombuffer(bytearray(raw), dtype=torch.uint8))
            heights.append(header.height)
            widths.append(header.width)
        boxes, _ = seeded_crops(heights, widths, seed, 0, range(len(paths)))
        mean_px = sum(h * w for h, w in zip(heights, widths, strict=True)) / len(paths)
        return cls(datas, [tuple(map(int, box)) for box in boxes.tolist()], mean_px / 1e6)

    def batches(self, size: int) -> list[tuple[list[torch.Tensor], list[Box]]]:
        return [
            (self.datas[i : i + size], self.boxes[i : i + size])
            for i in range(0, len(self.datas), size)
        ]


class DecodeRunner:
    """Decodes one batch through a backend and waits until its pixels are there: on a GPU a
    blocking event (the host sleeps rather than spins, so CPU time is the decode's own), then
    the whole device; on the CPU the batch is split over ``threads`` threads."""

    def __init__(self, device: torch.device, threads: int) -> None:
        import torch

        self.device = device
        self.threads = threads
        self.is_cuda = device.type == "cuda"
        self._torch = torch
        # One pool for the whole run: a backend keeps a decoder per thread.
        self._pool = None if self.is_cuda or threads == 1 else ThreadPoolExecutor(threads)

    def __call__(
        self, backend: JpegBackend, datas: list[torch.Tensor], boxes: list[Box] | None
    ) -> list[Decoded]:
        wanted = boxes if boxes is not None else [None] * len(datas)
        if self._pool is None:
            images = backend.decode(datas, self.device, wanted)
        else:
            step = -(-len(datas) // self.threads)
            parts = [
                (datas[i : i + step], wanted[i : i + step]) for i in range(0, len(datas), step)
            ]
            done = self._pool.map(lambda part: backend.decode(part[0], self.device, part[1]), parts)
            images = [image for part in done for image in part]
        if self.is_cuda:
            event = self._torch.cuda.Event(blocking=True)
            event.record()
            event.synchronize()
            self._torch.cuda.synchronize(self.device)
        return images

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown()


def _failures(images: list[Decoded]) -> list[str]:
    return [f"{type(i).__name__}: {i}" for i in images if isinstance(i, BaseException)]


def time_decode(
    backend: JpegBackend,
    run: DecodeRunner,
    data: DecodeSet,
    region: bool,
    batch: int,
    seconds: float,
) -> dict[str, Any]:
    """One case: a warm-up batch, then the set's batches in order, round and round, until at
    least ``seconds`` have passed and the set was decoded at least once."""
    import time

    batches = data.batches(batch)
    warm_datas, warm_boxes = batches[0]
    run(backend, warm_datas, warm_boxes if region else None)
    failed: list[str] = []
    images = passes = 0
    wall0, cpu0 = time.perf_counter(), time.process_time()
    while passes == 0 or time.perf_counter() - wall0 < seconds:
        for datas, boxes in batches:
            images_out = run(backend, datas, boxes if region else None)
            if passes == 0:  # the same images fail again on later passes
                failed += _failures(images_out)
            images += len(datas)
        passes += 1
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    return {
        "images": images,
        "passes": passes,
        "seconds": round(wall, 4),
        "images_per_s": images / wall,
        "source_mpx_per_s": images * data.megapixels / wall,
        "cpu_ms_per_image": 1000 * cpu / images,
        "failed_images": len(failed),
        "first_failure": failed[0] if failed else "",
    }


def _max_mean_diff(a: list[Decoded], b: list[Decoded]) -> dict[str, Any]:
    """The largest and the mean absolute pixel difference over pairs of CHW uint8 images."""
    worst, total, count = 0, 0.0, 0
    for x, y in zip(a, b, strict=True):
        if isinstance(x, BaseException) or isinstance(y, BaseException):
            continue
        if tuple(x.shape) != tuple(y.shape):
            return {"error": f"shapes differ: {tuple(x.shape)} and {tuple(y.shape)}"}
        diff = (x.cpu().int() - y.cpu().int()).abs()
        worst = max(worst, int(diff.max()))
        total += float(diff.double().sum())
        count += diff.numel()
    return {"max_abs": worst, "mean_abs": total / count if count else None}


def agreement(
    backends: dict[str, JpegBackend], run: DecodeRunner, data: DecodeSet, n: int
) -> list[dict[str, Any]]:
    """How far apart the pixels are, on the first ``n`` images: each library's whole decode
    against the baseline's, and nvImageCodec's region decode against its own whole decode cut
    to the box (the two decoders differ only in what they skip)."""
    from loaderbench.decode import cut

    datas, boxes = data.datas[:n], data.boxes[:n]
    whole = {name: run(backend, datas, None) for name, backend in backends.items()}
    results = []
    base = whole.get(DECODE_BASELINE)
    for name, images in whole.items():
        if name != DECODE_BASELINE and base is not None:
            results.append(
                {"what": f"{name} whole vs {DECODE_BASELINE} whole"} | _max_mean_diff(images, base)
            )
    if "nvimgcodec" in backends:
        regions = run(backends["nvimgcodec"], datas, boxes)
        cuts = [cut(image, box) for image, box in zip(whole["nvimgcodec"], boxes, strict=True)]
        results.append(
            {"what": "nvimgcodec region vs its whole decode, cut"} | _max_mean_diff(regions, cuts)
        )
    return results


def load_backends(names: list[str]) -> tuple[dict[str, JpegBackend], dict[str, str]]:
    """loaderbench.decode's backends of these names that load, and why the others do not."""
    from loaderbench import decode

    usable, missing = {}, {}
    for name in names:
        backend = decode.BACKENDS[name]
        try:
            backend.load()
            usable[name] = backend
        except Exception as error:  # ImportError, or OSError from a native library
            missing[name] = f"{type(error).__name__}: {error}".splitlines()[0]
    return usable, missing


def decode_case(
    backend: JpegBackend, kind: str, run: DecodeRunner, data: DecodeSet, batch: int, seconds: float
) -> dict[str, Any]:
    """One row: the figures, or why there are none."""
    row: dict[str, Any] = {"library": backend.name, "kind": kind}
    try:
        row |= time_decode(backend, run, data, kind == "region", batch, seconds)
        row["status"] = "failed" if row["failed_images"] else "ok"
    except Exception as error:  # the row says why; the other cases still run
        row |= {"status": "failed", "error": f"{type(error).__name__}: {error}"}
    row["region_decoded"] = kind == "region" and backend.can.region
    print(f"decode {backend.name} {kind}: {row['status']}, {_fmt(row.get('images_per_s'))} img/s")
    return row


def decode_benchmark(
    root: Path,
    device_name: str,
    batch: int,
    limit: int,
    seconds: float,
    save: Callable[[dict[str, Any]], None] = lambda result: None,
) -> dict[str, Any]:
    """Every case of DECODE_CASES on ``device_name``; a library that does not load is a row
    saying why. ``save`` gets the result after every case, so that a library crashing the
    process (a native library built for another torch) leaves the rows before it."""
    import torch

    from loaderbench import decode

    result: dict[str, Any] = {"device": device_name, "batch": batch, "seconds": seconds}
    if device_name == "cuda" and not torch.cuda.is_available():
        result["skipped"] = "no CUDA"
        save(result)
        return result
    device = torch.device(device_name, 0) if device_name == "cuda" else torch.device("cpu")
    threads = 1 if device.type == "cuda" else (os.cpu_count() or 1)
    data = DecodeSet.load(root, limit)
    try:
        choice = decode.backend(device)
    except RuntimeError as error:  # no backend works there: the rows say why
        choice = f"none ({error})"
    result |= {
        "images": len(data.datas),
        "mean_megapixels": data.megapixels,
        "mean_kept_fraction": sum(h * w for _, _, h, w in data.boxes)
        / (data.megapixels * 1e6 * len(data.boxes)),
        "threads": threads,
        "loaders_choose": choice,
        "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
    }
    usable, missing = load_backends(list(dict.fromkeys(name for name, _ in DECODE_CASES)))
    run = DecodeRunner(device, threads)
    result["cases"] = []
    try:
        for name, kind in DECODE_CASES:
            save(result)
            result["cases"].append(
                decode_case(usable[name], kind, run, data, batch, seconds)
                if name in usable
                else {
                    "library": name,
                    "kind": kind,
                    "status": "unavailable",
                    "error": missing[name],
                }
            )
        save(result)
        try:
            result["agreement"] = agreement(usable, run, data, min(64, len(data.datas)))
        except Exception as error:  # the figures stand without it
            result["agreement"] = [
                {"what": "pixel agreement", "error": f"{type(error).__name__}: {error}"}
            ]
    finally:
        run.close()
    save(result)
    return result


def decode_exit_code(result: dict[str, Any]) -> int:
    """0 when every case ran clean; on the CPU (the dry run) a library that is not installed
    is allowed, on a GPU it is a failure, as is any failed case."""
    if result.get("skipped"):
        return 0
    allowed = {"ok"} if result["device"] == "cuda" else {"ok", "unavailable"}
    ran = len(result["cases"]) == len(DECODE_CASES)
    return 0 if ran and all(case.get("status") in allowed for case in result["cases"]) else 1


def decode_lines(result: dict[str, Any]) -> list[str]:
    """The decode phase's report section."""
    lines = ["", "## Batched JPEG decode: nvImageCodec against TorchCodec", ""]
    if result.get("skipped"):
        return [*lines, f"skipped: {result['skipped']}"]
    where = result.get("gpu") or f"the CPU, {result.get('threads')} threads (not GPU figures)"
    megapixels = _fmt(result.get("mean_megapixels"))
    lines.append(
        f"{result.get('images')} train JPEGs of the check's set ({megapixels}"
        f" Mpx on average), batches of {result.get('batch')}, on {where}; train crop boxes "
        f"from `seeded_crops` (keeping {_fmt(result.get('mean_kept_fraction'))} of the pixels on"
        " average). Each row: one warm-up batch, then the set's batches round and round for"
        f" {_fmt(result.get('seconds'))} s or more, each batch waited for. **region**: nvImageCodec"
        " decodes only the box; the others decode the whole image and cut it. The loaders choose "
        f"`{result.get('loaders_choose')}` here."
    )
    lines += [
        "",
        "| library | decode | status | images | images/s | source Mpx/s | CPU ms / image "
        f"| vs {DECODE_BASELINE} | note |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    cases = result.get("cases", [])
    base = {
        c["kind"]: c.get("images_per_s")
        for c in cases
        if c["library"] == DECODE_BASELINE and c.get("status") == "ok"
    }
    done = {(case["library"], case["kind"]) for case in cases}
    cases = cases + [
        {"library": name, "kind": kind, "status": "not run", "error": "the phase ended before it"}
        for name, kind in DECODE_CASES
        if (name, kind) not in done
    ]
    for case in cases:
        rate, ref = case.get("images_per_s"), base.get(case["kind"])
        ratio = f"{rate / ref:.2f}x" if rate and ref else ""
        note = case.get("error") or case.get("first_failure") or ""
        if case.get("status") == "ok" and case["kind"] == "region":
            note = "only the box decoded" if case.get("region_decoded") else "whole, then cut"
        cells = [
            case["library"],
            case["kind"],
            case.get("status", ""),
            _fmt(case.get("images")),
            _fmt(rate),
            _fmt(case.get("source_mpx_per_s")),
            _fmt(case.get("cpu_ms_per_image")),
            ratio,
            _fmt(_short(str(note))),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    agree = result.get("agreement", [])
    if agree:
        lines += ["", "Pixels (first images of the set): "]
        lines += [
            f"- {a['what']}: "
            + (a["error"] if "error" in a else f"max {a['max_abs']}, mean {_fmt(a['mean_abs'])}")
            for a in agree
        ]
    return lines


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
                workers=_workers(values, metrics),
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
    if probe := row.metrics.get("autotune_probe"):
        rungs = ", ".join(
            f"{rung['workers']}: {rung['images_per_s']:,.0f}/s wait {rung['data_wait_frac']:.0%}"
            for rung in probe
        )
        found.append(f"probe {row.metrics.get('autotune_s', 0):.1f} s ({rungs})")
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
    decode_path: Path | None = None,
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

    if decode_path is not None:
        try:
            lines += decode_lines(json.loads(decode_path.read_text()))
        except (OSError, ValueError) as error:
            lines += ["", "## Batched JPEG decode", "", f"no figures: {_short(str(error))}"]

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
    env.add_argument("--quick", action="store_true", help="no library probes (seconds)")
    data = sub.add_parser("data", help="generate the synthetic set and print its root")
    data.add_argument("parent", type=Path)
    data.add_argument("--classes", type=int, default=100)
    data.add_argument("--train", type=int, default=40, help="train images a class")
    data.add_argument("--val", type=int, default=10, help="val images a class")
    dec = sub.add_parser("decode", help="time batched JPEG decoding, write JSON")
    dec.add_argument("root", type=Path, help="the synthetic set's root (train/ inside)")
    dec.add_argument("--out", type=Path, required=True)
    dec.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    dec.add_argument("--batch", type=int, default=256)
    dec.add_argument("--images", type=int, default=2048, help="at most this many train JPEGs")
    dec.add_argument("--seconds", type=float, default=3.0, help="each case's time")
    report = sub.add_parser("report", help="write the markdown report")
    report.add_argument("--out", type=Path, required=True)
    report.add_argument("--runs", type=Path, required=True)
    report.add_argument("--plan", type=Path)
    report.add_argument("--phases", type=Path)
    report.add_argument("--env", type=Path)
    report.add_argument("--pytest-log", type=Path)
    report.add_argument("--title", default="GPU check")
    report.add_argument("--note", action="append", default=[])
    report.add_argument("--decode", type=Path, help="the decode phase's JSON")
    args = parser.parse_args(argv)

    if args.command == "env":
        info = machine_info(probes=not args.quick)
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
    if args.command == "decode":

        def save(result: dict[str, Any]) -> None:
            args.out.write_text(json.dumps(result, indent=2) + "\n")

        result = decode_benchmark(
            args.root, args.device, args.batch, args.images, args.seconds, save
        )
        return decode_exit_code(result)
    ok, total = write_report(
        args.out,
        args.runs,
        args.plan,
        args.phases,
        args.env,
        args.pytest_log,
        args.title,
        args.note,
        args.decode,
    )
    print(f"{args.out}: {ok} of {total} benchmark jobs ok")
    return 0 if ok == total and total > 0 else 1


if __name__ == "__main__":
    sys.exit(main())
