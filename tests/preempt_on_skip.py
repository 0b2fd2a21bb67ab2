"""``python tests/preempt_on_skip.py [train.py overrides]``: train.py, preempted by a real
SIGUSR2 that the run sends itself the moment its loader first reports an unreadable image.

A preemption signal from outside lands wherever the run happens to be; this one lands at a
known place in the epoch: the loader has just left out a batch (or part of one), and the
training loop stops at the step after it, so a test can put an all-unreadable batch before
the preemption point by construction, for every loader.
"""

from __future__ import annotations

import logging
import os
import runpy
import signal
import sys
from pathlib import Path

TRAIN = Path(__file__).resolve().parents[1] / "train.py"
MARK = "skipping unreadable image"  # every loader's warning as an epoch meets such a file


class PreemptOnFirstSkip(logging.Handler):
    """Sends SIGUSR2 to the run's main process at the first warning of an unreadable image."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.main_pid = os.getpid()
        self.sent = False

    def emit(self, record: logging.LogRecord) -> None:
        if self.sent or os.getpid() != self.main_pid or MARK not in record.getMessage():
            return
        self.sent = True
        os.kill(self.main_pid, signal.SIGUSR2)


if __name__ == "__main__":
    # On "loaderbench" (Hydra's logging set-up configures the root logger only, and leaves
    # the handlers of other loggers in place).
    logging.getLogger("loaderbench").addHandler(PreemptOnFirstSkip())
    sys.argv[0] = str(TRAIN)  # Hydra names the job (and its outputs/ folder) after it
    runpy.run_path(str(TRAIN), run_name="__main__")
