"""Vector legality: every vector access contiguous and aligned to its width, for all shapes.

A vector access in the device IR is a ``Ramp(base, stride, lanes)`` index. It is one
``ld/st.v`` instruction only when ``stride == 1`` (contiguous) and its byte address is
a multiple of its width (``lanes * element size``); a misaligned vector access faults
at run time ("misaligned address"). For each one, Z3 looks for a block, thread, loop
iteration and shape (under the kernel's facts) where ``address % width != 0``: none
is a proof, a model is the counterexample. Global buffers are assumed to start at an
address aligned to at least 16 bytes (what PyTorch allocations give); that assumption
is reported with the verdict, since a sliced tensor can break it.

The program's own ``T.assume`` conditions that the launcher checks are facts here, as for
the bounds verifier: TileLang vectorizes a strided row only under one (``stride % 4 == 0``).

Missed vectorization: a scalar access in a loop whose index advances by exactly one
element per iteration, from a start that is provably aligned to ``w`` elements,
could be one ``w``-wide access; the widest such ``w`` (up to 16 bytes) is reported.

Branching selects (a performance note, never a verdict): an ``if_then_else`` whose value is a
vector and whose condition is one scalar is emitted by TileLang's CUDA code generator as an
``if``/``else`` per vector, so the arms' work (conversions, products) cannot be scheduled
across vectors. Reported when an arm computes (not only loads or constants: TileLang's own
bound guards are plain loads) and a loop that runs at run time (symbolic extent, or serial with
more than one step) encloses it. On the H200, taking such selects out of the e4m3 decode kernels' dequant made them
1.17-1.42x faster (bench/RESULTS.md, 2026-12-04).
"""

from __future__ import annotations

import time

import z3
from tilelang import tvm
from tlx.lowering import LoweredKernel
from tlx.passes import PassContext, TlxError, exit_status, raise_or_warn
from tlx.ir.facts import launcher_checks
from tlx.ir.program import Access, Program, collect_program
from tlx.ir.tir import const_int, device_functions, elem_bytes, nodes, op_name
from tlx.passes.smt import Encoder, context_facts, kernel_encoder

tir = tvm.tirx

__all__ = ["VectorError", "vectors_report"]

_MAX_VECTOR_BYTES = 16


class VectorError(TlxError):
    """A misaligned or non-contiguous vector access was proven under ``verify="error"``."""


def _thread_facts(enc: Encoder, prog: Program) -> list:
    facts = []
    for v, ext in prog.threads:
        facts += enc.range_facts(v, 0, ext)
    return facts


def _address(enc: Encoder, acc: Access, index) -> object:
    return acc.base_bytes + enc.encode(index) * elem_bytes(acc.dtype)


def program_assumptions(enc: Encoder, kernel: LoweredKernel) -> dict[str, list]:
    """Device function name -> the program's ``T.assume`` conditions in it that the launcher
    checks (its host asserts), as for the bounds verifier (TileLang vectorizes under them, e.g.
    a row stride assumed a multiple of 4): each conjunct ``v % m == 0`` over a variable as the
    pair (``v``'s term, ``m``), to be substituted (see ``_solve``), any other as an encoded fact."""
    checked = launcher_checks(kernel)
    out = {}
    for name, f in device_functions(kernel.device_mod):
        found = []
        for a in nodes(f.body, tir.AttrStmt):
            if a.attr_key == "tl.assume" and isinstance(a.node, tvm.ir.PrimExpr) and str(a.node) in checked:
                found += [_multiple(enc, c) or enc.encode_bool(c) for c in _conjuncts(a.node)]
        enc.take_obligations()
        out[name] = found
    return out


def _conjuncts(cond) -> list:
    return _conjuncts(cond.a) + _conjuncts(cond.b) if isinstance(cond, tir.And) else [cond]


def _multiple(enc: Encoder, cond) -> tuple | None:
    """(term, m) for ``v % m == 0`` (floor or truncated modulus) with ``v`` a variable, else None."""
    if isinstance(cond, tir.EQ) and const_int(cond.b) == 0 and isinstance(cond.a, (tir.FloorMod, tir.Mod)) \
            and isinstance(cond.a.a, tir.Var) and (const_int(cond.a.b) or 0) > 0:
        return enc.var(cond.a.a), const_int(cond.a.b)
    return None


