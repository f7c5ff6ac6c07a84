"""The programmatic-dependent-launch check (``tlx/passes/pdl.py``): what a kernel launched as a
dependent touches of global memory before its ``T.pdl_sync()``, against the grids it may overlap."""

import pytest
import tilelang.language as T

from tests.passes.corpus.correct import TARGET
from tlx.ir.tir import nodes, op_name, tir
from tlx.lowering import lower
from tlx.passes.pdl import pdl_report
from tlx.passes.races import races_report

N = T.dynamic("N")
BLOCK = 128


def chain(second: str):
    """Two kernels through a workspace: ``tripled = 3 * X``, then ``Y = tripled + X`` in the
    second, whose ``T.pdl_sync()`` stands where ``second`` says: "first" (before any access),
    "late" (after it reads ``tripled``), "after_x" (after it reads X only), "guarded" (under a
    condition on the thread), "none" (no sync: an ordinary launch)."""

    @T.prim_func
    def main(X: T.Tensor((N,), "float32"), Y: T.Tensor((N,), "float32")):
        tripled = T.alloc_global((N,), "float32")
        with T.Kernel(T.ceildiv(N, BLOCK), threads=BLOCK) as b:
            i = b * BLOCK + T.get_thread_binding()
            if i < N:
                tripled[i] = X[i] * T.float32(3)
        with T.Kernel(T.ceildiv(N, BLOCK), threads=BLOCK) as b:
            x = T.alloc_var("float32")
            t = T.alloc_var("float32")
            if second == "first":
                T.pdl_sync()
            i = b * BLOCK + T.get_thread_binding()
            if i < N:
                x = X[i]
            if second == "after_x":
                T.pdl_sync()
            if i < N:
                t = tripled[i]
            if second == "late":
                T.pdl_sync()
            if second == "guarded" and T.get_thread_binding() == 0:
                T.pdl_sync()
            if i < N:
                Y[i] = t + x

    return main


def first_dependent(write: bool):
    """One kernel, itself a dependent launch, that reads (or writes) Y before its sync."""

    @T.prim_func
    def main(X: T.Tensor((N,), "float32"), Y: T.Tensor((N,), "float32")):
        with T.Kernel(T.ceildiv(N, BLOCK), threads=BLOCK) as b:
            i = b * BLOCK + T.get_thread_binding()
            if write and i < N:
                Y[i] = T.float32(0)
            if not write and i < N:
                X[i] = Y[i]
            T.pdl_sync()
            if i < N:
                Y[i] = X[i] + T.float32(1)

    return main


def tma_chain(early_workspace: bool):
    """``Y = 2 * X + X`` in float16 through a workspace (the stores are TMA stores); the second kernel
    loads its X tile before its sync, and its workspace tile before it too if ``early_workspace``."""
    M, D, rows = T.dynamic("M"), 64, 64

    @T.prim_func
    def main(X: T.Tensor((M, D), "float16"), Y: T.Tensor((M, D), "float16")):
        doubled = T.alloc_global((M, D), "float16")
        with T.Kernel(T.ceildiv(M, rows), threads=128) as bx:
            tile = T.alloc_shared((rows, D), "float16")
            T.copy(X[bx * rows, 0], tile)
            for i, j in T.Parallel(rows, D):
                tile[i, j] = tile[i, j] * T.float16(2)
            T.copy(tile, doubled[bx * rows, 0])
        with T.Kernel(T.ceildiv(M, rows), threads=128) as bx:
            tile = T.alloc_shared((rows, D), "float16")
            back = T.alloc_shared((rows, D), "float16")
            T.copy(X[bx * rows, 0], tile)
            if early_workspace:
                T.copy(doubled[bx * rows, 0], back)
            T.pdl_sync()
            if not early_workspace:
                T.copy(doubled[bx * rows, 0], back)
            for i, j in T.Parallel(rows, D):
                tile[i, j] = tile[i, j] + back[i, j]
            T.copy(tile, Y[bx * rows, 0])

    return main


