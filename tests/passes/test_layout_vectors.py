"""Vector legality: aligned vectors proven, a misaligned one found, missed vectorization reported."""

import pytest
from tilelang import tvm

from tests.passes.layout_corpus import kernels as K
from tlx.lowering import lower
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
