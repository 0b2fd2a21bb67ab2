"""The spdl loader: SPDL's thread pipeline with the turbo, ffmpeg and nvjpeg decoders."""

from __future__ import annotations

import itertools
import threading
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from PIL import Image

from loaderbench.data.discovery import Split
from loaderbench.data.order import epoch_permutation, shard_indices
from loaderbench.imaging.files import load_rgb
from loaderbench.imaging.spdl import decoders
from loaderbench.imaging.spdl.geometry import Geometry
from loaderbench.imaging.spdl.records import Sample
from loaderbench.imaging.transforms import pil_val_transform
from loaderbench.loaders import LoaderSpec, build_loader
from loaderbench.loaders.spdl.loader import SpdlLoader, epoch_samples
from loaderbench.platform.buffers import BatchBuffers
from tests.conftest import cpu_spec, folder_index, read_metrics, run_dirs, single_run
from tests.in_process import run_here

# torchvision 0.29 deprecates its codecs (the decoders filter it; pytest resets the filters).
pytestmark = pytest.mark.filterwarnings(
    "ignore:The image decoding and encoding capabilities of TorchVision:DeprecationWarning"
)

CPU_DECODERS = ("turbo", "ffmpeg")
HAS_CUDA = torch.cuda.is_available()
NO_CUDA_REASON = "nvjpeg decodes on the GPU and this machine has no CUDA device"


def spec(split: Split, train: bool, decoder: str = "turbo", **kwargs) -> LoaderSpec:
    fields = {"decoder": decoder, "timeout_s": 60.0, "image_size": 64, "num_workers": 2}
    return cpu_spec(split, train, loader="spdl", **{**fields, **kwargs})


def spdl_threads() -> set[threading.Thread]:
    return set(threading.enumerate())


# ---------------------------------------------------------------------------------------------
# An epoch: every image once, labels intact, a new order each epoch.

# 24 solid colours far apart (a 3x3x3 grid): any crop of image i still has colour i.
PALETTE = [(r, g, b) for r, g, b in itertools.product((30, 128, 225), repeat=3)][:24]


@pytest.fixture(scope="module")
def colour_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """3 classes x 8 train (and 2 val) solid-colour JPEGs of mixed sizes; colour = identity."""
    root = tmp_path_factory.mktemp("colours")
    for i, colour in enumerate(PALETTE):
        size = (120, 90) if i % 2 else (90, 130)
        folder = root / "train" / f"n{i // 8 + 1:08d}"
        folder.mkdir(parents=True, exist_ok=True)
        Image.new("RGB", size, colour).save(folder / f"img_{i:02d}.JPEG", quality=95)
    for c in range(3):
        folder = root / "val" / f"n{c + 1:08d}"
        folder.mkdir(parents=True)
        Image.new("RGB", (100, 80), PALETTE[c]).save(folder / "v.JPEG", quality=95)
    return root


def identify(images: torch.Tensor) -> list[int]:
    """Which palette colour each (solid) image is."""
    palette = torch.tensor(PALETTE, dtype=torch.float32)
    means = images.float().mean(dim=(2, 3))
    distances = torch.cdist(means, palette)
    assert distances.min(dim=1).values.max() < 12, "an image is not one solid palette colour"
    return distances.argmin(dim=1).tolist()


@pytest.mark.parametrize("decoder", CPU_DECODERS)
@pytest.mark.timeout(120)
def test_epoch_yields_every_image_once_labels_intact_new_order(
    colour_root: Path, decoder: str
) -> None:
    index = folder_index(colour_root)
    split = index.train
    colour_of_path = {p: int(Path(p).stem.split("_")[1]) for p in split.paths}
    loader = build_loader(spec(split, train=True, decoder=decoder, batch_size=4))
    orders = []
    try:
        assert len(loader) == 6
        for epoch in range(3):
            loader.set_epoch(epoch)
            seen: list[int] = []
            for batch in loader:
                assert batch.images.dtype == torch.uint8 and batch.images.is_contiguous()
                assert batch.images.shape == (4, 3, 64, 64)
                assert batch.labels.dtype == torch.int64
                colours = identify(batch.images)
                for colour, label in zip(colours, batch.labels.tolist(), strict=True):
                    assert label == colour // 8  # the class folder of that image
                seen.extend(colours)
            assert sorted(seen) == list(range(24)), f"epoch {epoch}: {seen}"
            # The shared epoch order, in order: the same batches as the torchvision loader.
            order = shard_indices(epoch_permutation(24, 0, epoch, shuffle=True), 4, True)
            assert seen == [colour_of_path[split.paths[i]] for i in order.tolist()]
            orders.append(seen)
        assert len({tuple(order) for order in orders}) == 3
    finally:
        loader.close()


