"""Loaders by name: ``build_loader(name, spec)``.

Each loader lives in its own module and registers itself with ``@register_loader``; modules are
imported on first use so that, say, SPDL's native libraries load only when ``loader=spdl``.
"""

from __future__ import annotations

import importlib

from loaderbench.loaders.base import (
    LOADERS,
    Batch,
    Loader,
    LoaderSpec,
    loader_spec,
    register_loader,
)

LOADER_MODULES: dict[str, str] = {
    "torchvision": "loaderbench.loaders.torchvision_loader",
    "memmap": "loaderbench.loaders.memmap_loader",
    "spdl": "loaderbench.loaders.spdl_loader",
}


def build_loader(name: str, spec: LoaderSpec) -> Loader:
    if name not in LOADER_MODULES:
        raise ValueError(f"loader.name={name!r} is unknown; choose one of {sorted(LOADER_MODULES)}")
    importlib.import_module(LOADER_MODULES[name])
    return LOADERS[name](spec)


__all__ = [
    "LOADERS",
    "Batch",
    "Loader",
    "LoaderSpec",
    "build_loader",
    "loader_spec",
    "register_loader",
]
