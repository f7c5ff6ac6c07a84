"""Compile a TileLang program into a tlx kernel (interim: TileLang's own path)."""

from __future__ import annotations

from tlx.jit import Options
from tlx.lowering import normalize_target


def compile_kernel(prim_func, options: Options, source_key: str = ""):
    import tilelang

    from tlx.kernel import Kernel

    target = normalize_target(options.target_dict())
    jk = tilelang.compile(prim_func, out_idx=list(options.out_idx) or None, target=target, pass_configs=options.pass_config_dict())
    return Kernel(jk, options)