def test_val_keeps_the_split_order_and_the_short_last_batch(tiny_root: Path) -> None:
    index = folder_index(tiny_root)
    loader = build_loader(spec(index.val, train=False))
    try:
        batches = list(loader)
        assert [len(b.labels) for b in batches] == [5, 5, 2] and len(loader) == 3
        assert torch.cat([b.labels for b in batches]).tolist() == list(index.val.labels)
    finally:
        loader.close()


def test_epoch_samples_shard_the_epoch_like_every_loader(tiny_root: Path) -> None:
    split = folder_index(tiny_root).train
    parts = [
        list(epoch_samples(spec(split, train=True, rank=r, world_size=2), epoch=1)) for r in (0, 1)
    ]
    assert len(parts[0]) == len(parts[1]) == 10  # 12 each, cut to whole batches of 5
    assert not {s.index for s in parts[0]} & {s.index for s in parts[1]}
    assert all(
        s.path == split.paths[s.index] and s.label == split.labels[s.index]
        for s in parts[0] + parts[1]
    )
    # Each sample carries its epoch, which with its index seeds its augmentation.
    assert {s.epoch for s in epoch_samples(spec(split, train=True), epoch=2)} == {2}


# ---------------------------------------------------------------------------------------------
# Val pixels against the torchvision reference (PIL Resize + CenterCrop).


@dataclass(frozen=True)
class Tolerance:
    """Absolute differences in grey levels (0-255), measured on the synthetic set."""

    mean: float  # over all pixels of all images
    image_mean: float  # the worst image's mean
    p99: float  # 99th percentile of all pixel differences


# Measured on tiny_root's val images (500x375-class JPEGs):
#   turbo  (libjpeg-turbo, same filter as PIL) decoding the centre crop's region of the
#          original (``val_region_plan``: its edges rounded to whole source pixels, so the
#          crop is up to half a source pixel off the reference's): at 64 px mean 0.50, worst
#          0.79, p99 6, max 27; at 224 px mean 0.78-0.91, worst 1.60, p99 5-6, max 65. The
#          same top-1 within 0.2 points of torchvision's on 1000 val images (docs/decoding.md);
#          decoding the whole image (no region backend): mean 0.002, p99 0, max 1.
#   ffmpeg (FFmpeg's decoder and scaler): at 64 px mean 0.46, worst 0.70, p99 6, max 31;
#          at 224 px mean 0.93, worst 1.26, p99 9, max 84 (colour edges: its chroma upsampling
#          is not libjpeg's). Bounds below leave ~50% headroom.
TOLERANCES = {
    "turbo": Tolerance(mean=1.4, image_mean=2.4, p99=9.0),
    "turbo-whole": Tolerance(mean=0.05, image_mean=0.05, p99=1.0),
    "ffmpeg": Tolerance(mean=1.5, image_mean=2.0, p99=14.0),
    # Not measured here (no GPU): nvJPEG's IDCT and upsampling differ from libjpeg's, and the
    # region's rounding adds turbo's difference.
    "nvjpeg": Tolerance(mean=2.5, image_mean=3.5, p99=16.0),
}


