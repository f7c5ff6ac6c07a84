"""tlx: a compiler extension for TileLang (see README.md)."""

from tlx.jit import jit

__all__ = ["jit"]
__version__ = "0.1.0"
