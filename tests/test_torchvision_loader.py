"""The baseline loader on real JPEG files: what is its own (its worker processes). Its pixels,
order, shares, skips and resumes are the loader contract's (tests/test_loader_contract.py)."""

from __future__ import annotations

import os
import signal
import threading
import time
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

    def kill_the_rest() -> None:  # a worker forked holding a lock it never gets: ended
        for worker in workers:
            if worker.is_alive():
                os.kill(worker.pid, signal.SIGKILL)

    stuck = threading.Timer(60, kill_the_rest)
    stuck.start()
    try:
        os.kill(workers[0].pid, signal.SIGKILL)
        with pytest.raises(RuntimeError, match=f"worker pid {workers[0].pid} killed by SIGKILL"):
            for _ in iterator:
                pass
        loader.close()
        for worker in workers:  # close() ends them; their exit is not waited for there
            worker.join(10)
    finally:
        stuck.cancel()
    assert not any(worker.is_alive() for worker in workers)


@pytest.mark.timeout(120)
def test_a_worker_that_sends_nothing_within_timeout_s_is_an_error_naming_the_key(
    tiny_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker alive but stuck (a file system that does not answer, a deadlock), which
    DataLoader alone would wait for for ever: the epoch ends with an error naming the key."""
    from loaderbench.loaders.torchvision import loader as module

    decode = module.load_rgb

    def stuck(path: str):  # load_rgb's signature; the forked worker inherits it
        time.sleep(60)
        return decode(path)

    monkeypatch.setattr(module, "load_rgb", stuck)
    index = folder_index(tiny_root)
    loader = build_loader(spec(index.train, train=True, num_workers=1, timeout_s=1.0))
    started = time.monotonic()
    try:
        with pytest.raises(TimeoutError, match=r"loader.timeout_s=1 s in epoch 0 from 1 worker"):
            next(iter(loader))
    finally:
        loader.close()
    assert time.monotonic() - started < 30
