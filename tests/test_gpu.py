"""The CUDA paths, on a GPU (``pytest -m cuda``; skipped where there is none): the loops do not
sync per step, nvJPEG decodes batches whole and uncorrupted, the GPU crop matches the CPU's,
pinned buffers are reused only after their copies."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf
from PIL import Image

from loaderbench.config.schema import OptimConfig
from loaderbench.imaging.decode import CudaJpegDecoder, decode_cpu, hand_over
from loaderbench.imaging.device_resize import resize_boxes
from loaderbench.imaging.transforms import crop_resize_flip_batch, seeded_crops
from loaderbench.loaders import build_loader
from loaderbench.measure.meters import LoopMeter
from loaderbench.platform.buffers import BufferPool
from loaderbench.platform.runtime import PRECISIONS
from loaderbench.training.loops import train_one_epoch
from loaderbench.training.optim import build_optimizer
from tests.conftest import cpu_spec, folder_index
from tests.test_batched_crop import MAX_DIFF, MEAN_DIFF
from tests.test_loops import InMemoryLoader, Tiny, train_step

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]
CUDA = torch.device("cuda")


@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp16"])
def test_training_steps_never_wait_for_the_device(precision: str) -> None:
    """torch's sync debug mode raises on any host sync: only the log-point reads may sync.
    fp16 too: its GradScaler with the run's (fused) optimizer reads no inf flag per step."""
    model = Tiny().to(CUDA)
    step = train_step(model)
    step.device = CUDA
    step.precision = PRECISIONS[precision][0]
    step.scaler = step.precision.grad_scaler(CUDA)
    step.optimizer = build_optimizer(OmegaConf.structured(OptimConfig()), model, CUDA)
    step.scheduler = torch.optim.lr_scheduler.LambdaLR(step.optimizer, lambda _: 1.0)
    loader = InMemoryLoader(30)
    loader.batches = [type(b)(b.images.to(CUDA), b.labels.to(CUDA)) for b in loader.batches]
    reads = []

    def read(value: torch.Tensor) -> float:
        torch.cuda.set_sync_debug_mode(0)
        try:
            reads.append(float(value))
        finally:
            torch.cuda.set_sync_debug_mode("error")
        return reads[-1]

    torch.cuda.set_sync_debug_mode("error")
    try:
        train_one_epoch(step, loader, LoopMeter(), log_every=10, read=read)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert len(reads) == 3


def jpegs(count: int, seed: int = 0) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    out = []
    for i in range(count):
        h, w = 200 + 7 * i, 300 - 5 * i
        base = torch.rand(3, 8, 8, generator=generator) * 255
        pixels = torch.nn.functional.interpolate(base[None], size=(h, w), mode="bicubic")[0]
        array = pixels.clamp(0, 255).to(torch.uint8).permute(1, 2, 0).numpy()
        buffer = io.BytesIO()
        Image.fromarray(array).save(buffer, "JPEG", quality=90)
        out.append(torch.frombuffer(bytearray(buffer.getvalue()), dtype=torch.uint8))
    return out


def test_batched_nvjpeg_matches_libjpeg_turbo_under_a_busy_consumer() -> None:
    """Each batch decoded while the consumer's stream is busy and frees memory: the images,
    cropped on the decoder's stream, arrive whole (the stream race would corrupt them)."""
    datas = jpegs(24)
    references = [decode_cpu(d) for d in datas]
    decoder = CudaJpegDecoder.for_device(CUDA)
    assert CudaJpegDecoder.for_device(CUDA) is decoder  # one per device
    size = 64
    boxes, flips = seeded_crops(
        [r.shape[1] for r in references], [r.shape[2] for r in references], 0, 0, range(24)
    )
    expected = crop_resize_flip_batch_list(references, boxes, size, flips)
    for _ in range(20):
        busy = torch.randn(4096, 4096, device=CUDA)
        for _ in range(4):
            busy = busy @ busy / 64  # queued work that holds, then frees, memory
        del busy

        def finish(decoded):
            out = torch.empty((len(decoded), 3, size, size), dtype=torch.uint8, device=CUDA)
            return crop_resize_flip_batch_list(decoded, boxes, size, flips, out)

        batch, ready = decoder.run(datas, finish)
        hand_over(ready, batch)
        diff = (batch.cpu().int() - expected.int()).abs().float()
        assert diff.mean() < 2.0 and diff.amax(dim=(1, 2, 3)).max() < 60


def crop_resize_flip_batch_list(images, boxes, size, flips, out=None):
    from loaderbench.imaging.transforms import resized_crop_images

    return resized_crop_images(list(images), boxes, size, flips, out)


def test_pinned_buffers_are_reused_after_their_copy() -> None:
    pool = BufferPool((32, 3, 64, 64), capacity=2, pin=True)
    first = pool.take(32)
    assert first.is_pinned()
    address = first.data_ptr()
    on_gpu = pool.to_device(first, CUDA)
    del first
    torch.cuda.synchronize()
    again = pool.take(32)
    assert again.data_ptr() == address and pool.buffers == 1 and on_gpu.is_cuda


