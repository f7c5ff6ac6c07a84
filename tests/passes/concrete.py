"""Concrete evaluation of a lowered device function: every buffer index it computes, for given
scalar and shape values, over every thread and loop iteration.

The differential soundness test runs this beside the verifier: where the verifier says "proven"
and the launcher would accept the values, no index computed here may fall outside its buffer.
It covers the integer subset small test kernels use (arithmetic, comparisons, selects, lets,
loops, thread bindings, branches); an index that depends on a value loaded from memory, or any
construct it does not know, raises :class:`Unsupported` so a test can never pass by skipping.
Loaded values are known only where the test gives an input's contents (``memory``) and, from
there, in the thread-private integer scalars the kernel stores them into (``n = counts[b]``),
so a data-dependent counterexample can be replayed with the input it names.
"""

from __future__ import annotations

from dataclasses import dataclass

import tilelang  # noqa: F401
from tilelang import tvm

tir = tvm.tirx

__all__ = ["OutOfBounds", "Unsupported", "evaluate", "out_of_bounds"]


class Unsupported(Exception):
    """A construct this evaluator does not model."""


class _Found(Exception):
    """Stops the walk at the first out-of-bounds index when only one is asked for."""


@dataclass(frozen=True)
class OutOfBounds:
    buffer: str
    index: tuple[int, ...]
    shape: tuple[int, ...]
    env: tuple[tuple[str, int], ...]


def _trunc_div(a: int, b: int) -> int:
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b >= 0) else -q


def _wrap(value: int, dtype: str) -> int:
    """Two's-complement wrap-around of ``dtype`` (what the GPU computes)."""
    if dtype == "bool":
        return int(bool(value))
    bits = int("".join(c for c in dtype if c.isdigit()) or 64)
    value &= (1 << bits) - 1
    if dtype.startswith("int") and value >= 1 << (bits - 1):
        value -= 1 << bits
    return value


_BIN = {
    tir.Add: lambda a, b: a + b,
    tir.Sub: lambda a, b: a - b,
    tir.Mul: lambda a, b: a * b,
    tir.FloorDiv: lambda a, b: a // b,
    tir.FloorMod: lambda a, b: a % b,
    tir.Div: _trunc_div,
    tir.Mod: lambda a, b: a - _trunc_div(a, b) * b,
    tir.Min: min,
    tir.Max: max,
}
_CMP = {
    tir.EQ: lambda a, b: a == b,
    tir.NE: lambda a, b: a != b,
    tir.LT: lambda a, b: a < b,
    tir.LE: lambda a, b: a <= b,
    tir.GT: lambda a, b: a > b,
    tir.GE: lambda a, b: a >= b,
}
_CALLS = {
    "tirx.shift_left": lambda a, b: a << b,
    "tirx.shift_right": lambda a, b: a >> b,
    "tirx.bitwise_and": lambda a, b: a & b,
    "tirx.bitwise_or": lambda a, b: a | b,
    "tirx.bitwise_xor": lambda a, b: a ^ b,
}


