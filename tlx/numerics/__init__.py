"""Numerics: compile modes, exact intrinsics, NVCC parity, determinism checks, layout pinning."""

from tlx.numerics.modes import NUMERICS_MODES, nvcc_flags

__all__ = ["NUMERICS_MODES", "nvcc_flags"]
