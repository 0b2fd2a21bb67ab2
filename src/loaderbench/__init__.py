"""loaderbench: fast, measurable, comparable image data loading for PyTorch training.

The face of the package: what a fourth loader is written against (its settings, the interface,
the registry, the split it reads, the crops every loader shares) and what a script around a run
needs (the typed config, discovery). The layers below are packages of their own, each with its
face (docs/design.md maps them); ``loaderbench.app`` is what train.py and eval.py run.
"""

from loaderbench.config.checks import ConfigError
from loaderbench.config.loader import LoaderSettings
from loaderbench.config.schema import RunConfig
from loaderbench.data.discovery import discover
from loaderbench.data.splits import DatasetIndex, Split
from loaderbench.imaging.crops import seeded_crops
from loaderbench.loaders import (
    Batch,
    Loader,
    LoaderSpec,
    build_loader,
    loader_names,
    register_loader,
    settings_class,
)
from loaderbench.platform.version import VERSION as __version__

__all__ = [
    "Batch",
    "ConfigError",
    "DatasetIndex",
    "Loader",
    "LoaderSettings",
    "LoaderSpec",
    "RunConfig",
    "Split",
    "__version__",
    "build_loader",
    "discover",
    "loader_names",
    "register_loader",
    "seeded_crops",
    "settings_class",
]
