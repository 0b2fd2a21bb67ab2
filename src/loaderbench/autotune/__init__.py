"""``loader.num_workers=auto``: the fewest workers that keep this run fed on this machine.

Before the first epoch a probe runs the run's own loop (the configured loader, the model's
step) at a ladder of worker counts and keeps the fewest within ``loader.autotune.tolerance`` of
the best rate, or the fewest whose loop was fed. It changes nothing the run trains, and its
choice is remembered for the same machine, data and settings. docs/loaders.md
("num_workers=auto") says how; docs/design.md why it stops at the first fed count.

* ``policy``: the ladder, when to climb it, the choice (decisions on rows);
* ``rung``: one count measured; ``probe``: the ladder walked on real loaders;
* ``model_step``: the run's forward and loss, and what the probe leaves untouched;
* ``workload``: what each task probes; ``memory``: the probe's peak, apart;
* ``decisions``: the remembered choices; ``settle``: the entry point.
"""

from loaderbench.autotune.decisions import Decision
from loaderbench.autotune.model_step import ModelStep, model_step
from loaderbench.autotune.policy import choose, climb, fed_wait, worker_ladder
from loaderbench.autotune.probe import probe
from loaderbench.autotune.rung import PROBE_EPOCH, ProbeRow
from loaderbench.autotune.settle import settle_num_workers
from loaderbench.autotune.workload import Workload, evaluation_workload, training_workload

__all__ = [
    "PROBE_EPOCH",
    "Decision",
    "ModelStep",
    "ProbeRow",
    "Workload",
    "choose",
    "climb",
    "evaluation_workload",
    "fed_wait",
    "model_step",
    "probe",
    "settle_num_workers",
    "training_workload",
    "worker_ladder",
]