def _solve(enc: Encoder, formulas: list, assumed) -> object:
    """``enc.check`` of ``formulas`` and the ``assumed`` facts, each assumed multiple ``v = m * k``
    substituted for ``v`` (a fresh ``k``): Z3 gives up on a modulus constraint over a product of
    variables (a stride times a row index) where it proves the substituted form."""
    pairs = [(t, m * z3.Int(f"{t}!over{m}", enc.ctx)) for t, m in (a for a in assumed if isinstance(a, tuple))]
    facts = [a for a in assumed if not isinstance(a, tuple)]
    return enc.check([z3.substitute(f, *pairs) if pairs else f for f in formulas + facts])


def check_vector(enc: Encoder, prog: Program, acc: Access, assumed=()) -> dict:
    """Contiguity and alignment of one vector access (``assumed``: facts the launcher makes true)."""
    ramp = acc.index
    eb = elem_bytes(acc.dtype)
    entry = {"buffer": acc.buffer, "scope": acc.scope, "op": acc.op, "statement": acc.text, "lanes": int(ramp.lanes), "width_bytes": eb * int(ramp.lanes)}
    if const_int(ramp.stride) != 1:
        entry.update(contiguous=False, aligned="n/a", verdict="not contiguous", stride=str(ramp.stride))
        return entry
    width = eb * int(ramp.lanes)
    entry["contiguous"] = True
    facts = _thread_facts(enc, prog) + context_facts(enc, prog, acc) + [enc.encode_bool(c) for c in acc.conds]
    addr = _address(enc, acc, ramp.base)
    enc.take_obligations()
    v = _solve(enc, facts + [addr % width != 0], assumed)
    entry["aligned"] = v.status
    if v.status == "violation":
        entry["counterexample"] = _model_of(enc, v.model, prog, acc)
        entry["counterexample"]["byte_offset"] = enc.model_value(v.model, addr)
    if acc.scope == "global":
        entry["assumes"] = f"{acc.buffer} data pointer aligned to {max(width, 16)} bytes"
    entry["verdict"] = {"proven": "legal", "violation": "misaligned", "unknown": "unknown"}[v.status]
    return entry


def _model_of(enc, model, prog, acc) -> dict:
    out = {}
    for v, _ in prog.threads + prog.blocks:
        out[str(v.name)] = enc.model_value(model, enc.var(v))
    for v, _, _ in acc.loops:
        out[str(v.name)] = enc.model_value(model, enc.var(v))
    return out


