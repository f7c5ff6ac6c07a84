"""The ``reduce_barriers`` pass: two warpgroups' cross-warp reductions get named barriers of
their own (TileLang gives every ``tl::AllReduce`` ids 1 and 2)."""

import tilelang.language as T

from tests.passes.corpus.correct import TARGET
from tlx.ir.tir import calls, device_functions, extern_name
from tlx.lowering import lower
from tlx.passes import PassContext
from tlx.passes.progress import _all_reduce_barriers
from tlx.passes.reduce_barriers import PRELUDE, reduce_barriers_pass, reduce_groups


def column_maxima(warpgroups: int):
    """Each warpgroup (in its own branch) the column maxima of its 128 rows of A: a reduction
    across its four warps."""

    @T.prim_func
    def main(A: T.Tensor((256, 4), "float32"), M: T.Tensor((2, 4), "float32")):
        with T.Kernel(1, threads=128 * warpgroups):
            tx = T.get_thread_binding()
            f0 = T.alloc_fragment((128, 4), "float32")
            m0 = T.alloc_fragment((4,), "float32")
            f1 = T.alloc_fragment((128, 4), "float32")
            m1 = T.alloc_fragment((4,), "float32")
            if tx < 128:
                T.copy(A[0:128, :], f0)
                T.reduce_max(f0, m0, dim=0)
                T.copy(m0, M[0, :])
            elif warpgroups == 2:
                T.copy(A[128:256, :], f1)
                T.reduce_max(f1, m1, dim=0)
                T.copy(m1, M[1, :])

    return main


def _reductions(kernel) -> list[str]:
    [(_, func)] = list(device_functions(kernel.device_mod))
    return sorted(name for c in calls(func) if (name := extern_name(c) or "").startswith("tl::AllReduce<"))


def test_the_second_warpgroup_reduces_on_ids_of_its_own():
    before = lower(column_maxima(2), TARGET)
    [(_, func)] = list(device_functions(before.device_mod))
    assert reduce_groups(func) == [(0, 128), (128, 128)]
    assert _reductions(before) == ["tl::AllReduce<tl::MaxOp, 128, 1, 0, tl::NamedBarrier<128>>::run",
                                   "tl::AllReduce<tl::MaxOp, 128, 1, 128, tl::NamedBarrier<128>>::run"]
    ctx = PassContext()
    after = reduce_barriers_pass(before, ctx)
    assert _reductions(after) == ["tl::AllReduce<tl::MaxOp, 128, 1, 0, tl::NamedBarrier<128>>::run",
                                  "tl::AllReduce<tl::MaxOp, 128, 1, 128, tlx::NamedBarrierIds<128, 15, 14>>::run"]
    [(_, f1)] = list(device_functions(after.device_mod))
    assert f1.body.attr_key == "pragma_import_c" and f1.body.value.value == PRELUDE
    assert ctx.reports["reduce_barriers"] == {"main_kernel": {"groups": [[0, 128], [128, 128]], "renumbered": True,
                                                              "ids": [[1, 2], [15, 14]]}}
    # the progress check reads the new barrier's ids: two levels (offsets 64, 32) through shared memory
    assert _all_reduce_barriers("tl::AllReduce<tl::MaxOp, 128, 1, 128, tlx::NamedBarrierIds<128, 15, 14>>::run") == [
        ("bar", 15, 128), ("bar", 14, 128), ("bar", 15, 128), ("bar", 14, 128)]


def test_one_warpgroup_is_left_as_it_is():
    before = lower(column_maxima(1), TARGET)
    ctx = PassContext()
    assert reduce_barriers_pass(before, ctx).device_mod.same_as(before.device_mod)
    assert "reduce_barriers" not in ctx.reports


def test_ids_in_use_are_not_taken():
    """TileLang's partial syncs and the kernel's own named barriers keep their ids: the new pair
    comes from the highest ids that no ``tvm_storage_sync`` of the function names."""

    @T.prim_func
    def main(A: T.Tensor((256, 4), "float32"), M: T.Tensor((2, 4), "float32")):
        with T.Kernel(1, threads=256):
            tx = T.get_thread_binding()
            f0 = T.alloc_fragment((128, 4), "float32")
            m0 = T.alloc_fragment((4,), "float32")
            f1 = T.alloc_fragment((128, 4), "float32")
            m1 = T.alloc_fragment((4,), "float32")
            T.sync_threads(15, 256)
            if tx < 128:
                T.copy(A[0:128, :], f0)
                T.reduce_max(f0, m0, dim=0)
                T.copy(m0, M[0, :])
            else:
                T.copy(A[128:256, :], f1)
                T.reduce_max(f1, m1, dim=0)
                T.copy(m1, M[1, :])

    after = reduce_barriers_pass(lower(main, TARGET), PassContext())
    assert "tlx::NamedBarrierIds<128, 14, 13>" in _reductions(after)[1]


def test_the_progress_check_finds_two_warpgroups_on_one_barrier():
    """Before the pass the two warpgroups' reductions share bar.sync 1 and 2: a random schedule
    releases part of one warpgroup with part of the other (each alone 128 threads), which the
    progress check reports; after it, each barrier joins one warpgroup every time."""
    from tlx.passes.progress import check_progress

    before = lower(column_maxima(2), TARGET)
    [(_, func)] = list(device_functions(before.device_mod))
    report = check_progress(func)
    assert report.verdict == "deadlock" and "two groups of threads share it" in report.detail, report.detail
    [(_, func)] = list(device_functions(reduce_barriers_pass(before, PassContext()).device_mod))
    assert check_progress(func).verdict == "ok"
