"""How the GPU's JPEG decoder is best driven (``python -m tools.gpu_check sharing ROOT --out
JSON``): one decoder behind a lock (the loaders' way), a decoder per thread on a stream of its
own, or one call a batch from one thread; at batches of 256 and 64.

Each mode decodes the check's train JPEGs from memory with nvImageCodec's hardware engine
(``--backend hybrid``: the CUDA decoder, Huffman on the CPU), each decoder first warmed by a
whole batch (the first call sizes the engine's share of later ones), for ``--seconds``:
images/s and the process's CPU ms per image. ``--device cpu`` (the dry run) runs the same modes
on the CPU decoder, for the code path only.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loaderbench.measure.metrics import IMAGES_PER_S
from loaderbench.platform.tables import markdown_table
from tools.gpu_check.markdown import fmt, short

# (mode, threads, decoders, images a call): the question's three answers, and smaller calls.
MODES = (
    ("one call a batch", 1, 1, 256),
    ("one call a batch", 1, 1, 64),
    ("one decoder behind a lock", 4, 1, 256),
    ("a decoder per thread and stream", 4, 4, 256),
    ("a decoder per thread and stream", 4, 4, 64),
)
BACKENDS = {"hw": "HW_GPU_ONLY", "hybrid": "HYBRID_CPU_GPU", "cpu": "CPU_ONLY"}


@dataclass
class Driver:
    """One decoder and what it decodes on: a CUDA stream (None on the CPU)."""

    decoder: Any
    stream: Any


def _decoders(nv: Any, device: str, backend: str, count: int) -> list[Driver]:
    import torch

    kind = getattr(nv.BackendKind, BACKENDS["cpu" if device == "cpu" else backend])
    drivers = []
    for _ in range(count):
        decoder = nv.Decoder(
            device_id=nv.NVIMGCODEC_DEVICE_CPU_ONLY if device == "cpu" else 0,
            max_num_cpu_threads=1 if device == "cpu" else 0,
            backends=[nv.Backend(kind)],
            options=":fancy_upsampling=1",
        )
        stream = torch.cuda.Stream() if device == "cuda" else None
        drivers.append(Driver(decoder, stream))
    return drivers


def _decode(driver: Driver, streams: list[Any], params: Any) -> int:
    """One call; waits for its work; the images decoded."""
    if driver.stream is None:
        return sum(i is not None for i in driver.decoder.decode(streams, params=params))
    images = driver.decoder.decode(streams, params=params, cuda_stream=driver.stream.cuda_stream)
    driver.stream.synchronize()
    return sum(i is not None for i in images)


def time_mode(
    datas: list[bytes], device: str, backend: str, mode: tuple[str, int, int, int], seconds: float
) -> dict[str, Any]:
    """One mode's images/s and CPU ms per image."""
    from nvidia import nvimgcodec as nv

    name, threads, count, batch = mode
    row: dict[str, Any] = {"mode": name, "threads": threads, "decoders": count, "batch": batch}
    params = nv.DecodeParams(apply_exif_orientation=False, color_spec=nv.ColorSpec.SRGB)
    try:
        drivers = _decoders(nv, device, backend, count)
    except Exception as error:  # a backend this GPU does not have
        return {**row, "status": "failed", "error": f"{type(error).__name__}: {error}"}
    calls = [datas[k : k + batch] for k in range(0, len(datas) - batch + 1, batch)] or [datas]
    lock = threading.Lock()
    for driver in drivers:  # warmed by a whole call: the engine's share is sized by the first
        _decode(driver, [nv.CodeStream(d) for d in calls[0]], params)
    decoded = [0] * threads
    stop = time.perf_counter() + seconds

    def work(k: int) -> None:
        driver, turn = drivers[k % count], k
        while time.perf_counter() < stop:
            streams = [nv.CodeStream(d) for d in calls[turn % len(calls)]]
            if count < threads:
                with lock:
                    decoded[k] += _decode(driver, streams, params)
            else:
                decoded[k] += _decode(driver, streams, params)
            turn += threads

    wall0, cpu0 = time.perf_counter(), time.process_time()
    workers = [threading.Thread(target=work, args=(k,)) for k in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    images = sum(decoded)
    return {
        **row,
        "status": "ok" if images else "failed",
        "images": images,
        IMAGES_PER_S: images / wall if wall else None,
        "cpu_ms_per_image": 1000 * cpu / images if images else None,
    }


def sharing_benchmark(
    root: Path, device: str, backend: str, limit: int, seconds: float
) -> dict[str, Any]:
    """Every mode on the set's first ``limit`` train JPEGs."""
    paths = sorted((root / "train").rglob("*.JPEG"))[:limit]
    if not paths:
        raise FileNotFoundError(f"no train JPEGs under {root / 'train'}")
    datas = [path.read_bytes() for path in paths]
    result: dict[str, Any] = {"device": device, "backend": backend, "images": len(datas)}
    result["cases"] = [time_mode(datas, device, backend, m, seconds) for m in MODES]
    return result


def sharing_lines(result: dict[str, Any]) -> list[str]:
    """The report's section."""
    where = "the GPU" if result.get("device") == "cuda" else "CPU threads (not GPU figures)"
    lines = ["", "## Driving the JPEG decoder: shared, per thread, or one call a batch", ""]
    lines.append(
        f"{result.get('images')} train JPEGs in memory, nvImageCodec backend "
        f"`{result.get('backend')}` on {where}; each decoder warmed by a whole call first."
    )
    header = ["mode", "threads", "decoders", "images a call", "status", "images/s"]
    rows = [
        [
            case["mode"],
            str(case["threads"]),
            str(case["decoders"]),
            str(case["batch"]),
            case.get("status", ""),
            fmt(case.get(IMAGES_PER_S)),
            fmt(case.get("cpu_ms_per_image")),
            fmt(short(case.get("error", ""))),
        ]
        for case in result.get("cases", [])
    ]
    return [*lines, "", *markdown_table([*header, "CPU ms / image", "note"], rows).splitlines()]
