"""``bench/report.json``: what the benchmark measured, typed; the renderer draws from it alone.

The measuring side (``tools.bench.measure``) fills a ``Report`` and writes it; the
rendering side (``tools.bench.render``) reads it back and draws report.md and report.png.
Each piece converts itself (``to_json`` / ``from_json``); derived figures (a row's share, a
limit's images/s, a store's ImageNet size) are written for readers of the file and recomputed,
never read back. ``SCHEMA_VERSION`` changes whenever a key changes meaning or goes away.

Standard library only: re-drawing a report needs neither torch nor the loaders.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from loaderbench.measure.metrics import IMAGES_PER_S

SCHEMA_VERSION = 1
PIPELINES = ("val", "train")

# What bounds a pipeline's work per image (``tools.bench.work_bounds``, by loader name), and the
# limit each kind names in the report. The first bound of a row is the limit its share is of;
# further ones are yardsticks the report also sets the row against ("pool": the decode limit's
# plain thread pool, "region": the region decode limit).
LIMIT_NAMES = {"decode": "CPU decode", "copy": "memory copy", "crop": "crop + resize"}
# Bounds of readers of stored pixels (they decode nothing).
STORED_PIXELS = ("copy", "crop")

# The peers' rows, by name.
DALI_NAMES = {"cpu": "dali (cpu)", "gpu": "dali (mixed)"}
FFCV_NAMES = {"raw": "ffcv (raw)", "jpeg": "ffcv (jpg)"}  # by our store names
CLASSIC = "classic (float in workers)"
TUTORIAL = "tutorial tensorclass"

# ImageNet's images per split and the core counts the stores' build times are projected to.
IMAGENET_IMAGES = {"train": 1_281_167, "val": 50_000}
CORES = (16, 64)
# The node "How many cores feed my GPUs?" answers for unless told another (``--gpus``,
# ``--cores``): 8 GPUs and 112 cores (two 56-core CPUs, as in NVIDIA's DGX H100).
NODE_GPUS, NODE_CORES = 8, 112


def _pick(cls: Any, data: dict[str, Any], where: str) -> Any:
    """``cls`` from the keys of ``data`` that are its fields; a missing one is named."""
    try:
        return cls(**{f.name: data[f.name] for f in fields(cls) if f.name in data})
    except TypeError as error:
        raise ValueError(f"report.json: {where}: {error}") from None


@dataclass(frozen=True)
class DecodeRate:
    """One candidate's single-thread rate (best of the repeats)."""

    name: str
    images: int
    wall_s: float
    cpu_s: float

    @property
    def images_per_s(self) -> float:
        return self.images / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def images_per_cpu_s(self) -> float:
        return self.images / self.cpu_s if self.cpu_s > 0 else 0.0

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), IMAGES_PER_S: self.images_per_s}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> DecodeRate:
        return _pick(cls, data, "a rate")


@dataclass(frozen=True)
class DecodeLimit:
    cores: int
    image_size: int
    rates: tuple[DecodeRate, ...]
    # The best candidate on ``cores`` threads of a plain pool (None: not measured).
    pool: DecodeRate | None = None
    job: str = "val decode + resize"  # what each candidate does for one image
    title: str = "CPU decode limit"
    # The crop limit's best way without the flips (the resize alone), single-thread.
    without_flips: DecodeRate | None = None

    @property
    def best(self) -> DecodeRate:
        return max(self.rates, key=lambda rate: rate.images_per_s)

    @property
    def images_per_s(self) -> float:
        """cores x the fastest candidate's single-core rate."""
        return self.cores * self.best.images_per_s

    @property
    def best_images_per_cpu_s(self) -> float:
        return max(rate.images_per_cpu_s for rate in self.rates)

    def ratio(self, images_per_s: float) -> float:
        """A loader's share of the limit (1.0 = every core decoding with the best decoder)."""
        return images_per_s / self.images_per_s if self.images_per_s else 0.0

    def efficiency(self, cpu_s_per_1k_images: float) -> float:
        """Images per CPU second of a loader (whole process tree) over the best candidate's."""
        if not cpu_s_per_1k_images or not self.best_images_per_cpu_s:
            return 0.0
        return (1000.0 / cpu_s_per_1k_images) / self.best_images_per_cpu_s

    def pool_ratio(self, images_per_s: float) -> float | None:
        """A loader's share of what a plain thread pool of the best decoder reaches."""
        if self.pool is None or not self.pool.images_per_s:
            return None
        return images_per_s / self.pool.images_per_s

    def to_json(self) -> dict[str, Any]:
        def rate(r: DecodeRate) -> dict[str, Any]:
            return {**r.to_json(), "images_per_cpu_s": r.images_per_cpu_s}

        return {
            "job": self.job,
            "title": self.title,
            "cores": self.cores,
            "image_size": self.image_size,
            "best": self.best.name,
            "limit_images_per_s": self.images_per_s,
            "rates": [rate(r) for r in self.rates],
            "pool": None if self.pool is None else rate(self.pool),
            **({} if self.without_flips is None else {"without_flips": rate(self.without_flips)}),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any] | None) -> DecodeLimit | None:
        if data is None:
            return None

        def rate(value: dict[str, Any] | None) -> DecodeRate | None:
            return None if value is None else DecodeRate.from_json(value)

        return cls(
            cores=data["cores"],
            image_size=data["image_size"],
            rates=tuple(DecodeRate.from_json(r) for r in data["rates"]),
            pool=rate(data.get("pool")),
            job=data["job"],
            title=data["title"],
            without_flips=rate(data.get("without_flips")),
        )


