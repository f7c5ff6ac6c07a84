"""The project's kernels in ``kernels/``: once the derived preconditions hold, nothing is refuted
for every input; what remains needs particular input data (unknown, data-dependent) or
values the verifier does not track or calls it does not model (unknown)."""

import functools

import pytest

from tests.passes.corpus import lower_jit
from tests.passes.corpus.team import TEAM
from tlx.passes.preconditions import derive_preconditions
from tlx.passes.verification import verify_kernel

# The grouped GEMMs take ~10 s each to lower here; bench/verify_cost.py covers them.
FAST = [e for e in TEAM if "grouped_gemm" not in e[0]]


@functools.cache
def _final(name):
    _, fn, params, assume = next(e for e in TEAM if e[0] == name)
    kernel = lower_jit(fn, **params)
    report = verify_kernel(kernel, assume)
    if report.violations() or report.unknowns():
        return derive_preconditions(kernel, report, assume)
    return [], report


@pytest.mark.parametrize("name", [e[0] for e in FAST])
def test_no_refuted_access(name):
    pre, final = _final(name)
    assert final.checked > 0
    assert not final.violations(), [a.detail for a in final.violations()]
    for a in final.unknowns():
        assert a.data_dependent or any(w in a.detail for w in ("does not track", "may overflow", "does not model")), a.detail


@pytest.mark.parametrize("name", [e[0] for e in FAST if e[0].startswith("quant.") or e[0] == "moe.combine"])
def test_fully_proven(name):
    _, final = _final(name)
    assert final.proven == final.checked
