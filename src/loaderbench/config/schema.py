"""The run's typed config: every key a user can set, with its type, default and range.

``RunConfig`` is the whole run (one field per group under ``conf/``: ``dataset``, ``loader``,
``model``, ``device``, ``precision``, ``logger``, ``optim``, ``scheduler``, ``augment``,
``train``, ``bench``, ``runtime``). Hydra composes the YAML against these schemas, and
``loaderbench.run.validation.validate_config`` converts the composed node into a ``RunConfig``
once, range checks included (each dataclass's ``checks``, each naming its key); the run's
rooms then take the typed piece they need and never read the composed node again.

Each config group under ``conf/`` pulls in its schema from here through its defaults list
(``defaults: [<group>_schema]``), so an override with a wrong type or an unknown key fails
at composition time, with OmegaConf's message naming the key. A loader's keys live with the
loader (``loaderbench/loaders/<name>/settings.py``) and are registered here as
``<name>_schema``; the defaults of every key are the dataclass fields' (the YAML files under
``conf/`` only pick a schema and say what differs).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, OmegaConf

from loaderbench.config.loader import AUTO, Check, is_worker_count
from loaderbench.data.splits import INDEX_CHECKS
from loaderbench.loaders import LoaderSettings, loader_names, settings_class
from loaderbench.platform.runtime import DEVICE_TYPES, PRECISIONS
from loaderbench.training.optim import OPTIMIZERS, SCHEDULES

ON_ERROR = ("skip", "raise")


def one_of(value: object, choices: Iterable[str], key: str) -> Check:
    """``value`` among ``choices`` (the names a registry knows)."""
    names = sorted(choices)
    return value in names, f"{key} must be one of {names}", value


def range_pair(values: list[float], key: str) -> Check:
    """``values`` as two numbers ``0 < low <= high``."""
    pair = list(values)
    ok = len(pair) == 2 and 0 < pair[0] <= pair[1]
    return ok, f"{key} must be two numbers 0 < low <= high", pair


@dataclass
class SyntheticConfig:
    """Parameters of the generated ImageNet-like set (used only when ``root`` is null)."""

    num_classes: int = 10
    train_per_class: int = 100
    val_per_class: int = 30
    seed: int = 0
    jpeg_quality: int = 90


@dataclass
class DatasetConfig:
    name: str = MISSING
    # An ImageFolder tree with train/ and val/. Null means: generate the synthetic set.
    root: str | None = None
    # Where the synthetic set is generated. Relative paths, here and in every key that names a
    # file or folder (root, train_list, val_list, loader.cache_dir, checkpoint), are relative
    # to the directory the command is run from.
    generated_dir: str = "data"
    synthetic: SyntheticConfig = field(default_factory=SyntheticConfig)
    # Per-split text files of relative image paths (ImageNet style); see loaderbench.data.discovery.
    train_list: str | None = None
    val_list: str | None = None
    # Use at most this many images a split (null: all). Handy for quick looks at big sets.
    max_images: int | None = None
    # An unreadable image (truncated, empty, not an image, over max_image_pixels): skip it
    # (counted in skipped_files, named in the log) or raise, naming it (ON_ERROR).
    on_error: str = "skip"
    # Refuse images with more pixels than this, from their header, before decoding (null: no
    # limit). The default is PIL's decompression-bomb threshold.
    max_image_pixels: int | None = 178_956_970
    # Where the dataset index (one scan of the tree, loaded by every rank and later run) is
    # kept; null: scan on every run. See loaderbench.data.index.
    index_dir: str | None = "cache"
    # Scan the tree again instead of loading a saved index.
    rescan: bool = False
    # How a saved index is checked against the disk, once a job: files (every file's size and
    # mtime, in parallel: sees a file rewritten in place) or folders (their mtimes only: for
    # file systems where per-file stats are slow; a file rewritten in place needs rescan=true).
    index_check: str = "files"

    def checks(self) -> list[Check]:
        return [
            (
                self.max_images is None or self.max_images >= 1,
                "dataset.max_images must be >= 1 or null",
                self.max_images,
            ),
            (
                self.max_image_pixels is None or self.max_image_pixels >= 1,
                "dataset.max_image_pixels must be >= 1 or null",
                self.max_image_pixels,
            ),
            (
                self.index_check in INDEX_CHECKS,
                f"dataset.index_check must be one of {list(INDEX_CHECKS)}",
                self.index_check,
            ),
            (
                self.on_error in ON_ERROR,
                f"dataset.on_error must be one of {list(ON_ERROR)}",
                self.on_error,
            ),
        ]


@dataclass
class ModelConfig:
    name: str = MISSING
    pretrained: bool = False
    channels_last: bool = False
    compile: bool = False
    compile_mode: str | None = None
    drop_rate: float = 0.0
    # Extra keyword arguments for timm.create_model.
    kwargs: dict[str, Any] = field(default_factory=dict)

    def checks(self) -> list[Check]:
        drop = self.drop_rate
        return [(0 <= drop < 1, "model.drop_rate must be >= 0 and < 1", drop)]


@dataclass
class DeviceConfig:
    # After ``runtime.resolve_device`` the run writes the device it resolved to (``auto``: cpu
    # or cuda, and the GPU's index) back here, so run_config.json says what ran.
    type: str = "auto"
    index: int = 0

    def checks(self) -> list[Check]:
        return [
            one_of(self.type, DEVICE_TYPES, "device.type"),
            (self.index >= 0, "device.index must be >= 0", self.index),
        ]


@dataclass
class PrecisionConfig:
    name: str = "fp32"

    def checks(self) -> list[Check]:
        return [one_of(self.name, PRECISIONS, "precision.name")]


@dataclass
class LoggerConfig:
    name: str = "none"
    project: str = "loaderbench"
    entity: str | None = None
    # null: read WANDB_MODE; offline when unset.
    mode: str | None = None
    tags: list[str] = field(default_factory=list)
    init_timeout_s: float = 20.0
    # The training loop reads its loss from the device every this many steps (and at the end
    # of an epoch), never in between: the log points of the progress bar and the step curves.
    log_every_n_steps: int = 50
    # train.py: the last checkpoint as a W&B artifact (type model, named after the run).
    log_checkpoint: bool = False

    def checks(self) -> list[Check]:
        every = self.log_every_n_steps
        return [(every >= 1, "logger.log_every_n_steps must be >= 1", every)]


@dataclass
class OptimConfig:
    name: str = "sgd"
    lr: float = 0.2
    momentum: float = 0.9
    nesterov: bool = True
    weight_decay: float = 5e-5
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])

    def checks(self) -> list[Check]:
        betas = list(self.betas)
        return [
            one_of(self.name, OPTIMIZERS, "optim.name"),
            (math.isfinite(self.lr) and self.lr > 0, "optim.lr must be > 0", self.lr),
            (self.momentum >= 0, "optim.momentum must be >= 0", self.momentum),
            (self.weight_decay >= 0, "optim.weight_decay must be >= 0", self.weight_decay),
            (
                len(betas) == 2 and all(0 <= beta < 1 for beta in betas),
                "optim.betas must be two numbers >= 0 and < 1",
                betas,
            ),
        ]


@dataclass
class SchedulerConfig:
    name: str = "cosine"
    warmup_epochs: float = 1.0
    min_lr_ratio: float = 0.0

    def checks(self) -> list[Check]:
        warmup, floor = self.warmup_epochs, self.min_lr_ratio
        return [
            one_of(self.name, SCHEDULES, "scheduler.name"),
            (warmup >= 0, "scheduler.warmup_epochs must be >= 0", warmup),
            (0 <= floor <= 1, "scheduler.min_lr_ratio must be >= 0 and <= 1", floor),
        ]


@dataclass
class BenchConfig:
    # images_per_s counts from this batch on: the first batches pay for start-up.
    warmup_batches: int = 3
    # Stop an epoch after this many batches (null: the whole epoch).
    max_batches: int | None = None
    # Passes over the data in a model=none run, and in eval.py's throughput with a model
    # (its accuracy is the first pass's). auto: passes until the steady window holds
    # min_window_batches and min_window_s, within max_measure_s (``run.autorange``); an
    # integer: that many. Typed Any: OmegaConf 2.3 has no union of int and str.
    epochs: Any = AUTO
    min_window_batches: int = 10
    min_window_s: float = 0.5
    # The bound on auto's passes (seconds from the first pass's start): a data set whose one
    # pass is longer than this gets one pass.
    max_measure_s: float = 20.0
    # Wait for the device after each batch's arrival and each step: a per-step breakdown of
    # data and compute time, at the cost of the overlap a real run has (see meters.py).
    sync_cuda: bool = False
    # Evict the image files and the loader's cache files from the page cache before the run
    # (posix_fadvise DONTNEED), to measure a cold first epoch.
    drop_page_cache: bool = False
    # A train or eval job with a model ends with a pass over loader=resident (the model's own
    # rate: ceiling_images_per_s, ceiling_frac) of at least this many steady batches and
    # min_window_s (passes as auto's, within max_measure_s); 0: no pass.
    ceiling_batches: int = 10

    def checks(self) -> list[Check]:
        warmup, most, epochs = self.warmup_batches, self.max_batches, self.epochs
        passes = epochs == AUTO or (is_worker_count(epochs) and epochs >= 1)
        return [
            (passes, f"bench.epochs must be an integer >= 1 or {AUTO!r}", epochs),
            (
                self.min_window_batches >= 1,
                "bench.min_window_batches must be >= 1",
                self.min_window_batches,
            ),
            (self.min_window_s >= 0, "bench.min_window_s must be >= 0", self.min_window_s),
            (self.max_measure_s > 0, "bench.max_measure_s must be > 0", self.max_measure_s),
            (warmup >= 0, "bench.warmup_batches must be >= 0", warmup),
            (
                self.ceiling_batches >= 0,
                "bench.ceiling_batches must be >= 0",
                self.ceiling_batches,
            ),
            (most is None or most >= 1, "bench.max_batches must be >= 1 or null", most),
        ]


@dataclass
class AugmentConfig:
    """The train pipeline's random-resized crop (the same in every loader)."""

    # Area fraction and aspect-ratio range of the crop; ImageNet's defaults.
    scale: list[float] = field(default_factory=lambda: [0.08, 1.0])
    ratio: list[float] = field(default_factory=lambda: [0.75, 1.3333333333333333])

    def checks(self) -> list[Check]:
        return [range_pair(self.scale, "augment.scale"), range_pair(self.ratio, "augment.ratio")]


