"""Bijectivity proofs of real kernels' layouts, and planted layout bugs found with witnesses."""

import pytest
import tilelang.language as T
from tilelang import tvm
from tilelang.layout import Layout

from tests.passes.layout_corpus import kernels as K
from tlx.lowering import lower
from tlx.passes import PassContext
from tlx.passes.layouts import UsedLayout, check_layout, collect_layouts, gf2_rank, layouts_pass, layouts_report

CORPUS = {
    "gemm_tma": lambda: K.gemm(),
    "gemm_cp_async": lambda: K.gemm(configs=K.GEMM_SIMT_COPY),
    "row_sum": lambda: K.row_sum(),
    "swizzled_copy": lambda: K.swizzled_copy(),
}


@pytest.fixture(scope="module")
def lowered():
    target = {"kind": "cuda", "arch": "sm_90a"}
    out = {}
    for name, make in CORPUS.items():
        func, configs = make()
        out[name] = lower(func, target, configs)
    return out


@pytest.mark.parametrize("name", sorted(CORPUS))
def test_every_layout_of_real_kernels_is_bijective(lowered, name):
    report = layouts_report(lowered[name])
    assert report["checked"] >= 1
    for entry in report["layouts"]:
        assert entry["verdict"] == "bijective", entry
        gf2 = entry["gf2"]
        if gf2["applicable"]:
            assert gf2["agrees"] and gf2["rank"] == gf2["input_bits"] == gf2["output_bits"], entry


def test_gemm_swizzles_take_the_gf2_cross_check(lowered):
    entries = {e["buffer"]: e for e in layouts_report(lowered["gemm_tma"])["layouts"]}
    for buf in ("A_s", "B_s"):
        assert entries[buf]["gf2"]["applicable"], entries[buf]
        assert entries[buf]["kind"] == "layout"
    assert entries["C_l"]["kind"] == "fragment"


def _layout_value(layout, point):
    return [int(tvm.arith.Analyzer().simplify(e)) for e in layout.map_forward_index([tvm.tirx.IntImm("int32", p) for p in point])]


