"""The training layer: models by name, optimisers and schedules by name, and the loops (one
training epoch, one evaluation pass, the loader-alone benchmark pass)."""
