"""tlx: a compiler extension for TileLang (see README.md)."""

from tlx.jit import compile, jit
from tlx.numerics import ieee

__all__ = ["autotune", "compile", "jit"]
__version__ = "0.1.0"


def __getattr__(name: str):
    # tlx.autotune imports TileLang's autotuner (torch, tqdm ...): only when it is used.
    if name == "autotune":
        from tlx.tuning import autotune

        return autotune
    raise AttributeError(f"module 'tlx' has no attribute {name!r}")
