"""tlx: a compiler extension for TileLang (see README.md)."""

from tlx.jit import jit
from tlx.numerics import ieee

__all__ = ["jit"]
__version__ = "0.1.0"
