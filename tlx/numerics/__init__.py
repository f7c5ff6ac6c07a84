"""Numerics: compile modes, exact intrinsics, NVCC parity, determinism checks, layout pinning.

Importing this package registers its passes (strict mode, ieee prelude injection).
"""

from tlx.numerics import ieee, prelude, strict  # noqa: F401  (prelude/strict register passes)
from tlx.numerics.modes import NUMERICS_MODES, nvcc_flags

__all__ = ["NUMERICS_MODES", "ieee", "nvcc_flags"]
