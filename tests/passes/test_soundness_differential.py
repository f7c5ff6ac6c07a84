"""Differential soundness: the bounds verifier against concrete evaluation.

For small kernels with scalar parameters (offsets, strides, windows, shifts, unsigned values,
negative steps) the verifier's verdict and derived preconditions are compared with every index
the lowered device code computes (``tests/passes/concrete.py``) over a grid of parameter values
that includes each precondition's boundary. A kernel reported proven must have no out-of-bounds
index at any value the launcher accepts: its dtype's range and every derived precondition.
"""

from __future__ import annotations

import itertools

import pytest
import tilelang.language as T

from tests.passes.concrete import evaluate, out_of_bounds
from tests.passes.corpus import lower_jit
from tests.passes.test_bound_values import counted_sum
from tests.shared_read import offset_read as shared_offset_read
from tests.shared_read import shared_read
from tlx.lowering import lower, normalize_target
from tlx.passes.check import check_kernel
from tlx.passes.verification import verify_kernel

TARGET = normalize_target({"kind": "cuda", "arch": "sm_90a"})
THREADS = 32


def offset_read():
    return shared_offset_read(THREADS)


def strided_read():
    return shared_read(lambda tx, stride: tx * stride, THREADS)


def window_sum():
    @T.prim_func
    def main(A: T.Tensor((128,), "float32"), B: T.Tensor((THREADS,), "float32"), w: T.int32):
        with T.Kernel(1, threads=THREADS):
            S = T.alloc_shared((128,), "float32")
            acc = T.alloc_var("float32")
            tx = T.get_thread_binding()
            for i in T.Parallel(128):
                S[i] = A[i]
            acc = 0.0
            for i in T.serial(w):
                acc += S[tx + i]
            B[tx] = acc

    return main


def shifted_offset():
    return shared_read(lambda tx, off: T.shift_right(off, 2) + tx, THREADS)


def unsigned_offset():
    return shared_read(lambda tx, off: T.Cast("int32", off) + tx, THREADS, scalar=T.uint32)


def backwards_walk():
    @T.prim_func
    def main(A: T.Tensor((128,), "float32"), B: T.Tensor((THREADS,), "float32"), start: T.int32, n: T.int32):
        with T.Kernel(1, threads=THREADS):
            S = T.alloc_shared((128,), "float32")
            acc = T.alloc_var("float32")
            tx = T.get_thread_binding()
            for i in T.Parallel(128):
                S[i] = A[i]
            acc = 0.0
            for i in T.serial(n):
                acc += S[start - i]
            B[tx] = acc

    return main


def counted_compaction(steps=16):
    """A count advanced under a condition the verifier does not decide (bit ``j`` of ``a``): at
    step ``j`` it is at most ``j``, so ``S[tx * 16 + c]`` stays in the thread's 16 slots of shared
    memory (which TileLang does not guard) while the loop takes 16 steps; with 17, ``a = -1``
    (every bit set) writes past the last thread's slots."""

    @T.prim_func
    def main(Y: T.Tensor((THREADS,), "int32"), a: T.int32):
        with T.Kernel(1, threads=THREADS):
            tx = T.get_thread_binding()
            S = T.alloc_shared((THREADS * 16,), "int32")
            c = T.alloc_var("int32")
            c = 0
            for j in T.serial(steps):
                if T.shift_right(a, j) % 2 != 0:
                    S[tx * 16 + c] = j
                    c = c + 1
            Y[tx] = S[tx * 16]

    return main


KERNELS = [offset_read, strided_read, window_sum, shifted_offset, unsigned_offset, backwards_walk, counted_compaction]
GRID = (-300, -129, -5, -2, -1, 0, 1, 2, 3, 4, 5, 31, 32, 33, 95, 96, 97, 127, 128, 129, 224, 225, 255, 256, 257)
PAIR_GRID = (-129, -2, -1, 0, 1, 2, 31, 32, 33, 96, 97, 127, 128, 129)  # two parameters: fewer points each
DTYPE_RANGE = {"int32": (-(2**31), 2**31 - 1), "uint32": (0, 2**32 - 1), "int64": (-(2**63), 2**63 - 1)}


def _scalar_params(prim_func):
    return [p for p in prim_func.params if p not in prim_func.buffer_map]


def _candidates(prim_func, preconditions) -> dict[str, list[int]]:
    """GRID plus every integer constant in the preconditions and its neighbours, within the dtype."""
    constants = set()

    def collect(e):
        if hasattr(e, "value") and isinstance(getattr(e, "value"), int):
            constants.add(int(e.value))

    from tilelang import tvm

    for p in preconditions:
        tvm.tirx.stmt_functor.post_order_visit(tvm.tirx.Evaluate(p.expr), collect)
    scalars = _scalar_params(prim_func)
    values = sorted(set(GRID if len(scalars) == 1 else PAIR_GRID) | {c + d for c in constants for d in (-1, 0, 1)})
    out = {}
    for p in scalars:
        lo, hi = DTYPE_RANGE[str(p.dtype)]
        out[p.name] = [v for v in values if lo <= v <= hi]
    return out


