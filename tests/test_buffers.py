"""Bounded memory on the way to the GPU: the pooled batch buffers and the per-box crop."""

from __future__ import annotations

import gc

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from loaderbench.imaging.transforms import crop_resize_flip_batch, resized_crop_images, seeded_crops
from loaderbench.platform.buffers import BatchBuffers, BufferPool


def test_a_buffer_is_reused_once_nobody_holds_it() -> None:
    pool = BufferPool((8, 3, 4, 4), capacity=2)
    first = pool.take(8)
    first_address = first.data_ptr()
    second = pool.take(5)  # the first is held: another buffer
    assert second.data_ptr() != first_address and second.shape == (5, 3, 4, 4)
    view = first[2:]  # a view of it keeps it taken
    del first
    third = pool.take(8)  # both held: over capacity, a fresh buffer from outside the pool
    assert third.data_ptr() not in (first_address, second.data_ptr())
    assert pool.overflows == 1 and pool.buffers == 2
    del view, third
    gc.collect()
    assert pool.take(8).data_ptr() == first_address  # free again: reused, not reallocated
    assert pool.buffers == 2 and pool.nbytes == 2 * 8 * 3 * 4 * 4


def test_the_pool_stays_bounded_over_many_batches() -> None:
    """A loop that keeps the last two batches alive (a prefetching consumer) never needs more
    than three buffers, whatever the number of batches."""
    buffers = BatchBuffers(16, (3, 8, 8), capacity=3, pin=False)
    kept: list[tuple[torch.Tensor, torch.Tensor]] = []
    addresses = set()
    for step in range(200):
        images, labels = buffers.take(16 if step % 7 else 9)
        images.fill_(step % 256)
        labels.fill_(step)
        addresses.add(images.data_ptr())
        kept = [*kept[-1:], (images, labels)]
        assert (
            int(kept[0][1][0]) in (step - 1, step) and int(kept[-1][0].flatten()[0]) == step % 256
        )
    assert len(addresses) == 3 and buffers.images.overflows == 0
    stats = buffers.stats()
    assert stats["buffers_mb"] == pytest.approx(3 * (16 * 3 * 8 * 8 + 16 * 8) / 2**20)
    assert stats["buffer_pool_overflows"] == 0


def peak_cpu_bytes(fn) -> int:
    """The most memory that ``fn``'s tensors held at once beyond what existed before, read
    from the profiler's allocation events (every CPU allocation and free torch makes)."""
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    events = [e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"]
    assert events, "the profiler recorded no allocations"
    live = peak = 0
    for event in sorted(events, key=lambda e: e.start_ns()):
        live += event.nbytes()
        peak = max(peak, live)
    return peak


def test_the_gpu_crop_path_holds_one_box_in_float_not_the_batch() -> None:
    """The crop the GPU runs (only the box converted to float, one image at a time), run on the
    CPU with ``via_float``: its memory beyond the output batch stays within one stored image
    and two output images in float, where converting the stored batch would take 16 images."""
    n, height, width, size = 16, 300, 400, 64
    generator = torch.Generator().manual_seed(0)
    stored = torch.randint(0, 256, (n, 3, height, width), dtype=torch.uint8, generator=generator)
    boxes, flips = seeded_crops([height] * n, [width] * n, 0, 0, list(range(n)))
    out = torch.empty((n, 3, size, size), dtype=torch.uint8)

    def crop() -> None:
        resized_crop_images(list(stored.unbind(0)), boxes, size, flips, out, via_float=True)

    peak = peak_cpu_bytes(crop)
    float_bytes = 4 * 3
    bound = float_bytes * (height * width + 2 * size * size)
    whole_batch_in_float = float_bytes * n * height * width
    assert 0 < peak <= bound < whole_batch_in_float / 8
    # The measurement sees a whole-batch conversion: the bound is not vacuous.
    assert peak_cpu_bytes(lambda: stored.float()) >= whole_batch_in_float
    # And the float path gives the CPU's uint8 kernel's pixels, to rounding.
    uint8_path = crop_resize_flip_batch(stored, boxes, size, flips)
    assert (out.int() - uint8_path.int()).abs().max() <= 1
