"""``loader.num_workers=auto``: the fewest workers that keep this run fed on this machine.

Before the first epoch a probe runs the run's own loop at a ladder of worker counts (1, 2, 3,
4, 6, 8, 12, 16, ... up to the CPUs this process may use) and keeps the fewest workers whose
images/s is within ``loader.autotune.tolerance`` of the best it saw, or, if fewer, the fewest
whose loop was fed: a loop that waited ``w`` of its time for data could run at most
``1 / (1 - w)`` times faster with more workers, so at ``w <= tolerance / (1 + tolerance)``
(``fed_wait``) no count can beat it by more than the tolerance, and a higher count's better
rate in a window of a few batches is the machine's noise (or the probe's first steps warming
the process up), not the workers'. The loop is the real one: the configured loader, rebuilt
for each count, and the model's forward and backward on the run's device in its precision (the
optimizer does not step; ``model=none``: the loader alone, which always waits; eval.py: the
forward pass). It stops at the first fed count; otherwise it always measures a second count
(where the CPUs allow one), then climbs while a count beats the best before it by more than
``loader.autotune.gain``, and starts no count after ``loader.autotune.max_probe_s``. Where two
or more counts came out within ``loader.autotune.confirm_within`` of the best, and the fewest
of them was not fed, those are measured once more, in reverse order, and chosen on both
windows pooled: one window of a few batches does not resolve a few percent on a busy machine,
and the counts near the tolerance's edge are the ones its noise can swap.

The probe changes nothing the run computes: it reads probe epochs (``PROBE_EPOCH`` on), far
from the run's, so epoch 1's images, order and crops are untouched; it restores the model's
buffers (BatchNorm statistics) and mode and drops its gradients; and it runs inside saved and
restored random states (torch's, the CUDA device's, Python's, numpy's). A run with ``auto``
trains the same weights as one given the chosen count.

Each count's window opens only once its loader's head start is consumed (``rung``):
batches made ahead while the loop was busy elsewhere are not the workers' rate.

Under DDP every rank probes at the same time (they share the node's CPUs) and climbs one
ladder: the CPUs of the rank given the fewest (``settle.job_cpus``), so ranks given different
numbers run the same collectives. Each count's figures are combined over the ranks (images/s summed,
the job's rate; data wait the largest, since a rank that waits holds every rank at the next
all-reduce), so every rank climbs and stops alike, and rank 0's choice is broadcast.

The choice is remembered in a small JSON file in the cache folder, keyed by everything it
depends on (``decisions``); the next run with the same key starts at once,
``loader.autotune.refresh=true`` probes again, and a file that cannot be trusted is named in
a warning and probed over. The probe's peak memory is ``autotune_peak_rss_mb``, kept out of
``peak_rss_mb``; with ``bench.drop_page_cache=true`` the files are evicted after the probe.

One concept a module: ``policy`` (the ladder, when to climb it, the choice: decisions on
rows), ``rung`` (one count measured), ``probe`` (the ladder walked on real loaders),
``model_step`` (the run's forward and loss, ``engine.LossStep``, and what the probe leaves
untouched), ``workload`` (what each task probes), ``memory`` (the probe's peak apart),
``decisions`` (remembered choices), ``settle`` (the entry point).
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
