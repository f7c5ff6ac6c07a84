"""Numerics modes and the nvcc flags each implies.

Both the tlx device compile and the CUDA baselines take their flags from here, so a
kernel and its baseline are built under the same floating-point contract.
"""

from __future__ import annotations

# "default" mirrors nvcc's own defaults (FMA contraction on, IEEE div/sqrt, denormals kept).
# "strict" forbids contraction as well: only FMAs written explicitly remain.
NUMERICS_MODES: dict[str, tuple[str, ...]] = {
    "default": ("--fmad=true", "--prec-div=true", "--prec-sqrt=true", "--ftz=false"),
    "strict": ("--fmad=false", "--prec-div=true", "--prec-sqrt=true", "--ftz=false"),
}


def nvcc_flags(mode: str) -> list[str]:
    """The floating-point flags for ``mode``; raises ``ValueError`` for an unknown mode."""
    try:
        return list(NUMERICS_MODES[mode])
    except KeyError:
        raise ValueError(f"numerics: expected one of {sorted(NUMERICS_MODES)}, got {mode!r}") from None
