"""Races of warp-specialized pipelines whose trip count is symbolic and whose producer stages rows
with plain stores (released by ``cp.async.mbarrier.arrive.noinc``) between named barriers: the
stage released before the rows are read is a definite race with its witness, the fixed order is not."""

import math

from kernels.attention import dense_bwd
from tests.kernels.attention import racy_dense_bwd
from tests.passes.async_corpus.pipelines import staged_rows_pipeline
from tlx.lowering import lower
from tlx.passes.races import races_report

TARGET = {"kind": "cuda", "arch": "sm_90a"}


def _races(report):
    return [r for k in report["kernels"] for r in k["races"]]


def _staged_row_race(report, buffer):
    """The one race on ``buffer``: the producer's plain store two steps after the consumer's read."""
    assert report["verdict"] == "race", report["summary"]
    found = [r for r in _races(report) if r["buffer"] == buffer]
    assert found, _races(report)
    for r in found:
        write, read = (r["first"], r["second"]) if r["first"]["write"] else (r["second"], r["first"])
        assert write["write"] and not read["write"] and not write["async"] and not read["async"]
        assert write["thread"]["tx"] < 128 <= read["thread"]["tx"]  # producer warpgroup, consumer warpgroup
        # same stage (step % 2), a later round: the producer refills what the consumer still reads
        assert write["loops"]["step"] > read["loops"]["step"] and (write["loops"]["step"] - read["loops"]["step"]) % 2 == 0
        # the producer waited for the phase the consumer's early release completed, and nothing later
        step, read_step = write["loops"]["step"], read["loops"]["step"]
        assert step == read_step + 2  # two steps ahead: a later refill waits for a release after the read
        waited = [s.split("waits on ")[1].split(" for")[0] for s in r["schedule"]
                  if s.startswith(f"thread {write['thread']}") and f"iteration {{'step': {step}}}: waits on mbarrier[" in s and f"for phase {step // 2 - 1}" in s]
        assert waited, r["schedule"]
        # ... which the consumer's release of that stage in the read's step completed before it read
        assert any(s.startswith(f"thread {read['thread']}") and f"arrives on {waited[0]} (round {read_step // 2}), before the access" in s
                   for s in r["schedule"]), r["schedule"]
    return found


def _no_race_on(report, buffer):
    assert report["verdict"] in ("race-free", "unknown"), report["summary"]
    assert not any(r["buffer"] == buffer for r in _races(report))


def _staged(release_early):
    func, configs = staged_rows_pipeline(release_early)
    return races_report(lower(func, TARGET, configs))


def test_stage_released_before_its_rows_are_read_is_a_race_with_its_witness():
    _staged_row_race(_staged(release_early=True), "r_s")


def test_stage_released_after_its_rows_are_read_is_not_a_race():
    _no_race_on(_staged(release_early=False), "r_s")


def _dv_kernel(module):
    func = module.bwd_dkdv_kernel.get_tir(256, False, 1 / math.sqrt(256) * math.log2(math.e), 1 / math.sqrt(256), "bfloat16", "dv")
    return races_report(lower(func, TARGET))


def test_old_d256_dv_kernel_races_on_lse():
    """The kernel before 023f2a5: dV wrong and different on every run on the H200."""
    _staged_row_race(_dv_kernel(racy_dense_bwd), "lse_s")


def test_shipped_d256_dv_kernel_is_proven_free_of_the_lse_race():
    """Every pair on lse_s and on the TMA stages (Q_s, dO_s) is proven ordered; what stays unknown is
    outside the pipeline (the prologue's K_s copy under a loaded condition, the epilogue's out_s
    between the consumer's named barriers)."""
    report = _dv_kernel(dense_bwd)
    _no_race_on(report, "lse_s")
    left = [u for k in report["kernels"] for u in k["unknown"]]
    assert left and not any(b in u["first"] + u["second"] for u in left for b in ("lse_s", "Q_s", "dO_s")), left


def test_indexer_pipeline_of_a_loaded_trip_count_is_proven():
    """Unknown before (a named barrier beside its mbarriers, a trip count read from memory): the
    paged indexer's TMA stage K_s (TileLang's pipeline over a page count derived from
    ``seq_lens``) is proven released before it is refilled, for every trip count. (The prefill
    kernel's pipeline is written by hand since 2026-12-04; its own mbarriers are not modelled.)"""
    from kernels.attention.indexer import indexer_paged_kernel

    report = races_report(lower(indexer_paged_kernel.get_tir(1, 128), TARGET))
    assert report["verdict"] != "race", report["summary"]
    kernel = report["kernels"][0]
    assert any("mbarrier pipeline modelled" in n for n in kernel["notes"])
    assert kernel["pairs"] >= 4 and not any("K_s" in u["first"] + u["second"] for u in kernel["unknown"]), kernel["unknown"]
