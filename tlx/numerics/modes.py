"""Numerics modes and the nvcc flags each implies.

Both the tlx device compile and the CUDA baselines take their flags from here, so a
kernel and its baseline are built under the same floating-point contract.

``"default"`` adds no flag at all: a kernel compiles exactly as under ``tilelang.jit`` (nvcc's
own defaults, FMA contraction on, IEEE div/sqrt, denormals kept, unless the kernel itself asks
for fast math through its pass configs), so the two give the same bits. ``"strict"`` forbids
contraction as well (only FMAs written explicitly remain), and refuses a kernel whose pass
configs ask for fast math instead of overriding them.
"""

from __future__ import annotations

import shlex

NUMERICS_MODES: dict[str, tuple[str, ...]] = {
    "default": (),
    "strict": ("--fmad=false", "--prec-div=true", "--prec-sqrt=true", "--ftz=false"),
}

FAST_MATH_CONFIG = "tl.enable_fast_math"
DEVICE_FLAGS_CONFIG = "tl.device_compile_flags"
REGISTER_USAGE_CONFIG = "tl.ptxas_register_usage_level"

# Device flags that loosen what strict mode guarantees (either spelling nvcc accepts).
_LOOSENING_FLAGS = ("use_fast_math", "fmad=true", "ftz=true", "prec-div=false", "prec-sqrt=false")


def nvcc_flags(mode: str) -> list[str]:
    """The floating-point flags for ``mode``; raises ``ValueError`` for an unknown mode."""
    try:
        return list(NUMERICS_MODES[mode])
    except KeyError:
        raise ValueError(f"numerics: expected one of {sorted(NUMERICS_MODES)}, got {mode!r}") from None


def pass_config_flags(pass_configs: dict) -> list[str]:
    """The nvcc flags TileLang 0.1.15 derives from a kernel's pass configs, in its order
    (``tilelang/cuda/backend.py``): ``tl.device_compile_flags``, then ``--use_fast_math`` for
    ``tl.enable_fast_math``, then the ptxas register-usage level."""
    flags: list[str] = []
    extra = pass_configs.get(DEVICE_FLAGS_CONFIG)
    if extra:
        if isinstance(extra, str):
            flags += shlex.split(extra)
        else:
            for item in extra:
                flags += shlex.split(item) if isinstance(item, str) else [str(item)]
    if pass_configs.get(FAST_MATH_CONFIG):
        flags.append("--use_fast_math")
    level = pass_configs.get(REGISTER_USAGE_CONFIG)
    if level is not None:
        flags.append(f"--ptxas-options=--register-usage-level={int(level)}")
    return flags


def strict_conflicts(pass_configs: dict) -> list[str]:
    """The pass configs that ask for looser numerics than ``numerics="strict"`` allows, each
    as ``"name=value"`` (empty when none does)."""
    conflicts = []
    if pass_configs.get(FAST_MATH_CONFIG):
        conflicts.append(f"{FAST_MATH_CONFIG}={pass_configs[FAST_MATH_CONFIG]!r}")
    flags = pass_config_flags({DEVICE_FLAGS_CONFIG: pass_configs.get(DEVICE_FLAGS_CONFIG)})
    conflicts += [f"{DEVICE_FLAGS_CONFIG} contains {f!r}" for f in flags if f.lstrip("-") in _LOOSENING_FLAGS]
    return conflicts


def device_flags(mode: str, pass_configs: dict) -> list[str]:
    """Every floating-point and pass-config flag of a device compile: the kernel's own (as
    TileLang passes them), then the mode's. Strict mode meeting a kernel that asks for fast math
    raises ``ValueError`` naming the config, rather than letting one set of flags win silently."""
    mode_flags = nvcc_flags(mode)
    if mode == "strict":
        conflicts = strict_conflicts(pass_configs)
        if conflicts:
            raise ValueError(
                f"numerics='strict' conflicts with the kernel's pass config {'; '.join(conflicts)}: "
                "drop it, or compile with numerics='default'"
            )
    return pass_config_flags(pass_configs) + mode_flags
