"""The run layer: one run's lifecycle, from the validated config to metrics.json.

``compose`` registers the config schemas with Hydra; ``session`` sets a run up and finishes
it (metrics.json, run_config.json and W&B through its private modules); ``fitting`` trains over
epochs; ``checkpoint`` writes and reads the state (whether a checkpoint may continue this run,
and on another number of ranks, is decided privately beside it); ``autorange`` repeats passes
until a rate is a measurement; ``ceiling`` measures the model's own rate; ``sweeps`` and
``folders`` read a multirun back. docs/design.md maps it.
"""

# The face names its modules, not their contents: each entry point takes the part it runs, and
# ``compose`` must load before Hydra's decorator reads the schemas.
__all__ = [
    "autorange",
    "ceiling",
    "checkpoint",
    "compose",
    "fitting",
    "folders",
    "session",
    "sweeps",
]
