"""``loader=memmap``: a decoded uint8 cache on disk (a tensordict TensorClass over memory-mapped
files), read a whole batch at a time: ``loader`` serves batches, ``cache`` finds, builds and opens
the cache folders, ``build`` is what every store shares, ``store_raw`` and ``store_jpeg`` the two
ways of keeping the images.

The face is the loader's keys: the registry imports them in every run, and the store's
modules (tensordict, the build's worker pool) load only where ``loader=memmap`` is chosen."""

from loaderbench.loaders.memmap.settings import Settings

__all__ = ["Settings"]
