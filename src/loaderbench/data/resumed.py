"""The epoch a job resumed on another number of ranks continues: what a training loader's
spec carries from the run core (``elastic`` makes it) into the shared epoch order
(``loaders.base.LoaderSpec.epoch_places``)."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True, eq=False)
class ResumedEpoch:
    """The epoch a job resumed on another number of ranks continues: ``done`` marks the
    places of the epoch's global order (``epoch_permutation``) that the job had gone through
    before it stopped, on every rank. The rest is shared out among the ranks now."""

    epoch: int
    done: torch.Tensor  # bool, one per place of the order
