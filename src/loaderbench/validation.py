"""Config checks that run before any heavy work, each naming the key and the allowed values.

Composition already rejects wrong types and unknown keys given as ``key=value``; this also
catches keys added with ``+key=value`` and values outside their allowed set or range. It is the
one place settings are checked: ``validate_config`` returns the loader's typed settings, which
the loaders then take as they are.
"""

from __future__ import annotations

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from loaderbench.config import ON_ERROR, SCHEMAS
from loaderbench.loaders import LoaderSettings, loader_names, settings_class
from loaderbench.loaders.settings import Check, failed_checks


class ConfigError(ValueError):
    pass


def _typed(node: DictConfig, schema: type, key: str) -> object:
    """``node`` as an instance of ``schema``; a ConfigError naming the key if it does not fit."""
    try:
        merged = OmegaConf.merge(OmegaConf.structured(schema), OmegaConf.to_container(node))
        return OmegaConf.to_object(merged)
    except OmegaConfBaseException as error:
        message = str(error).splitlines()[0]
        raise ConfigError(f"{key}: {message}") from None


def _range_pair(values: object, key: str) -> Check:
    pair = list(values)  # type: ignore[call-overload]
    ok = len(pair) == 2 and 0 < pair[0] <= pair[1]
    return ok, f"{key} must be two numbers 0 < low <= high", pair


def _run_checks(cfg: DictConfig) -> list[Check]:
    dataset, bench = cfg.dataset, cfg.bench
    stop_after = cfg.train.stop_after_epochs
    return [
        (cfg.image_size is None or cfg.image_size >= 8, "image_size must be >= 8", cfg.image_size),
        (cfg.epochs >= 1, "epochs must be >= 1", cfg.epochs),
        (stop_after is None or stop_after >= 1, "train.stop_after_epochs must be >= 1", stop_after),
        (
            cfg.logger.log_every_n_steps >= 1,
            "logger.log_every_n_steps must be >= 1",
            cfg.logger.log_every_n_steps,
        ),
        (
            cfg.runtime.threads is None or cfg.runtime.threads >= 1,
            "runtime.threads must be >= 1 or null",
            cfg.runtime.threads,
        ),
        (bench.warmup_batches >= 0, "bench.warmup_batches must be >= 0", bench.warmup_batches),
        (
            bench.max_batches is None or bench.max_batches >= 1,
            "bench.max_batches must be >= 1 or null",
            bench.max_batches,
        ),
        (
            dataset.max_images is None or dataset.max_images >= 1,
            "dataset.max_images must be >= 1 or null",
            dataset.max_images,
        ),
        (
            dataset.max_image_pixels is None or dataset.max_image_pixels >= 1,
            "dataset.max_image_pixels must be >= 1 or null",
            dataset.max_image_pixels,
        ),
        (
            dataset.on_error in ON_ERROR,
            f"dataset.on_error must be one of {list(ON_ERROR)}",
            dataset.on_error,
        ),
        _range_pair(cfg.augment.scale, "augment.scale"),
        _range_pair(cfg.augment.ratio, "augment.ratio"),
    ]


def validate_config(cfg: DictConfig) -> LoaderSettings:
    """Check every group and range; returns the loader's typed settings."""
    name = cfg.loader.name
    if name not in loader_names():
        raise ConfigError(f"loader={name!r} is unknown; choose one of {list(loader_names())}")
    settings = _typed(cfg.loader, settings_class(name), "loader")
    assert isinstance(settings, LoaderSettings)
    for group, schema in SCHEMAS.items():
        if group != "loader":
            _typed(cfg[group], schema, group)
    problems = failed_checks([*settings.checks(), *_run_checks(cfg)])
    if problems:
        raise ConfigError("; ".join(problems))
    return settings


def validate_against_dataset(
    settings: LoaderSettings, train_images: int, task: str, ranks: int
) -> None:
    """Checks that need the dataset's size, made right after discovery (before a cache build
    or a model): training drops the last partial batch, so a batch larger than a rank's share
    of the train set would make every epoch empty."""
    if task == "train" and settings.batch_size > train_images // ranks:
        raise ConfigError(
            f"loader.batch_size={settings.batch_size} is larger than the train set "
            f"({train_images} images"
            + (f" over {ranks} ranks" if ranks > 1 else "")
            + ") and training drops the last partial batch; lower loader.batch_size"
        )
