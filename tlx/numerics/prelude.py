"""Inject :data:`tlx.ieee.PRELUDE` into device kernels that call ``tlx.ieee`` conversions."""

from __future__ import annotations

from tilelang import tvm

from tlx.ir.tir import calls, device_functions, extern_name
from tlx.numerics.ieee import EXTERN_PREFIX, PRELUDE

def uses_ieee_externs(func) -> bool:
    return any((extern_name(c) or "").startswith(EXTERN_PREFIX) for c in calls(func))


def inject_ieee_prelude(kernel, ctx):
    """Wrap each device function that calls a ``tlx_ieee_*`` helper in a ``pragma_import_c``
    attribute holding the prelude; CUDA codegen prints it before the kernels, and its include
    guard keeps a user's own ``T.Kernel(prelude=tlx.ieee.PRELUDE)`` from defining it twice."""
    mod = kernel.device_mod
    updates = {}
    for name, func in device_functions(mod):
        if uses_ieee_externs(func):
            body = tvm.tirx.AttrStmt(tvm.tirx.IntImm("int32", 0), "pragma_import_c", tvm.tirx.StringImm(PRELUDE), func.body)
            updates[name] = func.with_body(body)
    if not updates:
        return kernel
    new_mod = tvm.IRModule({gv: updates.get(gv.name_hint, f) for gv, f in mod.functions.items()}, attrs=mod.attrs)
    return kernel.with_device_mod(new_mod)
