"""GIL-held CPU of spdl turbo's batch path, on one thread, unaffected by the machine's load:
``python -m tools.bench.gil_cpu PHOTOS [--size 224] [--batch 32] [--passes 3]``.

The thread's CPU time in ``TurboDecoder.decode_batch`` less its CPU time inside the two calls
that release the GIL (``cpu_batch.read_files``, ``cpu_batch.decode_into``): what is left ran
with the GIL held (or in a call that releases it on its own: Pillow's decode of the files the
admission rule sends to it, so this is an upper bound). py-spy's ``--gil`` figure
(``make profile ARGS='--gil ...'``) is wall time and grows with the machine's load; this is
CPU time and does not (docs/gil.md).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from loaderbench.imaging.decode import cpu_batch
from loaderbench.imaging.spdl.decoders import TurboDecoder
from loaderbench.imaging.spdl.geometry import Geometry
from loaderbench.imaging.spdl.records import Sample
from loaderbench.platform.buffers import BatchBuffers


def _counted(fn: Callable[..., Any], total: list[float]) -> Callable[..., Any]:
    def counted(*args: Any, **kwargs: Any) -> Any:
        start = time.thread_time()
        try:
            return fn(*args, **kwargs)
        finally:
            total[0] += time.thread_time() - start

    return counted


def measure(paths: Sequence[str], size: int, batch: int, epoch: int) -> tuple[float, float]:
    """(thread CPU ms, GIL-held CPU ms) per image over one pass of train batches."""
    if not cpu_batch.available():
        raise SystemExit("the batch path does not run here (see the log)")
    decoder = TurboDecoder(Geometry(size, train=True), torch.device("cpu"))
    buffers = BatchBuffers(batch, (3, size, size), 2, pin=False)
    native = [0.0]
    read, decode = cpu_batch.read_files, cpu_batch.decode_into
    cpu_batch.read_files = _counted(read, native)  # type: ignore[assignment]
    cpu_batch.decode_into = _counted(decode, native)  # type: ignore[assignment]
    try:
        images, start = 0, time.thread_time()
        for at in range(0, len(paths) - batch + 1, batch):
            chunk = paths[at : at + batch]
            samples = [Sample(at + k, path, 0, epoch) for k, path in enumerate(chunk)]
            images += len(decoder.decode_batch(samples, buffers).labels)
        total = time.thread_time() - start
    finally:
        cpu_batch.read_files, cpu_batch.decode_into = read, decode  # type: ignore[assignment]
    return 1e3 * total / images, 1e3 * (total - native[0]) / images


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root", type=Path, help="a folder holding train/ (ImageFolder)")
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--passes", type=int, default=3)
    args = parser.parse_args(argv)
    paths = sorted(str(p) for p in (args.root / "train").glob("*/*") if p.is_file())
    if len(paths) < args.batch:
        raise SystemExit(f"{args.root / 'train'}: fewer than {args.batch} files")
    torch.set_num_threads(1)
    for epoch in range(args.passes):
        cpu, gil = measure(paths, args.size, args.batch, epoch)
        print(f"pass {epoch}: thread CPU {cpu:.3f} ms an image, GIL held {gil:.3f} ms an image")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