def evaluate(e, env: dict) -> int | tuple:
    """The integer value of ``e`` (a tuple for a vector expression) under ``env`` (Var -> int)."""
    if isinstance(e, int):
        return e
    if isinstance(e, tir.IntImm):
        return int(e.value)
    if isinstance(e, tir.Var):
        if e not in env:
            raise Unsupported(f"unbound variable {e.name}")
        return env[e]
    if isinstance(e, tir.Cast):
        v = evaluate(e.value, env)
        if not str(e.dtype).startswith(("int", "uint", "bool")):
            raise Unsupported(f"cast to {e.dtype}")
        return tuple(_wrap(x, str(e.dtype)) for x in v) if isinstance(v, tuple) else _wrap(v, str(e.dtype))
    for cls, fn in _BIN.items():
        if isinstance(e, cls):
            return _lanes(fn, evaluate(e.a, env), evaluate(e.b, env), str(e.dtype))
    for cls, fn in _CMP.items():
        if isinstance(e, cls):
            return _lanes(lambda a, b: int(fn(a, b)), evaluate(e.a, env), evaluate(e.b, env), "bool")
    if isinstance(e, tir.And):
        return int(bool(evaluate(e.a, env)) and bool(evaluate(e.b, env)))
    if isinstance(e, tir.Or):
        return int(bool(evaluate(e.a, env)) or bool(evaluate(e.b, env)))
    if isinstance(e, tir.Not):
        return int(not evaluate(e.a, env))
    if isinstance(e, tir.Select):
        return evaluate(e.true_value if evaluate(e.condition, env) else e.false_value, env)
    if isinstance(e, tir.Let):
        return evaluate(e.body, {**env, e.var: evaluate(e.value, env)})
    if isinstance(e, tir.Ramp):
        base, stride = evaluate(e.base, env), evaluate(e.stride, env)
        return tuple(base + i * stride for i in range(int(e.lanes)))
    if isinstance(e, tir.Broadcast):
        return (evaluate(e.value, env),) * int(e.lanes)
    if isinstance(e, tir.Call):
        op = str(e.op.name)
        if op == "tirx.if_then_else":
            return evaluate(e.args[1] if evaluate(e.args[0], env) else e.args[2], env)
        if op in _CALLS:
            return _wrap(_CALLS[op](evaluate(e.args[0], env), evaluate(e.args[1], env)), str(e.dtype))
        raise Unsupported(f"call {op}")
    if isinstance(e, tir.BufferLoad):
        return _load(e, env)
    raise Unsupported(type(e).__name__)


_MEMORY = "memory"  # env key: buffer data var -> {flat index: value} of the elements whose values are known


def _load(e, env) -> int:
    """The value of a one-index load whose element's value is known, else Unsupported."""
    contents = env.get(_MEMORY, {}).get(e.buffer.data)
    if contents is None or len(e.indices) != 1:
        raise Unsupported(f"value loaded from {e.buffer.name}")
    i = evaluate(e.indices[0], env)
    if isinstance(i, tuple) or i not in contents:
        raise Unsupported(f"value of {e.buffer.name}[{i}], which is not known")
    return contents[i]


def _remember(s, env) -> None:
    """A store to a thread-private integer scalar: its value is known from here if it can be
    evaluated (the kernels run here write such a scalar before they read it), else forgotten."""
    memory = env.get(_MEMORY)
    if memory is None or not str(s.buffer.scope()).startswith("local") or len(s.indices) != 1:
        return
    if not str(s.buffer.dtype).startswith(("int", "uint")):
        return
    contents = memory.setdefault(s.buffer.data, {})
    index = evaluate(s.indices[0], env)
    try:
        contents[index] = evaluate(s.value, env)
    except Unsupported:
        contents.pop(index, None)


def _lanes(fn, a, b, dtype: str):
    if isinstance(a, tuple) or isinstance(b, tuple):
        n = len(a) if isinstance(a, tuple) else len(b)
        a = a if isinstance(a, tuple) else (a,) * n
        b = b if isinstance(b, tuple) else (b,) * n
        return tuple(_wrap(fn(x, y), dtype) for x, y in zip(a, b, strict=True))
    return _wrap(fn(a, b), dtype)


