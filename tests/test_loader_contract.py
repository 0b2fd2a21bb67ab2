"""The loader contract, run over the registry: every loader ``loader_names()`` finds, in every
way it runs on the CPU (``conftest.CONTRACT_VARIANTS``), against the same rules, as
timm's test_models.py runs over ``list_models()``. A new loader (its package and its YAML) is
tested here with nothing else to add (``test_a_fourth_loader_needs_only_its_package_and_yaml``).

The rules: the pixels of the reference pipeline (PIL, the torchvision transforms); the shared
epoch order, sharded into disjoint shares that cover the epoch; an unreadable file left out,
counted and named once, or (``dataset.on_error=raise``) an error naming it; an epoch resumed
from its position; no draw from torch's global RNG; and no thread or worker process left
behind by ``close()``; its YAML composes into its typed settings. Each loader's
own finer points (its tolerances, its cache, its queues) are tested in its own module.

A clause that cannot hold for a loader by design (``loader=resident``, the ceiling, serves one
made-up batch: no reference pixels, no file to find unreadable) is one ``EXEMPTIONS`` names,
with the reason; the test then skips it saying so (``pytest -rs``),
and every other clause still runs on it.
"""

from __future__ import annotations

import ast
import logging
import os
import shutil
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
import torch
from tqdm.std import TMonitor

from loaderbench.data.discovery import Split
from loaderbench.data.synthetic import SyntheticSpec, ensure_synthetic
from loaderbench.imaging.files import load_rgb
from loaderbench.imaging.transforms import PilTrainTransform, pil_val_transform
from loaderbench.loaders import LoaderSpec, build_loader, loader_names, settings_class
from tests.conftest import REPO, cpu_spec, folder_index, loader_folders, loader_variants

SIZE, BATCH, BATCHES = 24, 4, 6  # 24 train images: 6 batches of 4 an epoch
BAD_BATCH = 1  # epoch 0's second batch: all unreadable files
BAD_VAL = 3  # the val split's unreadable file
# Per image, mean |difference| from the reference at most: val, FFmpeg's chroma and a
# re-encoded store (the messy set's bound, tests/test_messy.py); train, the same enlarged by a
# crop of a small image (measured: FFmpeg's worst 10.5, the others' 3.6). A loader's own module
# holds it tighter; here each image must also be nearer its own reference than any other.
VAL_TOLERANCE, TRAIN_TOLERANCE = 6.0, 12.0
# Hydra's search path for a loader's YAML kept outside conf/ (the throw-away loader's).
SEARCHPATH_ENV = "LOADER_CONTRACT_SEARCHPATH"
VARIANTS = loader_variants()


def variant_id(variant: tuple[str, dict[str, Any]]) -> str:
    name, options = variant
    return "-".join([name, *map(str, options.values())])


@pytest.fixture(params=VARIANTS, ids=[variant_id(v) for v in VARIANTS])
def variant(request: pytest.FixtureRequest) -> tuple[str, dict[str, Any]]:
    return request.param


@pytest.fixture(scope="module")
def contract_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """2 classes of small JPEGs (at most 64 px: every store keeps them as they are): 24 train
    images, the 4 of epoch 0's second batch (seed 0) unreadable, and 8 val, one unreadable."""
    spec = SyntheticSpec(num_classes=2, train_per_class=12, val_per_class=4, seed=7, max_side=64)
    root = ensure_synthetic(spec, tmp_path_factory.mktemp("data"))
    index = folder_index(root)
    first = cpu_spec(index.train, True, batch_size=BATCH).epoch_batches(0)[BAD_BATCH]
    bad = [index.train.paths[i] for i in first.tolist()] + [index.val.paths[BAD_VAL]]
    for number, path in enumerate(bad):
        data = Path(path).read_bytes()  # a cut JPEG, or garbage, named .JPEG
        Path(path).write_bytes(data[:40] if number % 2 else b"\x00garbage, not a JPEG" * 8)
    return root


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The loaders' own folders (memmap's caches), shared by the module's tests."""
    return tmp_path_factory.mktemp("folders")


# Clauses of the contract that cannot hold for a loader by design -> why; the suite names each
# exemption where it applies.
_RESIDENT = "loader=resident serves one made-up batch again and again"
EXEMPTIONS: dict[str, dict[str, str]] = {
    "resident": {
        "reference_pixels": f"{_RESIDENT}: its pixels are no image's",
        "unreadable_files": f"{_RESIDENT}: it reads no file, so none is unreadable",
        "pixel_shares": f"{_RESIDENT}: its shares differ in labels only, not in pixels",
    }
}


