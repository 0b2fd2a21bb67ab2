"""``python -m loaderbench.launch [torchrun's arguments]``: torchrun that outlives SLURM's
preemption signal.

SLURM's warning before a time limit or a preemption (``--signal=USR2@N``, ``scancel
--signal=USR2``) reaches every process of the step, and under ``srun torchrun ...`` that
includes torchrun, which does not handle USR2: it died at once while its ranks were still
writing the checkpoint, and the step (its task gone) took the ranks with it. Here USR2 is set
to be ignored, and torchrun (``torch.distributed.run``, the same interpreter) is executed in
this process: an ignored signal stays ignored across ``exec``, so the launcher keeps its pid
(srun's task) and lives until its ranks have saved their state and left. Each rank installs
its own handler (``stopping.preemption_noted``) and stops at a step boundary.
docs/imagenet_and_slurm.md, "Preemption under torchrun".
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
