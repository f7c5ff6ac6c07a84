"""Shared-memory races: proofs of absence, planted missing barriers found with witnesses."""

import pytest

from tests.passes.layout_corpus import kernels as K
from tlx.lowering import lower
from tlx.passes import PassContext
from tlx.passes.races import RaceError, races_pass, races_report

TARGET = {"kind": "cuda", "arch": "sm_90a"}


def _lower(make):
    func, configs = make
    return lower(func, TARGET, configs)


def test_transpose_with_barrier_is_race_free():
    r = races_report(_lower(K.transpose(pad=1)))
    assert r["verdict"] == "race-free" and r["kernels"][0]["pairs"] == 2


def test_missing_barrier_is_found_with_a_real_witness():
    r = races_report(_lower(K.transpose(pad=1, sync=False)))
    assert r["verdict"] == "race"
    race = r["kernels"][0]["races"][0]
    w, rd = race["first"], race["second"]
    assert w["write"] and not rd["write"]
    assert (w["thread"]["tx"], w["thread"]["ty"]) != (rd["thread"]["tx"], rd["thread"]["ty"])
    # The transpose writes S[r*264 + ty*33 + tx] and reads S[tx*33 + r*8 + ty] (float32, 33-wide rows).
    wa = 4 * (w["loops"]["r"] * 264 + w["thread"]["ty"] * 33 + w["thread"]["tx"])
    ra = 4 * (rd["thread"]["tx"] * 33 + rd["loops"]["r"] * 8 + rd["thread"]["ty"])
    assert wa == ra == race["byte_address"]


def test_reduction_workspace_is_race_free():
    assert races_report(_lower(K.row_sum()))["verdict"] == "race-free"


def test_tma_pipeline_is_proven_through_its_mbarriers():
    r = races_report(_lower(K.gemm()))
    assert r["verdict"] == "race-free", r["summary"]
    assert not r["kernels"][0]["unmodelled_ops"]


@pytest.mark.parametrize("sync", [True, False])
def test_cp_async_pipeline(sync):
    configs = dict(K.GEMM_SIMT_COPY)
    if not sync:
        configs["tl.disable_thread_storage_sync"] = True
    func, _ = K.gemm(configs=configs)
    r = races_report(lower(func, TARGET, configs))
    if sync:
        assert r["verdict"] == "race-free", r
    else:
        assert r["verdict"] == "race"
        assert any(x["first"]["async"] or x["second"]["async"] for x in r["kernels"][0]["races"])


def test_pass_raises_under_verify_error():
    with pytest.raises(RaceError, match="shared-memory race on S"):
        races_pass(_lower(K.transpose(sync=False)), PassContext(options={"verify": "error"}))


def test_compile_time_budget_turns_leftover_pairs_unknown():
    func, configs = K.gemm(configs=K.GEMM_SIMT_COPY)
    ctx = PassContext(options={"verify": "warn", "race_budget": 1})
    races_pass(lower(func, TARGET, configs), ctx)
    r = ctx.reports["races"]
    assert r["verdict"] == "unknown" and r["races"] == 0
    assert any(u["reason"] == "kernel race-analysis budget spent" for u in r["kernels"][0]["unknown"])
