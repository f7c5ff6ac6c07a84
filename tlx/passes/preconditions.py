"""Preconditions: weak conditions on shape variables under which the accesses the verifier
could not prove become proven; the launcher checks them on every call."""

from __future__ import annotations

from typing import Any

from tilelang import tvm

from tlx.ir.tir import device_functions
from tlx.lowering import LoweredKernel
from tlx.passes import Precondition
from tlx.ir.facts import dimension_vars
from tlx.passes.assume import shape_vars
from tlx.passes.smt import DEFAULT_RLIMIT, Encoder, shape_setup
from tlx.passes.verification import CheckedAccess, BoundsReport, verify_kernel

tir = tvm.tirx

__all__ = ["accesses_needing", "derive_preconditions"]


def _tile_constants(kernel: LoweredKernel) -> list[int]:
    """Positive constants >= 2 that appear in the device code (tile sizes, extents), smallest first."""
    found: set[int] = set()

    def visit(n):
        if isinstance(n, tir.IntImm) and 2 <= n.value <= 4096 and not str(n.dtype).startswith("bool"):
            found.add(int(n.value))

    for _, f in device_functions(kernel.device_mod):
        tir.stmt_functor.post_order_visit(f.body, visit)
    return sorted(found)


def _divisibility_candidates(variables: dict, names, consts):
    """``v >= 1`` then ``v % c == 0`` for the kernel's constants, weakest (smallest c) first."""
    for name in names:
        v = variables[name]
        yield tir.GE(v, tir.IntImm(v.dtype, 1)), f"{name} >= 1"
        for c in consts:
            yield tir.EQ(tir.floormod(v, tir.IntImm(v.dtype, c)), tir.IntImm(v.dtype, 0)), f"{name} % {c} == 0"


def _nonnegative(v, name: str):
    return tir.GE(v, tir.IntImm(v.dtype, 0)), f"{name} >= 0"


def _breaks_when_negative(kernel, assume, chosen, v, target, rlimit, hulls) -> bool:
    """Some negative value of scalar ``v`` still breaks ``target`` under ``chosen``."""
    rep = verify_kernel(kernel, assume, [c for c, _ in chosen] + [tir.LT(v, tir.IntImm(v.dtype, 0))], rlimit,
                           focus=target.key(), hulls=hulls)
    return not _fixes(rep, target)


def _upper_bound(kernel, assume, variables, name, chosen, target, rlimit, hulls):
    """``name <= B`` with B one below the least value of ``name`` that still breaks ``target``."""
    v = variables[name]
    rep = verify_kernel(kernel, assume, [c for c, _ in chosen], rlimit, focus=target.key(), least_of=name, hulls=hulls)
    least = [a.least[name] for a in rep.accesses if a.key() == target.key() and name in a.least]
    if not least or least[0] < 1:
        return None
    # Below the least violating value the target holds; the caller re-verifies everything.
    return tir.LE(v, tir.IntImm(v.dtype, least[0] - 1)), f"{name} <= {least[0] - 1}"


def _vars_in(access: CheckedAccess, variables: dict) -> list[str]:
    return sorted(k for k in access.counterexample if k in variables)