def assert_matches_reference(root: Path, decoder: str, size: int, device: str = "cpu") -> None:
    index = folder_index(root)
    reference = pil_val_transform(size)
    expected = torch.stack([reference(load_rgb(p)) for p in index.val.paths])
    loader = build_loader(
        spec(index.val, train=False, decoder=decoder, image_size=size, device=torch.device(device)),
    )
    try:
        got = torch.cat([b.images.cpu() for b in loader])
    finally:
        loader.close()
    assert got.shape == expected.shape
    diff = (got.int() - expected.int()).abs().float()
    # The val crop taken as a region of the original (decoded alone, or cut from a whole
    # decode: the same pixels), or the reference's plan.
    regions = loader.decoder.geometry.val_region
    tolerance = TOLERANCES[decoder if regions or decoder != "turbo" else "turbo-whole"]
    assert diff.mean() <= tolerance.mean, f"{decoder}: mean |diff| {diff.mean():.3f}"
    assert diff.mean(dim=(1, 2, 3)).max() <= tolerance.image_mean
    assert diff.flatten().quantile(0.99) <= tolerance.p99


@pytest.mark.parametrize("size", [64, 224])
@pytest.mark.parametrize("decoder", CPU_DECODERS)
def test_val_images_match_the_torchvision_reference(
    tiny_root: Path, decoder: str, size: int
) -> None:
    assert_matches_reference(tiny_root, decoder, size)


@pytest.mark.parametrize("decoder", CPU_DECODERS)
def test_train_pipeline_is_reproducible(tiny_root: Path, decoder: str) -> None:
    split = folder_index(tiny_root).train

    def first_epoch() -> torch.Tensor:
        loader = build_loader(spec(split, train=True, decoder=decoder))
        try:
            return torch.cat([b.images for b in loader])
        finally:
            loader.close()

    assert torch.equal(first_epoch(), first_epoch())


# ---------------------------------------------------------------------------------------------
# Unreadable files: skipped and counted, or raised naming the file; never a hang.


