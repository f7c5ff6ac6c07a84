"""Numerics: compile modes, exact intrinsics, NVCC parity, determinism checks, layout pinning.

Importing this package registers its passes (strict mode, determinism, pinning, ieee prelude injection).
"""

from tlx.numerics import determinism, ieee, pin, prelude, strict  # noqa: F401  (passes register on import)
from tlx.numerics.modes import NUMERICS_MODES, nvcc_flags

__all__ = ["NUMERICS_MODES", "ieee", "nvcc_flags"]
