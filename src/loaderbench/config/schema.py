"""The run's typed config: every key a user can set, with its type, default and range.

``RunConfig`` is the whole run (one field per group under ``conf/``: ``dataset``, ``loader``,
``model``, ``device``, ``precision``, ``logger``, ``optim``, ``scheduler``, ``augment``,
``train``, ``bench``, ``runtime``). Each dataclass checks its ranges in ``__post_init__``
(``config.checks``), naming the key; the names a registry knows (optimisers, devices) are
checked where the registries are, in ``loaderbench.run._validation``. Hydra composes the YAML
against these schemas (registered by ``loaderbench.run.compose``); a loader's own keys live with
the loader (``loaderbench/loaders/<name>/settings.py``). The defaults of every key are the
dataclass fields' (the YAML files under ``conf/`` only pick a schema and say what differs).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from omegaconf import MISSING

from loaderbench.config.checks import require, require_one_of, require_range_pair
from loaderbench.config.loader import AUTO, LoaderSettings, is_worker_count

ON_ERROR = ("skip", "raise")
# dataset.index_check: how a saved dataset index is checked against the disk.
INDEX_CHECKS = ("files", "folders")


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
    # kept; null: scan on every run. See loaderbench.data._index.
    index_dir: str | None = "cache"
    # Scan the tree again instead of loading a saved index.
    rescan: bool = False
    # How a saved index is checked against the disk, once a job: files (every file's size and
    # mtime, in parallel: sees a file rewritten in place) or folders (their mtimes only: for
    # file systems where per-file stats are slow; a file rewritten in place needs rescan=true).
    index_check: str = "files"

    def __post_init__(self) -> None:
        most, pixels = self.max_images, self.max_image_pixels
        require(most is None or most >= 1, "dataset.max_images must be >= 1 or null", most)
        require(
            pixels is None or pixels >= 1, "dataset.max_image_pixels must be >= 1 or null", pixels
        )
        require_one_of(self.index_check, INDEX_CHECKS, "dataset.index_check")
        require_one_of(self.on_error, ON_ERROR, "dataset.on_error")


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

    def __post_init__(self) -> None:
        drop = self.drop_rate
        require(0 <= drop < 1, "model.drop_rate must be >= 0 and < 1", drop)


@dataclass
class DeviceConfig:
    # After ``runtime.resolve_device`` the run writes the device it resolved to (``auto``: cpu
    # or cuda, and the GPU's index) back here, so run_config.json says what ran.
    type: str = "auto"
    index: int = 0

    def __post_init__(self) -> None:
        require(self.index >= 0, "device.index must be >= 0", self.index)


@dataclass
class PrecisionConfig:
    name: str = "fp32"


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

    def __post_init__(self) -> None:
        every = self.log_every_n_steps
        require(every >= 1, "logger.log_every_n_steps must be >= 1", every)


@dataclass
class OptimConfig:
    name: str = "sgd"
    lr: float = 0.2
    momentum: float = 0.9
    nesterov: bool = True
    weight_decay: float = 5e-5
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])

    def __post_init__(self) -> None:
        betas = list(self.betas)
        require(math.isfinite(self.lr) and self.lr > 0, "optim.lr must be > 0", self.lr)
        require(self.momentum >= 0, "optim.momentum must be >= 0", self.momentum)
        require(self.weight_decay >= 0, "optim.weight_decay must be >= 0", self.weight_decay)
        require(
            len(betas) == 2 and all(0 <= beta < 1 for beta in betas),
            "optim.betas must be two numbers >= 0 and < 1",
            betas,
        )


@dataclass
class SchedulerConfig:
    name: str = "cosine"
    warmup_epochs: float = 1.0
    min_lr_ratio: float = 0.0

    def __post_init__(self) -> None:
        warmup, floor = self.warmup_epochs, self.min_lr_ratio
        require(warmup >= 0, "scheduler.warmup_epochs must be >= 0", warmup)
        require(0 <= floor <= 1, "scheduler.min_lr_ratio must be >= 0 and <= 1", floor)


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

    def __post_init__(self) -> None:
        warmup, most, epochs = self.warmup_batches, self.max_batches, self.epochs
        passes = epochs == AUTO or (is_worker_count(epochs) and epochs >= 1)
        require(passes, f"bench.epochs must be an integer >= 1 or {AUTO!r}", epochs)
        window = self.min_window_batches
        require(window >= 1, "bench.min_window_batches must be >= 1", window)
        require(self.min_window_s >= 0, "bench.min_window_s must be >= 0", self.min_window_s)
        require(self.max_measure_s > 0, "bench.max_measure_s must be > 0", self.max_measure_s)
        require(warmup >= 0, "bench.warmup_batches must be >= 0", warmup)
        ceiling = self.ceiling_batches
        require(ceiling >= 0, "bench.ceiling_batches must be >= 0", ceiling)
        require(most is None or most >= 1, "bench.max_batches must be >= 1 or null", most)


@dataclass
class AugmentConfig:
    """The train pipeline's random-resized crop (the same in every loader)."""

    # Area fraction and aspect-ratio range of the crop; ImageNet's defaults.
    scale: list[float] = field(default_factory=lambda: [0.08, 1.0])
    ratio: list[float] = field(default_factory=lambda: [0.75, 1.3333333333333333])

    def __post_init__(self) -> None:
        require_range_pair(self.scale, "augment.scale")
        require_range_pair(self.ratio, "augment.ratio")


@dataclass
class TrainLoopConfig:
    label_smoothing: float = 0.1
    grad_clip: float | None = None
    # Continue from checkpoint=PATH (model, optimizer, schedule, epoch, RNG) to `epochs`.
    resume: bool = False
    # Stop after this many epochs in this run (a time-limited job that a resumed one continues).
    stop_after_epochs: int | None = None

    def __post_init__(self) -> None:
        stop_after = self.stop_after_epochs
        require(
            stop_after is None or stop_after >= 1,
            "train.stop_after_epochs must be >= 1",
            stop_after,
        )


@dataclass
class RuntimeConfig:
    # torch's intra-op threads in each process (null: the CPUs the process was given by SLURM
    # or torchrun, less its loader's workers; torch's default in a plain run).
    threads: int | None = None

    def __post_init__(self) -> None:
        threads = self.threads
        require(threads is None or threads >= 1, "runtime.threads must be >= 1 or null", threads)


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

    def __post_init__(self) -> None:
        image_size = self.image_size
        require(image_size is None or image_size >= 8, "image_size must be >= 8", image_size)
        require(self.epochs >= 1, "epochs must be >= 1", self.epochs)


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
