"""Loaders by name: one sub-package of ``loaderbench.loaders`` per loader.

A loader is a folder here holding ``settings.py`` (its typed keys, a ``Settings`` subclass of
``LoaderSettings``) and ``loader.py`` (the ``Loader`` subclass, registered with
``@register_loader``), plus whatever only it uses; ``conf/loader/<name>.yaml`` selects it.
Loader modules are imported on first use, so that, say, SPDL's native libraries load only when
``loader=spdl``.
"""

from __future__ import annotations

import functools
import importlib
import pkgutil
from typing import Any

from loaderbench.loaders.base import LOADERS, Batch, Loader, LoaderSpec, register_loader
from loaderbench.loaders.settings import LoaderSettings, is_worker_count


@functools.cache
def loader_names() -> tuple[str, ...]:
    """Every loader: the sub-packages of this package."""
    return tuple(sorted(module.name for module in pkgutil.iter_modules(__path__) if module.ispkg))


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
    "Batch",
    "Loader",
    "LoaderSettings",
    "LoaderSpec",
    "build_loader",
    "loader_names",
    "prepare_loader",
    "register_loader",
    "settings_class",
]
