"""Races through the async proxy: TMA pipelines proven race-free through their mbarriers, and
the planted pipeline bugs (tests/passes/async_corpus) each found with both accesses and a schedule."""

import types

import pytest
import tilelang.language as T
import z3

from tests.passes.async_corpus.pipelines import (BUGS, drop_block_barrier, drop_call, move_proxy_fence, rename_call, shared_histogram,
                                                 staged_then_wgmma, tile_once_pipeline, tma_pipeline, tma_store_rounds,
                                                 warpgroup_staging)
from tests.passes.layout_corpus import kernels as K
from tests.tiled_gemm import tiled_gemm
from tlx.ir.program import collect_program
from tlx.lowering import lower
from tlx.passes import PassContext
from tlx.passes.races import PASS_BUDGET, RaceError, _Pipeline, describe_race, races_pass, races_report

TARGET = {"kind": "cuda", "arch": "sm_90a"}


def _report(make):
    func, configs = make
    return races_report(lower(func, TARGET, configs))


def _races(report):
    return [r for k in report["kernels"] for r in k["races"]]


@pytest.mark.parametrize("stages", [2, 3])
def test_pipelined_tma_gemm_is_race_free(stages):
    # TileLang's own warp-specialized T.Pipelined GEMM: TMA into the stages, wgmma out of them
    r = _report((tiled_gemm(256, 256, 512, 128, 128, 64, "float16", num_stages=stages), {}))
    assert r["verdict"] == "race-free", r["summary"]
    kernel = r["kernels"][0]
    assert kernel["pairs"] >= 4 and not kernel["unmodelled_ops"]
    assert any("mbarrier pipeline modelled" in n for n in kernel["notes"])


def test_long_constant_pipeline_is_race_free_within_the_pass_budget():
    """32 steps of a 3-stage TMA GEMM (the shape of TileLang's own GEMM example): its barrier
    tables repeat with a step, which the solver gets in closed form (``k % 3``, ``k // 3``); one
    ``If`` per step ran out of the per-query budget (unknown)."""
    kernel = lower(tiled_gemm(1024, 1024, 1024, 128, 128, 32, "float16", num_stages=3), TARGET, {})
    r = races_report(kernel, budget=PASS_BUDGET)
    assert r["verdict"] == "race-free", r["summary"]


