"""The run's config, converted once: the composed node to a typed ``RunConfig``, checked.

Composition already rejects wrong types and unknown keys given as ``key=value``; this also
catches keys added with ``+key=value`` inside a group, values outside their range (each
schema's ``__post_init__``, in ``loaderbench.config.schema``) and names no registry knows (the
optimiser, the schedule, the device, the precision: the registries live above the schemas). It
is the one place the composed node is read: ``validate_config`` returns the whole typed run
config, whose pieces the run's rooms take as they are, never re-applying a default or
re-checking a range.
"""

from __future__ import annotations

from dataclasses import fields

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from loaderbench.config.checks import ConfigError, require_one_of
from loaderbench.config.schema import SCHEMAS, RunConfig
from loaderbench.loaders import LoaderSettings, loader_names, settings_class
from loaderbench.platform.runtime import DEVICE_TYPES, PRECISIONS
from loaderbench.training.optim import OPTIMIZERS, SCHEDULES

__all__ = ["ConfigError", "validate_against_dataset", "validate_config"]


def _typed(node: DictConfig, schema: type, key: str) -> object:
    """``node`` as an instance of ``schema``; a ConfigError naming the key if it does not fit."""
    try:
        merged = OmegaConf.merge(OmegaConf.structured(schema), OmegaConf.to_container(node))
        return OmegaConf.to_object(merged)
    except OmegaConfBaseException as error:
        message = str(error).splitlines()[0]
        raise ConfigError(f"{key}: {message}") from None


def validate_config(cfg: DictConfig) -> RunConfig:
    """The composed config as one typed ``RunConfig``: every group typed and every range
    checked, each error naming its key."""
    name = cfg.loader.name
    if name not in loader_names():
        raise ConfigError(f"loader={name!r} is unknown; choose one of {list(loader_names())}")
    schemas = {**SCHEMAS, "loader": settings_class(name)}
    pieces = {
        item.name: _typed(cfg[item.name], schemas[item.name], item.name)
        if item.name in schemas
        else cfg[item.name]
        for item in fields(RunConfig)
    }
    run = RunConfig(**pieces)
    assert isinstance(run.loader, LoaderSettings)
    _check_registered_names(run)
    return run


def _check_registered_names(run: RunConfig) -> None:
    """The names the registries above the schemas know (``require_one_of``: a ConfigError)."""
    require_one_of(run.device.type, DEVICE_TYPES, "device.type")
    require_one_of(run.precision.name, PRECISIONS, "precision.name")
    require_one_of(run.optim.name, OPTIMIZERS, "optim.name")
    require_one_of(run.scheduler.name, SCHEDULES, "scheduler.name")


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
