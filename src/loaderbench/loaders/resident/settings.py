"""``loader=resident`` keys: only the shared ones; it has no workers and reads no file."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from loaderbench.config.loader import LoaderSettings


@dataclass
class Settings(LoaderSettings):
    reads_files: ClassVar[bool] = False

    # Nothing runs beside the loop: the batch is made once, on the device, when the loader is
    # built. ``num_workers`` and ``prefetch`` are accepted (a sweep may turn them for every
    # loader) and change nothing.
    num_workers: Any = 0