def missed_vectorization(enc: Encoder, prog: Program, acc: Access) -> dict | None:
    """The widest vector a scalar access in its innermost loop could be, if wider than 1.

    Width ``w`` works when, for every iteration ``i`` that does not end a group of ``w``,
    the next iteration's element is the next element, and every group starts at an
    address aligned to ``w`` elements (the guard of the access, if any, is not examined).
    """
    if acc.lanes != 1 or not acc.loops or isinstance(acc.index, tir.Ramp) or acc.op not in ("load", "store"):
        return None
    v, lo, ext = acc.loops[-1]
    n = const_int(ext)
    if n is None or n < 2 or const_int(lo) != 0:
        return None
    eb = elem_bytes(acc.dtype)
    step = tir.stmt_functor.substitute(acc.index, {v: v + 1}) - acc.index
    facts = _thread_facts(enc, prog) + context_facts(enc, prog, acc) + [enc.encode_bool(c) for c in acc.conds]
    iv = enc.var(v)
    best, w = 1, 2
    while w <= min(n, _MAX_VECTOR_BYTES // eb) and n % w == 0:
        inner = enc.prove(enc.encode(step) == 1, facts + [iv % w != w - 1]).status == "proven"
        start = _address(enc, acc, tir.stmt_functor.substitute(acc.index, {v: v - tir.floormod(v, w)}))
        if not (inner and enc.prove(start % (w * eb) == 0, facts).status == "proven"):
            break
        best, w = w, w * 2
    enc.take_obligations()
    if best == 1:
        return None
    return {"buffer": acc.buffer, "scope": acc.scope, "op": acc.op, "statement": acc.text, "loop": str(v.name), "could_be_lanes": best, "width_bytes": best * eb}


# what an arm of a select may hold and still count as not computing: values read or named as they are
_PLAIN = (tir.BufferLoad, tir.Broadcast, tir.Ramp, tir.IntImm, tir.FloatImm, tir.Var)


def _computes(expr) -> bool:
    """``expr`` does arithmetic or a conversion (more than a load, a constant or a variable)."""
    if isinstance(expr, tir.Broadcast):
        return _computes(expr.value)
    return not isinstance(expr, _PLAIN) and not (isinstance(expr, tir.Call) and op_name(expr) == "tirx.reinterpret")


def _runs_repeatedly(loop) -> bool:
    """A loop that iterates at run time: symbolic extent, or serial with more than one step
    (unrolled and vectorized loops are straight-line code)."""
    extent = const_int(loop.extent)
    return extent is None or (loop.kind == tir.ForKind.SERIAL and extent > 1)


def _branching_selects(kernel: LoweredKernel) -> list[dict]:
    """The vector selects on a scalar condition that compute in an arm, inside a loop that
    runs repeatedly (module docstring), each once with its outermost such loop (a kernel's main
    loop); ``conditional``: an ``if`` inside that loop encloses it (a path that may run rarely,
    e.g. a last page)."""
    found, seen = [], []
    for name, func in device_functions(kernel.device_mod):
        loops = [f for f in nodes(func.body, tir.For) if _runs_repeatedly(f)]
        for loop in reversed(loops):  # `nodes` lists inner loops first: reversed, a select meets its outermost loop first
            guarded = [c for branch in nodes(loop.body, tir.IfThenElse) for case in (branch.then_case, branch.else_case)
                       if case is not None for c in nodes(case, tir.Call)]
            for call in nodes(loop.body, tir.Call):
                if (op_name(call) != "tirx.if_then_else" or call.dtype.lanes == 1 or call.args[0].dtype.lanes != 1
                        or not (_computes(call.args[1]) or _computes(call.args[2])) or any(call.same_as(c) for c in seen)):
                    continue
                seen.append(call)
                found.append({"kernel": name, "loop": str(loop.loop_var.name), "lanes": int(call.dtype.lanes),
                              "conditional": any(call.same_as(c) for c in guarded),
                              "condition": str(call.args[0]), "select": str(call)})
    return found


def vectors_report(kernel: LoweredKernel, programs: list[Program] | None = None, assume=()) -> dict:
    """``{"vectors": [...], "missed": [...], "misaligned": n, "unknown": n}`` for ``kernel``.

    ``assume``: the user's conditions on shape variables (``"N % 4 == 0"``), as for the bounds verifier.
    """
    t0 = time.perf_counter()
    enc = kernel_encoder(kernel, assume)
    assumed = program_assumptions(enc, kernel)
    vectors, missed = [], []
    for prog in programs or collect_program(kernel):
        vectors += [{"kernel": prog.name, "statement": what, "verdict": "unknown"} for what in prog.unread]
        for acc in prog.accesses:
            if acc.scope not in ("global", "shared", "shared.dyn") or acc.op not in ("load", "store"):
                continue
            if isinstance(acc.index, tir.Ramp):
                e = check_vector(enc, prog, acc, assumed.get(prog.name, ()))
                e["kernel"] = prog.name
                vectors.append(e)
            else:
                m = missed_vectorization(enc, prog, acc)
                if m is not None:
                    m["kernel"] = prog.name
                    missed.append(m)
    bad = sum(e["verdict"] in ("misaligned", "not contiguous") for e in vectors)
    unknown = sum(e["verdict"] == "unknown" for e in vectors)
    branches = _branching_selects(kernel)
    summary = [f"{len(vectors)} vector accesses: {len(vectors) - bad - unknown} proven aligned and contiguous, {bad} wrong, {unknown} unknown; "
               f"{len(missed)} missed vectorizations; {len(branches)} branching selects "
               f"({sum(b['conditional'] for b in branches)} on a conditional path)"]
    summary += [f"misaligned {e['width_bytes']}-byte `{e['statement'][:80]}` at {e['counterexample']}" for e in vectors if e["verdict"] == "misaligned"]
    summary += [f"`{m['statement'][:80]}` could be {m['could_be_lanes']}-wide" for m in missed[:5]]
    summary += [f"a branch per {b['lanes']}-wide vector in loop {b['loop']}: `{b['select'][:100]}` "
                "(branch once outside the loop, or select the inputs)" for b in branches if not b["conditional"]][:5]
    return {
        "summary": summary,
        "vectors": vectors,
        "missed": missed,
        "branches": branches,
        "checked": len(vectors),
        "misaligned": bad,
        "unknown": unknown,
        "exit_code": exit_status(bad, unknown),
        "seconds": round(time.perf_counter() - t0, 4),
    }


def vectors_pass(kernel: LoweredKernel, ctx: PassContext) -> LoweredKernel:
    """Report into ``ctx.reports["vectors"]``; a proven misaligned vector raises or warns per ``verify``."""
    report = vectors_report(kernel, assume=ctx.options.assume)
    ctx.reports["vectors"] = report
    bad = [e for e in report["vectors"] if e["verdict"] == "misaligned"]
    if bad:
        msg = "\n".join(f"misaligned {e['width_bytes']}-byte vector access `{e['statement']}` at {e['counterexample']}" for e in bad)
        raise_or_warn(ctx, VectorError(msg))
    return kernel
