"""Static determinism / batch-invariance analysis on planted and clean kernels, and the
invariance harness's own logic on CPU functions."""

import pytest
import torch

from tests.numerics import determinism_kernels as D
from tlx.compiler import compile_artifacts
from tlx.options import Options
from tlx.numerics.invariance import check_batch_invariance, check_determinism


@pytest.fixture(scope="module")
def reports():
    cache = {}

    def get(name):
        if name not in cache:
            _, build = compile_artifacts(getattr(D, name)(), Options.make(target={"kind": "cuda", "arch": "sm_90a"}, verify="off"), stop_after="passes")
            cache[name] = build.reports["determinism"]
        return cache[name]

    return get


@pytest.mark.parametrize("name", ["gemm", "elementwise", "row_sum"])
def test_clean_kernels_are_not_flagged(reports, name):
    r = reports(name)
    assert r["findings"] == [] and r["unresolved"] == []
    assert r["deterministic"] is True and r["batch_invariant"] is True


def test_planted_fp_atomic_is_flagged(reports):
    r = reports("atomic_total")
    kinds = {(f["kind"], f["buffer"]) for f in r["findings"]}
    assert ("fp_atomic", "total") in kinds and ("split_k", "total") in kinds
    assert r["deterministic"] is False and r["batch_invariant"] is False


def test_planted_split_k_gemm_is_flagged(reports):
    r = reports("split_k_gemm")
    split = [f for f in r["findings"] if f["kind"] == "split_k"]
    assert split and split[0]["buffer"] == "C" and split[0]["blocks"] == ["blockIdx.z"]
    assert any(f["kind"] == "fp_atomic" for f in r["findings"])
    assert r["deterministic"] is False


def test_planted_racy_split_k_is_flagged(reports):
    r = reports("split_k_racy")
    assert [(f["kind"], f["buffer"], f["blocks"]) for f in r["findings"]] == [("split_k", "y", ["blockIdx.y"])]
    assert "without atomics" in r["findings"][0]["detail"]
    assert r["deterministic"] is False


def test_planted_split_k_with_the_block_only_in_a_condition_is_flagged(reports):
    """A block index that only selects a branch of the index does not tell the blocks' elements
    apart (it once hid a cross-block read-modify-write from the analysis)."""
    r = reports("split_k_block_in_condition")
    assert ("split_k", "y", ["blockIdx.y"]) in [(f["kind"], f.get("buffer"), f.get("blocks")) for f in r["findings"]]
    assert r["deterministic"] is False


def test_planted_split_k_folded_by_its_index_is_flagged_by_the_solver(reports):
    """The index uses the split's block arithmetically, so only the solver's question (can two
    blocks reach one element?) tells that every split lands on the same elements."""
    r = reports("split_k_block_folded")
    flagged = [(f["kind"], f.get("buffer"), f.get("blocks")) for f in r["findings"]]
    assert ("split_k", "y", ["blockIdx.y"]) in flagged, flagged
    assert any("two of them can reach one element" in f["detail"] for f in r["findings"])
    assert r["deterministic"] is False


def test_per_block_partials_are_not_flagged(reports):
    r = reports("split_partials_per_block")
    assert [f for f in r["findings"] if f["kind"] == "split_k"] == []
    assert r["deterministic"] is True, r["unresolved"]


def test_planted_batch_dependent_split_is_flagged(reports):
    r = reports("batch_split_row_sum")
    flagged = {f["loop"]: f["vars"] for f in r["findings"] if f["kind"] == "batch_dependent_order"}
    assert flagged == {"k": ["M"], "kk": ["M"]}
    assert r["batch_invariant"] is False
    assert r["deterministic"] is True  # same bits run to run, only batch-dependent



def test_a_shape_reaching_a_branch_through_a_variable_is_unknown(reports):
    """A branch on a thread variable set from M: the analysis follows the variable (it read the
    variable's load as a value of no shape, and said batch invariant: unsound) and leaves the
    branch unresolved."""
    r = reports("variable_split_row_sum")
    assert r["batch_invariant"] == "unknown", r
    assert any("depends on ['M'] through a local variable" in u for u in r["unresolved"]), r["unresolved"]


def test_a_variable_behind_a_bounds_guard_or_an_index_clamp_keeps_the_verdict():
    """Through a variable, a bounds guard on M and an index clamped to M are not dependences on M
    (as for a branch written out); a length read from memory and clamped to K is one through the
    data: unresolved, with the clamp named."""
    target = Options.make(target={"kind": "cuda", "arch": "sm_90a"}, verify="off")
    clean = compile_artifacts(D.guarded_variable_row_scale(False), target, stop_after="passes")[1].reports["determinism"]
    assert (clean["batch_invariant"], clean["unresolved"]) == (True, []), clean
    clamp = compile_artifacts(D.guarded_variable_row_scale(True), target, stop_after="passes")[1].reports["determinism"]
    assert clamp["batch_invariant"] == "unknown" and clamp["findings"] == []
    assert any("['K'] through a local variable, only where a value read from memory is clamped" in u
               for u in clamp["unresolved"]), clamp["unresolved"]

