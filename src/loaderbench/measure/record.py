"""The run record: what metrics.json holds, typed. One dataclass a concern, each field a key of
metrics.json (its name written here once): what ran, where and how wide, the data set, the
``num_workers=auto`` probe, the model's ceiling and how the run ended. The loops' figures are
the catalog's (``metrics.METRICS``: each key declared there once, refused here if it is not);
each loader's own numbers keep the loader's names, under ``loader_<split>_``.

``RunRecord.as_dict`` is metrics.json, and the W&B summary (its keys that hold a value); a
field left ``UNSET`` is a key the run did not record, absent from both.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from loaderbench.measure.metrics import BY_KEY, rank_derived_keys


class _Unset:
    """A key the run has not recorded (absent from metrics.json, unlike a ``None`` value)."""

    def __repr__(self) -> str:
        return "UNSET"


# Typed Any, so that a field keeps its own type (``world_size: int = UNSET``) and may be unset.
UNSET: Any = _Unset()


def _set_fields(section: object) -> dict[str, Any]:
    return {
        item.name: value
        for item in dataclasses.fields(section)  # type: ignore[arg-type]
        if (value := getattr(section, item.name)) is not UNSET
    }


@dataclass
class WhatRan:
    """What ran, known before anything starts (from the config as composed: a run whose config
    fails validation records it too); ``device`` is resolved once the run starts."""

    task: str
    loader: str
    model: str | None
    device: str
    precision: str
    num_workers_auto: bool
    prefetch: int
    image_size: int | None
    seed: int
    crop_stream: str  # which train crops a (seed, epoch, image) gets
    version: str
    checkpoint: str = UNSET  # eval.py of a trained model: the checkpoint it read
    resumed_from: str = UNSET  # train.py resumed: the checkpoint it continued from


@dataclass
class Placement:
    """Where and how wide the run ran: its ranks, its settled batch and workers, torch's threads."""

    world_size: int = UNSET
    batch_size: int = UNSET
    global_batch: int = UNSET
    num_workers: int = UNSET
    intra_op_threads: int = UNSET
    intra_op_threads_source: str = UNSET


@dataclass
class DataSetFacts:
    """The data set the run read, as discovery found it, and the page cache it started from."""

    num_classes: int
    train_size: int
    val_size: int
    dataset_root: str
    dataset_index_check: str
    dataset_files_changed: int
    page_cache: str = UNSET
    requeues: int = UNSET  # train.py: the times SLURM requeued the job before this run


@dataclass
class AutotuneFacts:
    """``loader.num_workers=auto``'s probe (or the remembered choice it reused)."""

    autotune_s: float = UNSET
    autotune_key: str = UNSET
    autotune_peak_rss_mb: float = UNSET
    autotune_reused: bool = UNSET
    autotune_probe: list[dict[str, Any]] = UNSET
    autotune_rank_workers: list[int] = UNSET


@dataclass
class CeilingFacts:
    """The model's own rate in the job (``run.ceiling``) and the share of it the run fed."""

    ceiling_images_per_s: float | None = None
    ceiling_frac: float | None = None
    ceiling_frac_null_reason: str | None = None
    ceiling_from: str = UNSET


@dataclass
class Ending:
    """How the run ended, and what it held at the end."""

    status: str = "running"
    error: str = UNSET
    wall_s: float = UNSET
    pinned_host_peak_mb: float = UNSET  # CUDA runs: the peak of torch's pinned host memory
    skipped_files: int = 0


SECTIONS = (WhatRan, Placement, DataSetFacts, AutotuneFacts, CeilingFacts, Ending)
# The keys a section holds: set on the section, never as a figure.
SECTION_KEYS = frozenset(item.name for section in SECTIONS for item in dataclasses.fields(section))


def _figure_key(key: str) -> bool:
    """A key of the catalog that no section holds, or one data-parallel runs derive from it."""
    if key in SECTION_KEYS:
        return False
    return key in BY_KEY or key in rank_derived_keys()


@dataclass
class RunRecord:
    """metrics.json, typed: the sections above, the loops' figures, the loaders' numbers."""

    what: WhatRan
    placement: Placement = field(default_factory=Placement)
    data: DataSetFacts | None = None
    autotune: AutotuneFacts = field(default_factory=AutotuneFacts)
    ceiling: CeilingFacts | None = None
    ending: Ending = field(default_factory=Ending)
    # The catalog's figures: the loops', the epochs', the evaluation's, the process tree's.
    figures: dict[str, Any] = field(default_factory=dict)
    # Per split, the loader's own numbers (``Loader.stats``, ``Loader.prepare``'s).
    loaders: dict[str, dict[str, Any]] = field(default_factory=dict)

    def add(self, values: Mapping[str, Any] | None = None, **more: Any) -> None:
        """Add figures; a key the catalog does not declare fails here, naming it."""
        figures = {**(values or {}), **more}
        unknown = sorted(key for key in figures if not _figure_key(key))
        if unknown:
            raise KeyError(
                f"not figures of the metric catalog (loaderbench.measure.metrics), or kept by a "
                f"section of the run record: {unknown}"
            )
        self.figures.update(figures)

    @staticmethod
    def has_place_for(key: str) -> bool:
        """Whether metrics.json may hold ``key``: a section's field, or a figure (not the
        loaders' own ``loader_<split>_<key>``, which are theirs to name)."""
        return key in SECTION_KEYS or _figure_key(key)

    def add_loader(self, split: str, stats: Mapping[str, Any]) -> None:
        self.loaders.setdefault(split, {}).update(stats)

    def get(self, key: str, default: Any = None) -> Any:
        return self.as_dict().get(key, default)

    def as_dict(self) -> dict[str, Any]:
        """The record as metrics.json's keys and values."""
        out: dict[str, Any] = {}
        for section in (self.what, self.placement, self.data, self.autotune, self.ceiling):
            if section is not None:
                out.update(_set_fields(section))
        out.update(self.figures)
        for split, stats in self.loaders.items():
            out.update({f"loader_{split}_{key}": value for key, value in stats.items()})
        out.update(_set_fields(self.ending))
        return out
