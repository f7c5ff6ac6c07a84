"""Small TIR helpers shared by the numerics passes."""

from __future__ import annotations

from collections.abc import Iterator

from tilelang import tvm


def device_functions(mod) -> Iterator[tuple[str, object]]:
    """(name, PrimFunc) for every PrimFunc of an IRModule, in name order."""
    for gv, func in sorted(mod.functions.items(), key=lambda kv: kv[0].name_hint):
        if isinstance(func, tvm.tirx.PrimFunc):
            yield gv.name_hint, func


def op_name(call) -> str:
    """The operator name of a Call (``tl.__exp``), or ``""`` for a call through a GlobalVar."""
    op = call.op
    return str(op.name) if isinstance(op, tvm.ir.Op) else ""


def extern_name(call) -> str | None:
    """The C symbol of a ``call_extern``/``call_pure_extern``, else ``None``."""
    if op_name(call) in ("tirx.call_extern", "tirx.call_pure_extern") and call.args:
        first = call.args[0]
        if isinstance(first, tvm.tirx.StringImm):
            return str(first.value)
    return None


def calls(func) -> list:
    """Every Call node in a PrimFunc body, in visit order."""
    found = []

    def visit(node):
        if isinstance(node, tvm.tirx.Call):
            found.append(node)

    tvm.tirx.stmt_functor.post_order_visit(func.body, visit)
    return found
