"""Vector legality: aligned vectors proven, a misaligned one found, missed vectorization reported."""

import pytest
from tilelang import tvm

from tests.passes.layout_corpus import kernels as K
from tlx.lowering import codegen_cuda, lower
from tlx.passes import PassContext
from tlx.passes.vectors import VectorError, vectors_pass, vectors_report

TARGET = {"kind": "cuda", "arch": "sm_90a"}
tir = tvm.tirx


def _lower(make):
    func, configs = make
    return lower(func, TARGET, configs)


@pytest.fixture(scope="module")
def aligned_copy():
    return _lower(K.shifted_vector_copy(shift=4))


def test_tilelang_vectors_are_proven_aligned(aligned_copy):
    for kernel in (aligned_copy, _lower(K.scale_add())):
        r = vectors_report(kernel)
        assert r["checked"] >= 2 and r["misaligned"] == 0 and r["unknown"] == 0
        assert all(e["verdict"] == "legal" and e["contiguous"] for e in r["vectors"])


def _shift_loads(kernel, buffer_name: str, by: int):
    """Planted bug: move every vector load of ``buffer_name`` by ``by`` elements (a wrong offset)."""

    def rewrite(node):
        if isinstance(node, tir.BufferLoad) and node.buffer.name == buffer_name and isinstance(node.indices[0], tir.Ramp):
            r = node.indices[0]
            return tir.BufferLoad(node.buffer, [tir.Ramp(r.base + by, r.stride, r.lanes)])
        return None

    mod = tvm.IRModule({gv: f.with_body(tir.stmt_functor.ir_transform(f.body, None, rewrite, ["tirx.BufferLoad"])) for gv, f in kernel.device_mod.functions.items()})
    return kernel.with_device_mod(mod)


def test_misaligned_vector_load_has_a_counterexample(aligned_copy):
    bad = _shift_loads(aligned_copy, "A", -3)
    r = vectors_report(bad)
    wrong = [e for e in r["vectors"] if e["verdict"] == "misaligned"]
    assert len(wrong) == 1 and wrong[0]["buffer"] == "A"
    cex = wrong[0]["counterexample"]
    # the load starts at element bx*512 + tx*16 + i*4 + 1: never a multiple of 4 elements
    assert cex["byte_offset"] == 4 * (cex["bx"] * 512 + cex["tx"] * 16 + cex["i"] * 4 + 1)
    assert cex["byte_offset"] % 16 != 0
    with pytest.raises(VectorError, match="misaligned 16-byte vector"):
        vectors_pass(bad, PassContext(options={"verify": "error"}))


def test_missed_vectorization_of_a_serialised_loop():
    r = vectors_report(_lower(K.shifted_vector_copy(shift=1)))
    assert r["checked"] == 0  # TileLang fell back to scalar code
    missed = {m["buffer"]: m for m in r["missed"]}
    assert missed["B"]["could_be_lanes"] == 4  # the store is aligned and contiguous
    assert "A" not in missed  # the load is contiguous but starts one element off


def test_select_per_vector_in_a_loop_is_reported_as_a_branch():
    """TileLang emits a vector ``if_then_else`` on a scalar condition as an if/else per vector
    (the CUDA shows it); tested once per step instead, the per-value test stays only on the
    path of a partial block, and is reported as conditional."""
    per_vector = _lower(K.masked_row_scale(branch_per_step=False))
    r = vectors_report(per_vector)
    assert [(b["loop"], b["conditional"], b["lanes"]) for b in r["branches"]] == [("s", False, 4)]
    cuda = codegen_cuda(per_vector)  # the branch the report stands for: the select's value set in an if/else
    assert "uint2 condval;" in cuda and "< L[0])) {" in cuda
    assert "1 branching selects (0 on a conditional path)" in r["summary"][0]
    assert any("a branch per 4-wide vector in loop s" in line for line in r["summary"][1:])
    hoisted = vectors_report(_lower(K.masked_row_scale(branch_per_step=True)))
    assert [(b["loop"], b["conditional"]) for b in hoisted["branches"]] == [("s", True)]
    assert not any("a branch per" in line for line in hoisted["summary"][1:])


def test_selects_of_plain_loads_and_outside_loops_are_not_reported():
    """TileLang's own bound guards select a plain load (nothing computed in the arms), and a
    select in straight-line code runs once: neither is reported."""
    for make in (K.scale_add(), K.shifted_vector_copy(shift=4), K.row_sum()):
        assert vectors_report(_lower(make))["branches"] == []


def _strided_rows_under_assume():
    """Rows of a ``StridedTensor`` X (row stride ``S``) copied as 16-byte vectors, which TileLang
    emits only under the program's ``T.assume(S % 4 == 0)`` (as DeepSeek's TileKernels transpose
    does); the launcher checks that assumption."""
    from tilelang import language as T

    S = T.dynamic("S")

    @T.prim_func
    def main(X: T.StridedTensor((64, 64), (S, 1), "float32"), Y: T.Tensor((64, 64), "float32")):
        with T.Kernel(8, threads=128) as bx:
            T.assume(S % 4 == 0)
            for i, j in T.Parallel(8, 16):
                for v in T.vectorized(4):
                    Y[bx * 8 + i, j * 4 + v] = X[bx * 8 + i, j * 4 + v]

    return lower(main, TARGET, {})


def test_the_programs_checked_assumptions_make_a_strided_vector_aligned():
    """With the launcher-checked ``T.assume`` as a fact (a stride multiple substituted, which Z3
    proves where the modulus constraint over a product leaves it unknown), X's vector loads are
    proven aligned; without it, an odd stride misaligns them (before: every TileKernels kernel
    vectorized this way was reported misaligned)."""
    from tlx.ir.program import collect_program
    from tlx.passes.smt import kernel_encoder
    from tlx.passes.vectors import check_vector

    kernel = _strided_rows_under_assume()
    r = vectors_report(kernel)
    loads = [e for e in r["vectors"] if e["buffer"] == "X"]
    assert loads and all(e["verdict"] == "legal" for e in loads), r["vectors"]
    enc = kernel_encoder(kernel)
    [prog] = collect_program(kernel)
    bare = [check_vector(enc, prog, a) for a in prog.accesses if a.buffer == "X" and isinstance(a.index, tir.Ramp)]
    assert bare and all(e["verdict"] == "misaligned" for e in bare)
