"""``loader=spdl`` keys: ``num_workers`` are the decode threads of the pipeline."""

from __future__ import annotations

from dataclasses import dataclass

from loaderbench.config.checks import require_one_of, require_timeout
from loaderbench.config.loader import LoaderSettings


@dataclass
class Settings(LoaderSettings):
    # Which decoder the decode stage calls: turbo (libjpeg-turbo through torchvision.io, the
    # fastest on the CPU), ffmpeg (spdl.io + an FFmpeg filter graph), nvjpeg (GPU; needs CUDA).
    decoder: str = "turbo"
    # A batch not ready within this many seconds raises TimeoutError (null: wait forever).
    timeout_s: float | None = 600.0
    # Also log SPDL's per-stage statistics every this many seconds (null: when it stops).
    stats_interval_s: float | None = None
    # One pipeline for the whole run, its source re-iterated each epoch (like DataLoader's
    # persistent_workers); false: a pipeline built and stopped per epoch.
    persistent: bool = True

    def __post_init__(self) -> None:
        from loaderbench.imaging.spdl.decoders import DECODERS  # the registry; spdl not loaded

        super().__post_init__()
        require_one_of(self.decoder, DECODERS, "loader.decoder")
        require_timeout(self.timeout_s, "loader.timeout_s")

    def ready_batches(self) -> int:
        """The sink's size: ``prefetch`` in total, less the batches being decoded."""
        return max(1, self.prefetch - max(1, self.num_workers))
