"""loaderbench: fast, measurable, comparable image data loading for PyTorch training."""

__version__ = "0.1.0"
