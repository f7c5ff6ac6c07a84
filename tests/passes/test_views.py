"""Accesses through a view that a program makes from an address (``T.make_tensor_from_addr``):
checked against the allocation the view points into, never against the view's own declared
shape, which bounds nothing; a pointer from an address the walk does not model is unknown."""

import pytest
import tilelang.language as T

from tests.passes.corpus.correct import TARGET
from tlx.lowering import lower
from tlx.passes.verification import verify_kernel

M = T.dynamic("M")


def rows_view(rows: int, opaque: bool = False):
    """Block ``bx`` writes ``rows`` rows of B from row ``4 * bx`` on, through a view of B."""

    @T.prim_func
    def main(A: T.Tensor((M, 64), "float32"), B: T.Tensor((M, 64), "float32")):
        with T.Kernel(T.ceildiv(M, 4), threads=64) as bx:
            addr = T.address_of(B[bx * 4, 0])
            view = T.make_tensor_from_addr(T.call_extern("handle", "(void*)", addr) if opaque else addr, (rows, 64), "float32")
            for r in T.serial(rows):
                for j in T.Parallel(64):
                    view[r, j] = A[T.min(bx * 4 + r, M - 1), j]

    return main


def _report(rows, assume, opaque=False):
    report = verify_kernel(lower(rows_view(rows, opaque), TARGET), assume).to_json()
    return report, [a for a in report["violations"] + report["unknown"] if a["buffer"] == "view"]


def test_a_view_that_stays_in_its_allocation_is_proven():
    report, view = _report(4, ("M % 4 == 0", "M <= 1048576"))
    assert report["proven"] == report["accesses"] and not view


def test_a_view_past_a_ragged_tail_is_a_violation_with_the_shape():
    """Four rows from row 4 bx: the last block of an M that is not a multiple of 4 writes past B
    (the view's own 4 x 64 shape holds every index, so checking against it would say safe)."""
    report, view = _report(4, ("M <= 1048576",))
    assert [v["detail"] for v in report["violations"]] == ["outside B, which the view points into"]
    cex = report["violations"][0]["counterexample"]
    assert cex["M"] % 4 != 0 and cex["bx"] == (cex["M"] + 3) // 4 - 1


def test_a_view_declared_longer_than_what_is_left_is_a_violation():
    report, _ = _report(8, ("M % 4 == 0", "M <= 1048576"))
    (v,) = report["violations"]
    assert v["counterexample"]["r"] >= 4 and v["counterexample"]["first byte"] >= v["counterexample"]["bytes"]


@pytest.mark.parametrize("rows", [4, 8])
def test_a_pointer_from_an_unmodelled_address_is_unknown_not_safe(rows):
    report, view = _report(rows, ("M % 4 == 0", "M <= 1048576"), opaque=True)
    assert [a["status"] for a in view] == ["unknown"] and "does not model" in view[0]["detail"]
    assert report["proven"] == report["accesses"] - 1
