"""A program's ``T.assume`` that the launcher cannot check (it names a block index or a loaded
value) is named, with the names that keep it on the device; one over parameters is the
launcher's check and is not."""

import warnings

import pytest
import tilelang.language as T

from tests.passes.corpus.correct import TARGET
from tlx.lowering import lower
from tlx.passes import PassContext
from tlx.passes.pipeline import run_passes
from tlx.passes.unchecked_assumes import unchecked_assumes

M = T.dynamic("M")


def rows(assumes: tuple[str, ...]):
    """Copy A to B in tiles of 32 under the chosen assumptions: over the parameter M, over the
    block index, over a value loaded from L."""

    @T.prim_func
    def main(A: T.Tensor((M,), "float32"), B: T.Tensor((M,), "float32"), L: T.Tensor((4,), "int32")):
        with T.Kernel(T.ceildiv(M, 32), threads=32) as bx:
            if "param" in assumes:
                T.assume(M % 32 == 0)
            if "block" in assumes:
                T.assume(bx < 100)
            n = L[0]
            if "loaded" in assumes:
                T.assume(n <= M)
            for i in T.Parallel(32):
                B[bx * 32 + i] = A[bx * 32 + i]

    return main


def test_assumes_off_the_parameters_are_named():
    kernel = lower(rows(("param", "block", "loaded")), TARGET)
    assert unchecked_assumes(kernel) == [{"condition": "bx < 100", "names": ["bx"]},
                                         {"condition": "n <= M", "names": ["n"]}]
    assert "Assume: M % 32 == 0" in kernel.host_mod.script()  # the parameter one: a host assert


@pytest.mark.parametrize("assumes", [(), ("param",)])
def test_none_without_them(assumes):
    assert unchecked_assumes(lower(rows(assumes), TARGET)) == []


def test_the_compile_warns_and_reports():
    ctx = PassContext(options={"skip_passes": ("bounds", "eliminate_guards")})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run_passes(lower(rows(("block",)), TARGET), ctx)
    said = [str(w.message) for w in caught if "checked nowhere" in str(w.message)]
    assert said == ["main: T.assume(bx < 100) is checked nowhere: it names bx, so TileLang keeps it on the device (it "
                    "hoists to the launcher only conditions over the kernel's parameters) and may simplify the code "
                    "with it; tlx's proofs do not use it"]
    assert ctx.reports["unchecked_assumes"] == [{"condition": "bx < 100", "names": ["bx"]}]


def test_tlx_check_names_them():
    from tlx.passes.check import check_kernel

    kernel = lower(rows(("param", "loaded")), TARGET)
    result = check_kernel(kernel, {})
    result.add_section("unchecked_assumes", unchecked_assumes(kernel))
    assert "unchecked: T.assume(n <= M) names n: the launcher cannot check it and the proofs do not use it" in result.human()
    assert "M % 32" not in result.human()
