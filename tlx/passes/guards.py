"""Guard elimination: drop the bound-check guards that the verifier proves always true.

TileLang's ``LegalizeSafeMemoryAccess`` wraps every global access it cannot prove safe
in an ``if`` or ``if_then_else``. Under the kernel's facts (launch extents, loop ranges,
enclosing conditions, assumptions and the preconditions that the launcher enforces),
many of those conditions are always true. The bounds verifier's walk proves which
(:attr:`~tlx.passes.verification.BoundsReport.proven_guards`; an unknown keeps the guard; at
compile time the bounds pass's walk has proven them, :class:`~tlx.passes.GuardProofs`),
and this pass then replaces an ``if (c) S`` by ``S`` and ``if_then_else(c, a, b)`` by ``a``
for those. Conditions that read memory or call intrinsics (e.g. warp-role tests) are
never touched.
"""

from __future__ import annotations

import re

from tilelang import tvm

from tlx.ir.tir import device_functions, op_name
from tlx.ir.walk import MATRIX_MOVES, is_access_ptr, is_cp_async
from tlx.lowering import LoweredKernel
from tlx.passes import PassContext
from tlx.passes.verification import verify_kernel

tir = tvm.tirx

__all__ = ["count_predicates", "eliminate_guards"]


def eliminate_guards(kernel: LoweredKernel, assume=(), conditions=()) -> tuple[LoweredKernel, dict]:
    """``kernel`` with proven guards removed, and ``{"seen", "removed"}`` counts.

    ``conditions`` are TIR preconditions the launcher checks on every call; they may be
    used as facts because no launch violates them.
    """
    report = verify_kernel(kernel, tuple(assume), list(conditions), prove_guards=True)
    return _without_guards(kernel, report.proven_guards), dict(report.guards)


def _without_guards(kernel: LoweredKernel, proven) -> LoweredKernel:
    """``kernel`` with the ``proven`` guard nodes (of its own device functions) removed; the
    same object when there are none."""
    if not proven:
        return kernel
    mod = kernel.device_mod
    for name, func in device_functions(mod):
        body = _drop_guards(func.body, proven)
        if not body.same_as(func.body):
            gv = mod.get_global_var(name)
            mod = tvm.IRModule({g: (func.with_body(body) if g.same_as(gv) else f) for g, f in mod.functions.items()},
                               attrs=mod.attrs)
    return kernel.with_device_mod(mod)


def _pointer_call(e) -> bool:
    """A call whose pointers the verifier checks as a whole: nothing inside it is rewritten."""
    return is_access_ptr(e) or is_cp_async(e) or op_name(e) in MATRIX_MOVES


def _drop_guards(s, proven: set):
    """``s`` with each proven guard statement replaced by its body, and each proven
    ``if_then_else`` that is the value evaluated or stored (or an argument of a call there)
    replaced by its first branch. Loop bounds, conditions, bindings and indices are left as
    they are."""
    if isinstance(s, tir.SeqStmt):
        seq = [_drop_guards(x, proven) for x in s.seq]
        return tir.SeqStmt(seq) if any(not a.same_as(b) for a, b in zip(seq, s.seq)) else s
    if isinstance(s, tir.IfThenElse):
        then = _drop_guards(s.then_case, proven)
        if s in proven:
            return then
        other = None if s.else_case is None else _drop_guards(s.else_case, proven)
        if then.same_as(s.then_case) and (other is None or other.same_as(s.else_case)):
            return s
        return tir.IfThenElse(s.condition, then, other)
    if isinstance(s, (tir.AttrStmt, tir.For, tir.While)):
        body = _drop_guards(s.body, proven)
        if body.same_as(s.body):
            return s
        if isinstance(s, tir.AttrStmt):
            return tir.AttrStmt(s.node, s.attr_key, s.value, body)
        if isinstance(s, tir.While):
            return tir.While(s.condition, body)
        return tir.For(s.loop_var, s.min, s.extent, s.kind, body, s.thread_binding, s.annotations, getattr(s, "step", None))
    if isinstance(s, tir.Evaluate):
        value = _drop_in_value(s.value, proven)
        return s if value.same_as(s.value) else tir.Evaluate(value)
    if isinstance(s, tir.BufferStore):
        value = _drop_in_value(s.value, proven)
        return s if value.same_as(s.value) else tir.BufferStore(s.buffer, value, list(s.indices), s.predicate)
    return s


def _drop_in_value(e, proven: set):
    if not isinstance(e, tir.Call) or _pointer_call(e):
        return e
    if op_name(e) == "tirx.if_then_else":
        cond, a, b = e.args
        new_a = _drop_in_value(a, proven)
        if e in proven:
            return new_a
        new_b = _drop_in_value(b, proven)
        return e if new_a.same_as(a) and new_b.same_as(b) else tir.Call(e.dtype, e.op, [cond, new_a, new_b])
    args = [_drop_in_value(a, proven) for a in e.args]
    return tir.Call(e.dtype, e.op, args) if any(not a.same_as(b) for a, b in zip(args, e.args)) else e


_PREDICATE = re.compile(r"\bif\s*\(|\?")


def count_predicates(source: str) -> int:
    """Conditional branches and selects (``if (`` and ``?``) in generated CUDA source."""
    code = "\n".join(line.split("//", 1)[0] for line in source.splitlines())
    return len(_PREDICATE.findall(code))


def eliminate_guards_pass(kernel: LoweredKernel, ctx: PassContext) -> LoweredKernel:
    """Remove proven guards, using as facts only the preconditions the launcher enforces.

    The user's ``assume`` strings reach this pass as preconditions of the ``bounds`` pass
    (so they are checked on every call); with ``verify="off"`` there are none and only
    the kernel's own facts are used. The bounds pass's guard proofs are used when they were
    made on this kernel under exactly these preconditions; otherwise the kernel is walked here.
    """
    proofs = ctx.guard_proofs
    if (proofs is not None and proofs.kernel is kernel and len(proofs.preconditions) == len(ctx.preconditions)
            and all(a is b for a, b in zip(proofs.preconditions, ctx.preconditions))):
        new, stats = _without_guards(kernel, proofs.proven), dict(proofs.stats)
    else:
        new, stats = eliminate_guards(kernel, (), [p.expr for p in ctx.preconditions])
    ctx.reports["eliminate_guards"] = stats
    return new
