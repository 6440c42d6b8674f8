"""The package version: a leaf every module may import (`agent.__version__` re-exports it)."""

__version__ = "0.2.0"