@pytest.mark.parametrize("values", [[i % 3 + 3 for i in range(32)], [i // 3 for i in range(32)], [i // 3 - 1 for i in range(31)],
                                    [2 * i for i in range(20)], [3, 4, 5, 3, 4, 5, 3], [5, 2, 9, 1], [7]])
def test_barrier_table_term_is_the_table_at_every_iteration(values):
    """The closed form of a repeating table is the same function as the table, also outside it."""
    ctx = z3.Context()
    owner = types.SimpleNamespace(enc=types.SimpleNamespace(ctx=ctx))
    k = z3.Int("k", ctx)
    term = _Pipeline._table(owner, values, k)
    for i in range(-3, len(values) + 3):
        expected = values[i] if 0 <= i < len(values) else values[-1]
        assert z3.simplify(z3.substitute(term, (k, z3.IntVal(i, ctx)))).as_long() == expected, (values, i)


@pytest.mark.parametrize("stages", [2, 3])
def test_hand_scheduled_pipeline_is_race_free(stages):
    assert _report(tma_pipeline(stages=stages))["verdict"] == "race-free"


def _tma_wgmma_races(bug):
    r = _report(tma_pipeline(bug=bug))
    assert r["verdict"] == "race", r["summary"]
    pairs = [x for x in _races(r) if {"tma_load", "wgmma"} == {x[s]["statement"].split("(")[0] for s in ("first", "second")}]
    assert pairs, f"{bug}: no race between a TMA write and a wgmma read in {_races(r)}"
    for x in pairs:
        tma, mma = (x["first"], x["second"]) if x["first"]["write"] else (x["second"], x["first"])
        assert tma["async"] and tma["write"] and not mma["write"]
        assert x["schedule"] and any("tma_load" in s for s in x["schedule"]) and any("wgmma" in s for s in x["schedule"])
    return pairs


def _sides(x):
    return (x["first"], x["second"]) if x["first"]["write"] else (x["second"], x["first"])


def test_read_before_wait_is_a_race_in_the_round_being_loaded():
    pairs = _tma_wgmma_races("read_before_wait")
    # some witness reads the very stage the producer is filling in the same round
    assert any(_sides(x)[0]["loops"]["k"] == _sides(x)[1]["loops"]["k"] for x in pairs)


def test_overwrite_before_release_is_a_race_with_a_later_round():
    pairs = _tma_wgmma_races("overwrite_before_release")
    # the producer overwrites the stage a later round (same stage: k mod 3) while it is read
    assert any(t["loops"]["k"] > m["loops"]["k"] and t["loops"]["k"] % 3 == m["loops"]["k"] % 3 for t, m in map(_sides, pairs))
    # and the producer waited on nothing before it
    assert all("waits on empty" not in s for x in pairs for s in x["schedule"])


def test_wrong_phase_bit_is_a_race_and_the_schedule_shows_the_stale_phase():
    pairs = _tma_wgmma_races("wrong_phase")
    # the consumer waits for phase round-1 of full[stage]: in round k // 3 it waits for phase k // 3 - 1
    stale = [s for x in pairs for s in x["schedule"] if "waits on full" in s]
    assert stale
    for x in pairs:
        t, m = _sides(x)
        k = m["loops"]["k"]
        assert any(f"iteration {{'k': {k}" in s and f"for phase {k // 3 - 1}" in s for s in x["schedule"]), x["schedule"]


@pytest.mark.parametrize("bug", BUGS)
def test_every_planted_bug_is_a_race_not_unknown(bug):
    r = _report(tma_pipeline(bug=bug))
    assert r["verdict"] == "race" and r["races"] >= 1 and r["exit_code"] == 1


def test_bad_bug_name_is_refused():
    with pytest.raises(ValueError, match="bug: expected None or one of"):
        tma_pipeline(bug="typo")


def test_cp_async_into_wgmma_needs_a_proxy_fence():
    # cp.async (generic proxy) fills the stages; in the loop TileLang fences the async proxy
    # after the barrier and before wgmma, but the epilogue's wgmma (after the loop's last
    # wait_group + barrier) reads the last stage with no fence.proxy.async: only those races.
    cfg = {"tl.disable_tma_lower": True, "tl.disable_warp_specialized": True}
    func, _ = K.gemm(configs=cfg)
    r = races_report(lower(func, TARGET, cfg))
    assert r["verdict"] == "race"
    for x in _races(r):
        write, read = _sides(x)
        assert write["statement"].startswith("ptx_cp_async") and read["statement"].startswith("wgmma")
        assert "k" not in read["loops"], "a wgmma inside the pipelined loop is fenced"


def _unknown_reasons(report):
    return " ".join(u["reason"] for k in report["kernels"] for u in k["unknown"])


def test_wrong_arrival_count_is_unknown_not_safe():
    # full initialised for 1 arrival while 128 producer threads arrive: phases are miscounted
    r = _report(tma_pipeline(full_count=1))
    assert r["verdict"] == "unknown" and "do not match its count 1" in _unknown_reasons(r)


def test_pipeline_over_a_symbolic_loop_is_race_free_for_every_trip_count():
    # not tabulated: barrier index k % 3 and the parities proven periodic in k by Z3, rounds k // 3
    r = _report(tma_pipeline(K=T.dynamic("K")))
    assert r["verdict"] == "race-free", r["summary"]
    assert any("mbarrier pipeline modelled" in n for k in r["kernels"] for n in k["notes"])


@pytest.mark.parametrize("bug", BUGS)
def test_planted_bugs_over_a_symbolic_loop_are_races(bug):
    r = _report(tma_pipeline(K=T.dynamic("K"), bug=bug))
    assert r["verdict"] == "race" and r["exit_code"] == 1, r["summary"]


def test_barrier_index_without_a_period_is_unknown_not_safe():
    # the consumer waits on a barrier index that drifts (k % 3 + k // 7): no period, so not modelled
    func, configs = tma_pipeline(K=T.dynamic("K"))
    kernel = lower(func, TARGET, configs)
    prog = collect_program(kernel)[0]
    k = next(s.loops[0][0] for s in prog.syncs if s.kind == "wait")
    for s in prog.syncs:
        if s.kind == "wait":
            s.index = s.index + k // 7  # drifts: a new barrier every 7 steps
    r = races_report(kernel, [prog])
    assert r["verdict"] == "unknown" and "no period" in _unknown_reasons(r)


def test_wgmma_reads_span_one_stage_of_each_operand():
    # 128x64 fp16 tiles with 128-byte swizzle: A is read as two m64 halves of 8 KiB, B (K-major,
    # n128) as one 16 KiB span per instruction; every span starts inside stage k % 3
    func, configs = tma_pipeline()
    prog = collect_program(lower(func, TARGET, configs))[0]
    spans = {(a.buffer, a.width) for a in prog.accesses if a.op == "wgmma"}
    assert spans == {("A_s", 8192), ("B_s", 16384)}
    tma = {(a.buffer, a.width) for a in prog.accesses if a.op == "tma_load"}
    assert tma == {("A_s", 16384), ("B_s", 16384)}


def test_compile_pass_raises_on_a_planted_pipeline_bug_with_its_schedule():
    func, configs = tma_pipeline(bug="overwrite_before_release")
    with pytest.raises(RaceError, match=r"shared-memory race on [AB]_s .*schedule: .*tma_load"):
        races_pass(lower(func, TARGET, configs), PassContext(options={"verify": "error"}))


def _unknowns(report):
    return [u for k in report["kernels"] for u in k["unknown"]]


@pytest.fixture(scope="module")
def histograms():
    """The shared-atomics histogram lowered once per bin source: ``tx % 16``, or ``ids[tx]``."""
    return {src: lower(shared_histogram(from_input=src == "input")[0], TARGET) for src in ("thread", "input")}


def test_shared_atomics_between_barriers_are_race_free(histograms):
    for kernel in histograms.values():
        r = races_report(kernel)
        assert r["verdict"] == "race-free", r["summary"]
        assert not r["kernels"][0]["unmodelled_ops"]  # atomics were "not modelled" (unknown) before


@pytest.mark.parametrize("barrier,plain", [(0, "hist[tx] = 0"), (1, "hist[tx]")])
def test_missing_barrier_next_to_atomics_is_a_race_but_atomics_never_race_each_other(histograms, barrier, plain):
    # barrier 0 orders the clearing stores before the atomics, barrier 1 the atomics before the reads
    r = races_report(drop_block_barrier(histograms["thread"], barrier))
    assert r["verdict"] == "race", r["summary"]
    for x in _races(r):
        sides = {x["first"]["statement"], x["second"]["statement"]}
        assert plain in sides and any(t.startswith("atomic_add_elem_op") for t in sides), sides
        assert x["first"]["thread"] != x["second"]["thread"]


def test_race_that_needs_values_read_from_memory_is_unknown_not_a_race(histograms):
    """With the bin read from ``ids`` the witness picks an input value: data-dependent, unknown."""
    r = races_report(drop_block_barrier(histograms["input"], 1))
    assert r["verdict"] == "unknown" and not _races(r)
    assert [u for u in _unknowns(r) if u.get("data_dependent") and "hist[tx]" in (u["first"], u["second"])]


def test_reader_proxy_fence_in_an_earlier_epoch_orders_generic_writes_before_wgmma():
    func, configs = staged_then_wgmma()
    kernel = lower(func, TARGET, configs)
    assert races_report(kernel)["verdict"] == "race-free"  # TileLang's fence: by the writers, before the barrier
    # the fence moved after the barrier (each reader fences, then a barrier, then its wgmma)
    assert races_report(move_proxy_fence(kernel, "reader"))["verdict"] == "race-free"
    # no fence at all: the plain stores race with the wgmma reads
    r = races_report(move_proxy_fence(kernel, "none"))
    assert r["verdict"] == "race"
    for x in _races(r):
        write, read = _sides(x)
        assert not write["async"] and read["statement"].startswith("wgmma") and read["async"]
        assert "fence.proxy.async" in describe_race(x)


def test_race_budget_counts_each_query_once():
    """Z3's rlimit count is the context's running total: the budget must add each query's own
    share (at most the context's total), or a kernel of a few hundred pairs spends any budget
    after a dozen of them."""
    import z3

    from tlx.passes.races import find_races
    from tlx.passes.smt import kernel_encoder

    func, configs = tma_pipeline()
    kernel = lower(func, TARGET, configs)
    enc = kernel_encoder(kernel)
    reports = [find_races(enc, p) for p in collect_program(kernel)]
    assert sum(r["pairs"] for r in reports) >= 4 and enc.queries >= 10
    context_total = z3.Solver(ctx=enc.ctx).statistics().get_key_value("rlimit count")
    assert 0 < enc.rlimit_used <= context_total


def _tma_store_kernel():
    func, configs = tma_store_rounds()
    return lower(func, TARGET, configs)


def test_tma_store_rounds_are_race_free():
    """Writes, barrier, then in the elected thread fence + TMA store + tma_store_wait(0); the next
    round's writes after a barrier: the store's read of the tile is ordered on both sides."""
    r = races_report(_tma_store_kernel())
    assert r["verdict"] == "race-free", r["summary"]
    kernel = r["kernels"][0]
    assert not kernel["unmodelled_ops"] and kernel["pairs"] >= 2  # the writes against each other and against the store


@pytest.mark.parametrize("planted, race_with", [
    ("tl.tma_store_wait", "the next round's writes overwrite the tile while the store may still read it"),
    ("tl.fence_proxy_async", "the generic writes are not made visible to the async proxy"),
])
def test_tma_store_without_its_wait_or_fence_is_a_race(planted, race_with):
    r = races_report(drop_call(_tma_store_kernel(), planted))
    assert r["verdict"] == "race", f"{planted}: {race_with}; got {r['summary']}"
    pairs = [x for x in _races(r) if "tma_store" in (x["first"]["statement"] + x["second"]["statement"])]
    assert pairs, _races(r)
    for x in pairs:
        store, write = (x["first"], x["second"]) if "tma_store" in x["first"]["statement"] else (x["second"], x["first"])
        assert store["async"] and not store["write"] and write["write"]


def test_tma_store_without_the_barrier_after_the_writes_is_a_race():
    kernel = _tma_store_kernel()
    r = races_report(drop_block_barrier(kernel, 1))  # the barrier between a round's writes and its store
    assert r["verdict"] == "race", r["summary"]
    assert any("tma_store" in (x["first"]["statement"] + x["second"]["statement"]) for x in _races(r))


def _tile_once(wait_at):
    func, configs = tile_once_pipeline(wait_at)
    return lower(func, TARGET, configs)


def test_wait_in_the_first_iteration_orders_every_later_read_and_the_overwrite_after_the_loop():
    """``if k == 0: wait(ready)``: the reads of later iterations and the consumers' overwrite after
    the loop (behind warpgroup_wait(0) and the consumer group's named barrier) are ordered."""
    r = races_report(_tile_once(0))
    assert r["verdict"] == "race-free", r["summary"]


def test_wait_in_a_later_iteration_leaves_the_first_reads_racing():
    r = races_report(_tile_once(1))
    assert r["verdict"] == "race", r["summary"]
    pairs = [x for x in _races(r) if {"tma_load", "wgmma"} == {x[s]["statement"].split("(")[0] for s in ("first", "second")}]
    assert pairs and all(x[s]["loops"].get("k") == 0 for x in pairs for s in ("first", "second") if x[s]["statement"].startswith("wgmma"))


def test_overwrite_without_the_consumer_named_barrier_is_a_race():
    """Without ``bar.sync 3, 128`` a consumer thread may overwrite A_s while another's wgmma reads it."""
    r = races_report(drop_call(_tile_once(0), "tirx.tvm_storage_sync", nargs=3))
    assert r["verdict"] == "race", r["summary"]
    assert any("wgmma" in x["first"]["statement"] + x["second"]["statement"] for x in _races(r))


def test_wait_wgmma_is_the_warpgroup_wait():
    """``T.wait_wgmma(0)`` lowers to ``tl.wait_wgmma``: the same wait as ``warpgroup_wait(0)``, so
    the verdict stays race-free; without it the overwrite is not proven ordered after the wgmma
    reads (the named barrier alone does not end them), under either spelling."""
    plain = _tile_once(0)
    kernel = rename_call(plain, "tl.warpgroup_wait", "tl.wait_wgmma")
    assert races_report(kernel)["verdict"] == "race-free"
    dropped = races_report(drop_call(kernel, "tl.wait_wgmma"))
    assert dropped["verdict"] != "race-free"
    assert dropped["summary"] == races_report(drop_call(plain, "tl.warpgroup_wait"))["summary"]


@pytest.mark.parametrize("buffers, across, verdict", [(2, False, "race-free"), (1, False, "race"), (2, True, "race")])
def test_named_barrier_per_warpgroup_in_a_loop(buffers, across, verdict):
    """``bar.sync 2 + tx / 128, 128`` in the step loop: one barrier per warpgroup, its instances
    paired by step. Double-buffered staging read inside the warpgroup is ordered (step t's reads
    before step t + 2's writes); one buffer races the next step's writes, and a read of another
    warpgroup's values is not ordered by either group's barrier."""
    r = _report(warpgroup_staging(buffers, across))
    assert r["verdict"] == verdict, r["summary"]
    if verdict == "race":
        loops = [(x["first"]["loops"]["t"], x["second"]["loops"]["t"]) for x in _races(r)]
        assert loops and (across or all(abs(a - b) == 1 for a, b in loops)), loops
