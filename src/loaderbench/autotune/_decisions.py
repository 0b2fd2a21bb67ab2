"""``loader.num_workers=auto``'s remembered choices: one small JSON file per key in the cache
folder, ``autotune-<hash of the key>.json``, holding the key, the count and the probe's table.

The key holds everything that decides the choice (``decision_key``): a run whose key matches
takes the count at once, and any difference (a probe setting, an image replaced in place, the
decoder that would read the images, the model, the device, ...) probes again. A file that
cannot be read, or does not hold what ``save_decision`` writes, is named in a warning and
probed over, never trusted and never fatal: under DDP rank 0 reads it, and every rank then
probes together.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import platform
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from loaderbench.autotune._rung import ProbeRow
from loaderbench.data.discovery import resolve_path
from loaderbench.imaging import decode
from loaderbench.loaders import LoaderSpec
from loaderbench.platform.atomic import atomic_write_text
from loaderbench.platform.version import installed_versions
from loaderbench.run.session import Session

log = logging.getLogger(__name__)

# 2: the key holds the probe's settings, the split's fingerprint, the decoder and libraries.
KEY_VERSION = 2
FILE_PREFIX = "autotune-"
# Libraries whose speed the choice measured (torch's kernels, the decoders).
LIBRARIES = (
    "torch",
    "torchvision",
    "pillow",
    "spdl_io",
    "torchcodec",
    "nvidia-nvimgcodec-cu13",
    "nvidia-nvjpeg",
)


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return f"cuda:{torch.cuda.get_device_name(device)}"
    return device.type


def library_versions() -> dict[str, str | None]:
    """Installed versions of the libraries a decision depends on (None: not installed)."""
    return installed_versions(LIBRARIES)


def decoding(spec: LoaderSpec) -> str:
    """What decodes the split's images, as the loader's ``jpeg_backend`` names it: Pillow for
    the torchvision loader and memmap's raw stores (decoded when built), FFmpeg for spdl's
    ``ffmpeg`` decoder, else the backend ``loaderbench.imaging.decode`` picks where the loader
    decodes (spdl ``turbo``: the CPU; spdl ``nvjpeg`` and memmap's jpeg stores: the run's device). A
    backend that stops working (an upgrade, a missing library) moves that choice, and the
    worker count measured with the old one no longer holds."""
    settings = spec.settings
    decoder = getattr(settings, "decoder", None)
    store = getattr(settings, "store" if spec.train else "val_store", None)
    if decoder == "ffmpeg":
        return "ffmpeg"
    if decoder is None and store != "jpeg":
        return "pillow"
    on_device = decoder == "nvjpeg" or store == "jpeg"
    return decode.backend(spec.device if on_device else torch.device("cpu"))


def decision_key(
    session: Session, spec: LoaderSpec, model: dict[str, Any], cpus: int
) -> dict[str, Any]:
    """Everything the choice depends on: the machine and the CPUs the job's ranks agreed on,
    the libraries and the decoder, the loader and all its settings but the count (the probe's
    own included, but ``refresh``, which asks for a probe, and ``timeout_s``: neither decides
    anything), the model, the split (its name, size and fingerprint: files added, removed,
    resized or touched), image and batch size, augmentation, device, precision, world size
    and task."""
    config = session.config
    settings = dataclasses.asdict(spec.settings)
    settings.pop("num_workers")
    settings.pop("timeout_s", None)  # how long to wait for a stuck worker: decides nothing
    settings["autotune"].pop("refresh")
    key = {
        "version": KEY_VERSION,
        "machine": {"host": socket.gethostname(), "cpu": cpu_model(), "cpus_allowed": cpus},
        "libraries": library_versions(),
        "decoder": decoding(spec),
        "loader": settings,
        "model": model,
        "task": session.task,
        "split": spec.split.name,
        "train": spec.train,
        "dataset": {
            "root": str(session.dataset.root),
            "images": len(spec.split),
            "fingerprint": spec.split.fingerprint(),
            "on_error": spec.on_error,
            "max_image_pixels": config.dataset.max_image_pixels,
        },
        "image_size": spec.image_size,
        "augment": dataclasses.asdict(config.augment) if spec.train else None,
        "device": device_name(session.device),
        "precision": session.precision.name,
        "world_size": session.dist.world_size,
        "runtime_threads": config.runtime.threads,
    }
    # As a file gives it back (tuples become lists), so a saved key compares equal.
    return json.loads(json.dumps(key))


def key_hash(key: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]


def decision_folder(session: Session) -> Path | None:
    """Where choices are remembered: the loader's first folder where it declares one (memmap:
    its cache, ``LoaderSettings.folders``), else the dataset index's (``dataset.index_dir``);
    None (nothing remembered) when that is null."""
    folder = next(iter(session.loader.folders()), None) or session.config.dataset.index_dir
    return resolve_path(folder) if folder else None


@dataclass(frozen=True)
class Decision:
    num_workers: int
    probe: list[dict[str, Any]]
    probe_s: float


class ForeignDecision(ValueError):
    """A decision file that does not hold what ``save_decision`` writes."""


def parse_decision(saved: Any) -> tuple[Any, Decision]:
    """The key and the decision a saved file's JSON holds; ``ForeignDecision`` saying what is
    wrong where it holds something else."""
    if not isinstance(saved, dict):
        raise ForeignDecision(f"it holds a JSON {type(saved).__name__}, not an object")
    count, probe_s, probe = (saved.get(k) for k in ("num_workers", "probe_s", "probe"))
    if isinstance(count, bool) or not isinstance(count, int) or count < 0:
        raise ForeignDecision(f"num_workers is {count!r}, not an integer >= 0")
    if isinstance(probe_s, bool) or not isinstance(probe_s, int | float):
        raise ForeignDecision(f"probe_s is {probe_s!r}, not a number")
    if not isinstance(probe, list):
        raise ForeignDecision(f"probe is {type(probe).__name__}, not a list of rows")
    try:
        rows = [ProbeRow(**row).as_dict() for row in probe]
    except TypeError as error:  # not a mapping, or other fields than a row's
        raise ForeignDecision(f"a probe row is not one: {error}") from None
    return saved.get("key"), Decision(count, rows, float(probe_s))


def load_decision(path: Path, key: dict[str, Any]) -> Decision | None:
    """The choice remembered at ``path`` for exactly ``key``; None if there is none. A file
    that cannot be read or parsed, holds something else, or another key under this key's
    hash: a warning naming it, and None (the caller probes, and writes over it)."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as error:
        log.warning("num_workers=auto: %s cannot be read (%s); probing again", path, error)
        return None
    try:
        saved_key, decision = parse_decision(json.loads(text))
    except ValueError as error:  # not JSON (json.JSONDecodeError), or ForeignDecision
        log.warning(
            "num_workers=auto: %s is not a remembered choice (%s); probing again", path, error
        )
        return None
    if saved_key != key:
        log.warning(
            "num_workers=auto: %s holds the choice of another key under this key's name; "
            "probing again",
            path,
        )
        return None
    return decision


def save_decision(path: Path, key: dict[str, Any], decision: Decision) -> None:
    payload = {
        "key": key,
        "num_workers": decision.num_workers,
        "probe": decision.probe,
        "probe_s": decision.probe_s,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    try:
        atomic_write_text(path, json.dumps(payload, indent=1, sort_keys=True) + "\n")
    except OSError as error:  # a read-only cache folder: the choice is not remembered
        log.warning("num_workers=auto: cannot remember the choice in %s (%s)", path, error)