def test_extent_clamped_to_a_shape_through_loaded_values_is_unknown():
    """An offset read from memory and clamped to M (dense attention's sequence offsets) makes M
    reach the loop extent only through the data: not a finding, an unresolved item (unknown)."""
    target = Options.make(target={"kind": "cuda", "arch": "sm_90a"}, verify="off")
    clamped = compile_artifacts(D.ragged_row_sum(True), target, stop_after="passes")[1].reports["determinism"]
    assert clamped["findings"] == [] and clamped["batch_invariant"] == "unknown"
    assert any("only where a value read from memory is clamped to it" in u and "['M']" in u for u in clamped["unresolved"])
    scaled = compile_artifacts(D.ragged_row_sum(False), target, stop_after="passes")[1].reports["determinism"]
    assert [(f["loop"], f["vars"]) for f in scaled["findings"]] == [("k", ["M"])] and scaled["batch_invariant"] is False


def test_branch_on_a_shape_around_synchronization_only_keeps_the_verdict():
    """A branch on a shape variable whose body only waits on or arrives at barriers moves no
    data (the indexer's first stage wait, skipped when a CTA has no key tile); around a store it
    is unresolved."""
    target = Options.make(target={"kind": "cuda", "arch": "sm_90a"}, verify="off")
    sync = compile_artifacts(D.shape_branch(True), target, stop_after="passes")[1].reports["determinism"]
    assert sync["findings"] == [] and sync["unresolved"] == [] and sync["batch_invariant"] is True
    store = compile_artifacts(D.shape_branch(False), target, stop_after="passes")[1].reports["determinism"]
    assert store["batch_invariant"] == "unknown"
    assert any("branch on ['K'] that is not a bounds guard" in u for u in store["unresolved"])


def test_harness_finds_a_batch_dependent_function():
    def fn(x):  # rows of a batch of 4 or more are summed in the other order
        return x.flip(1).sum(1) if x.shape[0] >= 4 else x.sum(1)

    gen = torch.Generator().manual_seed(0)
    make = lambda n: (torch.randn(n, 1000, generator=gen, dtype=torch.float32),)  # noqa: E731
    r = check_batch_invariance(fn, make, range(1, 7))
    assert not r["ok"]
    assert {m["batch"] for m in r["mismatches"]} <= {4, 5, 6} and r["rows_differing"] > 0
    assert "differ" in r["mismatches"][0]["difference"]
    assert check_batch_invariance(lambda x: x.sum(1), make, range(1, 7))["ok"]


def test_harness_keeps_unbatched_inputs_whole():
    w = torch.randn(8, 3)
    r = check_batch_invariance(lambda x, w: x @ w, lambda n: (torch.randn(n, 8), w), [1, 2, 5])
    assert r["ok"] and r["rows_checked"] == 1 + 2 + 5


def test_harness_finds_a_nondeterministic_function():
    calls = {"n": 0}

    def fn(x):
        calls["n"] += 1
        return x * 2 if calls["n"] % 7 else x * 2 + 1

    r = check_determinism(fn, (torch.ones(16),), runs=20)
    assert not r["ok"] and r["runs_differing"] == 2 and r["mismatches"][0]["run"] == 6
    assert check_determinism(lambda x: x * 2, (torch.ones(16),), runs=5)["ok"]


def test_harness_rejects_bad_arguments():
    with pytest.raises(ValueError, match="batch_sizes: expected positive integers"):
        check_batch_invariance(lambda x: x, lambda n: (torch.ones(n),), [0, 2])
    with pytest.raises(ValueError, match="runs: expected at least 2, got 1"):
        check_determinism(lambda x: x, (torch.ones(1),), runs=1)


# (module, factory, parameters) of kernels in kernels/: none may be flagged.
REPO_KERNELS = {
    "moe.gating": ("kernels.moe.gating", "gating_kernel", (256, 6, "sqrtsoftplus")),
    "moe.grouped_gemm": ("kernels.moe.grouped_gemm", "grouped_gemm_contiguous_kernel", (2048, 4096)),
    "moe.metadata": ("kernels.moe.metadata", "metadata_kernel", (6, 256)),
    "moe.combine": ("kernels.moe.permute", "combine_kernel", (4096, 6)),
    "quant.group_cast": ("kernels.quant.group_cast", "group_cast_kernel", (4096, 128, "plain", "bfloat16")),
    "quant.dequant": ("kernels.quant.dequant", "dequant_kernel", (4096, "e4m3", 128, 128, "bfloat16")),
}


@pytest.mark.parametrize("name", sorted(REPO_KERNELS))
def test_no_false_flags_on_repo_kernels(name):
    import importlib

    from tlx.lowering import lower
    from tlx.numerics.determinism import analyze

    module, factory, params = REPO_KERNELS[name]
    prim = getattr(importlib.import_module(module), factory).get_tir(*params)
    r = analyze(lower(prim, {"kind": "cuda", "arch": "sm_90a"}))
    assert r["findings"] == [] and r["deterministic"] is True, r


