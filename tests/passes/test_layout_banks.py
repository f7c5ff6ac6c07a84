"""Bank-conflict degrees: exact per instruction, with lanes and addresses as witness."""

import pytest

from tests.passes.layout_corpus import kernels as K
from tlx.lowering import lower
from tlx.passes import PassContext
from tlx.passes.banks import banks_pass, banks_report

TARGET = {"kind": "cuda", "arch": "sm_90a"}


@pytest.fixture(scope="module")
def reports():
    out = {}
    for name, (func, configs) in {
        "transpose_padded": K.transpose(pad=1),
        "transpose_unpadded": K.transpose(pad=0),
        "gemm_cp_async": K.gemm(configs=K.GEMM_SIMT_COPY),
    }.items():
        out[name] = banks_report(lower(func, TARGET, configs))
    return out


def test_padded_transpose_is_conflict_free(reports):
    r = reports["transpose_padded"]
    assert r["checked"] == 2 and r["unknown"] == 0
    assert [e["degree"] for e in r["accesses"]] == [1, 1]
    assert all(e["status"] == "proven" for e in r["accesses"])


def test_removed_padding_column_gives_32_way_conflicts_with_witness(reports):
    r = reports["transpose_unpadded"]
    load = next(e for e in r["accesses"] if e["op"] == "load")
    store = next(e for e in r["accesses"] if e["op"] == "store")
    assert store["degree"] == 1
    assert load["degree"] == 32 and load["status"] == "proven"
    w = load["witness"]
    assert len(w["lanes"]) == 32 == len(set(w["lanes"]))
    words = [a // 4 for a in w["byte_addresses"]]
    assert len(set(words)) == 32  # distinct words ...
    assert {x % 32 for x in words} == {w["bank"]}  # ... all in the witness bank


def test_swizzled_ldmatrix_of_gemm_is_conflict_free(reports):
    r = reports["gemm_cp_async"]
    ld = [e for e in r["accesses"] if e["op"] == "ptx_ldmatrix"]
    assert len(ld) == 4
    for e in ld:
        assert e["degree"] == 1 and e["status"] == "proven" and e["lanes_per_phase"] == 8


def test_pass_writes_bank_conflicts_report():
    func, configs = K.transpose(pad=0)
    ctx = PassContext(options={"verify": "warn"})
    banks_pass(lower(func, TARGET, configs), ctx)
    assert ctx.reports["bank_conflicts"]["max_degree"] == 32


def test_exact_totals_match_the_degree_times_executions():
    from tlx.passes.banks import predict_ncu

    func, configs = K.NCU_CASES["transpose_unpadded"]()
    # 64 blocks x 8 warps x 4 iterations, each load 32-way (31 extra phases); stores conflict-free
    assert predict_ncu(lower(func, TARGET, configs)) == {"ld": 64 * 8 * 4 * 31, "st": 0}
    func, configs = K.NCU_CASES["strided_8B_s2"]()
    # 8-byte lanes at stride 16 B: 2-way in each of the two half-warp phases, for 4 blocks
    assert predict_ncu(lower(func, TARGET, configs)) == {"ld": 4 * 2, "st": 4 * 2}
