"""``loader.num_workers=auto``: the fewest workers that keep this run fed on this machine.

Before the first epoch a probe runs the run's own loop (the configured loader, the model's
step) at a ladder of worker counts and keeps the fewest within ``loader.autotune.tolerance`` of
the best rate, or the fewest whose loop was fed. It changes nothing the run trains, and its
choice is remembered for the same machine, data and settings. docs/loaders.md
("num_workers=auto") says how; docs/design.md why it stops at the first fed count.

Its private modules, behind this face:

* ``_policy``: the ladder, when to climb it, the choice (decisions on rows);
* ``_rung``: one count measured; ``_probe``: the ladder walked on real loaders;
* ``_model_step``: the run's forward and loss, and what the probe leaves untouched;
* ``_workload``: what each task probes; ``_memory``: the probe's peak, apart;
* ``_decisions``: the remembered choices; ``_settle``: the entry point.
"""

from loaderbench.autotune._decisions import Decision
from loaderbench.autotune._model_step import ModelStep, model_step
from loaderbench.autotune._policy import choose, climb, fed_wait, worker_ladder
from loaderbench.autotune._probe import probe
from loaderbench.autotune._rung import PROBE_EPOCH, ProbeRow
from loaderbench.autotune._settle import settle_num_workers
from loaderbench.autotune._workload import Workload, evaluation_workload, training_workload

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
