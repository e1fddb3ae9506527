"""rankrun: a torch-free, drop-in replacement for torchrun."""

__version__ = "0.1.0"
