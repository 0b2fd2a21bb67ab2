"""``loader=torchvision``: an ImageFolder-style dataset + DataLoader worker processes.

The names below are the package's public face (what the benchmark's classic float pipeline is
built on). They are loaded on first use: the loader registry imports ``torchvision.settings`` in
every run to learn its keys, and that must not import the loader's module where
``loader=torchvision`` is not chosen.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from loaderbench.loaders.torchvision.loader import EveryEpoch, ImageFileDataset

# Each public name -> the module of this package that defines it.
_PUBLIC = {"EveryEpoch": "loader", "ImageFileDataset": "loader"}
__all__ = ["EveryEpoch", "ImageFileDataset"]


def __getattr__(name: str) -> Any:
    """A public name, imported from its module on first use."""
    if name not in _PUBLIC:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_PUBLIC[name]}"), name)