@pytest.fixture(scope="module")
def damaged_root(tiny_root: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tiny_root's val split plus a truncated, a zero-byte and a text file named .JPEG, and a
    PNG named .JPEG (which must load)."""
    root = tmp_path_factory.mktemp("damaged")
    for split in ("train", "val"):
        for path in sorted((tiny_root / split).rglob("*.JPEG")):
            target = root / path.relative_to(tiny_root)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(path.read_bytes())
    good = sorted((root / "val").rglob("*.JPEG"))[0]
    folder = good.parent
    (folder / "zz_truncated.JPEG").write_bytes(good.read_bytes()[:4000])
    (folder / "zz_empty.JPEG").write_bytes(b"")
    (folder / "zz_text.JPEG").write_text("not an image at all\n")
    Image.open(good).convert("RGB").save(folder / "zz_png.JPEG", format="PNG")
    return root


BAD_FILES = {"zz_truncated.JPEG", "zz_empty.JPEG", "zz_text.JPEG"}


@pytest.mark.parametrize("decoder", CPU_DECODERS)
@pytest.mark.timeout(120)
def test_unreadable_files_are_skipped_and_counted(damaged_root: Path, decoder: str) -> None:
    index = folder_index(damaged_root)
    loader = build_loader(spec(index.val, train=False, decoder=decoder))
    try:
        labels = torch.cat([b.labels for b in loader])
    finally:
        loader.close()
    assert len(index.val) == 16
    assert len(labels) == 13  # 12 good JPEGs + the PNG named .JPEG
    assert loader.stats()["skipped_files"] == 3


@pytest.mark.parametrize("bad", sorted(BAD_FILES))
@pytest.mark.parametrize("decoder", CPU_DECODERS)
@pytest.mark.timeout(120)
def test_unreadable_file_raises_naming_it(damaged_root: Path, decoder: str, bad: str) -> None:
    index = folder_index(damaged_root)
    keep = [i for i, p in enumerate(index.val.paths) if Path(p).name not in BAD_FILES - {bad}]
    split = Split(
        "val", tuple(index.val.paths[i] for i in keep), tuple(index.val.labels[i] for i in keep)
    )
    before = spdl_threads()
    loader = build_loader(spec(split, train=False, decoder=decoder, on_error="raise"))
    with pytest.raises(OSError, match=f"cannot decode image .*{bad}"):
        for _ in loader:
            pass
    loader.close()
    assert spdl_threads() <= before


# ---------------------------------------------------------------------------------------------
# Threads: none outlives an epoch, an early stop, or close().


@pytest.mark.timeout(120)
def test_no_thread_outlives_the_loader(tiny_root: Path) -> None:
    index = folder_index(tiny_root)
    before = spdl_threads()
    loader = build_loader(spec(index.train, train=True, num_workers=3))
    for epoch in range(2):
        loader.set_epoch(epoch)
        assert sum(len(b.labels) for b in loader) == 20
    # Persistent (the default): one pipeline runs on into the next epoch, until close().
    assert len(spdl_threads() - before) > 0
    loader.close()
    loader.close()  # twice is fine
    assert spdl_threads() <= before

    iterator = iter(loader)
    next(iterator)  # an epoch left half-way, its threads busy
    assert len(spdl_threads() - before) > 0
    loader.close()
    assert spdl_threads() <= before
    del iterator

    with build_loader(spec(index.val, train=False)) as val_loader:
        for _ in val_loader:
            break  # abandoned mid-epoch: the generator's cleanup stops the pipeline
        assert spdl_threads() <= before
    assert spdl_threads() <= before


@pytest.mark.timeout(120)
def test_a_pipeline_per_epoch_when_not_persistent(tiny_root: Path) -> None:
    index = folder_index(tiny_root)
    before = spdl_threads()
    loader = build_loader(spec(index.train, True, persistent=False))
    for epoch in range(2):
        loader.set_epoch(epoch)
        assert sum(len(b.labels) for b in loader) == 20
        assert spdl_threads() <= before  # each finished epoch stopped its pipeline
    loader.close()


@pytest.mark.timeout(120)
def test_a_persistent_pipeline_serves_the_epoch_asked_for(colour_root: Path) -> None:
    """Reused across epochs, rebuilt when set_epoch jumps (resume) or repeats one."""
    split = folder_index(colour_root).train
    persistent = build_loader(spec(split, train=True, batch_size=4))

    def colours(loader, epoch: int) -> list[int]:
        loader.set_epoch(epoch)
        return [c for batch in loader for c in identify(batch.images)]

    fresh = {}
    for epoch in (0, 1, 2, 5):
        with build_loader(spec(split, train=True, batch_size=4)) as one_off:
            fresh[epoch] = colours(one_off, epoch)
    try:
        for epoch in (0, 1, 2, 5, 5, 1):
            assert colours(persistent, epoch) == fresh[epoch], f"epoch {epoch}"
    finally:
        persistent.close()


def test_stats_report_spdl_stage_figures(tiny_root: Path) -> None:
    loader = build_loader(spec(folder_index(tiny_root).val, train=False))
    for _ in loader:
        pass
    loader.close()
    stats = loader.stats()
    assert stats["skipped_files"] == 0 and stats["spdl_decoder"] == "turbo"
    assert stats["spdl_decode_threads"] == 2
    for key in (
        "spdl_src_occupancy",
        "spdl_decode_occupancy",
        "spdl_decode_task_ms",
        "spdl_decode_put_wait_ms",
        "spdl_sink_occupancy",
        "spdl_sink_get_wait_ms",
    ):
        assert key in stats, sorted(stats)
    assert 0.0 <= stats["spdl_sink_occupancy"] <= 1.0 and stats["spdl_decode_task_ms"] > 0


# ---------------------------------------------------------------------------------------------
# nvjpeg: the GPU decoder.


@pytest.mark.skipif(HAS_CUDA, reason="checks the message given where there is no CUDA device")
def test_nvjpeg_without_cuda_fails_at_once_saying_so(tiny_root: Path) -> None:
    before = spdl_threads()
    with pytest.raises(RuntimeError, match="nvjpeg.*no CUDA device"):
        build_loader(spec(folder_index(tiny_root).val, train=False, decoder="nvjpeg"))
    assert spdl_threads() <= before


def test_nvjpeg_batch_logic_runs_off_the_gpu(
    damaged_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The batch path (batched decode, one-by-one retry on a bad file, non-JPEG fallback,
    plans, stacking) with the CPU's batched decoder standing in for nvJPEG."""
    monkeypatch.setattr(decoders, "require_cuda", lambda device, what: None)
    index = folder_index(damaged_root)
    # Whole, with a sound frame header, so handed to the batched decode, which fails on it:
    # a Huffman table whose code counts add up to far over 256.
    bogus = bytearray(Path(index.val.paths[0]).read_bytes())
    at = bogus.find(b"\xff\xc4")
    bogus[at + 5 : at + 21] = b"\xff" * 16
    (tmp_path / "zz_bogus_huffman.JPEG").write_bytes(bogus)
    decoder = decoders.NvjpegDecoder(Geometry(64, train=False), torch.device("cpu"))
    paths = [*index.val.paths, str(tmp_path / "zz_bogus_huffman.JPEG")]
    labels = [*index.val.labels, 0]
    samples = [Sample(i, p, lab, 0) for i, (p, lab) in enumerate(zip(paths, labels, strict=True))]
    buffers = BatchBuffers(len(samples), (3, 64, 64), capacity=2, pin=False)
    read = decoder.decode_batch(samples, buffers)
    # The truncated file is refused on opening, by PIL (``images.jpeg_ends``); the PNG named
    # .JPEG is decoded there.
    assert len(read.jpegs) == 13 and len(read.staged_labels) == 1
    batch = decoder.to_device(read, buffers)
    assert batch.images.shape == (13, 3, 64, 64) and len(batch.labels) == 13
    assert {Path(f.path).name for f in batch.failures} == {*BAD_FILES, "zz_bogus_huffman.JPEG"}
    # The same pixels as the turbo decoder's threads give (the batched resize's float weights
    # round a few pixels 1 grey level apart from the CPU kernel's fixed-point ones).
    turbo = decoders.TurboDecoder(Geometry(64, train=False), torch.device("cpu"))
    first = turbo.open(samples[0])
    expected = turbo.finish(first, turbo.geometry.plans([first])[0])
    assert (batch.images[0].int() - expected.int()).abs().max() <= 1


@pytest.mark.parametrize("train", [False, True])
def test_nvjpeg_batches_are_the_turbo_decoders_off_the_gpu(
    tiny_root: Path, monkeypatch: pytest.MonkeyPatch, train: bool
) -> None:
    """nvjpeg's batched finish (every plan's resize, crop and flip in one batched resize),
    with the CPU's batched decoder standing in for nvJPEG, against the turbo decoder's
    per-image CPU path on the same samples: within 1 grey level, nearly all to the bit."""
    monkeypatch.setattr(decoders, "require_cuda", lambda device, what: None)
    split = folder_index(tiny_root).train if train else folder_index(tiny_root).val
    geometry = Geometry(48, train=train, seed=5)
    cpu = torch.device("cpu")
    nvjpeg, turbo = decoders.NvjpegDecoder(geometry, cpu), decoders.TurboDecoder(geometry, cpu)
    samples = [
        Sample(i, p, lab, 1)
        for i, (p, lab) in enumerate(zip(split.paths, split.labels, strict=True))
    ]
    buffers = BatchBuffers(len(samples), (3, 48, 48), capacity=4, pin=False)
    batch = nvjpeg.to_device(nvjpeg.decode_batch(samples, buffers), buffers)
    reference = turbo.decode_batch(samples, buffers)
    assert torch.equal(batch.labels, reference.labels) and not batch.failures
    diff = (batch.images.int() - reference.images.int()).abs()
    assert diff.max() <= 1 and diff.float().mean() < 0.05


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA, reason=NO_CUDA_REASON)
def test_nvjpeg_refuses_a_cpu_run(tiny_root: Path) -> None:
    with pytest.raises(RuntimeError, match="device=cuda"):
        build_loader(spec(folder_index(tiny_root).val, train=False, decoder="nvjpeg"))


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA, reason=NO_CUDA_REASON)
@pytest.mark.parametrize("size", [64, 224])
def test_nvjpeg_val_images_match_the_reference(tiny_root: Path, size: int) -> None:
    assert_matches_reference(tiny_root, "nvjpeg", size, device="cuda")


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA, reason=NO_CUDA_REASON)
@pytest.mark.timeout(120)
def test_nvjpeg_train_epoch_on_the_gpu_and_skips_damaged(damaged_root: Path) -> None:
    index = folder_index(damaged_root)
    loader = build_loader(
        spec(index.val, train=True, decoder="nvjpeg", device=torch.device("cuda"))
    )
    try:
        batches = list(loader)
    finally:
        loader.close()
    assert all(b.images.is_cuda and b.labels.is_cuda for b in batches)
    assert sum(len(b.labels) for b in batches) + loader.stats()["skipped_files"] == 15


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA, reason=NO_CUDA_REASON)
def test_cpu_decode_transfers_to_the_gpu(tiny_root: Path) -> None:
    loader = build_loader(
        spec(folder_index(tiny_root).val, train=False, device=torch.device("cuda"))
    )
    try:
        batches = list(loader)
    finally:
        loader.close()
    assert all(b.images.is_cuda for b in batches) and len(batches) == 3
    assert isinstance(loader, SpdlLoader)


