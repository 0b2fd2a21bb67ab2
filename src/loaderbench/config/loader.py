"""The keys every loader shares (``loader.*``), typed, with their defaults and range checks.

Each loader's package adds its own keys in ``<loader>/settings.py`` (a subclass named
``Settings``); Hydra composes ``conf/loader/<loader>.yaml`` against it, and the run turns the
composed node into that object once (``loaderbench.run._validation``), so a loader receives its
settings whole and typed, never re-applies a default and never re-checks a range: each
dataclass checks its keys in ``__post_init__`` (``config.checks``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, ClassVar

from omegaconf import MISSING

from loaderbench.config.checks import require

# ``loader.num_workers=auto``: the probe (``loaderbench.autotune``) picks the count.
AUTO = "auto"


def is_worker_count(value: object) -> bool:
    """A count of workers: an int >= 0 (a bool is not one)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


@dataclass
class AutotuneSettings:
    """``loader.autotune.*``: how ``loader.num_workers=auto`` probes (``loaderbench.autotune``)."""

    # Probe again instead of reusing the choice remembered for the same machine and run.
    refresh: bool = False
    # Choose the fewest workers whose images/s is at least (1 - tolerance) x the best seen, or
    # whose loop waited at most tolerance / (1 + tolerance) of its time for data (fed).
    tolerance: float = 0.05
    # Climb to the next count only while the last one beat the best before it by more than this.
    gain: float = 0.05
    # Each count's measured window (after its loader's head start): at least this many seconds
    # and batches, and whole rounds of the workers, two at least (autotune.rung.measure_rung).
    window_s: float = 1.5
    min_batches: int = 4
    # No count is started after this many seconds of probing.
    max_probe_s: float = 60.0
    # Counts within this fraction of the best rate (two or more) are measured a second time and
    # chosen on both windows pooled; 0: never.
    confirm_within: float = 0.10

    def __post_init__(self) -> None:
        finite, key = math.isfinite, "loader.autotune"
        tolerance, gain, within = self.tolerance, self.gain, self.confirm_within
        require(
            finite(tolerance) and 0 <= tolerance < 1,
            f"{key}.tolerance must be >= 0 and < 1",
            tolerance,
        )
        require(finite(gain) and gain >= 0, f"{key}.gain must be >= 0", gain)
        require(
            finite(self.window_s) and self.window_s > 0,
            f"{key}.window_s must be > 0",
            self.window_s,
        )
        require(self.min_batches >= 1, f"{key}.min_batches must be >= 1", self.min_batches)
        require(
            finite(within) and 0 <= within < 1, f"{key}.confirm_within must be >= 0 and < 1", within
        )
        most = self.max_probe_s
        require(finite(most) and most > 0, f"{key}.max_probe_s must be > 0", most)


@dataclass
class LoaderSettings:
    # What the loader is: whether it reads the data set's image files (every loader but
    # ``resident``, which serves a batch made once). The tests about files and pixels, and the
    # benchmark's loader rows, take the loaders that do (``file_loader_names``).
    reads_files: ClassVar[bool] = True

    name: str = MISSING
    batch_size: int = 32
    # The parallelism a sweep turns; what a worker is depends on the loader (docs/loaders.md: "What
    # num_workers and prefetch mean"): processes (torchvision), decode threads (spdl), reading
    # threads and cache-build processes (memmap). 0: everything in the main thread. "auto": the
    # fewest that keep the run fed, probed before its first epoch (``loaderbench.autotune``).
    # Typed Any because OmegaConf 2.3 has no union of int and str; ``checks`` allows those two,
    # and a loader only ever gets an int (``build_loader`` refuses "auto").
    num_workers: Any = 2
    # Batches in flight or ready ahead of the main loop, in total over the workers (each
    # loader keeps at least one per worker busy).
    prefetch: int = 4
    # On CUDA: gather or decode into pinned host memory, copy without blocking.
    pin_memory: bool = True
    autotune: AutotuneSettings = field(default_factory=AutotuneSettings)

    @property
    def auto_workers(self) -> bool:
        return self.num_workers == AUTO

    @classmethod
    def folder_keys(cls) -> tuple[str, ...]:
        """The keys of this loader's settings (``loader.<key>``) that name a folder on disk it
        keeps files in between runs (memmap: ``cache_dir``), whatever they are called: the one
        declaration ``folders`` and the tests (which point each elsewhere) read. None by
        default."""
        return ()

    def folders(self) -> tuple[str, ...]:
        """The folders of ``folder_keys``, as configured (relative to the directory the command
        runs from): evicted with the images for a cold run (``bench.drop_page_cache``), where a
        remembered ``num_workers=auto`` choice is kept, what housekeeping looks after."""
        return tuple(getattr(self, key) for key in self.folder_keys())

    def __post_init__(self) -> None:
        """Range checks of the shared keys; a loader's ``Settings`` adds its own after them."""
        workers = self.num_workers
        require(self.batch_size >= 1, "loader.batch_size must be >= 1", self.batch_size)
        require(
            is_worker_count(workers) or workers == AUTO,
            f"loader.num_workers must be an integer >= 0 or {AUTO!r}",
            workers,
        )
        require(self.prefetch >= 1, "loader.prefetch must be >= 1", self.prefetch)