@pytest.mark.parametrize("store", ["raw", "jpeg"])
def test_memmap_train_batches_on_the_gpu_match_the_cpu(
    tiny_root: Path, tmp_path: Path, store: str
) -> None:
    split = folder_index(tiny_root).train
    common = {"cache_dir": str(tmp_path), "store": store, "train_store_min_side": 0}
    on_cpu = build_loader(cpu_spec(split, True, loader="memmap", **common))
    on_gpu = build_loader(cpu_spec(split, True, loader="memmap", device=CUDA, **common))
    try:
        rows = on_cpu.cache.data.images.as_subclass(torch.Tensor) if store == "raw" else None
        order = on_cpu.spec.epoch_batches(0)
        for a, b, indices in zip(on_cpu, on_gpu, order, strict=True):
            assert b.images.is_cuda and torch.equal(a.labels, b.labels.cpu())
            diff = (a.images.int() - b.images.cpu().int()).abs().float()
            # raw: the CPU's antialiased filter, batched (tests/test_batched_crop.py);
            # jpeg: nvJPEG's pixels, then the same filter.
            assert diff.mean() < (MEAN_DIFF if store == "raw" else 2.0)
            assert store == "jpeg" or diff.max() <= MAX_DIFF
            if rows is not None:  # the same batched crop on the CPU: float rounding apart
                boxes, flips = on_cpu.parts.train_boxes(0, indices)
                stored = rows[indices].permute(0, 3, 1, 2)
                expected = resize_boxes(stored, boxes, b.images.shape[-1], flips)
                assert (expected.int() - b.images.cpu().int()).abs().max() <= 1
        assert on_gpu.stats()["pinned_mb"] > 0
    finally:
        on_cpu.close()
        on_gpu.close()


@pytest.mark.parametrize("store", ["raw", "jpeg"])
def test_memmap_cuda_batches_are_made_on_the_reading_threads_own_streams(
    tiny_root: Path, tmp_path: Path, store: str
) -> None:
    """Decode (jpeg), copy and crop run in the reading threads, each on a stream of its own,
    while the consumer's stream is busy and frees memory: the batches arrive whole (the
    consumer waits on each batch's event, the allocator keeps its memory for the consumer)."""
    split = folder_index(tiny_root).train
    common = {"cache_dir": str(tmp_path), "store": store, "train_store_min_side": 0}
    on_cpu = build_loader(cpu_spec(split, True, loader="memmap", **common))
    expected = [batch.images for batch in on_cpu]
    on_cpu.close()
    on_gpu = build_loader(
        cpu_spec(split, True, loader="memmap", device=CUDA, num_workers=2, prefetch=4, **common)
    )
    consumer = torch.cuda.current_stream(CUDA)
    try:
        for _ in range(3):
            means, held = [], []
            for batch in on_gpu:
                busy = torch.randn(2048, 2048, device=CUDA)
                for _ in range(4):
                    busy = busy @ busy / 64  # queued work that holds, then frees, memory
                del busy
                means.append(batch.images.float().mean((1, 2, 3)))  # on the consumer stream
                held.append(batch.images)  # kept: its memory must stay this batch's
            for mean, images, reference in zip(means, held, expected, strict=True):
                images = images.cpu()
                assert torch.allclose(mean.cpu(), images.float().mean((1, 2, 3)))
                assert (images.int() - reference.int()).abs().float().mean() < 2.0
        assert torch.cuda.current_stream(CUDA) == consumer
        threads = on_gpu.parts.threads.threads
        assert 1 <= len(threads) <= 2 and all(n.startswith("memmap-loader") for n in threads)
    finally:
        on_gpu.close()


def test_crop_on_the_gpu_matches_the_cpu_uint8_kernel() -> None:
    generator = torch.Generator().manual_seed(0)
    stored = torch.randint(0, 256, (8, 3, 120, 160), dtype=torch.uint8, generator=generator)
    boxes, flips = seeded_crops([120] * 8, [160] * 8, 0, 0, range(8))
    cpu = crop_resize_flip_batch(stored, boxes, 32, flips)
    gpu = crop_resize_flip_batch(stored.to(CUDA), boxes, 32, flips)
    assert (cpu.int() - gpu.cpu().int()).abs().max() <= 1


def test_the_batched_resize_on_the_gpu_is_its_cpu_pixels() -> None:
    """``device_resize`` on CUDA (cuBLAS's matmuls) against the same call on CPU tensors and
    against the CPU kernel, on noise: TF32 or another reduction order would show here."""
    generator = torch.Generator().manual_seed(0)
    stored = torch.randint(0, 256, (16, 3, 336, 336), dtype=torch.uint8, generator=generator)
    boxes, flips = seeded_crops([336] * 16, [336] * 16, 0, 0, range(16))
    on_cpu = resize_boxes(stored, boxes, 224, flips)
    on_gpu = resize_boxes(stored.to(CUDA), boxes, 224, flips).cpu()
    assert (on_cpu.int() - on_gpu.int()).abs().max() <= 1
    reference = crop_resize_flip_batch(stored, boxes, 224, flips)
    diff = (reference.int() - on_gpu.int()).abs()
    assert diff.max() <= MAX_DIFF and diff.float().mean() < MEAN_DIFF
    # A run that lets fp32 matmuls use TF32 gets the same pixels (the resize goes float64).
    saved = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high")
    try:
        with_tf32 = resize_boxes(stored.to(CUDA), boxes, 224, flips).cpu()
    finally:
        torch.set_float32_matmul_precision(saved)
    assert (with_tf32.int() - on_cpu.int()).abs().max() <= 1
