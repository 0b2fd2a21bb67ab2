"""The data layer: from a config to file lists. Discovery, the dataset index on disk, the splits
in memory, the generated set, the epoch order and its shares, and where a resumed epoch continues.

``synthetic`` (``python -m loaderbench.data.synthetic``, the generated set) is imported on its
own: a module run with ``-m`` must not be imported by its package first.
"""

from loaderbench.data.discovery import (
    DatasetError,
    discover,
    parse_wnid,
    resolve_path,
    scan_image_folder,
    spread_indices,
)
from loaderbench.data.order import epoch_permutation, shard_indices, training_places
from loaderbench.data.resumed import ResumedEpoch
from loaderbench.data.splits import SPLITS, DatasetIndex, PathTable, Split

__all__ = [
    "SPLITS",
    "DatasetError",
    "DatasetIndex",
    "PathTable",
    "ResumedEpoch",
    "Split",
    "discover",
    "epoch_permutation",
    "parse_wnid",
    "resolve_path",
    "scan_image_folder",
    "shard_indices",
    "spread_indices",
    "training_places",
]
