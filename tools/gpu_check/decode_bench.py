"""Batched JPEG decode (``python -m tools.gpu_check decode ROOT --out JSON --device cuda``): the
synthetic set's train images through ``loaderbench.decode``'s backends, nvImageCodec (whole
images, and only each image's random-resized-crop box) against TorchCodec's and torchvision.io's
batched decode (whole images; their "region" is the whole image, then cut), and how far their
pixels are apart. ``--device cpu`` runs the same on CPU threads (the dry run)."""

from __future__ import annotations

import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tools.gpu_check.markdown import fmt

if TYPE_CHECKING:  # torch and the decoders load when the phase runs, not on import
    import torch

    from loaderbench.decode import Box, Decoded, JpegBackend

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
    print(f"decode {backend.name} {kind}: {row['status']}, {fmt(row.get('images_per_s'))} img/s")
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