def exempt(variant: tuple[str, dict[str, Any]], clause: str) -> None:
    """Skip the test, saying why, where the loader is exempt from ``clause`` by design."""
    name = variant[0]
    reason = EXEMPTIONS.get(name, {}).get(clause)
    if reason is not None:
        pytest.skip(f"loader={name} is exempt from the contract's {clause!r}: {reason}")


def left_out(variant: tuple[str, dict[str, Any]], split: Split) -> set[int]:
    """The split's files the loader leaves out as unreadable: the reference's, for a loader
    that reads files; none for one that reads none (``resident``)."""
    return unreadable(split) if settings_class(variant[0]).reads_files else set()


def unreadable(split: Split) -> set[int]:
    """The split's files the reference (PIL) cannot read: those the fixture spoiled."""
    bad = set()
    for index, path in enumerate(split.paths):
        try:
            load_rgb(path)
        except OSError:
            bad.add(index)
    return bad


def make_spec(
    variant: tuple[str, dict[str, Any]], split: Split, train: bool, folders: Path, **fields: Any
) -> LoaderSpec:
    name, options = variant
    own = loader_folders(name, folders)
    return cpu_spec(
        split, train, loader=name, image_size=SIZE, batch_size=BATCH, **own, **options, **fields
    )


def fingerprint(image: torch.Tensor) -> bytes:
    return image.contiguous().numpy().tobytes()


class Epoch:
    """What one iteration of a loader gave: images, labels, the images' dataset indices, its
    position after each batch."""

    def __init__(self, loader: Any, epoch: int, start_batch: int = 0, stop: int | None = None):
        loader.set_epoch(epoch, start_batch)
        batches, self.positions, self.indices = [], [], []
        split_labels = loader.spec.split.labels
        for batch in loader:
            assert batch.images.dtype == torch.uint8 and batch.labels.dtype == torch.int64
            assert batch.images.shape[1:] == (3, SIZE, SIZE) and len(batch.labels) <= BATCH
            assert batch.indices.dtype == torch.int64 and batch.indices.device.type == "cpu"
            indices = batch.indices.tolist()
            assert batch.labels.tolist() == [split_labels[i] for i in indices]
            self.indices += indices
            batches.append((batch.images.clone(), batch.labels.clone()))
            self.positions.append(loader.position)
            if stop is not None and len(batches) == stop:
                break
        self.images = torch.cat([b[0] for b in batches]) if batches else torch.empty(0)
        self.labels = torch.cat([b[1] for b in batches]).tolist() if batches else []


def expected_labels(spec: LoaderSpec, epoch: int, skipped: set[int], start: int = 0) -> list:
    """The labels of this rank's share of ``epoch`` in the shared order, less the skipped."""
    order = spec.epoch_order(epoch, start).tolist()
    return [spec.split.labels[i] for i in order if i not in skipped]


def mean_differences(images: torch.Tensor, reference: torch.Tensor) -> torch.Tensor:
    """(image, reference image) -> mean |difference|, every image against every reference."""
    flat = images.flatten(1).float()
    return torch.cdist(flat, reference.flatten(1).float(), p=1) / flat.shape[1]


def assert_reference_pixels(
    images: torch.Tensor, reference: torch.Tensor, tolerance: float
) -> torch.Tensor:
    """Each image within ``tolerance`` of its reference, and nearer to it than to any other
    (a loader that served the images in another order fails); the differences, per image."""
    assert images.shape == reference.shape
    distances = mean_differences(images, reference)
    own = distances.diagonal()
    assert own.max() <= tolerance, f"mean |diff| per image {own.tolist()}"
    others = distances + torch.eye(len(own)) * 1e9
    assert (own < others.min(dim=1).values).all(), distances
    return own


def test_val_is_the_reference_pipeline(variant, contract_root: Path, folders: Path) -> None:
    exempt(variant, "reference_pixels")
    val = folder_index(contract_root).val
    spec = make_spec(variant, val, False, folders)
    with build_loader(spec) as loader:
        read = Epoch(loader, 0)
    kept = [i for i in range(len(val)) if i != BAD_VAL]
    assert read.labels == [val.labels[i] for i in kept]
    assert read.indices == kept  # row by row: what the ledger counts
    transform = pil_val_transform(SIZE)
    reference = torch.stack([transform(load_rgb(val.paths[i])) for i in kept])
    assert_reference_pixels(read.images, reference, VAL_TOLERANCE)