@dataclass
class Row:
    """One pipeline at one worker count: a loader's (from its sweep) or a peer's."""

    pipeline: str  # val | train
    name: str
    workers: int | None
    images_per_s: float | None
    cpu_s_per_1k_images: float | None = None
    data_wait_frac: float | None = None
    ttfb_s: float | None = None
    limit_name: str = ""
    limit_images_per_s: float | None = None
    note: str = ""
    extra: dict[str, Any] = field(default_factory=dict)
    kind: str = "peer"  # loader (one of the project's) | peer
    bounds: tuple[str, ...] = ()  # what bounds its work (LIMIT_NAMES' kinds and yardsticks)
    # images/s over the model's own rate (loader=resident at the same settings), and why it
    # is null: a model=none row has no model, so no ceiling (docs/metrics.md, "ceiling_frac").
    ceiling_frac: float | None = None
    ceiling_frac_null_reason: str | None = None

    @property
    def share(self) -> float | None:
        if not self.images_per_s or not self.limit_images_per_s:
            return None
        return self.images_per_s / self.limit_images_per_s

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "bounds": list(self.bounds), "share": self.share}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Row:
        row = _pick(cls, data, f"row {data.get('pipeline')}/{data.get('name')}")
        row.bounds = tuple(row.bounds)
        return row


@dataclass
class AutoRow:
    """A loader run with ``loader.num_workers=auto``: the count its probe chose, that run's
    images/s, and what the probe cost against the run's whole wall time."""

    pipeline: str  # val | train
    name: str
    workers: int | None
    images_per_s: float | None
    autotune_s: float | None
    wall_s: float | None
    note: str = ""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> AutoRow:
        return _pick(cls, data, f"auto row {data.get('pipeline')}/{data.get('name')}")


@dataclass
class StoreRow:
    """A memmap store as built and read here, projected to ImageNet."""

    pipeline: str  # val | train
    store: str
    bytes_per_image: float
    images_per_s: float | None
    build_images_per_s_per_core: float
    cpu_s_per_1k_images: float | None = None

    @property
    def imagenet_gb(self) -> float:
        return self.bytes_per_image * IMAGENET_IMAGES[self.pipeline] / 1e9

    def build_minutes(self, cores: int) -> float:
        return IMAGENET_IMAGES[self.pipeline] / (self.build_images_per_s_per_core * cores) / 60

    def to_json(self) -> dict[str, Any]:
        minutes = {f"build_minutes_{c}_cores": self.build_minutes(c) for c in CORES}
        return {**asdict(self), "imagenet_gb": self.imagenet_gb, **minutes}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> StoreRow:
        return _pick(cls, data, f"store {data.get('pipeline')}/{data.get('store')}")


@dataclass
class Options:
    """What the benchmark was asked to run (``python -m tools.bench``'s options)."""

    out: Path
    quick: bool = False
    image_size: int = 224
    batch_size: int = 32
    workers: tuple[int, ...] = (1, 2)
    # Passes over each split: the val split is small, and a pass of a fast loader takes
    # milliseconds, so more passes keep per-epoch start-up from dominating.
    epochs: dict[str, int] = field(default_factory=lambda: {"val": 4, "train": 3})
    drop_page_cache: bool = False
    repeats: int = 2
    root: Path | None = None
    own_data: bool = False  # --root: the user's images, not the generated set
    # The loader every other pipeline's images/s is set against, worker count by worker count
    # (the classic DataLoader pipeline most users start from).
    baseline: str = "torchvision"
    # "How many cores feed my GPUs?": the per-GPU images/s the pipelines must feed (None: a GPU
    # run's own model rate where the report holds one, else the documented default of
    # ``tools.bench.render_cores``) and the node they are fitted to. Keys absent from a
    # report.json written before them read as these defaults.
    gpu_rate: float | None = None
    node_gpus: int = NODE_GPUS
    node_cores: int = NODE_CORES

    @property
    def work(self) -> Path:
        """What the runs write besides the report: sweeps, the memmap cache, the tutorial's
        files, the quick data set. Nothing is written under the repository but ``out``."""
        return self.out / "work"

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        del data["out"]  # where it was written: the report's own folder, not a measurement
        return {**data, "workers": list(self.workers), "root": str(self.root)}

    @classmethod
    def from_json(cls, data: dict[str, Any], out: Path) -> Options:
        opts = _pick(cls, {**data, "out": out}, "options")
        opts.workers = tuple(opts.workers)
        opts.root = None if data.get("root") in (None, "None") else Path(data["root"])
        return opts


