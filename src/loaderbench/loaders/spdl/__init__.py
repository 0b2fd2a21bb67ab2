"""``loader=spdl``: SPDL's thread pipeline (``loader``), its keys (``settings``) and SPDL's
per-stage statistics (the private ``_stats``); the decoders it runs are
``loaderbench.imaging.spdl``'s.

The face is the loader's keys: the registry imports them in every run, and the pipeline's
modules load only where ``loader=spdl`` is chosen (``loaderbench.loaders.loader_class``)."""

from loaderbench.loaders.spdl.settings import Settings

__all__ = ["Settings"]
