"""The CPU an image that spdl's nvjpeg path spends outside the decoder, measured on the CPU.

``python -m tools.bench.host_cost DIR [--images 768]`` prints CPU ms an image (one thread,
median of 5 rounds, batches of 256) of the parts a GPU does not change: ``read`` (``open_file``:
bytes, admission, size), ``plans`` (the batch's plans as tensors) and ``finish batched`` /
``finish per image`` (one batched resize or a resize an image, on tiny images so that what is
left is Python and dispatch), with each one's operator count a batch. The decode call itself is
the GPU check's decoder table.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from loaderbench.imaging.device_resize import resize_images
from loaderbench.imaging.plans import Plan, apply_plan, plan_table
from loaderbench.imaging.spdl.decoders import open_file
from loaderbench.imaging.spdl.geometry import Geometry
from loaderbench.imaging.spdl.records import Sample

BATCH = 256


class _Operators(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        self.count += 1
        return func(*args, **(kwargs or {}))


def ms_per_image(work: Callable[[], object], images: int, rounds: int = 5) -> float:
    work()  # a first call's one-off costs
    times = []
    for _ in range(rounds):
        start = time.thread_time()
        work()
        times.append((time.thread_time() - start) / images * 1e3)
    return statistics.median(times)


def operators(work: Callable[[], object]) -> int:
    with _Operators() as counter:
        work()
    return counter.count


def finish_cases() -> dict[str, Callable[[], object]]:
    """A batch of tiny decoded images (10-16 x 12-16 px), finished to 8 x 8 both ways."""
    generator = torch.Generator().manual_seed(0)
    images = [
        torch.randint(0, 255, (3, 10 + k % 7, 12 + k % 5), dtype=torch.uint8, generator=generator)
        for k in range(BATCH)
    ]
    flips = torch.rand(BATCH, generator=generator) < 0.5
    plans = [
        Plan((0, 0, *image.shape[-2:]), (8, 8), None, bool(flip))
        for image, flip in zip(images, flips.tolist(), strict=True)
    ]

    def per_image() -> None:
        out = torch.empty((BATCH, 3, 8, 8), dtype=torch.uint8)
        for k, (image, plan) in enumerate(zip(images, plans, strict=True)):
            out[k].copy_(apply_plan(image, plan))

    return {
        "finish batched": lambda: resize_images(images, 8, flips),
        "finish per image": per_image,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.bench.host_cost")
    parser.add_argument("folder", type=Path, help="a folder of JPEGs (searched recursively)")
    parser.add_argument("--images", type=int, default=768)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    paths = sorted(str(p) for p in args.folder.rglob("*") if p.suffix.lower() in (".jpeg", ".jpg"))
    samples = [Sample(i, path, 0, 0) for i, path in enumerate(paths[: args.images])]
    if not samples:
        print(f"no JPEGs under {args.folder}", file=sys.stderr)
        return 1
    geometry = Geometry(224, train=True)
    opened = [open_file(sample) for sample in samples]

    def plans() -> None:
        for start in range(0, len(opened), BATCH):
            plan_table(geometry.plans(opened[start : start + BATCH]))

    n = len(samples)
    print(f"read: {ms_per_image(lambda: [open_file(s) for s in samples], n):.4f} ms an image")
    print(f"plans: {ms_per_image(plans, n):.4f} ms an image")
    for name, work in finish_cases().items():
        cost, count = ms_per_image(work, BATCH), operators(work)
        print(f"{name}: {cost:.4f} ms an image, {count} operators a batch of {BATCH}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
