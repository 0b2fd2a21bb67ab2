"""Loaders by name: one sub-package of ``loaderbench.loaders`` per loader.

A loader is a folder here holding ``settings.py`` (its typed keys, a ``LoaderSettings``
subclass) and ``loader.py`` (the ``Loader``, registered with ``@register_loader``);
``conf/loader/<name>.yaml`` selects it. Loader modules are imported on first use, so SPDL's
native libraries load only when ``loader=spdl``. A loader kept elsewhere lives in a folder
named by ``LOADERBENCH_LOADER_PATH``, laid out as here, its YAML found through
``hydra.searchpath`` (docs/loaders.md, "Adding a loader").
"""

from __future__ import annotations

import functools
import importlib
import os
import pkgutil
from pathlib import Path
from typing import Any

from loaderbench.config.loader import LoaderSettings, is_worker_count
from loaderbench.loaders.base import LOADERS, Batch, Loader, LoaderSpec, register_loader

LOADER_PATH_ENV = "LOADERBENCH_LOADER_PATH"


def _extra_loader_folders() -> list[str]:
    """The folders ``LOADERBENCH_LOADER_PATH`` names; one that is not a folder fails here,
    naming it (else its loaders would be "unknown", with no word of why)."""
    folders = [part for part in os.environ.get(LOADER_PATH_ENV, "").split(os.pathsep) if part]
    for folder in folders:
        if not Path(folder).is_dir():
            raise NotADirectoryError(f"{LOADER_PATH_ENV}: {folder!r} is not a folder")
    return [str(Path(folder).resolve()) for folder in folders]


# Searched after this package's own folder, so a loader of the tree keeps its name.
__path__ = [*__path__, *_extra_loader_folders()]


@functools.cache
def loader_names() -> tuple[str, ...]:
    """Every loader: the sub-packages of this package (and of ``LOADERBENCH_LOADER_PATH``)."""
    return tuple(sorted(module.name for module in pkgutil.iter_modules(__path__) if module.ispkg))


def file_loader_names() -> tuple[str, ...]:
    """The loaders that read the data set's files: all but the ceiling, ``resident``."""
    return tuple(name for name in loader_names() if settings_class(name).reads_files)


def settings_class(name: str) -> type[LoaderSettings]:
    """The typed settings of loader ``name``."""
    if name not in loader_names():
        raise ValueError(f"loader={name!r} is unknown; choose one of {list(loader_names())}")
    return importlib.import_module(f"{__name__}.{name}.settings").Settings


def loader_class(spec: LoaderSpec) -> type[Loader]:
    """The class of loader ``spec.settings.name``; refuses a worker count not yet settled."""
    name = spec.settings.name
    settings_class(name)  # an unknown name fails here, naming the choices
    if not is_worker_count(spec.num_workers):
        raise ValueError(
            f"loader.num_workers={spec.num_workers!r}: a loader needs a count "
            "(loaderbench.autotune settles 'auto' before any loader is built)"
        )
    importlib.import_module(f"{__name__}.{name}.loader")
    return LOADERS[name]  # type: ignore[return-value]


def build_loader(spec: LoaderSpec) -> Loader:
    """The loader ``spec.settings.name``, built for ``spec``."""
    return loader_class(spec)(spec)


def prepare_loader(spec: LoaderSpec) -> dict[str, Any]:
    """``Loader.prepare`` of the loader ``spec.settings.name`` (memmap: its cache built)."""
    return loader_class(spec).prepare(spec)


__all__ = [
    "LOADER_PATH_ENV",
    "Batch",
    "Loader",
    "LoaderSettings",
    "LoaderSpec",
    "build_loader",
    "file_loader_names",
    "loader_names",
    "prepare_loader",
    "register_loader",
    "settings_class",
]
