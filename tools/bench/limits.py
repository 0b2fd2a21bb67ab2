"""The limits a loader's rows are held to: what this machine's cores can make of the work.

The CPU decode limit is the usable cores times the single-core rate of the fastest CPU JPEG
decode + resize here (``pil``, ``turbo``, ``ffmpeg``: each doing the whole val job for one image,
as the loaders' decoders do): a loader cannot beat it without a cheaper decode, so ``loader
images/s / limit`` says how much of the machine it turns into images, and ``efficiency`` the same
per CPU second (steadier on a shared machine). Rates are taken over all the images the loaders
read, one pass each, since a few images decoded over and over stay in the CPU caches. The best
candidate also runs in a plain thread pool (the yardstick for a pipeline's own overhead), and
the train pipelines get a region decode limit and the crop-and-resize limit (``crop_limit``).
``python -m tools.bench.limit_report`` prints them.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from loaderbench.imaging.transforms import RRC_SCALE
from loaderbench.measure.metrics import CPU_S_PER_1K_IMAGES, IMAGES_PER_S
from loaderbench.platform.runtime import cpus_allowed
from loaderbench.platform.threads import serial_torch_in_this_thread
from tools.bench.schema import DecodeLimit, DecodeRate

DecodeFn = Callable[[str], torch.Tensor]
CPU = torch.device("cpu")
BATCH = 32  # images a loader's reading thread prepares in one go (the bench's batch size)


def batched(fn: Callable[[Sequence[str]], object]) -> DecodeFn:
    """Mark a candidate that does its job for a batch of paths at once (``run_over``)."""
    fn.batched = True  # type: ignore[attr-defined]
    return fn  # type: ignore[return-value]


def run_over(fn: DecodeFn, paths: Sequence[str]) -> None:
    """Do ``fn``'s job for every path: one call a path, or one a batch for a ``batched`` one."""
    if getattr(fn, "batched", False):
        for start in range(0, len(paths), BATCH):
            fn(paths[start : start + BATCH])  # type: ignore[arg-type]
        return
    for path in paths:
        fn(path)


def usable_cores() -> int:
    """Cores this process may run on: ``runtime.cpus_allowed`` (its SLURM allotment, else its
    affinity mask, not the machine's count), the count the probe's ladder climbs to."""
    return cpus_allowed()


def candidates(image_size: int) -> dict[str, DecodeFn]:
    """The val job for one file -> uint8 CHW, per available decoder."""
    from loaderbench.imaging.files import load_rgb
    from loaderbench.imaging.spdl import FFmpegDecoder, Geometry, Sample, TurboDecoder
    from loaderbench.imaging.transforms import pil_val_transform

    pil_transform = pil_val_transform(image_size)
    geometry = Geometry(image_size, train=False)
    cpu = torch.device("cpu")
    fns: dict[str, DecodeFn] = {"pil": lambda path: pil_transform(load_rgb(path))}
    for decoder_class in (TurboDecoder, FFmpegDecoder):
        try:
            decoder = decoder_class(geometry, cpu)
        except Exception:  # e.g. FFmpeg's libraries missing: not available here
            continue

        def decode(path: str, decoder: Any = decoder) -> torch.Tensor:
            # The decoder's own steps for one image, without a batch around it (val geometry).
            opened = decoder.open(Sample(index=0, path=path, label=0, epoch=0))
            return decoder.finish(opened, decoder.geometry.plans([opened])[0])

        fns[decoder_class.name] = decode
    return fns


def time_single_thread(
    fn: DecodeFn, paths: Sequence[str], repeats: int = 3, warmup: int = 8
) -> tuple[float, float]:
    """(wall_s, cpu_s) of the fastest of ``repeats`` passes over ``paths`` on one thread.

    Runs in a fresh thread whose torch ops are serial (as in the loaders' pools), so torch's
    intra-op threads do not count as "one core".
    """
    result: dict[str, Any] = {}

    def run() -> None:
        try:
            serial_torch_in_this_thread()
            run_over(fn, paths[:warmup])
            best = (float("inf"), float("inf"))
            for _ in range(repeats):
                wall, cpu = time.perf_counter(), time.thread_time()
                run_over(fn, paths)
                best = min(best, (time.perf_counter() - wall, time.thread_time() - cpu))
            result["best"] = best
        except BaseException as error:  # reported in the calling thread
            result["error"] = error

    thread = threading.Thread(target=run, name="decode-limit")
    thread.start()
    thread.join()
    if "error" in result:
        raise result["error"]
    return result["best"]


