"""``loader=torchvision``: an ImageFolder-style dataset + DataLoader worker processes.

The face is the loader's keys: the registry imports them in every run, and the loader's
module loads only where ``loader=torchvision`` is chosen."""

from loaderbench.loaders.torchvision.settings import Settings

__all__ = ["Settings"]
