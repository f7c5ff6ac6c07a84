"""Facts read from a loop's form: the range a step expression lies in, and which private scalars a
loop only accumulates into (what the bounds verifier bounds by the steps taken)."""

import tilelang.language as T
from tilelang import tvm

from tlx.ir.facts import accumulators, step_range
from tlx.ir.tir import device_functions, nodes
from tlx.lowering import lower

tir = tvm.tirx
TARGET = {"kind": "cuda", "arch": "sm_90a"}


def _var(dtype):
    return tir.Var("x", dtype)


def test_step_range_reads_masks_shifts_casts_and_selects():
    x32, u32 = _var("int32"), _var("uint32")
    assert step_range(tir.IntImm("int32", 5)) == (5, 5)
    assert step_range(T.bitwise_and(x32, 0xFFFF)) == (0, 0xFFFF)
    assert step_range(T.shift_right(x32, 16)) == (-(1 << 15), (1 << 15) - 1)  # arithmetic shift keeps the sign
    assert step_range(T.shift_right(u32, 16)) == (0, 0xFFFF)
    assert step_range(tir.Cast("int32", x32 > 0)) == (0, 1)
    assert step_range(tir.Select(x32 > 0, tir.IntImm("int32", 1), tir.IntImm("int32", 1 << 16))) == (1, 1 << 16)
    assert step_range(tir.IntImm("int32", 3) - T.bitwise_and(x32, 7)) == (-4, 3)


def test_step_range_refuses_what_its_form_does_not_bound():
    x32 = _var("int32")
    assert step_range(x32 + 1) is None  # a variable: any int32
    assert step_range(tir.Cast("int8", T.bitwise_and(x32, 0xFFFF))) is None  # narrowing: the range would wrap
    assert step_range(T.bitwise_and(x32, x32)) is None


def _outer_loop(func):
    """The loop over ``j`` in the lowered device function (the code the verifier reads)."""
    [(_, device)] = list(device_functions(lower(func, TARGET, {}).device_mod))
    return next(loop for loop in nodes(device.body, tir.For) if loop.loop_var.name == "j")


def test_accumulators_count_each_site_by_its_inner_trips_and_branches_add_zero():
    @T.prim_func
    def main(A: T.Tensor((64,), "int32")):
        with T.Kernel(1, threads=32):
            c = T.alloc_var("int32")
            d = T.alloc_var("int32")
            c = 0
            d = 0
            for j in T.serial(8):
                if A[j] > 0:
                    c = c + 2
                for i in T.unroll(4):
                    d = d + T.bitwise_and(A[i], 3)
                d = d + (-1)

    found = {buf.name: (lo, hi) for buf, lo, hi in accumulators(_outer_loop(main)).values()}
    assert found == {"c": (0, 2), "d": (-1, 12)}


def test_accumulators_leave_out_scalars_set_or_stepped_unknowably():
    @T.prim_func
    def unbounded(A: T.Tensor((64,), "int32"), n: T.int32):
        with T.Kernel(1, threads=32):
            c = T.alloc_var("int32")
            d = T.alloc_var("int32")
            c = 0
            d = 0
            for j in T.serial(8):
                c = c + A[j]  # an int32 step: no range of its own
                for i in T.serial(n):  # no constant trip count
                    d = d + 1

    assert accumulators(_outer_loop(unbounded)) == {}

    @T.prim_func
    def reset(A: T.Tensor((64,), "int32")):
        with T.Kernel(1, threads=32):
            c = T.alloc_var("int32")
            d = T.alloc_local((1,), "int32")
            c = 0
            d[0] = 0
            for j in T.serial(8):
                c = c + 1
                if A[j] > 0:
                    c = 0
                d[0] = d[0] + 1
                T.atomic_add(d[0], 1)  # through its address: it may change unseen

    assert accumulators(_outer_loop(reset)) == {}
