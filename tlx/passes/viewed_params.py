"""A parameter that a view is made from is not ``const``.

TileLang 0.1.15 marks every parameter the kernel never stores to as read-only
(``tl.readonly_param_indices``: ``const T* __restrict__`` in CUDA) and declares a pointer
bound inside the kernel as ``void*``. A view of a read-only input, such as a per-CTA base
``T.make_tensor_from_addr(T.address_of(KV[b, 0, 0]), (N, D), dtype)`` (32-bit offsets from
it instead of 64-bit ones from the tensor's start), then fails in nvcc: a ``const T*`` cannot
initialize a ``void*``. This pass drops such parameters from the read-only list; nothing else
in the kernel changes.
"""

from __future__ import annotations

from tilelang import tvm

from tlx.ir.tir import device_functions, nodes, op_name
from tlx.lowering import LoweredKernel
from tlx.passes import PassContext

tir = tvm.tirx

__all__ = ["viewed_params_pass"]

_READ_ONLY = "tl.readonly_param_indices"


def viewed_params(func) -> set:
    """Data variables whose address a handle binding in ``func`` takes."""
    out = set()
    for b in nodes(func.body, tir.Bind):
        if str(b.var.dtype) != "handle":
            continue
        for call in nodes(b.value, tir.Call):
            if op_name(call) == "tirx.address_of" and isinstance(call.args[0], tir.BufferLoad):
                out.add(call.args[0].buffer.data)
            elif op_name(call) == "tirx.tvm_access_ptr":
                out.add(call.args[1])
    return out


def viewed_params_pass(kernel: LoweredKernel, ctx: PassContext) -> LoweredKernel:
    mod = kernel.device_mod
    for name, func in device_functions(mod):
        read_only = func.attrs.get(_READ_ONLY) if func.attrs else None
        if not read_only:
            continue
        viewed = viewed_params(func)
        keep = [int(i) for i in read_only if func.params[int(i)] not in viewed]
        if len(keep) != len(read_only):
            func, gv = func.with_attr(_READ_ONLY, [tir.IntImm("int32", i) for i in keep]), mod.get_global_var(name)
            mod = tvm.IRModule({g: (func if g.same_as(gv) else f) for g, f in mod.functions.items()}, attrs=mod.attrs)
    return kernel.with_device_mod(mod)
