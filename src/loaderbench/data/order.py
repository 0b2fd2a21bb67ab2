"""The epoch order and its shares: the one seeded order of an epoch every rank draws alike, and
each rank's strided share of it (whole global batches in training, every image once in
validation), as DistributedSampler cuts it."""

from __future__ import annotations

import torch


def epoch_permutation(n: int, seed: int, epoch: int, shuffle: bool) -> torch.Tensor:
    """The order of an epoch: the same on every rank for the same (seed, epoch)."""
    if not shuffle:
        return torch.arange(n)
    generator = torch.Generator().manual_seed(seed * 100_003 + epoch)
    return torch.randperm(n, generator=generator)


def training_places(
    images: int, global_batch: int, rank: int, world_size: int, done: torch.Tensor | None = None
) -> torch.Tensor:
    """Rank ``rank``'s places in a training epoch's global order of ``images``: its whole
    global batches, strided over ``world_size`` ranks, less the places ``done`` marks (a job
    resumed on another number of ranks)."""
    places = torch.arange(images // global_batch * global_batch)
    if done is not None:
        places = places[~done[: len(places)]]
    return places[rank::world_size]


def shard_indices(
    order: torch.Tensor, batch_size: int, drop_last: bool, rank: int = 0, world_size: int = 1
) -> torch.Tensor:
    """This rank's share of an epoch's order (strided, like DistributedSampler).

    With ``drop_last`` (training) every rank gets the same number of full batches, which
    DistributedDataParallel needs; without it (validation) the ranks together cover every
    image exactly once and the last batches may be short.
    """
    if not drop_last:
        return order[rank::world_size]
    per_rank = len(order) // world_size
    mine = order[rank : per_rank * world_size : world_size]
    return mine[: per_rank // batch_size * batch_size]
