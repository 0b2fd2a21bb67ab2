"""The ledger of the images each training epoch trained on, over every rank: what tells that a
run preempted and resumed (on the same number of ranks or another) lost or repeated no sample.

Each rank keeps the dataset indices of the batches its steps had (observed, not the loader's
plan); after every pass the ranks add up their counts per image. A checkpoint taken mid-epoch
keeps the epoch's images so far as a bitmap (``np.packbits``) and those trained twice, so the
resumed run continues the count. metrics.json: ``epoch_samples`` and ``epoch_repeats``, lists
by epoch.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from loaderbench.platform import distributed


class SampleLedger:
    """The epochs' counts so far and the images of the epoch under way (``epoch``)."""

    def __init__(self, images: int) -> None:
        self.images = images
        self.epoch_samples: list[int] = []  # indexed by epoch
        self.epoch_repeats: list[int] = []
        self.epoch: int | None = None  # the epoch ``seen`` and ``repeated`` are of
        self.seen = torch.zeros(images, dtype=torch.bool)
        self.repeated = torch.zeros(images, dtype=torch.bool)

    def tally(self, epoch: int, trained: torch.Tensor) -> None:
        """Add a pass over ``epoch``: this rank's ``trained`` image indices (a collective:
        every rank calls it, with what it trained, maybe nothing)."""
        if epoch != self.epoch:
            self._start(epoch)
        counts = torch.bincount(trained.to(torch.int64), minlength=self.images).to(torch.int32)
        counts = distributed.all_reduce_tensor(counts)
        self.repeated |= counts + self.seen.to(torch.int32) > 1
        self.seen |= counts > 0

    def close_epoch(self, epoch: int) -> None:
        """``epoch`` is over: its counts join the lists (an epoch with no pass: none trained)."""
        if epoch != self.epoch:
            self._start(epoch)
        self.epoch_samples.append(int(self.seen.sum()))
        self.epoch_repeats.append(int(self.repeated.sum()))
        self.epoch = None

    def _start(self, epoch: int) -> None:
        self.epoch = epoch
        self.seen.zero_()
        self.repeated.zero_()

    def metrics(self) -> dict[str, list[int]]:
        return {
            "epoch_samples": list(self.epoch_samples),
            "epoch_repeats": list(self.epoch_repeats),
        }

    def state(self) -> dict[str, Any]:
        """For the checkpoint (``torch.load(weights_only=True)`` reads it): the lists, and for
        an epoch under way its images so far, packed, and those trained more than once."""
        state: dict[str, Any] = {**self.metrics(), "epoch": self.epoch}
        if self.epoch is not None:
            state["seen"] = torch.from_numpy(np.packbits(self.seen.numpy()))
            state["repeated"] = torch.nonzero(self.repeated).flatten().tolist()
        return state

    def restore(self, state: dict[str, Any]) -> None:
        """Continue from a checkpoint's ``state`` (``state()``)."""
        self.epoch_samples = list(state["epoch_samples"])
        self.epoch_repeats = list(state["epoch_repeats"])
        self.epoch = state.get("epoch")
        if self.epoch is None:
            return
        bits = np.unpackbits(state["seen"].cpu().numpy(), count=self.images)
        self.seen = torch.from_numpy(bits.astype(bool))
        self.repeated.zero_()
        self.repeated[torch.tensor(state["repeated"], dtype=torch.int64)] = True