def derive_preconditions(kernel: LoweredKernel, report: BoundsReport, assume=(), rlimit: int = DEFAULT_RLIMIT, max_conditions: int = 8, source_map=None,
                         prove_guards: bool = False):
    """Weak conditions on shape variables, from a fixed candidate family, that prove failing accesses.

    One failing access at a time (greedy; overflows first): ``v >= 0`` for a scalar parameter
    that is negative in its counterexample (only tensor dimensions are known to be >= 0), then the largest upper bound
    ``v <= B`` on a shape variable of its counterexample (int32 limits, static
    allocations indexed by a shape); for other refutations then ``v >= 1`` and
    ``v % c == 0`` for the kernel's constants, smallest ``c`` first. A
    candidate is kept when it proves that access and leaves some shape with every
    variable >= 1. Accesses no candidate proves (e.g. data-dependent ones) are skipped.
    Returns ``(preconditions, report under them)``; the report may still hold failures. With
    ``prove_guards`` every report that may become that one proves the guards too.
    """
    variables = shape_vars(kernel.prim_func)
    dims = dimension_vars(kernel.prim_func)
    consts = _tile_constants(kernel)
    chosen: list[tuple[Any, str]] = []
    current = report
    unfixable: set = set()
    while len(chosen) < max_conditions:
        # Only shape-dependent refutations can be fixed by shape conditions; unknowns that hang
        # on an overflow go away with it, and data-dependent ones never do.
        bad = [a for a in current.violations() if a.key() not in unfixable and not a.data_dependent]
        if not bad:
            break
        target = min(bad, key=lambda a: a.kind != "overflow")
        names = _vars_in(target, variables) or sorted(variables)
        # A scalar parameter that is negative in the counterexample: its sign first (the launcher
        # then checks it). It need not prove the access alone: the upper bound, if one is needed,
        # comes with the next counterexample.
        sign = next((cand for n in names if n not in dims and f"{n} >= 0" not in {c[1] for c in chosen}
                     for cand in [_nonnegative(variables[n], n)]
                     if _breaks_when_negative(kernel, assume, chosen, variables[n], target, rlimit, report.hulls)), None)
        if sign is not None and _satisfiable(kernel, assume, chosen + [sign]):
            chosen.append(sign)
            current = verify_kernel(kernel, assume, [c for c, _ in chosen], rlimit, source_map=source_map, hulls=report.hulls,
                                    prove_guards=prove_guards)
            continue
        fixed = None
        # Upper bounds next (int32 limits; static allocations indexed by a shape variable);
        # a bound that leaves no shape >= 1 (e.g. a tail bug, broken from N = 1) is rejected.
        for name in names:
            cand = _upper_bound(kernel, assume, variables, name, chosen, target, rlimit, report.hulls)
            if cand is not None and _satisfiable(kernel, assume, chosen + [cand]):
                fixed = cand
                break
        if fixed is None and not (target.kind == "overflow" or "overflow" in target.detail):
            for cand in _divisibility_candidates(variables, names, consts):
                if any(cand[1] == c[1] for c in chosen):
                    continue
                rep = verify_kernel(kernel, assume, [c for c, _ in chosen] + [cand[0]], rlimit, focus=target.key(),
                                       hulls=report.hulls)
                if _fixes(rep, target) and _satisfiable(kernel, assume, chosen + [cand]):
                    fixed = cand
                    break
        if fixed is None:
            unfixable.add(target.key())
            continue
        trial = verify_kernel(kernel, assume, [c for c, _ in chosen + [fixed]], rlimit, source_map=source_map,
                              hulls=report.hulls, prove_guards=prove_guards)
        if not _fixes(trial, target):
            unfixable.add(target.key())
            continue
        chosen.append(fixed)
        current = trial
    chosen, current = _drop_unneeded_signs(kernel, assume, chosen, current, rlimit, source_map, report.hulls, prove_guards)
    return [Precondition(c, text, "bounds") for c, text in _tightest_bounds(chosen)], current


def _drop_unneeded_signs(kernel, assume, chosen, current, rlimit, source_map, hulls, prove_guards):
    """A sign condition that proves nothing in the end (its access needed more than the family
    offers) would only refuse calls: drop it."""
    for cond in [c for c in chosen if c[1].endswith(" >= 0")]:
        rest = [c for c in chosen if c is not cond]
        trial = verify_kernel(kernel, assume, [c for c, _ in rest], rlimit, source_map=source_map, hulls=hulls,
                              prove_guards=prove_guards)
        if trial.proven >= current.proven:
            chosen, current = rest, trial
    return chosen, current


def _tightest_bounds(chosen):
    """Of several ``v <= B`` on one variable keep the smallest B (the others are implied)."""
    best: dict[str, int] = {}
    for _, text in chosen:
        name, op, value = text.partition(" <= ")
        if op:
            best[name] = min(best.get(name, int(value)), int(value))
    out = []
    for cond, text in chosen:
        name, op, value = text.partition(" <= ")
        if op and int(value) != best[name]:
            continue
        out.append((cond, text))
    return out


def _fixes(rep: BoundsReport, target: CheckedAccess) -> bool:
    """``target`` is proven in ``rep`` (an overflow entry that disappeared counts as proven)."""
    return all(a.status in ("proven", "skipped") for a in rep.accesses if a.key() == target.key())


def _satisfiable(kernel, assume, chosen) -> bool:
    """The assumptions plus ``chosen`` still allow some shape with every shape variable >= 1."""
    enc = Encoder()
    variables, terms = shape_setup(enc, kernel, tuple(assume), [c for c, _ in chosen])
    return enc.check([t >= 1 for t in terms.values()]).status == "violation"


def accesses_needing(kernel: LoweredKernel, preconditions: list[Precondition], report: BoundsReport, final: BoundsReport,
                     assume=(), rlimit: int = DEFAULT_RLIMIT, source_map=None) -> list[list[CheckedAccess]]:
    """For each precondition, every access (or overflow) proven under all of them that fails
    without it, with the counterexample of that failure (from a walk under the others).

    An access that fails only when several are dropped at once is listed under each of them,
    with its counterexample from the walk without any."""
    still = {a.key() for a in final.violations() + final.unknowns()}  # an overflow proven leaves no entry
    before = {a.key(): a for a in report.violations() + report.unknowns() if a.key() not in still}
    if len(preconditions) == 1:
        return [list(before.values())]
    lists, named = [], set()
    for i in range(len(preconditions)):
        others = [q.expr for j, q in enumerate(preconditions) if j != i]
        without = verify_kernel(kernel, assume, others, rlimit, source_map=source_map, hulls=report.hulls)
        failing = [a for a in without.violations() + without.unknowns() if a.key() not in still]
        named |= {a.key() for a in failing}
        lists.append(failing)
    shared = [a for key, a in before.items() if key not in named]
    return [failing + shared for failing in lists]
