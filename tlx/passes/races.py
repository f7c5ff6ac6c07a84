"""Shared-memory races: two threads, one address, at least one write, nothing ordering them.

Model. ``__syncthreads()`` (``tvm_storage_sync`` without a barrier id) splits each
thread's execution into *epochs*; the epoch of an access instance is the number of
block barriers executed before it, a symbolic expression of the enclosing loop
variables (a loop whose body passes ``s`` barriers adds ``s`` per iteration; a branch
adds ``Select(cond, then, else)``). Two plain accesses of different threads are
unordered exactly when their epochs are equal. A ``cp.async`` write stays in flight
from its issue until a ``cp.async.wait_group(n)`` of the issuing thread retires its
commit group (``commits(wait) - n > group``) *and* a barrier follows that wait: it
races with another thread's access in any epoch from its issue until then.

Both instances get their own loop iterations and threads; the block and shape
variables are shared. Each pair of shared accesses to one allocation (at least one
writing) is one Z3 query: unsat is a proof of absence; a model is a witness.

Not modelled, and therefore reported as ``unknown`` rather than safe: TMA and other
bulk-async copies, accesses through wgmma descriptors, named/partial barriers,
barriers under thread-dependent conditions, and kernels synchronised by mbarriers
(a race found there may be ordered by an mbarrier, so it is reported as possible).
Calls into TileLang's collective templates (``tl::AllReduce`` and the like) are
treated as one access of their whole workspace by every thread, synchronised inside
the call but not with anything outside it.
"""

from __future__ import annotations

import time

import z3

from tilelang import tvm
from tlx.lowering import LoweredKernel
from tlx.passes import PassContext, TlxError, exit_status, raise_or_warn
from tlx.ir.program import SHARED_SCOPES, Access, Program, collect_program
from tlx.ir.tir import const_int, elem_bytes
from tlx.passes.layouts import bit_split, bits_to_arith
from tlx.passes.smt import Encoder, Verdict, kernel_encoder

tir = tvm.tirx

__all__ = ["RaceError", "find_races", "races_report"]

_THREAD_OPS = ("load", "store", "ptx_ldmatrix", "ptx_stmatrix", "ptx_cp_async")
_MBARRIER_HINTS = ("mbarrier", "arrive_barrier", "ptx_arrive", "barrier_wait")


class RaceError(TlxError):
    """A shared-memory race was found under ``verify="error"``."""


def _collective(acc: Access) -> bool:
    return acc.op == "call_extern" or acc.op.startswith("tl::")


def _modelled(acc: Access) -> bool:
    return acc.op in _THREAD_OPS or _collective(acc)


class _Copy:
    """One dynamic instance of an access: its own threads and loop iterations.

    Thread indices and power-of-two loops are split into bits (see ``bit_split``) so the
    swizzled addresses of TileLang kernels stay easy for Z3; every copy gets fresh
    variables, so two copies are two independent instances.
    """

    def __init__(self, enc: Encoder, prog: Program, acc: Access, tag: str):
        ctx_vars = [(v, ext) for v, ext in prog.threads]
        split_loops = [(v, ext) for v, lo, ext in acc.loops if const_int(lo) == 0 and const_int(ext) is not None]
        other_loops = [(v, lo, ext) for v, lo, ext in acc.loops if not (const_int(lo) == 0 and const_int(ext) is not None)]
        index = acc.index.base if isinstance(acc.index, tir.Ramp) else acc.index
        extents = dict(ctx_vars + split_loops)
        exprs = [bits_to_arith(e, extents) for e in [index, acc.epoch, acc.commits] + list(acc.conds)]
        outs, inputs, recon, constraints = bit_split(exprs, ctx_vars + split_loops + [(v, None) for v, _, _ in other_loops], tag=f"@{tag}", fresh=True)
        facts = []
        for nv, ext in inputs:
            if const_int(ext) is not None:
                t = enc.var(nv)
                facts += [t >= 0, t < const_int(ext)]
        for v, lo, ext in other_loops:
            t = enc.encode(recon[v])
            lo_t = enc.encode(tir.stmt_functor.substitute(lo, recon))
            facts += [t >= lo_t, t < lo_t + enc.encode(tir.stmt_functor.substitute(ext, recon))]
        self.threads = [(str(v.name), enc.encode(recon[v])) for v, _ in prog.threads]
        self.loops = [(str(v.name), enc.encode(recon[v])) for v, _, _ in acc.loops]
        self.loop_env = {v: t for (v, _, _), (_, t) in zip(acc.loops, self.loops, strict=True)}
        self.thread_env = {v: t for (v, _), (_, t) in zip(prog.threads, self.threads, strict=True)}
        index, epoch, commits, *conds = outs
        self.facts = facts + [enc.encode_bool(c) for c in list(conds) + constraints]
        self.lo = acc.base_bytes + enc.encode(index) * elem_bytes(acc.dtype)
        self.hi = self.lo + acc.width  # exclusive
        self.epoch = enc.encode(epoch)
        self.group = enc.encode(commits)
        enc.take_obligations()


