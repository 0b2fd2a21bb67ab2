"""``loader=memmap``: a decoded uint8 cache on disk (a tensordict TensorClass over memory-mapped
files), read a whole batch at a time: ``loader`` serves batches, ``build`` is what every store
shares, ``store_raw`` and the private ``_store_jpeg`` the two ways of keeping the images, and
``housekeeping`` lists and removes old caches (``make clean-cache``). Finding, building and
opening the cache folders, reading rows and the device's share of the work are private.

The face is the loader's keys: the registry imports them in every run, and the store's
modules (tensordict, the build's worker pool) load only where ``loader=memmap`` is chosen."""

from loaderbench.loaders.memmap.settings import Settings

__all__ = ["Settings"]
