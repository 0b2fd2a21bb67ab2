"""``loader=memmap``: a decoded uint8 cache on disk (a tensordict TensorClass over memory-mapped
files), read a whole batch at a time: ``loader`` serves batches, ``cache`` finds, builds and opens
the cache folders, ``build`` is what every store shares, ``store_raw`` and ``store_jpeg`` the two
ways of keeping the images.

The names below are the package's public face (what the benchmark uses: its crop-and-resize
limit and FFCV's stores are built as the raw store keeps images). They are loaded on first use:
the loader registry imports ``memmap.settings`` in every run to learn its keys, and that must not
import the store's modules (tensordict, the build's worker pool) where ``loader=memmap`` is not
chosen.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from loaderbench.loaders.memmap.build import StorePolicy, decode_stored
    from loaderbench.loaders.memmap.settings import Settings
    from loaderbench.loaders.memmap.store_raw import write_fit

# Each public name -> the module of this package that defines it.
_PUBLIC = {
    "Settings": "settings",
    "StorePolicy": "build",
    "decode_stored": "build",
    "write_fit": "store_raw",
}
__all__ = ["Settings", "StorePolicy", "decode_stored", "write_fit"]


def __getattr__(name: str) -> Any:
    """A public name, imported from its module on first use."""
    if name not in _PUBLIC:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_PUBLIC[name]}"), name)