def test_wrong_swizzle_mask_gives_a_real_collision():
    wrong = Layout((64, 64), lambda i, j: [i, T.bitwise_and((j // 8) ^ (i % 8), 3) * 8 + j % 8])
    r = check_layout(UsedLayout("S", "shared.dyn", "float16", wrong))
    assert r["verdict"] == "invalid" and r["injective"] == "violation"
    x, y = r["collision"]["x"], r["collision"]["y"]
    px, py = (x["_i"], x["_j"]), (y["_i"], y["_j"])
    assert px != py
    assert _layout_value(wrong, px) == _layout_value(wrong, py)  # TVM agrees the two collide
    assert r["gf2"]["applicable"] and not r["gf2"]["injective"] and r["gf2"]["agrees"]


def test_no_enumeration_cap_on_a_4m_point_swizzle():
    big = Layout((2048, 2048), lambda i, j: [i, ((j // 8) ^ (i % 256)) * 8 + j % 8])
    r = check_layout(UsedLayout("S", "shared", "float16", big))
    assert r["verdict"] == "bijective" and r["gf2"]["rank"] == 22


def test_collision_found_beyond_tilelangs_exhaustive_limit():
    big = Layout((2048, 2048), lambda i, j: [i, T.bitwise_and((j // 8) ^ (i % 256), 127) * 8 + j % 8])
    r = check_layout(UsedLayout("S", "shared", "float16", big))
    assert r["verdict"] == "invalid"
    x, y = r["collision"]["x"], r["collision"]["y"]
    assert _layout_value(big, (x["_i"], x["_j"])) == _layout_value(big, (y["_i"], y["_j"]))


def test_padded_layout_is_injective_with_an_unreached_slot():
    padded = Layout((32, 32), lambda i, j: [i * 33 + j])
    r = check_layout(UsedLayout("S", "shared", "float32", padded))
    assert r["injective"] == "proven" and r["verdict"] == "injective"
    slot = r["unreached"]["index[0]"]
    assert slot % 33 == 32  # only the padding column is never reached


def test_non_power_of_two_extent_is_counted_whole():
    """192 rows bit-split into 8 bits under ``< 192``: the domain has 192 rows, not 256, so a
    swizzled 192 x 64 tile onto a 192 x 64 range is bijective (it read 'unknown' before)."""
    tile = Layout((192, 64), lambda i, j: [i, ((j // 8) ^ (i % 8)) * 8 + j % 8])
    r = check_layout(UsedLayout("S", "shared", "float16", tile))
    assert r["injective"] == "proven" and r["in_range"] == "proven"
    assert r["verdict"] == "bijective", r


def test_gf2_rank():
    assert gf2_rank([0b001, 0b010, 0b100]) == 3
    assert gf2_rank([0b011, 0b110, 0b101]) == 2
    assert gf2_rank([]) == 0


def test_pass_reports_and_respects_verify(lowered):
    ctx = PassContext(options={"verify": "error"})
    layouts_pass(lowered["gemm_tma"], ctx)
    assert ctx.reports["layouts"]["invalid"] == 0 and ctx.reports["layouts"]["checked"] == 3


def test_collect_needs_layout_ir(lowered):
    from dataclasses import replace

    with pytest.raises(ValueError, match="layout_mod"):
        collect_layouts(replace(lowered["row_sum"], layout_mod=None))


def test_a_fragment_laid_out_for_part_of_it_is_wrong():
    """A ``T.Parallel(64, 64)`` over rows 0..63 of a (128, 64) fragment: TileLang 0.1.15 lays the
    whole fragment out for (64, 64), so rows 64..127 have no register (the kernel silently
    computes half its tile). The layout is bijective on its own domain; the check against the
    buffer's shape catches it, and a fragment updated in full is not flagged."""

    def kernel(partial: bool):
        @T.prim_func
        def main(A: T.Tensor((512, 64), "float16"), B: T.Tensor((512, 64), "float32")):
            with T.Kernel(4, threads=128) as bx:
                tile = T.alloc_shared((128, 64), "float16")
                acc = T.alloc_fragment((128, 64), "float32")
                T.clear(acc)
                T.copy(A[bx * 128, 0], tile)
                for i, j in T.Parallel(128, 64):
                    acc[i, j] += tile[i, j]
                if partial:
                    for i, j in T.Parallel(64, 64):
                        acc[i, j] += tile[i, j]
                T.copy(acc, B[bx * 128, 0])

        return main

    target = {"kind": "cuda", "arch": "sm_90a"}
    bad = {e["buffer"]: e for e in layouts_report(lower(kernel(True), target))["layouts"]}["acc"]
    assert bad["verdict"] == "invalid" and bad["uncovered"] == {"layout": ["64", "64"], "buffer": ["128", "64"]}
    assert bad["coverage"]["status"] == "violation" and bad["coverage"]["last"][0] >= 64, bad["coverage"]
    report = layouts_report(lower(kernel(True), target))
    assert any(line.startswith("kernel main: fragment acc is declared [128, 64] but TileLang laid it out for [64, 64] only") for line in report["summary"]), report["summary"]
    good = {e["buffer"]: e for e in layouts_report(lower(kernel(False), target))["layouts"]}["acc"]
    assert good["verdict"] == "bijective" and "uncovered" not in good


def test_a_fragment_declared_smaller_than_the_loops_that_use_it_is_fine():
    """The attention-sink pattern: a per-row broadcast fragment declared with the wrong extent (4)
    but written and read only in ``T.Parallel(64)`` loops. TileLang gives it the 64-row layout
    of those loops and allocates its registers from that layout, so every index has a register
    of its own: the layout is fine and the declaration is reported as a note, not a violation.
    Declared with the right extent it gets no note."""

    def kernel(declared: int):
        @T.prim_func
        def main(X: T.Tensor((256, 64), "float32"), Bias: T.Tensor((4,), "float32"), Y: T.Tensor((256,), "float32")):
            with T.Kernel(4, threads=128) as bx:
                rows = T.alloc_fragment((64, 64), "float32")
                row_sum = T.alloc_fragment((64,), "float32")
                bias = T.alloc_fragment((declared,), "float32")
                T.copy(X[bx * 64, 0], rows)
                T.reduce_sum(rows, row_sum, dim=1)
                for i in T.Parallel(64):
                    bias[i] = Bias[bx]
                for i in T.Parallel(64):
                    row_sum[i] += bias[i]
                T.copy(row_sum, Y[bx * 64])

        return main

    target = {"kind": "cuda", "arch": "sm_90a"}
    lowered = lower(kernel(4), target)
    report = layouts_report(lowered)
    bias = {e["buffer"]: e for e in report["layouts"]}["bias"]
    assert bias["verdict"] == "bijective" and bias["coverage"] == {"status": "proven"}, bias
    assert bias["declared_shape"] == {"layout": ["64"], "buffer": ["4"]} and "uncovered" not in bias
    assert report["invalid"] == 0 and report["unknown"] == 0
    assert any(line.startswith("kernel main: fragment bias is declared [4] but used over [64]") for line in report["summary"]), report["summary"]
    layouts_pass(lowered, PassContext(options={"verify": "error"}))  # no LayoutError
    exact = {e["buffer"]: e for e in layouts_report(lower(kernel(64), target))["layouts"]}["bias"]
    assert exact["verdict"] == "bijective" and "declared_shape" not in exact and "coverage" not in exact


@pytest.mark.parametrize("guard", ["data_dependent_branch", "data_dependent_index"])
def test_an_access_that_may_leave_the_layout_is_unknown_not_fine(guard):
    """A (128, 64) fragment laid out for (64, 64), with one access that reaches rows 64.. only
    under a value read from memory (a branch on it, or an offset): tlx cannot show that the
    access runs, nor that it stays inside, so the layout is unknown, never fine."""

    @T.prim_func
    def main(A: T.Tensor((512, 64), "float16"), Flag: T.Tensor((1,), "int32"), B: T.Tensor((512, 64), "float32")):
        with T.Kernel(4, threads=128) as bx:
            tile = T.alloc_shared((128, 64), "float16")
            acc = T.alloc_fragment((128, 64), "float32")
            T.copy(A[bx * 128, 0], tile)
            for i, j in T.Parallel(64, 64):
                acc[i, j] = tile[i, j]
            if guard == "data_dependent_branch":
                if Flag[0] > 0:
                    for i, j in T.Parallel(64, 64):
                        acc[i + 64, j] = tile[i, j]
            else:
                for i, j in T.Parallel(64, 64):
                    acc[i + Flag[0], j] = tile[i, j]
            T.copy(acc[0:64, 0:64], B[bx * 128, 0])

    report = layouts_report(lower(main, {"kind": "cuda", "arch": "sm_90a"}))
    acc = {e["buffer"]: e for e in report["layouts"]}["acc"]
    assert acc["verdict"] == "unknown" and acc["coverage"]["status"] == "unknown", acc
    assert acc["uncovered"] == {"layout": ["64", "64"], "buffer": ["128", "64"]}
    assert report["unknown"] == 1 and report["invalid"] == 0
    assert any("kernel main: fragment acc is declared [128, 64] but laid out for [64, 64]; tlx could not prove" in line for line in report["summary"])