def skippable_middle():
    """Y = X + 1 (grid over N), then an ordinary kernel over another extent K that may be empty
    (the launcher then skips it), then a dependent kernel over N that reads Y before its sync."""
    K = T.dynamic("K")

    @T.prim_func
    def main(X: T.Tensor((N,), "float32"), Y: T.Tensor((N,), "float32"), Z: T.Tensor((K,), "float32"),
             W: T.Tensor((N,), "float32")):
        with T.Kernel(T.ceildiv(N, BLOCK), threads=BLOCK) as b:
            i = b * BLOCK + T.get_thread_binding()
            if i < N:
                Y[i] = X[i] + T.float32(1)
        with T.Kernel(T.ceildiv(K, BLOCK), threads=BLOCK) as b:
            i = b * BLOCK + T.get_thread_binding()
            if i < K:
                Z[i] = Z[i] * T.float32(2)
        with T.Kernel(T.ceildiv(N, BLOCK), threads=BLOCK) as b:
            i = b * BLOCK + T.get_thread_binding()
            y = T.alloc_var("float32")
            if i < N:
                y = Y[i]
            T.pdl_sync()
            if i < N:
                W[i] = y

    return main


def report(func):
    return pdl_report(lower(func, TARGET))


def test_a_sync_before_every_access_orders_the_dependent_kernel():
    r = report(chain("first"))
    assert r["dependents"] == 1 and r["races"] == [] and r["unknown"] == []


def test_reading_the_first_kernels_output_before_the_sync_is_a_race_naming_both_kernels():
    (race,) = report(chain("late"))["races"]
    assert (race["buffer"], race["access"], race["other_access"]) == ("tripled", "read", "write")
    assert race["kernel"] != race["other"] and "before its T.pdl_sync()" in race["reason"]


def test_reading_what_the_first_kernel_only_reads_is_no_race():
    r = report(chain("after_x"))
    assert r["races"] == [] and r["unknown"] == []


@pytest.mark.parametrize("early_workspace", [False, True])
def test_a_tma_store_writes_the_tensor_its_descriptor_maps(early_workspace):
    """The first kernel writes the workspace through a TMA descriptor (``tl.tma_store``): loading
    it before the sync races with that write; loading X (which the first kernel only reads) does not."""
    lowered = lower(tma_chain(early_workspace), TARGET)
    (first, _) = [f for _, f in sorted(lowered.device_mod.functions.items(), key=lambda kv: kv[0].name_hint)]
    assert any(op_name(c) == "tl.tma_store" for c in nodes(first.body, tir.Call))
    races = pdl_report(lowered)["races"]
    assert [(r["buffer"], r["access"], r["other_access"]) for r in races] == ([("doubled", "read", "write")] if early_workspace else [])


def test_an_ordinary_launch_the_host_may_skip_orders_nothing():
    """The middle kernel's grid may be empty while the dependent's is not (the launcher skips it):
    the dependent may then overlap the first kernel, whose write of Y it reads early."""
    (race,) = report(skippable_middle())["races"]
    assert (race["buffer"], race["access"], race["other_access"]) == ("Y", "read", "write")


def test_a_sync_under_a_condition_orders_nothing():
    """Threads that skip the guarded ``griddepcontrol.wait`` run on: the whole body is early."""
    (race,) = report(chain("guarded"))["races"]
    assert race["buffer"] == "tripled" and "under a condition or loop" in race["reason"]


def test_no_sync_means_an_ordinary_launch_and_nothing_to_check():
    assert report(chain("none")) == {"races": [], "unknown": [], "dependents": 0}


@pytest.mark.parametrize("write", [False, True])
def test_a_programs_first_dependent_launch_overlaps_what_tlx_cannot_see(write):
    """The grid before it on the stream is outside the program: unknown, never ok."""
    r = report(first_dependent(write))
    assert r["races"] == []
    assert [(u["buffer"], u["access"]) for u in r["unknown"]] == ([("Y", "write")] if write else [("X", "write"), ("Y", "read")])
    assert all("outside this program" in u["reason"] for u in r["unknown"])


def test_the_races_verdict_carries_the_dependent_launch_findings():
    race = races_report(lower(chain("late"), TARGET))
    assert race["verdict"] == "race" and race["races"] == 1
    assert any("tripled" in line for line in race["summary"])
    unknown = races_report(lower(first_dependent(False), TARGET))
    assert unknown["verdict"] == "unknown"
    assert races_report(lower(chain("first"), TARGET))["verdict"] == "race-free"
