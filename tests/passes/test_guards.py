"""Guard elimination removes only guards the verifier proves, and the result still verifies."""

import warnings

import pytest

from tests.passes.corpus import lowered
from tlx.lowering import codegen_cuda
from tlx.passes import PassContext
from tlx.passes.bounds import bounds_pass
from tlx.passes.verification import verify_kernel
from tlx.passes.guards import count_predicates, eliminate_guards, eliminate_guards_pass


def _passes(name, assume):
    kernel = lowered(name)
    ctx = PassContext(options={"verify": "error", "assume": assume, "eliminate_guards": True})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        kernel = bounds_pass(kernel, ctx)
    return eliminate_guards_pass(kernel, ctx), ctx


@pytest.mark.parametrize(
    "name,assume,removed",
    [
        ("add_dynamic", ("N % 128 == 0",), 1),
        ("softmax_rows", ("M % 2 == 0",), 2),
        ("gemm_pipelined", ("M % 128 == 0", "K % 32 == 0"), 1),
    ],
)
def test_divisible_shapes_lose_their_guards(name, assume, removed):
    before = lowered(name)
    after, ctx = _passes(name, assume)
    stats = ctx.reports["eliminate_guards"]
    assert stats["removed"] == removed == stats["seen"]
    assert count_predicates(codegen_cuda(after)) == count_predicates(codegen_cuda(before)) - removed
    # Still every access proven, under the conditions the launcher checks.
    report = verify_kernel(after, (), [p.expr for p in ctx.preconditions])
    assert report.proven == report.checked


def test_needed_guards_stay():
    """Without divisibility the tail guard is necessary: nothing may be removed."""
    after, ctx = _passes("add_dynamic", ())
    assert ctx.reports["eliminate_guards"] == {"seen": 1, "removed": 0}
    assert after is lowered("add_dynamic")


def test_guard_protecting_a_planted_bug_is_kept():
    kernel = lowered("wrong_ceildiv")
    new, stats = eliminate_guards(kernel)
    report = verify_kernel(new)
    assert stats["removed"] == 0
    assert [a.buffer for a in report.violations()] == ["S"]


def test_count_predicates_ignores_comments():
    assert count_predicates("if (a) { b = c ? d : e; } // if (x)") == 2
