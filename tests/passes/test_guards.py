"""Guard elimination removes only guards the verifier proves, and the result still verifies."""

import warnings

import pytest

from tests.passes.corpus import lowered
from tlx.lowering import codegen_cuda
from tlx.passes import PassContext, Precondition, guards
from tlx.passes.assume import parse_assumption, shape_vars
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


@pytest.mark.parametrize(
    "name,assume",
    [
        ("add_dynamic", ("N % 128 == 0",)),  # guard removed, no derived precondition
        ("add_dynamic", ()),  # guard kept, a derived precondition (N <= ...)
        ("gemm_pipelined", ("M % 128 == 0", "K % 32 == 0")),
        ("softmax_rows", ()),
    ],
)
def test_guard_elimination_reuses_the_bounds_walks_proofs(monkeypatch, name, assume):
    """The bounds pass proves the guards in its own walk, under the launcher's preconditions:
    guard elimination then walks nothing, and removes what a walk of its own would."""
    kernel = lowered(name)
    ctx = PassContext(options={"verify": "warn", "assume": assume, "eliminate_guards": True})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        bounds_pass(kernel, ctx)
    own = verify_kernel(kernel, (), [p.expr for p in ctx.preconditions], prove_guards=True)
    proofs = ctx.guard_proofs
    assert proofs is not None and proofs.stats == own.guards
    assert len(proofs.proven) == len(own.proven_guards) and all(g in own.proven_guards for g in proofs.proven)

    def no_second_walk(*args, **kwargs):
        raise AssertionError("guard elimination walked the kernel again")

    monkeypatch.setattr(guards, "verify_kernel", no_second_walk)
    after = eliminate_guards_pass(kernel, ctx)
    assert ctx.reports["eliminate_guards"] == own.guards
    assert (after is kernel) == (not own.proven_guards)


def test_guard_elimination_walks_again_when_the_preconditions_changed():
    """Proofs made under other preconditions than the launcher's (here one more) are not used."""
    kernel = lowered("add_dynamic")
    ctx = PassContext(options={"verify": "warn", "assume": (), "eliminate_guards": True})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        bounds_pass(kernel, ctx)
    assert ctx.guard_proofs.stats == {"seen": 1, "removed": 0}
    fact = parse_assumption("N % 128 == 0", shape_vars(kernel.prim_func))
    ctx.preconditions.append(Precondition(fact, "N % 128 == 0", "test"))
    after = eliminate_guards_pass(kernel, ctx)
    assert ctx.reports["eliminate_guards"] == {"seen": 1, "removed": 1}
    assert after is not kernel


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
