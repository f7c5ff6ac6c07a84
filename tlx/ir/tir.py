"""Small facts about TIR that every analysis asks: device functions, operator and extern
names, calls, constants, free variables, dtypes."""

from __future__ import annotations

import re
from collections.abc import Iterator

import tilelang  # noqa: F401  (sets up the bundled TVM)
from tilelang import tvm

tir = tvm.tirx

__all__ = ["PRIVATE_SCOPES", "arith_only", "calls", "const_int", "device_functions", "elem_bytes", "eval_numpy", "extern_name", "free_vars", "nodes", "op_name", "scalar_dtype", "unit_step"]

PRIVATE_SCOPES = ("local", "local.var")  # a thread's own registers: only its own stores change them

_DTYPE_RE = re.compile(r"^(bool|int|uint|float|bfloat|handle|float8_\w+|float4_\w+|float6_\w+)(\d*)(?:x(\d+))?$")


def device_functions(mod) -> Iterator[tuple[str, object]]:
    """(name, PrimFunc) for every PrimFunc of an IRModule, in name order."""
    for gv, func in sorted(mod.functions.items(), key=lambda kv: kv[0].name_hint):
        if isinstance(func, tir.PrimFunc):
            yield gv.name_hint, func


def op_name(call) -> str:
    """The operator name of a Call (``tl.__exp``), or ``""`` for a call through a GlobalVar."""
    op = call.op
    return str(op.name) if isinstance(op, tvm.ir.Op) else ""


def extern_name(call) -> str | None:
    """The C symbol of a ``call_extern``/``call_pure_extern``, else ``None``."""
    if op_name(call) in ("tirx.call_extern", "tirx.call_pure_extern") and call.args:
        first = call.args[0]
        if isinstance(first, tir.StringImm):
            return str(first.value)
    return None


def nodes(node, kind) -> list:
    """Every node of type ``kind`` in statement or expression ``node``, in visit order."""
    found = []
    tir.stmt_functor.post_order_visit(node if isinstance(node, tir.Stmt) else tir.Evaluate(node),
                                      lambda n: found.append(n) if isinstance(n, kind) else None)
    return found


def calls(func) -> list:
    """Every Call node in a PrimFunc body, in visit order."""
    return nodes(func.body, tir.Call)


def const_int(x) -> int | None:
    """The value of an integer constant (``IntImm`` or ``int``), else ``None``."""
    if isinstance(x, int):
        return x
    if isinstance(x, tir.IntImm):
        return int(x.value)
    return None


def unit_step(loop) -> bool:
    """Whether ``loop`` steps by 1 (TIR's ``For`` has no step, or a step of constant 1)."""
    step = getattr(loop, "step", None)
    return step is None or (isinstance(step, tir.IntImm) and step.value == 1)


def free_vars(expr) -> list:
    """The variables of ``expr``, each once, in visit order."""
    out = []
    for v in nodes(expr, tir.Var):
        if v not in out:
            out.append(v)
    return out


def arith_only(cond) -> bool:
    """True when ``cond`` reads no memory and calls nothing opaque (a guard, not a role test)."""
    ok = [True]

    def visit(n):
        if isinstance(n, (tir.BufferLoad, tir.Call)):
            ok[0] = False

    tir.stmt_functor.post_order_visit(tir.Evaluate(cond), visit)
    return ok[0]


def scalar_dtype(dtype) -> tuple[str, int, int]:
    """``"int32x4"`` -> ``("int", 32, 4)``; ``"bool"`` -> ``("bool", 1, 1)``."""
    s = str(dtype)
    m = _DTYPE_RE.match(s)
    if not m:
        return ("other", 0, 1)
    kind, bits, lanes = m.group(1), m.group(2), m.group(3)
    if kind == "bool":
        return ("bool", 1, int(lanes or 1))
    if kind in ("int", "uint"):
        return (kind, int(bits or 32), int(lanes or 1))
    return ("other", int(bits) if bits else 0, int(lanes or 1))


def elem_bytes(dtype) -> int:
    """Bytes of one element of ``dtype`` (at least 1: sub-byte types count as one byte)."""
    _, bits, _ = scalar_dtype(dtype)
    if bits == 0:
        bits = tvm.DataType(str(dtype)).bits
    return max(bits // 8, 1)


def eval_numpy(expr, env: dict):
    """Evaluate an integer/boolean TIR expression on numpy arrays (TVM floor semantics = numpy's).

    ``env`` maps variables to ints or arrays; anything else (a load, an opaque call, a free
    variable) raises ``ValueError``. Bank-conflict totals and the mbarrier tables use it.
    """
    import numpy as np

    e = expr
    if isinstance(e, tir.IntImm):
        return int(e.value)
    if isinstance(e, tir.Var):
        if e not in env:
            raise ValueError(f"{e.name} has no known value; only constant-extent kernels can be enumerated")
        return env[e]
    ops = {
        tir.Add: np.add, tir.Sub: np.subtract, tir.Mul: np.multiply, tir.FloorDiv: np.floor_divide, tir.FloorMod: np.mod,
        tir.Min: np.minimum, tir.Max: np.maximum, tir.EQ: np.equal, tir.NE: np.not_equal, tir.LT: np.less,
        tir.LE: np.less_equal, tir.GT: np.greater, tir.GE: np.greater_equal, tir.And: np.logical_and, tir.Or: np.logical_or,
    }
    for cls, fn in ops.items():
        if isinstance(e, cls):
            return fn(eval_numpy(e.a, env), eval_numpy(e.b, env))
    if isinstance(e, tir.Not):
        return np.logical_not(eval_numpy(e.a, env))
    if isinstance(e, tir.Select):
        return np.where(eval_numpy(e.condition, env), eval_numpy(e.true_value, env), eval_numpy(e.false_value, env))
    if isinstance(e, tir.Cast):
        return eval_numpy(e.value, env)
    if isinstance(e, tir.Call) and str(e.op.name) in ("tirx.if_then_else", "tirx.likely"):
        args = [eval_numpy(a, env) for a in e.args]
        return args[0] if len(args) == 1 else np.where(*args)
    bitwise = {"tirx.bitwise_and": np.bitwise_and, "tirx.bitwise_or": np.bitwise_or, "tirx.bitwise_xor": np.bitwise_xor,
               "tirx.shift_left": np.left_shift, "tirx.shift_right": np.right_shift}
    if isinstance(e, tir.Call) and str(e.op.name) in bitwise:
        return bitwise[str(e.op.name)](*(np.asarray(eval_numpy(a, env), dtype=np.int64) for a in e.args))
    raise ValueError(f"cannot enumerate {type(e).__name__} ({e})")
