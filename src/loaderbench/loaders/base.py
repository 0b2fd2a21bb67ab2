"""The one interface every loader implements, and the registry that picks one by name.

A loader is built for one split and yields, per epoch, ``Batch(images, labels, indices)``: uint8
NCHW images at the model's input size and int64 labels, both already on the target device, and
the images' dataset indices (int64, on the CPU), which the training loop counts (the ledger).
Normalisation is not the loader's job (the model wrapper does it on the device), so all loaders
hand over the same kind of batch and the comparison between them is fair.
"""

from __future__ import annotations

import abc
import logging
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch

from loaderbench.config.loader import LoaderSettings
from loaderbench.data.discovery import Split
from loaderbench.data.order import epoch_permutation, training_places
from loaderbench.data.resumed import ResumedEpoch
from loaderbench.imaging.transforms import RRC_RATIO, RRC_SCALE, seeded_crops
from loaderbench.measure.metrics import SKIPPED_FILES

log = logging.getLogger(__name__)

Sizes = Sequence[int] | torch.Tensor


class Batch(NamedTuple):
    images: torch.Tensor  # uint8, (N, 3, H, W), on the target device
    labels: torch.Tensor  # int64, (N,), on the target device
    # int64, (N,), on the CPU: the split's indices of the images, row by row. What the run's
    # sample ledger counts (what the steps had, observed: not the order the loader planned).
    indices: torch.Tensor


