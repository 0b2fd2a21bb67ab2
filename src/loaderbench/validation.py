"""Config checks that run before any heavy work, each naming the key and the allowed values.

Composition already rejects wrong types and unknown keys given as ``key=value``; this also
catches keys added with ``+key=value`` and values outside their allowed set or range.
"""

from __future__ import annotations

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from loaderbench.config import _LOADER_SCHEMAS, _SCHEMAS

ON_ERROR = ("skip", "raise")


class ConfigError(ValueError):
    pass


def _check_schema(node: DictConfig, schema: type, key: str) -> None:
    try:
        OmegaConf.merge(OmegaConf.structured(schema), OmegaConf.to_container(node))
    except OmegaConfBaseException as error:
        message = str(error).splitlines()[0]
        raise ConfigError(f"{key}: {message}") from None


def validate_config(cfg: DictConfig) -> None:
    from loaderbench.loaders import LOADER_MODULES

    loader = cfg.loader.name
    if loader not in LOADER_MODULES:
        raise ConfigError(f"loader={loader!r} is unknown; choose one of {sorted(LOADER_MODULES)}")
    _check_schema(cfg.loader, _LOADER_SCHEMAS[loader], "loader")
    for group, schema in _SCHEMAS.items():
        if group != "loader":
            _check_schema(cfg[group], schema, group)
    checks = [
        (cfg.loader.batch_size >= 1, "loader.batch_size must be >= 1", cfg.loader.batch_size),
        (cfg.loader.num_workers >= 0, "loader.num_workers must be >= 0", cfg.loader.num_workers),
        (cfg.loader.prefetch >= 1, "loader.prefetch must be >= 1", cfg.loader.prefetch),
        (cfg.image_size is None or cfg.image_size >= 8, "image_size must be >= 8", cfg.image_size),
        (cfg.epochs >= 1, "epochs must be >= 1", cfg.epochs),
        (
            cfg.train.stop_after_epochs is None or cfg.train.stop_after_epochs >= 1,
            "train.stop_after_epochs must be >= 1 or null",
            cfg.train.stop_after_epochs,
        ),
        (
            cfg.bench.warmup_batches >= 0,
            "bench.warmup_batches must be >= 0",
            cfg.bench.warmup_batches,
        ),
        (
            cfg.bench.max_batches is None or cfg.bench.max_batches >= 1,
            "bench.max_batches must be >= 1 or null",
            cfg.bench.max_batches,
        ),
        (
            cfg.dataset.max_image_pixels is None or cfg.dataset.max_image_pixels >= 1,
            "dataset.max_image_pixels must be >= 1 or null",
            cfg.dataset.max_image_pixels,
        ),
        (
            cfg.dataset.on_error in ON_ERROR,
            f"dataset.on_error must be one of {ON_ERROR}",
            cfg.dataset.on_error,
        ),
    ]
    if loader == "spdl":
        from loaderbench.loaders.spdl.decoders import DECODERS

        checks.append(
            (
                cfg.loader.decoder in DECODERS,
                f"loader.decoder must be one of {sorted(DECODERS)}",
                cfg.loader.decoder,
            )
        )
    for ok, message, value in checks:
        if not ok:
            raise ConfigError(f"{message}, got {value!r}")


def validate_against_dataset(cfg: DictConfig, train_images: int, task: str, ranks: int) -> None:
    """Checks that need the dataset's size, made right after discovery (before a cache build
    or a model): training drops the last partial batch, so a batch larger than a rank's share
    of the train set would make every epoch empty."""
    if task == "train" and cfg.loader.batch_size > train_images // ranks:
        raise ConfigError(
            f"loader.batch_size={cfg.loader.batch_size} is larger than the train set "
            f"({train_images} images"
            + (f" over {ranks} ranks" if ranks > 1 else "")
            + ") and training drops the last partial batch; lower loader.batch_size"
        )