# ---------------------------------------------------------------------------------------------
# The entry points.


@pytest.mark.slow
def test_train_py_trains_end_to_end_with_spdl(small_root: Path, tmp_path: Path) -> None:
    """train.py with spdl: its validation's top1 is what eval.py gives on the checkpoint it
    saved, with spdl exactly, and with torchvision's loader within one of the 40 val images
    (turbo matches Pillow to a grey level). A count of other images, or of other labels, than
    the checkpoint's own evaluation would differ."""
    common = [f"dataset.root={small_root}", "device=cpu", "logger=none"]
    train = tmp_path / "train"
    train.mkdir()
    run_here(
        "train.py",
        *common,
        "loader=spdl",
        "loader.batch_size=16",
        "epochs=1",
        "model.name=test_resnet",
        cwd=train,
    )
    run_dir, metrics = single_run(train, "train")
    assert metrics["status"] == "ok" and metrics["loader"] == "spdl"
    assert metrics["images"] == 160 and metrics["skipped_files"] == 0
    assert metrics["epochs"] == 1 and metrics["val_size"] == 40
    assert metrics["loader_train_spdl_decoder"] == "turbo"
    assert "loader_train_spdl_decode_occupancy" in metrics
    evaluate = tmp_path / "eval"
    evaluate.mkdir()
    checkpoint = f"checkpoint={run_dir / 'checkpoint.pt'}"
    run_here("eval.py", "--multirun", *common, checkpoint, "loader=spdl,torchvision", cwd=evaluate)
    top1 = {read_metrics(d)["loader"]: read_metrics(d)["top1"] for d in run_dirs(evaluate, "eval")}
    assert top1["spdl"] == metrics["top1"], (top1, metrics["top1"])
    assert abs(top1["torchvision"] - metrics["top1"]) <= 1 / 40 + 1e-9, (top1, metrics["top1"])


@pytest.mark.timeout(120)
def test_a_failing_stage_ends_the_epoch_with_its_cause(
    tiny_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Not a bad file (those are Failures) but the stage itself raising: the consumer gets the
    error, not an epoch quietly short of a batch, and the threads are gone."""
    before = spdl_threads()
    loader = build_loader(spec(folder_index(tiny_root).val, train=False))
    real, calls = loader.decoder.decode_batch, []

    def fails_second(samples, buffers):
        calls.append(len(samples))
        if len(calls) == 2:
            raise RuntimeError("pinned buffer exhausted")
        return real(samples, buffers)

    monkeypatch.setattr(loader.decoder, "decode_batch", fails_second)
    with pytest.raises(RuntimeError, match="pinned buffer exhausted"):
        for _ in loader:
            pass
    loader.close()
    assert spdl_threads() <= before