def test_declared_pure_helper_counts_as_arithmetic():
    import tilelang.language as T

    from tlx.lowering import lower
    from tlx.numerics import determinism

    n = T.dynamic("n")

    @T.prim_func
    def scale(x: T.Tensor((n,), "float32"), y: T.Tensor((n,), "float32")):
        with T.Kernel(T.ceildiv(n, 128), threads=128) as bx:
            for i in T.Parallel(128):
                if bx * 128 + i < n:
                    y[bx * 128 + i] = T.call_extern("float32", "test_only_twice", x[bx * 128 + i])

    kernel = lower(scale, {"kind": "cuda", "arch": "sm_90a"})
    before = determinism.analyze(kernel)
    assert before["deterministic"] == "unknown" and "test_only_twice" in before["unresolved"][0]
    determinism.declare_pure("test_only_twice")
    after = determinism.analyze(kernel)
    assert after["deterministic"] is True and after["batch_invariant"] is True and after["unresolved"] == []


def _flag_kernel(record_outside_failure: bool, float_flag: bool = False):
    """One thread waits on a flag (recording a failure where the wait returned 0, or, planted,
    wherever), then copies a row and raises a counter: the synchronization of MegaMoE's kernels
    in miniature, through helpers whose names only these tests declare."""
    import tilelang.language as T

    from tlx.lowering import lower

    n = T.dynamic("n")

    @T.prim_func
    def copy_after_flag(flags: T.Tensor((4,), "int32"), x: T.Tensor((n,), "float32"), y: T.Tensor((n,), "float32")):
        with T.Kernel(T.ceildiv(n, 128), threads=128) as bx:
            if T.get_thread_binding() == 0:
                if T.call_extern("int32", "test_only_wait", T.address_of(flags[0]), 1) == 0:
                    T.evaluate(T.call_extern("handle", "test_only_record", T.address_of(flags[1]), 7))
                if record_outside_failure:
                    T.evaluate(T.call_extern("handle", "test_only_record", T.address_of(flags[1]), 8))
            T.evaluate(T.call_extern("handle", "test_only_fence"))
            for i in T.Parallel(128):
                if bx * 128 + i < n:
                    y[bx * 128 + i] = x[bx * 128 + i]
            if T.get_thread_binding() == 0:
                T.evaluate(T.call_extern("handle", "test_only_add", T.address_of(flags[2]),
                                         T.float32(1) if float_flag else 1))

    return lower(copy_after_flag, {"kind": "cuda", "arch": "sm_90a"})


def test_declared_sync_helpers_give_a_verdict_under_the_wait_assumption():
    """Undeclared, the flag helpers leave the verdict unknown; declared by effect, the kernel is
    deterministic and batch-invariant under the stated wait assumption, and ``tlx check`` says
    so. A failure record outside a failed wait's branch, a counter given a float, or an unknown
    effect name are not accepted."""
    from tlx.numerics import determinism
    from tlx.passes.check import section_verdict

    kernel = _flag_kernel(False)
    before = determinism.analyze(kernel)
    assert before["deterministic"] == "unknown" and any("test_only_wait" in u for u in before["unresolved"])
    with pytest.raises(ValueError, match=r"effect of test_only_wait expected one of .*got 'spin'"):
        determinism.declare_sync(test_only_wait="spin")
    determinism.declare_sync(test_only_wait="wait", test_only_record="failure_record", test_only_fence="fence",
                             test_only_add="counter_add")
    after = determinism.analyze(kernel)
    assert (after["deterministic"], after["batch_invariant"], after["unresolved"]) == (True, True, [])
    assert after["assumptions"] == [determinism.WAIT_ASSUMPTION]
    verdict, summary = section_verdict("determinism", after)
    assert verdict == "ok" and summary.endswith("assuming " + determinism.WAIT_ASSUMPTION)

    stray = determinism.analyze(_flag_kernel(True))
    assert stray["deterministic"] == "unknown"
    assert any("test_only_record records a failure outside" in u for u in stray["unresolved"]), stray["unresolved"]
    floaty = determinism.analyze(_flag_kernel(False, float_flag=True))
    assert floaty["deterministic"] == "unknown"
    assert any("test_only_add (counter_add) given a floating-point argument" in u for u in floaty["unresolved"])


def test_megamoe_flag_kernels_are_deterministic_under_the_wait_assumption():
    """The MegaMoE kernels whose flags are inline PTX (kernels/moe/mega/sysflags.py declares
    them): deterministic; the ones that wait say what they assume."""
    from kernels.moe.mega import protocol as K
    from tlx.numerics import determinism

    for kernel, waits in ((K.announce_kernel(), False), (K.exchange_kernel(2), True),
                          (K.dispatch_kernel(2, 4096, 6, 1, 16, 32, 16), False)):
        r = kernel.metadata["reports"]["determinism"]
        assert r["deterministic"] is True, (kernel.name, r["unresolved"])
        assert r["assumptions"] == ([determinism.WAIT_ASSUMPTION] if waits else []), kernel.name