@pytest.mark.parametrize("factory", KERNELS, ids=lambda f: f.__name__)
def test_proven_kernels_have_no_reachable_out_of_bounds_index(factory):
    prim = factory()
    kernel = lower(prim, TARGET, {}, name=factory.__name__)
    result = check_kernel(kernel)
    proven = not result.violations and not result.unknown
    device_funcs = [f for f in kernel.device_mod.functions.values() if hasattr(f, "body")]
    grid = _candidates(prim, result.preconditions)
    params = {p.name: p for p in _scalar_params(prim)}
    accepted = 0
    for combo in itertools.product(*grid.values()):
        values = dict(zip(grid, combo, strict=True))
        env = {params[k]: v for k, v in values.items()}
        if not all(evaluate(p.expr, env) for p in result.preconditions):
            continue  # the launcher refuses these values
        accepted += 1
        bad = [oob for f in device_funcs for oob in out_of_bounds(f, values, first=True)]
        if proven:
            assert not bad, (
                f"{factory.__name__}: verifier says proven under {[p.text for p in result.preconditions]}, "
                f"but {values} (accepted by the launcher) reaches {bad[0]}"
            )
    assert accepted, f"{factory.__name__}: no grid point satisfies the preconditions; the test checked nothing"
    for violation in result.violations:  # the other direction: every reported violation is real
        values = {k: v for k, v in violation.counterexample.items() if k in params}
        assert any(out_of_bounds(f, values, first=True) for f in device_funcs), (
            f"{factory.__name__}: counterexample {violation.counterexample} reaches no out-of-bounds index"
        )


def test_the_evaluator_sees_the_planted_out_of_bounds_read():
    """The oracle itself: a negative offset reaches S[-1], a large one S[256]."""
    kernel = lower(offset_read(), TARGET, {}, name="offset_read")
    (f,) = [f for f in kernel.device_mod.functions.values() if hasattr(f, "body")]
    assert [o.index for o in out_of_bounds(f, {"off": -1})] == [(-1,)]
    assert out_of_bounds(f, {"off": 0}) == []
    assert out_of_bounds(f, {"off": 256 - THREADS}) == []
    assert {o.index for o in out_of_bounds(f, {"off": 256 - THREADS + 1})} == {(256,)}
    assert len(out_of_bounds(f, {"off": -2}, first=True)) == 1 < len(out_of_bounds(f, {"off": -2}))


def test_the_launcher_enforces_a_derived_sign_condition():
    """``off >= 0`` is no assumption: it is a precondition, and the generated launcher checks it."""
    from tlx.compiler import compile_artifacts
    from tlx.options import Options

    source, build = compile_artifacts(offset_read(), Options.make(target=dict(TARGET)), name="offset_read", stop_after="launcher")
    texts = [p.text for p in build.preconditions]
    assert "off >= 0" in texts and f"off <= {256 - THREADS}" in texts
    assert '"off >= 0"' in source and "(v_off >= int64_t(0))" in source


def _device_func(kernel):
    (f,) = [f for f in kernel.device_mod.functions.values() if hasattr(f, "body")]
    return f


def test_data_dependent_counterexample_is_out_of_bounds_only_with_its_input():
    """The verifier's counterexample for ``counted_sum``'s S[j], replayed: with the count it names
    in ``counts``, the kernel reads past the shared table; with counts within the table (the
    caller's contract) it reads nothing out of bounds, so no shape or thread alone refutes it
    (unknown, not a violation). The clamped kernel, proven, stays in bounds with that count."""
    rows, table = 2, 64
    kernel = lower_jit(counted_sum, rows=rows, table=table)
    (read,) = [a for a in verify_kernel(kernel).accesses if a.buffer == "S" and a.kind == "load"]
    assert read.status == "unknown" and read.data_dependent
    cex = read.counterexample
    counts = [0] * rows
    counts[cex["bx"]] = cex["counts[bx]"]
    (bad,) = out_of_bounds(_device_func(kernel), {}, first=True, memory={"counts": counts})
    assert bad.buffer == "S" and bad.index == (table,) and dict(bad.env)["bx"] == cex["bx"], bad
    assert out_of_bounds(_device_func(kernel), {}, memory={"counts": [table] * rows}) == []
    clamped = lower_jit(counted_sum, rows=rows, table=table, clamp=True)
    assert all(a.status == "proven" for a in verify_kernel(clamped).accesses if a.buffer == "S" and a.kind == "load")
    assert out_of_bounds(_device_func(clamped), {}, memory={"counts": counts}) == []


def test_a_count_is_bounded_by_the_steps_taken_and_no_further():
    """The count's bound comes from the loop's steps (``tlx.ir.facts.accumulators``): over 16
    steps the store is proven and no value of ``a`` leaves the row; over 17 it is not proven
    (unknown, it depends on the count), and ``a = -1`` does leave it."""
    for steps, safe in ((16, True), (17, False)):
        kernel = lower(counted_compaction(steps), TARGET, {}, name=f"counted_compaction_{steps}")
        (store,) = [a for a in verify_kernel(kernel).accesses if a.buffer == "S" and a.kind == "store"]
        assert store.status == ("proven" if safe else "unknown"), (steps, store.status, store.detail)
        reached = out_of_bounds(_device_func(kernel), {"a": -1}, first=True)
        assert bool(reached) != safe, (steps, reached)
