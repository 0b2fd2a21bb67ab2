"""Which nvImageCodec engines decode on a GPU, in which order: measured once per machine, GPU
and library versions, then remembered, as ``loader.num_workers=auto`` remembers its count.

``measure`` times each engine alone on a batch of generated photo-sized JPEGs; ``rank`` orders
those that decoded every image by rate, a CPU-Huffman engine ahead of a GPU one only where it
is faster by ``CPU_HUFFMAN_MARGIN`` (it takes cores the loader needs). Remembered in
``decode-engines-<hash of the key>.json`` in ``LOADERBENCH_CACHE_DIR`` (default
``~/.cache/loaderbench``); ``LOADERBENCH_DECODE_REFRESH=1`` measures again, and a file that
cannot be trusted is named in a warning and measured over.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import platform
import socket
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from loaderbench.platform.version import installed_versions

log = logging.getLogger(__package__)

KEY_VERSION = 1
# A CPU-Huffman engine goes ahead of a GPU one only if this much faster.
CPU_HUFFMAN_MARGIN = 1.10
LIBRARIES = ("nvidia-nvimgcodec-cu13", "nvidia-nvimgcodec-cu12", "nvidia-nvjpeg", "torch")
# The measurement: a batch of this many JPEGs of ImageNet's typical size, timed this many times.
BATCH, ROUNDS, SIZE = 128, 5, (500, 375)


@dataclass(frozen=True)
class EngineRate:
    engine: str
    huffman: str  # "engine", "gpu" or "cpu"
    images_per_s: float | None  # None: it did not decode the batch (``error`` says why)
    cpu_ms_per_image: float | None = None
    error: str = ""


def rank(rates: list[EngineRate]) -> list[str]:
    """The engines that decoded the batch, fastest first; a CPU-Huffman engine counts as
    ``CPU_HUFFMAN_MARGIN`` times slower than it measured against the others."""
    usable = [rate for rate in rates if rate.images_per_s]

    def score(rate: EngineRate) -> float:
        speed = rate.images_per_s or 0.0
        return speed / CPU_HUFFMAN_MARGIN if rate.huffman == "cpu" else speed

    return [rate.engine for rate in sorted(usable, key=score, reverse=True)]


def sample_jpegs(count: int = BATCH, size: tuple[int, int] = SIZE) -> list[bytes]:
    """Baseline 4:2:0 JPEGs (Pillow, quality 90) of textured pictures: most photos' kind."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    yy, xx = np.mgrid[0 : size[1], 0 : size[0]]
    datas = []
    for i in range(count):
        base = np.stack([(xx * (i + 3)) % 256, (yy * 5 + i) % 256, (xx + yy * i) % 256], -1)
        noise = rng.integers(-25, 25, base.shape)
        buffer = io.BytesIO()
        Image.fromarray(np.clip(base + noise, 0, 255).astype("u1")).save(buffer, "JPEG", quality=90)
        datas.append(buffer.getvalue())
    return datas


def time_engine(decode: Callable[[], int], batch: int, rounds: int = ROUNDS) -> tuple[float, float]:
    """Images/s and CPU ms per image of ``decode`` (one batch; returns the images it decoded,
    having waited for them), after one untimed call; raises where it decodes fewer."""
    if decode() != batch:
        raise RuntimeError(f"decoded fewer than the {batch} images of the batch")
    wall0, cpu0 = time.perf_counter(), time.process_time()
    for _ in range(rounds):
        if decode() != batch:
            raise RuntimeError(f"decoded fewer than the {batch} images of the batch")
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    return rounds * batch / wall, 1000 * cpu / (rounds * batch)


def cache_folder() -> Path:
    folder = os.environ.get("LOADERBENCH_CACHE_DIR")
    if folder:
        return Path(folder)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "loaderbench"


def choice_key(gpu: str) -> dict[str, Any]:
    """What the ranking depends on: the machine, the GPU (name, driver) and the libraries."""
    versions = installed_versions(LIBRARIES)
    return {
        "version": KEY_VERSION,
        "host": socket.gethostname(),
        "cpu": platform.processor() or platform.machine(),
        "gpu": gpu,
        "libraries": versions,
    }


def choice_path(key: dict[str, Any]) -> Path:
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    return cache_folder() / f"decode-engines-{digest}.json"


def load_choice(path: Path, key: dict[str, Any]) -> list[EngineRate] | None:
    """The measurement remembered at ``path`` for exactly ``key``; None (with a warning for a
    file that is there but unusable) where there is none."""
    try:
        saved = json.loads(path.read_text())
        if saved["key"] != key:
            raise ValueError("it holds another key's measurement")
        return [EngineRate(**row) for row in saved["rates"]]
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as error:
        log.warning("JPEG engines: %s is no usable measurement (%s); measuring again", path, error)
        return None


def save_choice(path: Path, key: dict[str, Any], rates: list[EngineRate]) -> None:
    from loaderbench.platform.atomic import atomic_write_text

    payload = {"key": key, "rates": [asdict(rate) for rate in rates], "order": rank(rates)}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, json.dumps(payload, indent=1, sort_keys=True) + "\n")
    except OSError as error:  # a read-only home: measured again next time
        log.warning("JPEG engines: cannot remember the measurement in %s (%s)", path, error)


def remembered_rates(
    gpu: str, measure: Callable[[], list[EngineRate]]
) -> tuple[list[EngineRate], bool]:
    """The engines' rates on this machine: remembered, else ``measure``d and remembered;
    and whether they were measured now."""
    key = choice_key(gpu)
    path = choice_path(key)
    refresh = os.environ.get("LOADERBENCH_DECODE_REFRESH", "") not in ("", "0")
    rates = None if refresh else load_choice(path, key)
    if rates is not None:
        return rates, False
    rates = measure()
    save_choice(path, key, rates)
    summary = ", ".join(
        f"{r.engine} {r.images_per_s:,.0f}/s" if r.images_per_s else f"{r.engine}: {r.error}"
        for r in rates
    )
    log.info("JPEG engines on %s measured (%s): order %s", gpu, summary, rank(rates))
    return rates, True
