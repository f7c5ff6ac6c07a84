"""Print the integer expressions of lowered host IR as C++ over int64_t."""

from __future__ import annotations

import re

from tvm import tirx

from tlx.hostgen.plan import HostgenError

__all__ = ["c_name", "cexpr", "pyexpr"]

_BINARY = {
    tirx.Add: "+",
    tirx.Sub: "-",
    tirx.Mul: "*",
    tirx.EQ: "==",
    tirx.NE: "!=",
    tirx.LT: "<",
    tirx.LE: "<=",
    tirx.GT: ">",
    tirx.GE: ">=",
    tirx.And: "&&",
    tirx.Or: "||",
}
_HELPERS = {tirx.FloorDiv: "tlx::floordiv", tirx.FloorMod: "tlx::floormod", tirx.Div: "tlx::truncdiv", tirx.Mod: "tlx::truncmod"}


def c_name(var) -> str:
    """A C identifier for a TIR variable (names are kept readable; ``v_`` avoids keywords)."""
    return "v_" + re.sub(r"\W", "_", var.name)


def cexpr(e, names: dict | None = None) -> str:
    """C++ source for ``e``; ``names`` maps variables to their C names where not :func:`c_name`."""
    names = names or {}
    if isinstance(e, int):
        return f"int64_t({e})"
    if isinstance(e, tirx.IntImm):
        if str(e.dtype) == "bool":
            return "true" if e.value else "false"
        return f"int64_t({int(e.value)})"
    if isinstance(e, tirx.FloatImm):
        return repr(float(e.value))
    if isinstance(e, tirx.Var):
        return names.get(e, c_name(e))
    for cls, op in _BINARY.items():
        if isinstance(e, cls):
            return f"({cexpr(e.a, names)} {op} {cexpr(e.b, names)})"
    for cls, fn in _HELPERS.items():
        if isinstance(e, cls):
            return f"{fn}({cexpr(e.a, names)}, {cexpr(e.b, names)})"
    if isinstance(e, tirx.Min):
        return f"tlx::min({cexpr(e.a, names)}, {cexpr(e.b, names)})"
    if isinstance(e, tirx.Max):
        return f"tlx::max({cexpr(e.a, names)}, {cexpr(e.b, names)})"
    if isinstance(e, tirx.Not):
        return f"(!{cexpr(e.a, names)})"
    if isinstance(e, tirx.Select):
        return f"({cexpr(e.condition, names)} ? {cexpr(e.true_value, names)} : {cexpr(e.false_value, names)})"
    if isinstance(e, tirx.Cast):
        dt = str(e.dtype)
        inner = cexpr(e.value, names)
        if dt.startswith("int"):
            return f"int64_t(int{dt[3:] or '32'}_t({inner}))"
        if dt.startswith("uint"):
            return f"int64_t(uint{dt[4:] or '32'}_t({inner}))"
        if dt == "bool":
            return f"bool({inner})"
        if dt.startswith("float"):
            return f"double({inner})"
    if isinstance(e, tirx.Call) and getattr(e.op, "name", "") == "tirx.if_then_else":
        c, a, b = e.args
        return f"({cexpr(c, names)} ? {cexpr(a, names)} : {cexpr(b, names)})"
    raise HostgenError(f"unsupported expression in host code: {type(e).__name__} {e}")


_PY_BINARY = {tirx.Add: "+", tirx.Sub: "-", tirx.Mul: "*", tirx.FloorDiv: "//", tirx.FloorMod: "%"}


def pyexpr(e) -> str:
    """``e`` as Python integer arithmetic over variable names (for metadata and output sizing)."""
    if isinstance(e, int):
        return str(e)
    if isinstance(e, tirx.IntImm):
        return str(int(e.value))
    if isinstance(e, tirx.Var):
        return e.name
    if isinstance(e, tirx.Cast):
        return pyexpr(e.value)
    for cls, op in _PY_BINARY.items():
        if isinstance(e, cls):
            return f"({pyexpr(e.a)} {op} {pyexpr(e.b)})"
    if isinstance(e, (tirx.Min, tirx.Max)):
        return f"{'min' if isinstance(e, tirx.Min) else 'max'}({pyexpr(e.a)}, {pyexpr(e.b)})"
    return str(e)