def _not_landed(enc: Encoder, prog: Program, ca: _Copy, other: _Copy) -> object:
    """``ca``'s async write may still be in flight (or unpublished) when ``other`` runs.

    It has landed for ``other`` once some ``wait_group(n)`` instance of the issuing thread
    retired its group (``commits - n > group``) before a barrier that precedes ``other``
    (``epoch(wait) < epoch(other)``). Instead of quantifying over every wait instance,
    a few candidate instances are tried: for each loop around the wait, the iteration
    of ``other`` or the one before it, that of ``ca`` or the one after, and the first and
    last. Trying fewer waits can only report more races, never fewer: no false "safe".
    """
    import itertools

    landed = []
    for w in prog.waits:
        choices = []
        for v, lo, ext in w.loops:
            opts = []
            if v in other.loop_env:
                opts += [other.loop_env[v], other.loop_env[v] - 1]
            if v in ca.loop_env:
                opts += [ca.loop_env[v], ca.loop_env[v] + 1]
            opts += [None, "last"]
            choices.append([(v, lo, ext, o) for o in opts])
        for combo in itertools.product(*choices):
            env = dict(ca.thread_env)
            dom = []
            for v, lo, ext, o in combo:
                lo_t, ext_t = enc.encode(lo, env), enc.encode(ext, env)
                t = lo_t if o is None else lo_t + ext_t - 1 if isinstance(o, str) else o
                env[v] = t
                dom += [t >= lo_t, t < lo_t + ext_t]
            dom += [enc.encode_bool(c, env) for c in w.conds]
            dom += [enc.encode(w.commits, env) - w.n > ca.group, enc.encode(w.epoch, env) < other.epoch]
            landed.append(z3.And(dom))
    enc.take_obligations()
    return z3.Not(z3.Or(landed)) if landed else z3.BoolVal(True, enc.ctx)


def _pair_query(enc, prog, a: Access, b: Access):
    ca, cb = _Copy(enc, prog, a, "1"), _Copy(enc, prog, b, "2")
    cons = ca.facts + cb.facts
    cons.append(z3.Or([x != y for (_, x), (_, y) in zip(ca.threads, cb.threads, strict=True)]))
    cons += [ca.lo < cb.hi, cb.lo < ca.hi]
    if a is b and _collective(a):
        cons.append(z3.Or([x != y for (_, x), (_, y) in zip(ca.loops, cb.loops, strict=True)]) if ca.loops else z3.BoolVal(False, enc.ctx))
    if a.is_async and b.is_async:
        window = z3.Or(
            z3.And(cb.epoch >= ca.epoch, z3.Or(cb.epoch == ca.epoch, _not_landed(enc, prog, ca, cb))),
            z3.And(ca.epoch >= cb.epoch, z3.Or(ca.epoch == cb.epoch, _not_landed(enc, prog, cb, ca))),
        )
    elif a.is_async:
        window = z3.And(cb.epoch >= ca.epoch, z3.Or(cb.epoch == ca.epoch, _not_landed(enc, prog, ca, cb)))
    elif b.is_async:
        window = z3.And(ca.epoch >= cb.epoch, z3.Or(ca.epoch == cb.epoch, _not_landed(enc, prog, cb, ca)))
    else:
        window = ca.epoch == cb.epoch
    cons.append(window)
    return _solve(enc, cons), ca, cb


def _solve(enc: Encoder, formulas: list) -> Verdict:
    """One-shot QF_LIA solve on the encoder's context and facts, same rlimit budget.

    Race queries compare two full instances; Z3's non-incremental solver preprocesses
    them (bounded 0/1 bit variables, equalities) several times faster than the
    encoder's incremental solver, with the same deterministic budget.
    """
    s = z3.SolverFor("QF_LIA", ctx=enc.ctx)
    s.set("rlimit", enc.rlimit)
    s.add(*enc.facts)
    s.add(*formulas)
    r = s.check()
    enc.queries += 1
    enc.rlimit_used += _rlimit_count(s)
    if r == z3.unsat:
        return Verdict("proven")
    if r == z3.sat:
        return Verdict("violation", s.model())
    return Verdict("unknown", reason=s.reason_unknown())


def _rlimit_count(solver) -> int:
    st = solver.statistics()
    return int(st.get_key_value("rlimit count")) if "rlimit count" in st.keys() else 0


def _disjoint(enc, prog, a: Access, b: Access, distinct_threads: bool = False) -> bool:
    """Proven: no instance of ``a`` and no instance of ``b`` (by another thread) touch a common byte."""
    ca, cb = _Copy(enc, prog, a, "1"), _Copy(enc, prog, b, "2")
    cons = ca.facts + cb.facts + [ca.lo < cb.hi, cb.lo < ca.hi]
    if distinct_threads:
        cons.append(z3.Or([x != y for (_, x), (_, y) in zip(ca.threads, cb.threads, strict=True)]))
    return _solve(enc, cons).status == "proven"


