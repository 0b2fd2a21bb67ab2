"""The keys every loader shares (``loader.*``), typed, with their defaults and range checks.

Each loader's package adds its own keys in ``<loader>/settings.py`` (a subclass named
``Settings``); Hydra composes ``conf/loader/<loader>.yaml`` against it, and the run turns the
composed node into that object once (``loaderbench.validation``), so a loader receives its
settings whole and typed, never re-applies a default and never re-checks a range.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from omegaconf import MISSING

Check = tuple[bool, str, object]  # (holds, "key must be ...", the value)


def failed_checks(checks: Iterable[Check]) -> list[str]:
    """``"<rule>, got <value>"`` for every check that does not hold."""
    return [f"{rule}, got {value!r}" for holds, rule, value in checks if not holds]


@dataclass
class LoaderSettings:
    name: str = MISSING
    batch_size: int = 32
    # The parallelism a sweep turns; what a worker is depends on the loader (README: "What
    # num_workers and prefetch mean"): processes (torchvision), decode threads (spdl), reading
    # threads and cache-build processes (memmap). 0: everything in the main thread.
    num_workers: int = 2
    # Batches in flight or ready ahead of the main loop, in total over the workers (each
    # loader keeps at least one per worker busy).
    prefetch: int = 4
    # On CUDA: gather or decode into pinned host memory, copy without blocking.
    pin_memory: bool = True

    def checks(self) -> list[Check]:
        """Range checks of this loader's keys; subclasses add theirs."""
        return [
            (self.batch_size >= 1, "loader.batch_size must be >= 1", self.batch_size),
            (self.num_workers >= 0, "loader.num_workers must be >= 0", self.num_workers),
            (self.prefetch >= 1, "loader.prefetch must be >= 1", self.prefetch),
        ]