@dataclass(frozen=True)
class GpuModelRate:
    """A GPU run's own model rate: the images/s one GPU trains its model at, and where it was
    read (a metrics.json of a ``device=cuda`` run, with its model)."""

    images_per_s: float
    source: str

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any] | None) -> GpuModelRate | None:
        return None if data is None else _pick(cls, data, "gpu_model_rate")


@dataclass
class Machine:
    """Where it was measured."""

    arch: str
    cores: int
    python: str
    torch: str

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Machine:
        return _pick(cls, data, "machine")


@dataclass
class Report:
    """Everything report.md and report.png show."""

    options: Options
    machine: Machine
    wall_s: float
    rows: list[Row]
    decode_limit: DecodeLimit
    memory_copy_bytes_per_s: float
    stores: list[StoreRow] = field(default_factory=list)
    crop_limit: DecodeLimit | None = None
    region_decode_limit: DecodeLimit | None = None
    auto: list[AutoRow] = field(default_factory=list)
    ffcv_version: str | None = None
    gpu_model_rate: GpuModelRate | None = None  # None: no GPU run measured one

    @property
    def image_bytes(self) -> int:
        """Bytes of one uint8 image at the report's size (the memory-copy limit's unit)."""
        return 3 * self.options.image_size * self.options.image_size

    def to_json(self) -> dict[str, Any]:
        def limit(value: DecodeLimit | None) -> dict[str, Any] | None:
            return None if value is None else value.to_json()

        return {
            "schema_version": SCHEMA_VERSION,
            "machine": self.machine.to_json(),
            "options": self.options.to_json(),
            "wall_s": self.wall_s,
            "rows": [row.to_json() for row in self.rows],
            "auto": [row.to_json() for row in self.auto],
            "decode_limit": self.decode_limit.to_json(),
            "crop_limit": limit(self.crop_limit),
            "region_decode_limit": limit(self.region_decode_limit),
            "memory_copy_bytes_per_s": self.memory_copy_bytes_per_s,
            "ffcv_version": self.ffcv_version,
            "stores": [row.to_json() for row in self.stores],
            "gpu_model_rate": self.gpu_model_rate and self.gpu_model_rate.to_json(),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any], out: Path) -> Report:
        version = data.get("schema_version")
        if version != SCHEMA_VERSION:
            raise ValueError(
                f"report.json: schema_version is {version!r}, this renderer reads "
                f"{SCHEMA_VERSION}: measure again (make bench)"
            )
        decode = DecodeLimit.from_json(data["decode_limit"])
        if decode is None:
            raise ValueError("report.json: decode_limit is null")
        return cls(
            options=Options.from_json(data["options"], out),
            machine=Machine.from_json(data["machine"]),
            wall_s=data["wall_s"],
            rows=[Row.from_json(row) for row in data["rows"]],
            decode_limit=decode,
            memory_copy_bytes_per_s=data["memory_copy_bytes_per_s"],
            stores=[StoreRow.from_json(row) for row in data.get("stores", [])],
            crop_limit=DecodeLimit.from_json(data.get("crop_limit")),
            region_decode_limit=DecodeLimit.from_json(data.get("region_decode_limit")),
            auto=[AutoRow.from_json(row) for row in data.get("auto", [])],
            ffcv_version=data.get("ffcv_version"),
            gpu_model_rate=GpuModelRate.from_json(data.get("gpu_model_rate")),
        )

    def write(self, path: Path) -> None:
        path.write_text(json.dumps(self.to_json(), indent=1) + "\n")

    @classmethod
    def load(cls, path: Path) -> Report:
        """The report in ``path``; a missing key or another schema is named with the file."""
        try:
            return cls.from_json(json.loads(path.read_text()), path.parent)
        except KeyError as error:
            raise ValueError(f"{path}: no key {error} (measure again: make bench)") from None
        except ValueError as error:
            raise ValueError(f"{path}: {error}") from None
