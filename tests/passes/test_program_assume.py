"""A program's own ``T.assume`` over its parameters is a fact of the bounds proofs: TileLang
drops the guards it makes redundant, and the launcher checks it (a host assert)."""

import dataclasses

import tilelang.language as T
from tilelang import tvm

from tests.passes.corpus.correct import TARGET
from tlx.lowering import lower
from tlx.passes.verification import verify_kernel

M = T.dynamic("M")


def tiles(assume: bool):
    """Copy A to B in tiles of 32, with no guard of its own: the last tile is only whole when 32
    divides M."""

    @T.prim_func
    def main(A: T.Tensor((M,), "float32"), B: T.Tensor((M,), "float32")):
        with T.Kernel(T.ceildiv(M, 32), threads=32) as bx:
            if assume:
                T.assume(M % 32 == 0)
            for i in T.Parallel(32):
                B[bx * 32 + i] = A[bx * 32 + i]

    return main


def test_the_assume_proves_the_accesses_that_tilelang_left_unguarded():
    kernel = lower(tiles(True), TARGET)
    (device,) = [f for _, f in kernel.device_mod.functions.items()]
    assert "if " not in device.script()  # TileLang dropped its tail guard on the assumption
    report = verify_kernel(kernel, ("M <= 1048576",)).to_json()
    assert report["proven"] == report["accesses"] == 2 and not report["violations"]


def test_without_it_tilelang_guards_the_tail_and_the_guard_proves_it():
    kernel = lower(tiles(False), TARGET)
    (device,) = [f for _, f in kernel.device_mod.functions.items()]
    assert "if " in device.script()
    report = verify_kernel(kernel, ("M <= 1048576",)).to_json()
    assert report["proven"] == report["accesses"] == 2


def test_the_assume_is_not_a_fact_where_no_launcher_checks_it():
    """The same device code with the host's assert taken out: the condition is then checked by
    no launcher, so the unguarded tail is a violation again."""
    kernel = lower(tiles(True), TARGET)

    def without_asserts(f):
        drop = lambda s: tvm.tirx.Evaluate(0) if isinstance(s, tvm.tirx.AssertStmt) else None  # noqa: E731
        return f.with_body(tvm.tirx.stmt_functor.ir_transform(f.body, None, drop, ["tirx.AssertStmt"]))

    host = tvm.IRModule({g: without_asserts(f) if isinstance(f, tvm.tirx.PrimFunc) else f for g, f in kernel.host_mod.functions.items()})
    report = verify_kernel(dataclasses.replace(kernel, host_mod=host), ("M <= 1048576",)).to_json()
    assert sorted(v["buffer"] for v in report["violations"]) == ["A", "B"]
    assert all(v["counterexample"]["M"] % 32 for v in report["violations"])