def find_races(enc: Encoder, prog: Program, budget: int | None = None) -> dict:
    """Check every pair of shared accesses of one device function.

    ``budget`` caps the Z3 resource units spent on the whole kernel (deterministic, like
    the per-query rlimit); pairs left when it is spent are reported as unknown.
    """
    shared = [a for a in prog.accesses if a.scope in SHARED_SCOPES]
    unmodelled = sorted({a.op for a in shared if not _modelled(a)})
    mbarriers = any(any(h in c for h in _MBARRIER_HINTS) for c in prog.calls)
    pairs, races, unknown = 0, [], []
    for i, a in enumerate(shared):
        for b in shared[i:]:
            if not a.root.same_as(b.root):
                continue
            if not (a.write or b.write):
                continue
            if not (_modelled(a) and _modelled(b)):
                if _disjoint(enc, prog, a, b):
                    continue
                unknown.append({"first": a.text, "second": b.text, "reason": f"{a.op if not _modelled(a) else b.op} not modelled"})
                continue
            if budget is not None and enc.rlimit_used > budget:
                unknown.append({"first": a.text, "second": b.text, "reason": "kernel race-analysis budget spent"})
                continue
            pairs += 1
            if _disjoint(enc, prog, a, b, distinct_threads=True):
                continue
            v, ca, cb = _pair_query(enc, prog, a, b)
            if v.status == "unknown":
                unknown.append({"first": a.text, "second": b.text, "reason": "solver budget"})
            elif v.status == "violation":
                races.append(_witness(enc, v.model, a, b, ca, cb))
    reasons = []
    if prog.divergent_barriers:
        reasons.append("barrier under a thread-dependent condition")
    if mbarriers:
        reasons.append("mbarrier synchronisation not modelled")
    if any("partial barrier" in o for o in prog.opaque):
        reasons.append("named/partial barriers not modelled")
    if reasons:
        # The epoch model may miss an ordering here: what it found is possible, not certain.
        unknown += [dict(r, reason="; ".join(reasons)) for r in races]
        races = []
    return {"kernel": prog.name, "pairs": pairs, "races": races, "unknown": unknown, "unmodelled_ops": unmodelled, "notes": reasons}


def _witness(enc, model, a, b, ca, cb) -> dict:
    def val(t):
        return enc.model_value(model, t)

    lo = max(val(ca.lo), val(cb.lo))
    return {
        "buffer": a.buffer if a.buffer == b.buffer else f"{a.buffer}/{b.buffer}",
        "first": {"statement": a.text, "write": a.write, "async": a.is_async, "thread": {n: val(t) for n, t in ca.threads}, "loops": {n: val(t) for n, t in ca.loops}},
        "second": {"statement": b.text, "write": b.write, "async": b.is_async, "thread": {n: val(t) for n, t in cb.threads}, "loops": {n: val(t) for n, t in cb.loops}},
        "byte_address": lo,
        "epochs": [val(ca.epoch), val(cb.epoch)],
    }


def describe_race(r: dict) -> str:
    return (
        f"shared-memory race on {r['buffer']} byte {r['byte_address']}: thread {r['first']['thread']} "
        f"{'writes' if r['first']['write'] else 'reads'} in `{r['first']['statement']}` and thread {r['second']['thread']} "
        f"{'writes' if r['second']['write'] else 'reads'} in `{r['second']['statement']}` with no barrier between"
    )


def races_report(kernel: LoweredKernel, programs: list[Program] | None = None, budget: int | None = None, assume=()) -> dict:
    """``{"kernels": [...], "races": n, "unknown": n, "verdict": "race-free"|"race"|"unknown"}``."""
    t0 = time.perf_counter()
    enc = kernel_encoder(kernel, assume)
    per = [find_races(enc, p, budget) for p in (programs or collect_program(kernel))]
    n_races = sum(len(p["races"]) for p in per)
    n_unknown = sum(len(p["unknown"]) for p in per)
    verdict = "race" if n_races else "unknown" if n_unknown else "race-free"
    summary = [f"shared memory: {verdict} ({sum(p['pairs'] for p in per)} access pairs checked, {n_unknown} unknown)"]
    summary += [describe_race(r) for p in per for r in p["races"]][:5]
    summary += sorted({f"unknown: {u['reason']}" for p in per for u in p["unknown"]})[:5]
    return {"summary": summary, "kernels": per, "races": n_races, "unknown": n_unknown, "verdict": verdict, "exit_code": exit_status(n_races, n_unknown),
            "rlimit_used": enc.rlimit_used, "seconds": round(time.perf_counter() - t0, 4)}


PASS_BUDGET = 20_000_000
"""Z3 resource units the compile-time pass spends per kernel (a few seconds on 2 cores); pairs
beyond it are unknown. ``races_report(kernel)`` without a budget checks every pair."""


def races_pass(kernel: LoweredKernel, ctx: PassContext) -> LoweredKernel:
    """Report into ``ctx.reports["races"]``; a proven race raises or warns per ``verify``."""
    budget = PASS_BUDGET if ctx.options.race_budget is None else ctx.options.race_budget
    report = races_report(kernel, budget=budget, assume=ctx.options.assume)
    ctx.reports["races"] = report
    if report["races"]:
        raise_or_warn(ctx, RaceError("\n".join(describe_race(r) for p in report["kernels"] for r in p["races"])))
    return kernel