def time_thread_pool(
    fn: DecodeFn, paths: Sequence[str], threads: int, repeats: int = 2, chunk: int = 32
) -> tuple[float, float]:
    """(wall_s, process CPU s) of the fastest of ``repeats`` passes over ``paths`` decoded by a
    plain pool of ``threads`` threads, ``chunk`` images per task (a loader's batch)."""
    from concurrent.futures import ThreadPoolExecutor

    def decode_chunk(chunk_paths: Sequence[str]) -> None:
        serial_torch_in_this_thread()
        run_over(fn, chunk_paths)

    chunks = [paths[i : i + chunk] for i in range(0, len(paths), chunk)]
    best = (float("inf"), float("inf"))
    with ThreadPoolExecutor(threads, "decode-pool") as pool:
        list(pool.map(decode_chunk, [chunk_paths[:2] for chunk_paths in chunks[:threads]]))
        for _ in range(repeats):
            wall, cpu = time.perf_counter(), time.process_time()
            list(pool.map(decode_chunk, chunks))
            best = min(best, (time.perf_counter() - wall, time.process_time() - cpu))
    return best


def measure_decode_limit(
    paths: Sequence[str],
    image_size: int,
    repeats: int = 2,
    only: Sequence[str] | None = None,
    pool: bool = True,
) -> DecodeLimit:
    """Single-thread rates of every available candidate over ``paths``, the limit and (when
    ``pool``) the best candidate's rate in a plain pool of one thread per core."""
    if not paths:
        raise ValueError("measure_decode_limit needs at least one image path")
    fns = {name: fn for name, fn in candidates(image_size).items() if only is None or name in only}
    return measure_rates(fns, paths, image_size, repeats, pool)


def measure_rates(
    fns: dict[str, DecodeFn],
    paths: Sequence[str],
    image_size: int,
    repeats: int,
    pool: bool,
    pool_with: str | None = None,
) -> DecodeLimit:
    """The single-thread rate of each of ``fns``, and a plain pool's: of the best one, and of
    ``pool_with`` too (the way the loader runs, where a pool of another way loses to the GIL),
    the faster of the two kept."""
    rates = []
    for name, fn in fns.items():
        wall, cpu = time_single_thread(fn, paths, repeats)
        rates.append(DecodeRate(name, len(paths), wall, cpu))
    limit = DecodeLimit(usable_cores(), image_size, tuple(rates))
    if not pool:
        return limit
    pools = []
    for name in dict.fromkeys([limit.best.name, pool_with or limit.best.name]):
        wall, cpu = time_thread_pool(fns[name], paths, limit.cores, repeats)
        pools.append(DecodeRate(f"{name} x {limit.cores} threads", len(paths), wall, cpu))
    return replace(limit, pool=max(pools, key=lambda rate: rate.images_per_s))


def train_candidates(
    image_size: int,
    paths: Sequence[str],
    seed: int = 0,
    epoch: int = 0,
    scale: tuple[float, float] = RRC_SCALE,
) -> dict[str, DecodeFn]:
    """The train job for one file -> uint8 CHW: read it, decode its random-resized crop, resize
    it to ``image_size`` and flip it, with the box and flip the train pipeline draws for image
    ``i`` of ``paths`` (``seeded_crops`` of seed, epoch, i): the spdl turbo decoder's own steps,
    decoding only the box (``turbo-region``, where the CPU's JPEG backend decodes regions) or
    the whole image, then cutting the box (``turbo-whole``)."""
    from loaderbench.imaging import decode
    from loaderbench.imaging.plans import apply_plan
    from loaderbench.imaging.spdl import Geometry, Sample, TurboDecoder, is_encoded

    decoder = TurboDecoder(Geometry(image_size, train=True, seed=seed, scale=scale), CPU)
    index = {path: i for i, path in enumerate(paths)}

    def opened_and_plan(path: str) -> tuple[Any, Any]:
        opened = decoder.open(Sample(index=index[path], path=path, label=0, epoch=epoch))
        return opened, decoder.geometry.plans([opened])[0]

    def whole(path: str) -> torch.Tensor:
        opened, plan = opened_and_plan(path)
        image = decode.decode_cpu(opened.payload) if is_encoded(opened) else opened.payload
        return apply_plan(image, plan)

    fns: dict[str, DecodeFn] = {"turbo-whole": whole}
    if decode.region_decode("cpu"):
        fns["turbo-region"] = lambda path: decoder.finish(*opened_and_plan(path))
    return fns


