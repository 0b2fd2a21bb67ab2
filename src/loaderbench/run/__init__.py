"""The run core: one run's lifecycle, from the validated config to metrics.json.

``session`` sets a run up and finishes it (``records``: metrics.json, run_config.json); ``fitting``
trains over epochs; ``checkpoint`` writes and reads the state, ``resume_rules`` says whether a
checkpoint may continue this run, ``elastic`` continues it on another number of ranks
(``resumed``: the interrupted epoch the loaders share out); ``ledger`` counts the images each
epoch trained on; ``stopping`` turns signals into stops and preemptions; ``distributed`` is
the ranks and their collectives. docs/design.md maps it.

Nothing is imported here: the loaders import ``resumed`` without the rest of the run.
"""