@dataclass
class TrainLoopConfig:
    label_smoothing: float = 0.1
    grad_clip: float | None = None
    # Continue from checkpoint=PATH (model, optimizer, schedule, epoch, RNG) to `epochs`.
    resume: bool = False
    # Stop after this many epochs in this run (a time-limited job that a resumed one continues).
    stop_after_epochs: int | None = None

    def checks(self) -> list[Check]:
        stop_after = self.stop_after_epochs
        return [
            (
                stop_after is None or stop_after >= 1,
                "train.stop_after_epochs must be >= 1",
                stop_after,
            )
        ]


@dataclass
class RuntimeConfig:
    # torch's intra-op threads in each process (null: the CPUs the process was given by SLURM
    # or torchrun, less its loader's workers; torch's default in a plain run).
    threads: int | None = None

    def checks(self) -> list[Check]:
        threads = self.threads
        return [(threads is None or threads >= 1, "runtime.threads must be >= 1 or null", threads)]


@dataclass
class RunConfig:
    """The primary config of train.py and eval.py: Hydra's schema for composing it, and the
    typed object the run takes once validated (``validate_config``). ``loader`` holds the
    chosen loader's own ``Settings`` as composed; it is never rewritten: the ``auto`` probe and
    an elastic resume return the settled settings the run goes on with (``run.session``)."""

    task: str = MISSING
    seed: int = 0
    # null (eval.py): the checkpoint's own, or 64 without one.
    image_size: int | None = 64
    epochs: int = 1
    checkpoint: str | None = None
    dataset: DatasetConfig = MISSING
    loader: LoaderSettings = MISSING
    model: ModelConfig = MISSING
    device: DeviceConfig = MISSING
    precision: PrecisionConfig = MISSING
    logger: LoggerConfig = MISSING
    optim: OptimConfig = field(default_factory=OptimConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    augment: AugmentConfig = field(default_factory=AugmentConfig)
    train: TrainLoopConfig = field(default_factory=TrainLoopConfig)
    bench: BenchConfig = field(default_factory=BenchConfig)
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)

    def checks(self) -> list[Check]:
        """Every range check of the run: the loader's first, then each group's."""
        image_size = self.image_size
        return [
            *self.loader.checks(),
            (image_size is None or image_size >= 8, "image_size must be >= 8", image_size),
            (self.epochs >= 1, "epochs must be >= 1", self.epochs),
            *self.train.checks(),
            *self.logger.checks(),
            *self.runtime.checks(),
            *self.bench.checks(),
            *self.dataset.checks(),
            *self.augment.checks(),
            *self.model.checks(),
            *self.device.checks(),
            *self.precision.checks(),
            *self.optim.checks(),
            *self.scheduler.checks(),
        ]