def measure_region_decode_limit(
    paths: Sequence[str],
    image_size: int,
    repeats: int = 2,
    pool: bool = True,
    scale: tuple[float, float] = RRC_SCALE,
) -> DecodeLimit:
    """The region decode limit: the train job (``train_candidates``) of the fastest candidate
    on one thread x cores, and in a plain pool of one thread per core; the yardstick of a
    loader that decodes its train crops per epoch (spdl, memmap's jpeg store)."""
    if not paths:
        raise ValueError("measure_region_decode_limit needs at least one image path")
    fns = train_candidates(image_size, paths, scale=scale)
    limit = measure_rates(fns, paths, image_size, repeats, pool)
    return replace(limit, job="train region decode + resize", title="CPU region decode limit")


def format_limit(limit: DecodeLimit) -> str:
    lines = [f"single-thread {limit.job} at {limit.image_size} px:"]
    for r in sorted(limit.rates, key=lambda r: -r.images_per_s):
        lines.append(
            f"  {r.name:8s} {r.images_per_s:8.1f} images/s  "
            f"{r.images_per_cpu_s:8.1f} images per CPU s"
        )
    lines.append(
        f"{limit.title}: {limit.cores} cores x {limit.best.images_per_s:.1f} "
        f"({limit.best.name}) = {limit.images_per_s:.1f} images/s"
    )
    if limit.pool is not None:
        lines.append(
            f"plain thread pool ({limit.pool.name}): {limit.pool.images_per_s:.1f} images/s "
            f"= {limit.ratio(limit.pool.images_per_s):.1%} of the limit"
        )
    if limit.without_flips is not None:
        alone = limit.without_flips.images_per_s
        lines.append(
            f"the resize alone ({limit.without_flips.name}): {alone:.1f} images/s on one core; "
            f"the flips cost {1 - limit.best.images_per_s / alone:.1%} of it"
        )
    return "\n".join(lines)


def run_bounds(metrics_path: Path, metrics: dict[str, Any]) -> tuple[str, ...]:
    """What bounds a run's work (``work_bounds``) for
    the settings the run had (its Hydra config beside metrics.json); decoding, where the run
    left no config or names no loader of this tree."""
    from loaderbench.loaders import loader_names, settings_class
    from tools.bench.work_bounds import work_bounds

    config = metrics_path.parent / ".hydra" / "config.yaml"
    name = metrics.get("loader")
    if not config.is_file() or name not in loader_names():
        return ("decode",)
    from omegaconf import OmegaConf

    ran_with = OmegaConf.load(config).loader
    node = OmegaConf.merge(OmegaConf.structured(settings_class(name)), ran_with)
    return work_bounds(OmegaConf.to_object(node), metrics.get("task") == "train")


def format_ratio(limit: DecodeLimit, metrics: dict[str, Any], label: str) -> str:
    ips, cpu = metrics.get(IMAGES_PER_S) or 0.0, metrics.get(CPU_S_PER_1K_IMAGES) or 0.0
    pool = limit.pool_ratio(ips)
    return (
        f"{label}: {ips:.1f} images/s = {limit.ratio(ips):.1%} of the {limit.title}"
        + (f" and {pool:.1%} of the plain thread pool" if pool is not None else "")
        + f"; {1000 / cpu if cpu else 0:.1f} images per CPU s = {limit.efficiency(cpu):.1%} "
        f"of the best single-thread {limit.job}"
    )


def run_label(metrics_path: Path, metrics: dict[str, Any]) -> str:
    """``loader`` or ``loader/decoder``, the decoder read from the run's Hydra config."""
    label = str(metrics.get("loader"))
    config = metrics_path.parent / ".hydra" / "config.yaml"
    if config.is_file():
        from omegaconf import OmegaConf

        decoder = OmegaConf.load(config).get("loader", {}).get("decoder")
        if decoder:
            label += f"/{decoder}"
    return label