def out_of_bounds(device_func, values: dict[str, int], limit: int = 200_000, first: bool = False,
                  memory: dict[str, list[int]] | None = None) -> list[OutOfBounds]:
    """Every buffer access of ``device_func`` outside its buffer (only the first with ``first``),
    with ``values`` for its scalar parameters and symbolic extents (by name), and ``memory`` for
    the contents of input tensors (by parameter name, flat) that indices or loop bounds read.
    Threads and loops are enumerated; at most ``limit`` statements are executed (a test kernel
    that needs more is Unsupported, not silently cut)."""
    env = {_MEMORY: {}}
    for p in device_func.params:
        if p.name in values:
            env[p] = values[p.name]
        if memory and p.name in memory:
            env[_MEMORY][p] = dict(enumerate(memory[p.name]))
    found: list[OutOfBounds] = []
    budget = [limit]

    def check(buf, indices, env):
        shape = [evaluate(s, env) for s in buf.shape]
        idx = [evaluate(i, env) for i in indices]
        lanes = max((len(i) for i in idx if isinstance(i, tuple)), default=0)
        for lane in range(max(lanes, 1)):
            point = tuple(i[lane] if isinstance(i, tuple) else i for i in idx)
            if any(not 0 <= x < n for x, n in zip(point, shape, strict=True)):
                found.append(OutOfBounds(buf.name, point, tuple(shape), tuple(sorted((v.name, x) for v, x in env.items() if v is not _MEMORY))))
                if first:
                    raise _Found

    def visit_expr(e, env):
        if isinstance(e, tir.BufferLoad):
            check(e.buffer, e.indices, env)
            return
        if isinstance(e, (tir.IntImm, tir.FloatImm, tir.Var, tir.StringImm)):
            return
        if isinstance(e, tir.Call):
            op = str(e.op.name)
            if op == "tirx.if_then_else":
                visit_expr(e.args[0], env)
                visit_expr(e.args[1] if evaluate(e.args[0], env) else e.args[2], env)
                return
            if op in ("tirx.tvm_storage_sync",):
                return
            if op not in _CALLS and not op.startswith("tirx.") :
                raise Unsupported(f"call {op}")
            for a in e.args:
                visit_expr(a, env)
            return
        if isinstance(e, tir.Let):
            visit_expr(e.value, env)
            visit_expr(e.body, {**env, e.var: evaluate(e.value, env)})
            return
        if isinstance(e, tir.Select):
            visit_expr(e.condition, env)
            visit_expr(e.true_value if evaluate(e.condition, env) else e.false_value, env)
            return
        for field in ("a", "b", "value", "base", "stride"):
            child = getattr(e, field, None)
            if isinstance(child, tir.PrimExpr):
                visit_expr(child, env)

    def run(s, env):
        budget[0] -= 1
        if budget[0] < 0:
            raise Unsupported(f"more than {limit} statements")
        if isinstance(s, tir.SeqStmt):
            for x in s.seq:
                run(x, env)
        elif isinstance(s, tir.AttrStmt):
            if s.attr_key == "thread_extent":
                var = s.node.var
                for t in range(evaluate(s.value, env)):
                    run(s.body, {**env, var: t})
            else:
                run(s.body, env)
        elif isinstance(s, tir.For):
            lo, n = evaluate(s.min, env), evaluate(s.extent, env)
            for i in range(lo, lo + n):
                run(s.body, {**env, s.loop_var: i})
        elif isinstance(s, tir.IfThenElse):
            visit_expr(s.condition, env)
            if evaluate(s.condition, env):
                run(s.then_case, env)
            elif s.else_case is not None:
                run(s.else_case, env)
        elif isinstance(s, tir.BufferStore):
            check(s.buffer, s.indices, env)
            for i in s.indices:
                visit_expr(i, env)
            visit_expr(s.value, env)
            _remember(s, env)
        elif isinstance(s, tir.Evaluate):
            visit_expr(s.value, env)
        elif isinstance(s, (tir.DeclBuffer, tir.AllocBuffer)):
            if getattr(s, "body", None) is not None:
                run(s.body, env)
        elif isinstance(s, tir.Bind):
            env[s.var] = evaluate(s.value, env)
            if getattr(s, "body", None) is not None:
                run(s.body, env)
        elif isinstance(s, tir.AssertStmt):
            if getattr(s, "body", None) is not None:
                run(s.body, env)
        else:
            raise Unsupported(type(s).__name__)

    try:
        run(device_func.body, env)
    except _Found:
        pass
    return found
