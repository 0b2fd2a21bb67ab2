"""``loader=torchvision`` keys: ``num_workers`` are DataLoader worker processes."""

from __future__ import annotations

from dataclasses import dataclass

from loaderbench.config.checks import require_timeout
from loaderbench.config.loader import LoaderSettings


@dataclass
class Settings(LoaderSettings):
    # Keep the worker processes between epochs (DataLoader's persistent_workers).
    persistent_workers: bool = True
    # With worker processes, a batch not ready within this many seconds raises TimeoutError
    # (null: wait forever): a worker stuck on a file system that does not answer, or
    # deadlocked, is otherwise never noticed (DataLoader notices only workers that died).
    timeout_s: float | None = 600.0

    def __post_init__(self) -> None:
        super().__post_init__()
        require_timeout(self.timeout_s, "loader.timeout_s")

    def per_worker_prefetch(self) -> int:
        """DataLoader's prefetch_factor (per worker) for ``prefetch`` batches in total."""
        return max(1, -(-self.prefetch // max(1, self.num_workers)))