@dataclass(frozen=True)
class LoaderSpec:
    """What a loader must deliver, independent of how: the run's part, and the loader's own
    typed ``settings`` (``loader.*``, already checked)."""

    split: Split
    train: bool
    image_size: int
    device: torch.device
    settings: LoaderSettings
    seed: int = 0
    # The train pipeline's random-resized crop: area fraction and aspect-ratio ranges.
    rrc_scale: tuple[float, float] = RRC_SCALE
    rrc_ratio: tuple[float, float] = RRC_RATIO
    # dataset.on_error: skip an unreadable image (counted, named once) or raise, naming it.
    on_error: str = "skip"
    # Data-parallel sharding: this process reads only its share of every epoch.
    rank: int = 0
    world_size: int = 1
    # Training only: the epoch a job resumed on another number of ranks continues.
    resumed: ResumedEpoch | None = None

    @property
    def batch_size(self) -> int:
        return self.settings.batch_size

    @property
    def num_workers(self) -> int:
        return self.settings.num_workers

    @property
    def prefetch(self) -> int:
        return self.settings.prefetch

    @property
    def skip_errors(self) -> bool:
        return self.on_error == "skip"

    @property
    def drop_last(self) -> bool:
        return self.train

    @property
    def use_pinned_memory(self) -> bool:
        return self.settings.pin_memory and self.device.type == "cuda"

    def epoch_order(self, epoch: int, start_batch: int = 0) -> torch.Tensor:
        """This rank's image indices of ``epoch``, in the order every loader shares, from its
        batch ``start_batch`` on (a job resumed in the middle of an epoch)."""
        order = epoch_permutation(len(self.split), self.seed, epoch, shuffle=self.train)
        places = self.epoch_places(epoch, resumed=True)
        return order[places][start_batch * self.batch_size :]

    def epoch_places(self, epoch: int, resumed: bool = True) -> torch.Tensor:
        """This rank's places in ``epoch``'s global order (strided, like DistributedSampler;
        the same as ``shard_indices`` of it). Training keeps the ``len // global batch``
        whole global batches of it: as many steps for any number of ranks with the same
        global batch, and after ``k`` steps the ranks together have gone through its first
        ``k`` global batches. A job resumed on another number of ranks (``resumed``, for
        its epoch) shares out the places not yet gone through, in order."""
        if not self.drop_last:
            return torch.arange(len(self.split))[self.rank :: self.world_size]
        applies = resumed and self.resumed is not None and self.resumed.epoch == epoch
        done = self.resumed.done if applies and self.resumed is not None else None
        global_batch = self.batch_size * self.world_size
        return training_places(len(self.split), global_batch, self.rank, self.world_size, done)

    def epoch_batches(self, epoch: int, start_batch: int = 0) -> list[torch.Tensor]:
        """This rank's batches of image indices for ``epoch`` (from batch ``start_batch``)."""
        mine = self.epoch_order(epoch, start_batch)
        return list(torch.split(mine, self.batch_size)) if len(mine) else []

    def random_crops(
        self,
        heights: Sizes,
        widths: Sizes,
        epoch: int,
        indices: Sequence[int] | torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Boxes ``(top, left, h, w)`` and flips of images ``indices``, of these sizes, in
        ``epoch``: each image's from (seed, epoch, image) alone (``crops.seeded_crops``)."""
        return seeded_crops(
            heights, widths, self.seed, epoch, indices, self.rrc_scale, self.rrc_ratio
        )

    def batches_per_epoch(self) -> int:
        """Batches per epoch on this rank (the same for every epoch, a resumed one's too:
        the schedule's steps)."""
        return -(-len(self.epoch_places(0, resumed=False)) // self.batch_size)


class Loader(abc.ABC):
    """Iterate it once per epoch; ``set_epoch`` first to reshuffle; ``close`` when done."""

    def __init__(self, spec: LoaderSpec) -> None:
        self.spec = spec
        self.epoch = 0
        self.start_batch = 0
        # Batches of the epoch's order (this rank's) the iteration under way has gone
        # through, counted in the consumer's thread as each is handed over or left out (all
        # its files unreadable): not the batches handed over, which are fewer after such a
        # batch. A job resumed in this epoch continues from here (``set_epoch(epoch,
        # position)``); from the batches handed over, it would serve one twice.
        self.position = 0
        # Whether the caller iterates the epoch after this one next (``set_epoch``): a loader
        # may then read ahead into it once this epoch's batches are all under way.
        self.next_epoch = False
        # The skipped-file ledger: the split's files (indices) this loader found unreadable in
        # the epochs served so far (``skip_unreadable``).
        self._skipped: set[int] = set()

    @classmethod
    def prepare(cls, spec: LoaderSpec) -> dict[str, Any]:
        """Work done once for a split, with ``spec.num_workers`` workers, before any loader of
        it is built (``loader.num_workers=auto`` prepares with every CPU allowed, then tries
        counts from 1 up); returns numbers for metrics.json, as ``stats`` does. Nothing here;
        memmap builds its cache."""
        return {}

    @abc.abstractmethod
    def __iter__(self) -> Iterator[Batch]: ...

    def __len__(self) -> int:
        """Batches per epoch on this rank."""
        return self.spec.batches_per_epoch()

    def set_epoch(self, epoch: int, start_batch: int = 0, *, next_epoch: bool = False) -> None:
        """The epoch the next iteration serves, from its batch ``start_batch`` (a job resumed
        in the middle of an epoch; the epoch's order and augmentation are the same);
        ``next_epoch``: the caller will iterate ``epoch + 1`` after it, from its start."""
        self.epoch = epoch
        self.start_batch = start_batch
        self.position = start_batch
        self.next_epoch = next_epoch

    def queue_depth(self) -> int:
        """Batches this loader may have decoded, ready or under way, ahead of the loop at most:
        the head start it takes whenever the loop is not asking (its start, the warm-up
        steps), which the meter lets the loop consume before it measures (``LoopMeter``).
        Default: ``prefetch`` in total, at least one per worker, none without workers (the
        loop's own thread makes each batch when asked); a loader that keeps more overrides."""
        workers = self.spec.num_workers
        return max(self.spec.prefetch, workers) if workers > 0 else 0

    def batches_ahead(self) -> tuple[int, int] | None:
        """(batches made and waiting for the loop, batches being made) now: asked after every
        step, it lets the meter keep the steady window of a loop that never waits (the model
        the bottleneck) where the loader vouches that it made the loop's batches inside the
        window (``meters.first_short``). None: it cannot tell (the window then needs
        ``AHEAD_WINDOW_DEPTHS`` queue depths)."""
        return None

    def queued_at_start(self) -> int:
        """Batches the next iteration may find decoded before it asks for any: work done
        between epochs. 0 for a loader that starts each epoch when it is iterated."""
        return 0

    def stats(self) -> dict[str, Any]:
        """Loader-specific numbers for metrics.json (``skipped_files`` at least: this rank's,
        ``len(skipped_indices())``)."""
        return {SKIPPED_FILES: len(self.skipped_indices())}

    def skip_unreadable(self, index: int, error: str) -> None:
        """Enter file ``index`` of the split, which could not be read (``error`` says why), in
        the ledger: counted once and named once in the log, however many epochs, ranks'
        shares or retries meet it. Call it in the consumer's thread (the ledger has no lock)."""
        if index in self._skipped:
            return
        self._skipped.add(index)
        # This run's path: a loader reading a cache built from a copy names the file here.
        log.warning("skipping unreadable image %s: %s", self.spec.split.paths[index], error)

    def skipped_indices(self) -> frozenset[int]:
        """The files of the split (indices) this loader was to deliver, in the epochs served so
        far, and skipped as unreadable: each once, however many epochs met it. The session
        unites them over splits and ranks into ``skipped_files``."""
        return frozenset(self._skipped)

    def close(self) -> None:  # noqa: B027 - most loaders hold something to release
        """Release workers, threads and files. Safe to call twice."""

    def __enter__(self) -> Loader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


LoaderFactory = Callable[[LoaderSpec], Loader]
LOADERS: dict[str, LoaderFactory] = {}


def register_loader(name: str) -> Callable[[LoaderFactory], LoaderFactory]:
    def decorator(factory: LoaderFactory) -> LoaderFactory:
        LOADERS[name] = factory
        return factory

    return decorator


def to_device(batch: Batch, device: torch.device, non_blocking: bool) -> Batch:
    """Copy a (possibly pinned) CPU batch to the device; asynchronous from pinned memory."""
    if batch.images.device == device:
        return batch
    return Batch(
        batch.images.to(device, non_blocking=non_blocking),
        batch.labels.to(device, non_blocking=non_blocking),
        batch.indices,  # stays on the CPU: the ledger counts it there, no device read
    )


def stop_workers(iterator: object) -> None:
    """A DataLoader iterator's worker processes stopped now (a no-op for other iterators).

    Left to the garbage collector, an iterator that an exception's traceback still holds (a
    failed cache build, a stopped epoch) keeps its workers alive for as long as the traceback
    lives, and every process forked meanwhile inherits a copy of it to finalize."""
    shutdown = getattr(iterator, "_shutdown_workers", None)
    if shutdown is not None:
        shutdown()
