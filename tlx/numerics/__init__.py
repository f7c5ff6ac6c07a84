"""Numerics: compile modes, exact intrinsics, NVCC parity, determinism checks, layout pinning.

The passes defined here (strict mode, determinism, pinning, ieee prelude injection) run in
the order of :mod:`tlx.passes.pipeline`.
"""

from tlx.numerics import ieee
from tlx.numerics.modes import NUMERICS_MODES, nvcc_flags

__all__ = ["NUMERICS_MODES", "ieee", "nvcc_flags"]
