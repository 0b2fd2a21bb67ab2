"""``loader=resident``: one batch of the run's shape made once on the run's device and served
again and again, with no file read and no decode: the model's own rate (its ceiling)."""

from loaderbench.loaders.resident.settings import Settings

__all__ = ["Settings"]
