"""train.py and eval.py run in the test's own process: the same ``main`` a command runs, through
Hydra's whole path (the overrides parsed from ``sys.argv``, the config composed, the run
directory, ``.hydra/``, the job's log), without the interpreter's start and its imports: a
fresh process spends about 4 s of CPU importing torch, torchvision and timm before its first
step, and most of the suite's CPU went there (docs/design.md, "The test suite").

For a test whose subject is a run's results, not its process: the command line's exit code and
output, signals, launchers and ranks keep ``conftest.run_entry`` (a real subprocess). What a run
changes in the process (signal handlers, torch's threads and RNG, the environment, the logging
set-up, the working directory, the pixel limit) is put back afterwards, so that the tests after
it in this worker see the process as it was.
"""

from __future__ import annotations

import logging
import os
import random
import runpy
import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch

from loaderbench.imaging.files import max_pixels, set_max_pixels

REPO = Path(__file__).resolve().parents[1]
_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2, signal.SIGHUP)


@contextmanager
def _process_state_kept() -> Iterator[None]:
    env, cwd, argv = dict(os.environ), os.getcwd(), list(sys.argv)
    handlers = {sig: signal.getsignal(sig) for sig in _SIGNALS}
    threads, pixels = torch.get_num_threads(), max_pixels()
    rng = (random.getstate(), np.random.get_state(), torch.get_rng_state())
    root = logging.getLogger()
    root_state = (list(root.handlers), root.level)
    levels = {name: logging.getLogger(name).level for name in logging.root.manager.loggerDict}
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(env)
        os.chdir(cwd)
        sys.argv[:] = argv
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
        torch.set_num_threads(threads)
        set_max_pixels(pixels)
        random.setstate(rng[0])
        np.random.set_state(rng[1])
        torch.set_rng_state(rng[2])
        for handler in root.handlers:
            if handler not in root_state[0]:
                handler.close()
        root.handlers[:] = root_state[0]
        root.setLevel(root_state[1])
        for name, level in levels.items():
            logging.getLogger(name).setLevel(level)


def run_here(script: str, *overrides: str, cwd: Path) -> None:
    """``python script overrides`` with outputs under ``cwd``, in this process; a failing run
    raises its own exception (``HYDRA_FULL_ERROR``: not Hydra's exit)."""
    with _process_state_kept():
        os.environ.update({"WANDB_MODE": "disabled", "HYDRA_FULL_ERROR": "1"})
        os.chdir(cwd)
        sys.argv[:] = [str(REPO / script), *overrides]
        # As ``__main__``, as the command runs it: Hydra finds conf/ beside the script's file.
        runpy.run_path(str(REPO / script), run_name="__main__")