def test_train_crops_are_the_seeded_reference_crops(
    variant, contract_root: Path, folders: Path
) -> None:
    """Epoch 1's crops and flips: each image's own from (seed, epoch, image), cut from the
    whole image and resized as torchvision's RandomResizedCrop does; epoch 2's are others."""
    exempt(variant, "reference_pixels")
    train = folder_index(contract_root).train
    bad = unreadable(train)
    spec = make_spec(variant, train, True, folders, seed=3)
    with build_loader(spec) as loader:
        read = Epoch(loader, 1)
    assert read.labels == expected_labels(spec, 1, bad)
    order = [i for i in spec.epoch_order(1).tolist() if i not in bad]
    assert read.indices == order  # row by row: what the ledger counts
    crop = PilTrainTransform(spec.image_size, spec.seed, spec.rrc_scale, spec.rrc_ratio)
    reference = torch.stack([crop(load_rgb(train.paths[i]), i, 1) for i in order])
    own = assert_reference_pixels(read.images, reference, TRAIN_TOLERANCE)
    next_epoch = torch.stack([crop(load_rgb(train.paths[i]), i, 2) for i in order])
    assert (mean_differences(read.images, next_epoch).diagonal() > own).all()


@pytest.mark.parametrize("train", [True, False], ids=["train", "val"])
def test_unreadable_files_are_left_out_counted_and_named_once(
    variant, train: bool, contract_root: Path, folders: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """One rank, three epochs: each unreadable file counted and named once. Two ranks: each
    counts what its share met; together, each file once."""
    exempt(variant, "unreadable_files")
    split = folder_index(contract_root).split("train" if train else "val")
    bad = unreadable(split)
    assert len(bad) == (BATCH if train else 1)
    caplog.set_level(logging.WARNING)
    spec = make_spec(variant, split, train, folders)
    with build_loader(spec) as loader:
        for epoch in range(3):
            read = Epoch(loader, epoch)
            assert read.labels == expected_labels(spec, epoch, bad)
            assert loader.skipped_indices() == bad
            assert loader.stats()["skipped_files"] == len(bad)
    for index in bad:
        assert caplog.text.count(f"unreadable image {split.paths[index]}:") == 1, caplog.text
    shares = []
    for rank in range(2):
        spec = make_spec(variant, split, train, folders, rank=rank, world_size=2)
        with build_loader(spec) as loader:
            for epoch in range(2):
                Epoch(loader, epoch)
            shares.append(loader.skipped_indices())
            assert loader.stats()["skipped_files"] == len(shares[-1])
    assert shares[0] | shares[1] == bad
    if not train:  # val: the same shares every epoch, the file in one rank's only
        assert not shares[0] & shares[1]


def test_on_error_raise_names_the_unreadable_file(
    variant, contract_root: Path, folders: Path
) -> None:
    exempt(variant, "unreadable_files")
    val = folder_index(contract_root).val
    spec = make_spec(variant, val, False, folders, on_error="raise")

    def read() -> None:
        with build_loader(spec) as loader:  # memmap raises here, the others when iterated
            Epoch(loader, 0)

    with no_thread_or_process_left(), pytest.raises(OSError) as raised:
        read()
    assert Path(val.paths[BAD_VAL]).name in str(raised.value)


def test_two_ranks_shares_are_disjoint_and_cover_the_epoch(
    variant, contract_root: Path, folders: Path
) -> None:
    """Each rank serves its share of the shared order; the images of the two shares (told
    apart by their pixels, as the one rank served them) never meet and make up the epoch."""
    index = folder_index(contract_root)
    for split, train in ((index.val, False), (index.train, True)):
        bad = left_out(variant, split)
        with build_loader(make_spec(variant, split, train, folders)) as loader:
            whole = Epoch(loader, 1)
        shares = []
        for rank in range(2):
            spec = make_spec(variant, split, train, folders, rank=rank, world_size=2)
            with build_loader(spec) as loader:
                assert len(loader) == (BATCHES // 2 if train else 1)
                share = Epoch(loader, 1)
            assert share.labels == expected_labels(spec, 1, bad), (split.name, rank)
            shares.append(Counter(fingerprint(image) for image in share.images))
        assert len(whole.labels) == len(split) - len(bad)
        assert sum((shares[0] + shares[1]).values()) == len(whole.labels)
        if EXEMPTIONS.get(variant[0], {}).get("pixel_shares"):
            continue  # the labels above held; the pixels below cannot (said after the loop)
        assert not shares[0].keys() & shares[1].keys(), split.name
        everything = Counter(fingerprint(image) for image in whole.images)
        assert shares[0] + shares[1] == everything, split.name
    exempt(variant, "pixel_shares")


def test_an_epoch_resumes_from_its_position(variant, contract_root: Path, folders: Path) -> None:
    """``position`` counts the batches of the order gone through, the left-out one included;
    an epoch stopped part-way and resumed from its position serves the rest, as an
    uninterrupted epoch did; from its end, nothing."""
    train = folder_index(contract_root).train
    spec = make_spec(variant, train, True, folders)
    # The second batch (all unreadable) left out, by a loader that reads the files.
    skips = BAD_BATCH if left_out(variant, train) else None
    positions = [batch + 1 for batch in range(BATCHES) if batch != skips]
    with build_loader(spec) as loader:
        whole = Epoch(loader, 0)
        assert whole.positions == positions
        stopped = Epoch(loader, 0, stop=2)  # left part-way (a preemption)
        assert stopped.positions == positions[:2]
        rest = Epoch(loader, 0, start_batch=loader.position)
        assert rest.positions == positions[2:]
        resumed = torch.cat([stopped.images, rest.images])
        assert torch.equal(resumed, whole.images)
        assert stopped.indices + rest.indices == whole.indices
        assert stopped.labels + rest.labels == whole.labels
        end = Epoch(loader, 0, start_batch=BATCHES)
        assert end.labels == [] and loader.position == BATCHES


def test_an_epoch_leaves_the_global_rng_alone(variant, contract_root: Path, folders: Path) -> None:
    """Read in this process (no workers), a train epoch draws nothing from torch's global RNG:
    augmentation comes from (seed, epoch, image) alone."""
    train = folder_index(contract_root).train
    spec = make_spec(variant, train, True, folders, num_workers=0)
    torch.manual_seed(123)
    before = torch.get_rng_state()
    with build_loader(spec) as loader:
        Epoch(loader, 0)
    assert torch.equal(torch.get_rng_state(), before)


def own_threads() -> set[threading.Thread]:
    """The live threads, but tqdm's monitor: one a process, started by the process's first
    progress bar (the memmap cache build's) and kept, whichever test made that bar first."""
    return {
        thread
        for thread in threading.enumerate()
        if thread.is_alive() and not isinstance(thread, TMonitor)
    }


def own_children() -> set[int]:
    return {child.pid for child in psutil.Process().children(recursive=True)}


def running(pid: int) -> bool:
    """Whether process ``pid`` still runs (a zombie has ended; its parent reaps it)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


class no_thread_or_process_left:
    """Fails if a thread or a child process started inside the block outlives it (a few
    seconds of grace for one that is on its way out)."""

    def __enter__(self) -> None:
        self.threads, self.children = own_threads(), own_children()

    def __exit__(self, kind: type[BaseException] | None, *exc: object) -> None:
        if kind is not None:
            return  # the block's own failure says more
        deadline = time.monotonic() + 10
        while True:
            threads = own_threads() - self.threads
            children = {pid for pid in own_children() - self.children if running(pid)}
            if (not threads and not children) or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert not threads, f"threads left behind: {sorted(t.name for t in threads)}"
        assert not children, f"processes left behind: {sorted(children)}"


def held_iterator(loader: Any) -> Iterator[Any]:
    """An epoch started and left after one batch, its iterator still held (as an exception's
    traceback holds it)."""
    iterator = iter(loader)
    next(iterator)
    return iterator


def test_close_leaves_no_thread_or_worker_behind(
    variant, contract_root: Path, folders: Path
) -> None:
    """After a whole epoch, another left part-way with its iterator still held, ``close()``
    (twice: safe) leaves no thread and no worker process of the loader running."""
    train = folder_index(contract_root).train
    spec = make_spec(variant, train, True, folders, num_workers=2)
    with no_thread_or_process_left():
        loader = build_loader(spec)
        Epoch(loader, 0)
        loader.set_epoch(1)
        held = held_iterator(loader)
        loader.close()
        loader.close()
    del held


def test_the_yaml_composes_into_the_loaders_typed_settings(variant) -> None:
    """``loader=<name>`` composes from its YAML into its settings, with its variant's keys."""
    from hydra import compose, initialize_config_dir

    import loaderbench.run.compose  # noqa: F401  (registers the schemas the YAML files extend)
    from loaderbench.run._validation import validate_config

    name, options = variant
    extra = os.environ.get(SEARCHPATH_ENV)
    overrides = [f"loader={name}", *(f"loader.{k}={v}" for k, v in options.items())]
    if extra:
        overrides.append(f"hydra.searchpath=[file://{extra}]")
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        cfg = compose("train", overrides=overrides)
    settings = validate_config(cfg).loader
    assert type(settings) is settings_class(name)
    assert settings == settings_class(name)(name=name, **options)


# ---------------------------------------------------------------------------------------------
# A fourth loader: its own package and YAML, written by a newcomer, and nothing else.

THROWAWAY_SETTINGS = """
from dataclasses import dataclass

from loaderbench.loaders import LoaderSettings


@dataclass
class Settings(LoaderSettings):
    # A folder it keeps files in between runs (a note of each epoch it served), declared in
    # folder_keys whatever its key is called: evicted for a cold run, and in the tests pointed
    # into the test's own folder.
    scratch: str = "pilplain-scratch"

    @classmethod
    def folder_keys(cls):
        return ("scratch",)
"""

THROWAWAY_LOADER = '''
"""One image at a time, with PIL, in the caller's thread: the simplest loader there is."""

from pathlib import Path

import torch

from loaderbench.imaging.files import load_rgb
from loaderbench.loaders import Batch, Loader, register_loader
from loaderbench.imaging.transforms import PilTrainTransform, pil_val_transform


@register_loader("pilplain")
class PilLoader(Loader):
    def __iter__(self):
        spec = self.spec
        crop = PilTrainTransform(spec.image_size, spec.seed, spec.rrc_scale, spec.rrc_ratio)
        val = pil_val_transform(spec.image_size)
        Path(spec.settings.scratch).mkdir(parents=True, exist_ok=True)
        (Path(spec.settings.scratch) / f"served-{self.epoch}").touch()
        self.position = self.start_batch
        for indices in spec.epoch_batches(self.epoch, self.start_batch):
            images, labels, kept = [], [], []
            for index in indices.tolist():
                try:
                    image = load_rgb(spec.split.paths[index])
                except Exception as error:
                    if not spec.skip_errors:
                        raise OSError(f"cannot read {spec.split.paths[index]}: {error}") from error
                    self.skip_unreadable(index, f"{type(error).__name__}: {error}")
                    continue
                images.append(crop(image, index, self.epoch) if spec.train else val(image))
                labels.append(spec.split.labels[index])
                kept.append(index)
            self.position += 1
            if labels:
                yield Batch(torch.stack(images), torch.tensor(labels), torch.tensor(kept))
'''

THROWAWAY_YAML = """defaults:
  - pilplain_schema
  - _self_
name: pilplain
"""


def test_the_fourth_loader_imports_no_other_loaders_modules() -> None:
    """The example a newcomer copies takes what it shares with the loaders (the seeded train
    crop, the val pipeline) from public places, never from another loader's package."""
    reaches = [
        node.module
        for source in (THROWAWAY_SETTINGS, THROWAWAY_LOADER)
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.ImportFrom)
        and (node.module or "").startswith("loaderbench.loaders.")
        and node.module.split(".")[2] in loader_names()
    ]
    assert reaches == []


@pytest.mark.slow
def test_a_fourth_loader_needs_only_its_package_and_yaml(tmp_path: Path) -> None:
    """A newcomer's loader, written outside the tree (``LOADERBENCH_LOADER_PATH``, and its YAML
    on Hydra's search path), is found by the registry and passes this whole contract."""
    package = tmp_path / "loaders" / "pilplain"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "settings.py").write_text(THROWAWAY_SETTINGS)
    (package / "loader.py").write_text(THROWAWAY_LOADER)
    (tmp_path / "conf" / "loader").mkdir(parents=True)
    (tmp_path / "conf" / "loader" / "pilplain.yaml").write_text(THROWAWAY_YAML)
    env = {
        **os.environ,
        "LOADERBENCH_LOADER_PATH": str(tmp_path / "loaders"),
        SEARCHPATH_ENV: str(tmp_path / "conf"),
    }
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "no:cacheprovider",
            "-q",
            "-k",
            "pilplain and not fourth_loader",
            f"--basetemp={tmp_path / 'tmp'}",
            str(Path(__file__)),
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    said = proc.stdout[-6000:] + proc.stderr[-3000:]
    left_in_repo = REPO / "pilplain-scratch"
    if left_in_repo.exists():
        shutil.rmtree(left_in_repo)
        pytest.fail(f"the loader's folder (loader.scratch) was not redirected: {left_in_repo}")
    assert list((tmp_path / "tmp").glob("folders*/scratch/served-*")), said
    assert proc.returncode == 0, said
    # Every contract test ran on it (none skipped, none deselected by a name it lacks).
    contract = [name for name in globals() if name.startswith("test_") and "fourth" not in name]
    expected = len(contract) + 1  # the skips-and-counts test runs for train and val
    assert f"{expected} passed" in said and "skipped" not in said, said
