"""The baseline loader on real JPEG files: what is its own (its worker processes). Its pixels,
order, shares, skips and resumes are the loader contract's (tests/test_loader_contract.py)."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from loaderbench.loaders import LoaderSpec, build_loader
from tests.conftest import cpu_spec, folder_index


def spec(split, train: bool, **kwargs) -> LoaderSpec:
    return cpu_spec(split, train, loader="torchvision", **kwargs)


@pytest.mark.timeout(120)
def test_a_killed_worker_ends_the_epoch_with_its_cause(tiny_root: Path) -> None:
    """A worker process gone (the OOM killer, a segfault in a codec): an error naming it, not
    a hang; and close() still releases the rest."""
    index = folder_index(tiny_root)
    loader = build_loader(spec(index.train, train=True, num_workers=2, batch_size=2, prefetch=1))
    iterator = iter(loader)
    next(iterator)
    workers = loader.dataloader._iterator._workers  # the live worker processes
    os.kill(workers[0].pid, signal.SIGKILL)
    with pytest.raises(RuntimeError, match=f"worker pid {workers[0].pid} killed by SIGKILL"):
        for _ in iterator:
            pass
    loader.close()
    assert not any(worker.is_alive() for worker in workers)