# Each group's schema: what ``validate_config`` types the composed node's group as (the
# loader's is the chosen loader's own ``Settings``, a subclass of ``LoaderSettings``).
SCHEMAS: dict[str, type] = {
    "dataset": DatasetConfig,
    "loader": LoaderSettings,
    "model": ModelConfig,
    "device": DeviceConfig,
    "precision": PrecisionConfig,
    "logger": LoggerConfig,
    "optim": OptimConfig,
    "scheduler": SchedulerConfig,
    "augment": AugmentConfig,
    "train": TrainLoopConfig,
    "bench": BenchConfig,
    "runtime": RuntimeConfig,
}

# The groups Hydra's config store takes a ``<group>_schema`` entry for (``conf/<group>/``).
STORED_GROUPS = ("dataset", "loader", "model", "device", "precision", "logger")


# `model=<name>` for these timm architectures, with no YAML file each (conf/model/timm.yaml
# takes any other name: `model=timm model.name=convnext_tiny`).
NAMED_MODELS = ("mobilenetv3_large_100", "resnet10t", "resnet18", "resnet50", "test_resnet")


def _run_stamp(default: str) -> str:
    """The run directory's last part: shared by every rank of one torchrun/SLURM launch, so
    they all write into one run directory; the time of day otherwise."""
    from loaderbench.platform.distributed import run_id

    return run_id() or default


def register_configs() -> None:
    """Register the schemas with Hydra's ConfigStore (idempotent)."""
    if not OmegaConf.has_resolver("run_stamp"):
        OmegaConf.register_new_resolver("run_stamp", _run_stamp)
    if not OmegaConf.has_resolver("if_cuda"):
        # The SLURM launchers' resources: GPUs only for device=cuda (conf/hydra/launcher/).
        OmegaConf.register_new_resolver(
            "if_cuda", lambda device, on_cuda, otherwise: on_cuda if device == "cuda" else otherwise
        )
    store = ConfigStore.instance()
    store.store(name="run_schema", node=RunConfig)
    for group in STORED_GROUPS:
        store.store(group=group, name=f"{group}_schema", node=SCHEMAS[group])
    for name in loader_names():  # each loader's own typed keys, from its package
        store.store(group="loader", name=f"{name}_schema", node=settings_class(name))
    for name in NAMED_MODELS:
        store.store(group="model", name=name, node=ModelConfig(name=name))


register_configs()
