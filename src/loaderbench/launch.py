"""``python -m loaderbench.launch [torchrun's arguments]``: torchrun that outlives SLURM's
preemption signal.

SLURM's USR2 warning before a time limit or preemption reaches every process of the step,
torchrun included, which does not handle it: it dies at once, taking its ranks with it while
they write their checkpoint. Here USR2 is ignored and torchrun is executed in this process (an
ignored signal stays ignored across ``exec``), so the launcher keeps srun's task alive until
its ranks, each with its own handler, have saved their state and left
(docs/imagenet_and_slurm.md, "Preemption under torchrun").
"""

from __future__ import annotations

import os
import signal
import sys

from loaderbench.platform.stopping import PREEMPT_SIGNAL


def main(argv: list[str] | None = None) -> None:
    """Replace this process by torchrun with ``argv`` (default: this command's arguments),
    the preemption signal ignored."""
    args = sys.argv[1:] if argv is None else argv
    asked = [os.environ.get("TORCHELASTIC_SIGNALS_TO_HANDLE", ""), *args]
    if any("SIGUSR2" in arg for arg in asked):
        # torchrun's --signals-to-handle=...,SIGUSR2 stops the ranks on USR2: the opposite.
        sys.exit("loaderbench.launch: leave SIGUSR2 out of torchrun's --signals-to-handle")
    signal.signal(PREEMPT_SIGNAL, signal.SIG_IGN)
    sys.stdout.flush()
    os.execv(sys.executable, [sys.executable, "-m", "torch.distributed.run", *args])


if __name__ == "__main__":
    main()
