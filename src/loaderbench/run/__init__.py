"""The run layer: one run's lifecycle, from the validated config to metrics.json.

``validation`` types the composed config; ``session`` sets a run up and finishes it
(``records``: metrics.json, run_config.json; ``tracking``: W&B); ``fitting`` trains over epochs;
``checkpoint`` writes and reads the state, ``resume_rules`` says whether a checkpoint may
continue this run, ``elastic`` continues it on another number of ranks; ``ledger`` counts the
images each epoch trained on; ``autorange`` repeats passes until a rate is a measurement;
``ceiling`` measures the model's own rate; ``sweeps`` and ``folders`` read a multirun back.
docs/design.md maps it.
"""
