"""``loader=resident`` keys: only the shared ones; it has no workers and reads no file."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from loaderbench.config.loader import LoaderSettings


@dataclass
class Settings(LoaderSettings):
    # Nothing runs beside the loop: the batch is made once, on the device, when the loader is
    # built. ``num_workers`` and ``prefetch`` are accepted (a sweep may turn them for every
    # loader) and change nothing.
    num_workers: Any = 0

    @classmethod
    def reads_files(cls) -> bool:
        return False

    @classmethod
    def contract_exemptions(cls) -> dict[str, str]:
        why = "loader=resident serves one made-up batch again and again"
        return {
            "reference_pixels": f"{why}: its pixels are no image's",
            "unreadable_files": f"{why}: it reads no file, so none is unreadable",
            "pixel_shares": f"{why}: its shares differ in labels only, not in pixels",
        }
