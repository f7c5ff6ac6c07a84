"""The registered ``bounds`` pass: error / warn / off, reports, and preconditions for the launcher."""

import warnings

import pytest

from tests.passes.corpus import lowered
from tilelang import tvm
from tlx.passes import PassContext, registered_passes, run_passes
from tlx.passes.bounds import VerificationError, bounds_pass

tir = tvm.tirx


def _ctx(**options):
    return PassContext(options={"verify": "error", "assume": (), **options})


def test_error_mode_raises_with_counterexample():
    with pytest.raises(VerificationError, match=r"S\[tx \+ 1\].*counterexample: .*tx=127"):
        bounds_pass(lowered("off_by_one_tail"), _ctx())


def test_warn_mode_warns_and_reports():
    ctx = _ctx(verify="warn")
    with pytest.warns(UserWarning, match="out of bounds"):
        bounds_pass(lowered("wrong_stride"), ctx)
    rep = ctx.reports["bounds"]
    assert rep["accesses"] == 4 and rep["proven"] == 2
    assert {v["buffer"] for v in rep["violations"]} == {"S"}


def _holds(expr, **values):
    subst = {v: tir.IntImm(v.dtype, values[v.name]) for v in _free_vars(expr)}
    out = tvm.arith.Analyzer().simplify(tir.stmt_functor.substitute(expr, subst))
    return bool(out.value)


def _free_vars(expr):
    found = []
    tir.stmt_functor.post_order_visit(tir.Evaluate(expr), lambda n: found.append(n) if isinstance(n, tir.Var) else None)
    return found


def test_dynamic_kernel_gets_enforceable_precondition():
    ctx = _ctx()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        bounds_pass(lowered("add_dynamic"), ctx)
    assert [(p.text, p.origin) for p in ctx.preconditions] == [("N <= 2147483520", "bounds")]
    expr = ctx.preconditions[0].expr
    assert _holds(expr, N=2147483520) and not _holds(expr, N=2147483521)
    assert ctx.reports["bounds"]["preconditions"] == ["N <= 2147483520"]


def test_assumptions_become_launcher_checks():
    ctx = _ctx(assume=("N % 128 == 0",))
    bounds_pass(lowered("add_dynamic"), ctx)
    assert [(p.text, p.origin) for p in ctx.preconditions] == [("N % 128 == 0", "assume")]
    assert _holds(ctx.preconditions[0].expr, N=256) and not _holds(ctx.preconditions[0].expr, N=200)


def test_off_mode_does_not_run():
    assert {"bounds", "eliminate_guards"} <= set(registered_passes())
    ctx = _ctx(verify="off", eliminate_guards=False)
    skip = tuple(n for n in registered_passes() if n not in ("bounds", "eliminate_guards"))
    run_passes(lowered("off_by_one_tail"), ctx, skip=skip)
    assert "bounds" not in ctx.reports and "eliminate_guards" not in ctx.reports
