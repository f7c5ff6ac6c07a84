"""Parse ``assume=["M % 128 == 0", "1 <= M <= 1 << 20"]`` into TIR over the kernel's shape variables.

Python's ``ast`` reads the text; only integer arithmetic, comparisons (chained too),
``and``/``or``/``not`` and the shape-variable names are accepted — nothing is evaluated.
``%`` and ``//`` mean floor modulo and floor division, as in Python and TIR.
"""

from __future__ import annotations

import ast

import tilelang  # noqa: F401
from tilelang import tvm

from tlx.passes import TlxError

tir = tvm.tirx

__all__ = ["AssumptionError", "parse_assumption", "shape_vars"]


class AssumptionError(TlxError, ValueError):
    """An assumption string that is not a condition over the kernel's shape variables."""


def shape_vars(prim_func) -> dict[str, object]:
    """Name -> ``tir.Var`` of every symbolic variable in the declared buffer shapes and scalar params."""
    out: dict[str, object] = {}

    def collect(e):
        if isinstance(e, tir.Var) and e.name not in out:
            out[e.name] = e

    for buf in prim_func.buffer_map.values():
        for dim in list(buf.shape) + list(buf.strides or []):
            tir.stmt_functor.post_order_visit(tir.Evaluate(dim) if not isinstance(dim, int) else tir.Evaluate(0), collect)
    for p in prim_func.params:
        if p not in prim_func.buffer_map and str(p.dtype).startswith(("int", "uint")):
            collect(p)
    return out


_BINOPS = {
    ast.Add: lambda a, b: a + b,
    ast.Sub: lambda a, b: a - b,
    ast.Mult: lambda a, b: a * b,
    ast.FloorDiv: tir.floordiv,
    ast.Mod: tir.floormod,
    ast.LShift: lambda a, b: a * (1 << _const(b)),
}
_CMPOPS = {
    ast.Lt: lambda a, b: a < b,
    ast.LtE: lambda a, b: a <= b,
    ast.Gt: lambda a, b: a > b,
    ast.GtE: lambda a, b: a >= b,
    ast.Eq: lambda a, b: tir.EQ(a, b),
    ast.NotEq: lambda a, b: tir.NE(a, b),
}


def _const(e) -> int:
    if isinstance(e, int):
        return e
    if isinstance(e, tir.IntImm):
        return int(e.value)
    raise AssumptionError("assume: a shift amount must be an integer constant")


def parse_assumption(text: str, variables: dict[str, object]):
    """The boolean TIR expression of ``text``; raises :class:`AssumptionError` naming what is wrong."""
    if not isinstance(text, str):
        raise AssumptionError(f"assume: expected a string such as 'M % 128 == 0', got {text!r}")
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError as e:
        raise AssumptionError(f"assume: {text!r} is not a valid expression ({e.msg})") from None

    def conv(node):
        if isinstance(node, ast.Constant) and isinstance(node.value, int) and not isinstance(node.value, bool):
            return tir.IntImm("int64", node.value) if abs(node.value) >= 1 << 31 else node.value
        if isinstance(node, ast.Name):
            if node.id not in variables:
                raise AssumptionError(f"assume: {text!r} names {node.id!r}, which is not a shape variable of this kernel (known: {sorted(variables)})")
            return variables[node.id]
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            v = conv(node.operand)
            return -v if isinstance(v, int) else 0 - v
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            return tir.Not(_as_bool(conv(node.operand)))
        if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
            a, b = conv(node.left), conv(node.right)
            if isinstance(a, int) and isinstance(b, int):
                return {ast.Add: a + b, ast.Sub: a - b, ast.Mult: a * b, ast.FloorDiv: a // b if b else None, ast.Mod: a % b if b else None, ast.LShift: a << b}[type(node.op)]
            return _BINOPS[type(node.op)](_as_expr(a), b if type(node.op) is ast.LShift else _as_expr(b))
        if isinstance(node, ast.Compare):
            parts = []
            left = conv(node.left)
            for op, comp in zip(node.ops, node.comparators):
                if type(op) not in _CMPOPS:
                    raise AssumptionError(f"assume: comparison {type(op).__name__} is not supported in {text!r}")
                right = conv(comp)
                parts.append(_CMPOPS[type(op)](_as_expr(left), _as_expr(right)))
                left = right
            out = parts[0]
            for p in parts[1:]:
                out = tir.And(out, p)
            return out
        if isinstance(node, ast.BoolOp):
            vals = [_as_bool(conv(v)) for v in node.values]
            out = vals[0]
            for v in vals[1:]:
                out = tir.And(out, v) if isinstance(node.op, ast.And) else tir.Or(out, v)
            return out
        raise AssumptionError(f"assume: {ast.unparse(node)!r} in {text!r} is not supported (use integers, shape variables, + - * // % <<, comparisons, and/or/not)")

    expr = conv(tree.body)
    if isinstance(expr, (int, type(None))) or not str(expr.dtype).startswith("bool"):
        raise AssumptionError(f"assume: {text!r} is not a condition (expected e.g. 'M % 128 == 0')")
    return expr


def _as_expr(v):
    if v is None:
        raise AssumptionError("assume: division or modulo by zero")
    return tir.IntImm("int32", v) if isinstance(v, int) and abs(v) < 1 << 31 else (tir.IntImm("int64", v) if isinstance(v, int) else v)


def _as_bool(v):
    if isinstance(v, int) or not str(v.dtype).startswith("bool"):
        raise AssumptionError(f"assume: {v} is not a condition")
    return v
