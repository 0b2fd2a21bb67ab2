"""loaderbench: fast, measurable, comparable image data loading for PyTorch training.

The layers are packages, each with its face (``__all__``; docs/design.md maps them): a fourth
loader is written against ``loaderbench.loaders`` (``Loader``, ``LoaderSpec``, ``Batch``,
``LoaderSettings``, ``register_loader``) and composes ``loaderbench.imaging``; a script around a
run calls ``loaderbench.app`` (``train``, ``evaluate_checkpoint``: what train.py and eval.py
run, on a composed config). Nothing is imported here: every import of a module of the
package runs this file first, and the GPU check's report reads the metric catalog on machines
without torch, Hydra or OmegaConf.
"""

from loaderbench.platform.version import VERSION as __version__

__all__ = ["__version__"]
