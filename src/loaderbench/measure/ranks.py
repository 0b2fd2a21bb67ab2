"""A run's loop metrics over its data-parallel ranks: each combined as the catalog declares
(``metrics.combine_over_ranks``), through the ranks' collectives."""

from __future__ import annotations

from typing import Any

import torch.distributed as dist

from loaderbench.measure.metrics import combine_over_ranks
from loaderbench.platform.distributed import all_reduce


def reduce_loop_metrics(metrics: dict[str, Any], world_size: int) -> dict[str, Any]:
    """This rank's loop metrics combined over ranks, each as the metric catalog declares."""
    rank = dist.get_rank() if dist.is_initialized() else 0
    return combine_over_ranks(metrics, rank, world_size, lambda values, op: all_reduce(values, op))
