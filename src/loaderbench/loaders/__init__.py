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

from loaderbench.loaders.base import LOADERS, Batch, Loader, LoaderSpec, register_loader
from loaderbench.loaders.settings import LoaderSettings


@functools.cache
def loader_names() -> tuple[str, ...]:
    """Every loader: the sub-packages of this package."""
    return tuple(sorted(module.name for module in pkgutil.iter_modules(__path__) if module.ispkg))


def settings_class(name: str) -> type[LoaderSettings]:
    """The typed settings of loader ``name``."""
    if name not in loader_names():
        raise ValueError(f"loader={name!r} is unknown; choose one of {list(loader_names())}")
    return importlib.import_module(f"{__name__}.{name}.settings").Settings


def build_loader(spec: LoaderSpec) -> Loader:
    """The loader ``spec.settings.name``, built for ``spec``."""
    name = spec.settings.name
    settings_class(name)  # an unknown name fails here, naming the choices
    importlib.import_module(f"{__name__}.{name}.loader")
    return LOADERS[name](spec)


__all__ = [
    "Batch",
    "Loader",
    "LoaderSettings",
    "LoaderSpec",
    "build_loader",
    "loader_names",
    "register_loader",
    "settings_class",
]
