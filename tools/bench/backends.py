"""The JPEG backends of ``loaderbench.imaging.decode`` side by side on real photos: what keeps each.

``python -m tools.bench.backends DIR [--images 400] [--image-size 224] [--threads 1 2]`` decodes
the first ``--images`` JPEGs under DIR (held in memory: no file reads timed) and prints, per job
and thread count, CPU ms an image (it holds up on a shared machine, where wall time does not)
and images/s. The jobs: ``full`` (a whole decode), ``region`` (each train box alone, the boxes
the loaders draw), ``train-full`` / ``train-region`` (the box cut from a whole decode or decoded
alone, then resized), and ``scaled`` (PIL's DCT-scaled decode, on the boxes at least twice the
output in both sides, against ``train-region``). docs/decoding.md keeps the results.
"""

from __future__ import annotations

import argparse
import io
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

from loaderbench.imaging import decode
from loaderbench.imaging.decode import Box
from loaderbench.imaging.files import jpeg_header
from loaderbench.imaging.transforms import resize_uint8, seeded_crops

Job = Callable[[int], object]  # does one image's work, by its position


def read_jpegs(root: Path, count: int) -> list[torch.Tensor]:
    paths = sorted(p for p in root.rglob("*") if p.suffix.lower() in (".jpg", ".jpeg"))
    datas = [torch.frombuffer(bytearray(p.read_bytes()), dtype=torch.uint8) for p in paths]
    return [d for d in datas if jpeg_header(d.numpy().tobytes()) is not None][:count]


def train_boxes(datas: Sequence[torch.Tensor]) -> list[Box]:
    sizes = [jpeg_header(d.numpy().tobytes()) for d in datas]
    heights = [s.height for s in sizes if s is not None]
    widths = [s.width for s in sizes if s is not None]
    boxes, _ = seeded_crops(heights, widths, 0, 0, range(len(datas)))
    return [tuple(b) for b in boxes.tolist()]  # type: ignore[misc]


def pil_scaled(data: torch.Tensor, box: Box, size: int) -> torch.Tensor:
    """PIL's DCT-scaled whole decode (the largest 1/2^k keeping the box >= the output), the
    box cut at that scale, resized."""
    import numpy as np
    from PIL import Image

    top, left, h, w = box
    image = Image.open(io.BytesIO(data.numpy().tobytes()))
    full_w = image.width
    scale = 1
    while min(h, w) // (2 * scale) >= size and scale < 8:
        scale *= 2
    image.draft("RGB", (image.width // scale, image.height // scale))
    image = image.convert("RGB")
    s = image.width / full_w
    pixels = torch.from_numpy(np.array(image)).permute(2, 0, 1)
    crop = pixels[:, round(top * s) : round((top + h) * s), round(left * s) : round((left + w) * s)]
    return resize_uint8(crop, (size, size))


def jobs(datas: list[torch.Tensor], boxes: list[Box], size: int) -> dict[str, Job]:
    cpu = torch.device("cpu")
    out: dict[str, Job] = {}
    for name, backend in decode.BACKENDS.items():
        try:
            backend.load()
        except Exception as error:
            print(f"{name}: does not load here ({error})", file=sys.stderr)
            continue

        def one(i: int, box: Box | None, backend: decode.JpegBackend = backend) -> torch.Tensor:
            (image,) = backend.decode([datas[i]], cpu, [box])
            assert isinstance(image, torch.Tensor)
            return image

        out[f"full {name}"] = lambda i, one=one: one(i, None)
        out[f"train-full {name}"] = lambda i, one=one: resize_uint8(
            decode.cut(one(i, None), boxes[i]),  # type: ignore[arg-type]
            (size, size),
        )
        if backend.can.region:
            out[f"region {name}"] = lambda i, one=one: one(i, boxes[i])
            out[f"train-region {name}"] = lambda i, one=one: resize_uint8(
                one(i, boxes[i]), (size, size)
            )
    return out


def timed(job: Job, items: Sequence[int], threads: int) -> tuple[float, float]:
    """(wall s, process CPU s) of ``job`` over ``items`` on ``threads`` threads."""
    wall, cpu = time.perf_counter(), time.process_time()
    if threads == 1:
        for i in items:
            job(i)
    else:
        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(job, items, chunksize=16))
    return time.perf_counter() - wall, time.process_time() - cpu


def measure(named: dict[str, Job], items: Sequence[int], threads: int, repeats: int) -> None:
    for job in named.values():  # warm-up: libraries, thread-local decoders, caches
        for i in items[:4]:
            job(i)
    best = {name: (float("inf"), float("inf")) for name in named}
    for _ in range(repeats):  # interleaved, so a busy moment hits every job alike
        for name, job in named.items():
            best[name] = min(best[name], timed(job, items, threads))
    for name, (wall, cpu) in best.items():
        n = len(items)
        print(
            f"  {name:28s} {cpu / n * 1e3:6.2f} CPU ms/image  {n / wall:7.1f} images/s "
            f"({threads} thread{'s' if threads > 1 else ''})"
        )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root", type=Path)
    parser.add_argument("--images", type=int, default=400)
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    datas = read_jpegs(args.root, args.images)
    boxes = train_boxes(datas)
    size = args.image_size
    named = jobs(datas, boxes, size)
    items = list(range(len(datas)))
    print(f"{len(datas)} JPEGs from {args.root}, boxes for {size} px:")
    for threads in args.threads:
        measure(named, items, threads, args.repeats)
    large = [i for i, (_, _, h, w) in enumerate(boxes) if h >= 2 * size and w >= 2 * size]
    print(f"boxes >= 2x the output in both sides: {len(large)} of {len(boxes)}")
    if large:
        scaled: dict[str, Job] = {
            "scaled pil-draft": lambda i: pil_scaled(datas[i], boxes[i], size)
        }
        region = [name for name in named if name.startswith("train-region")]
        scaled.update({name: named[name] for name in region[:1]})
        measure(scaled, large, 1, args.repeats)
        if region:
            differences = [
                (pil_scaled(datas[i], boxes[i], size).int() - named[region[0]](i).int())  # type: ignore[union-attr]
                .abs()
                .float()
                .mean()
                .item()
                for i in large
            ]
            mean = sum(differences) / len(differences)
            print(f"  scaled vs region pixels: mean |difference| {mean:.2f} grey levels")
    return 0


if __name__ == "__main__":
    sys.exit(main())
