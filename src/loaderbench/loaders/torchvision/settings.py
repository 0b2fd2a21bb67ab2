"""``loader=torchvision`` keys: ``num_workers`` are DataLoader worker processes."""

from __future__ import annotations

from dataclasses import dataclass

from loaderbench.loaders.settings import LoaderSettings


@dataclass
class Settings(LoaderSettings):
    # Keep the worker processes between epochs (DataLoader's persistent_workers).
    persistent_workers: bool = True

    def per_worker_prefetch(self) -> int:
        """DataLoader's prefetch_factor (per worker) for ``prefetch`` batches in total."""
        return max(1, -(-self.prefetch // max(1, self.num_workers)))
