"""Every tensor argument exists, so its byte size fits in int64 (``smt.tensor_size_fact``): an
overflow that needs an impossible tensor is gone, a real one on a possible tensor is still
reported, with a counterexample whose tensors all fit."""

import tilelang.language as T

from tests.conftest import CPU_TARGET
from tests.passes.corpus import lowered
from tlx.ir.tir import elem_bytes
from tlx.lowering import lower
from tlx.passes.smt import INT64_MAX, Encoder, shape_setup
from tlx.passes.verification import verify_kernel

ROWS, HEADS = T.dynamic("R"), T.dynamic("H")


@T.prim_func
def rows_copy(X: T.Tensor((ROWS, HEADS, 64), "float16"), Y: T.Tensor((ROWS, HEADS, 64), "float16")):
    """Row r of head h: int64 offsets ``(r * H + h) * 64`` that overflow only past 2**63 elements."""
    with T.Kernel(T.ceildiv(ROWS, 128), HEADS, threads=128) as (bx, by):
        tx = T.get_thread_binding()
        r = bx * 128 + tx
        if r < ROWS:
            for d in T.serial(64):
                Y[r, by, d] = X[r, by, d]


N = T.dynamic("N")


@T.prim_func
def strided_gather(X: T.Tensor((N,), "float32"), Y: T.Tensor((N,), "float32"), step: T.int64):
    """``X[i * step % N]``: ``i * step`` overflows int64 for a large step, whatever the tensors."""
    with T.Kernel(T.ceildiv(N, 128), threads=128) as bx:
        tx = T.get_thread_binding()
        i = bx * 128 + tx
        if i < N:
            Y[i] = X[T.floormod(T.Cast("int64", i) * step, T.Cast("int64", N))]


def _bytes(buf, values: dict) -> int:
    """The byte size of ``buf`` at the counterexample's shape values (dims are vars or constants)."""
    n = elem_bytes(buf.dtype)
    for d in buf.shape:
        n *= values[d.name] if hasattr(d, "name") else int(d)
    return n


def test_shape_setup_bounds_each_tensor_size():
    kernel = lower(rows_copy, CPU_TARGET)
    enc = Encoder()
    _, terms = shape_setup(enc, kernel, (), [])
    r, h = terms["R"], terms["H"]
    # 2 bytes * 64 * R * H <= INT64_MAX: the dense_fwd counterexample (TQ=1073741568, H=1301503758) is gone
    assert enc.check([r == 1073741568, h == 1301503758]).status == "proven"
    assert enc.check([r * h * 128 > INT64_MAX]).status == "proven"
    # tight: 2**30 rows of 2**26 - 1 heads (2**63 - 2**37 bytes) exist, 2**26 heads do not
    assert enc.check([r == 2**30, h == 2**26 - 1]).status == "violation"
    assert enc.check([r == 2**30, h == 2**26]).status == "proven"
    # a dimension of 0 makes an empty tensor: the other one is then free (up to its dtype)
    assert enc.check([h == 0, r == 2**31 - 1]).status == "violation"


def test_overflow_that_needs_an_impossible_tensor_is_proven():
    report = verify_kernel(lower(rows_copy, CPU_TARGET), ("R <= 1 << 30",))
    assert report.checked == 2
    assert report.proven == report.checked and not report.violations() and not report.unknowns(), \
        [(a.status, a.detail, a.counterexample) for a in report.accesses]


def test_real_int64_overflow_on_a_possible_tensor_is_still_reported():
    kernel = lower(strided_gather, CPU_TARGET)
    report = verify_kernel(kernel, ("N <= 1 << 30",))
    (hit,) = [a for a in report.violations() if a.kind == "overflow"]
    cex = hit.counterexample
    # differential: the counterexample is a launch the launcher accepts with tensors that exist,
    # and evaluating the product concretely leaves int64
    assert all(_bytes(b, cex) <= INT64_MAX for b in kernel.prim_func.buffer_map.values())
    assert 1 <= cex["N"] <= 1 << 30 and -(2**63) <= cex["step"] < 2**63
    product = (cex["bx"] * 128 + cex["tx"]) * cex["step"]
    assert product == cex["value"] and not -(2**63) <= product <= INT64_MAX
    # the load depends on it, so it stays unknown (never proven)
    (load,) = [a for a in report.accesses if a.buffer == "X"]
    assert load.status == "unknown"


def test_int32_overflow_bug_counterexample_is_a_possible_tensor():
    """The planted int32 overflow is refuted with tensors far below the int64 size limit."""
    kernel = lowered("int32_overflow")
    hit = next(a for a in verify_kernel(kernel).violations() if a.kind == "overflow")
    shapes = {k: v for k, v in hit.counterexample.items() if k.isupper()}
    assert all(_bytes(b, shapes) <= INT64_MAX for b in kernel.prim_func.buffer_map.values())


def test_dense_forward_d64_has_no_impossible_overflow():
    """kernels/attention/dense_fwd.py at head dim 64 (non-causal) was reported with two int64
    overflows whose counterexamples were impossible tensors (TQ=1073741568, H=1301503758: a Q of
    2**63 * 9.7 bytes); with the size fact every access is proven under the kernel's assumptions."""
    import math

    from kernels.attention import common as C
    from kernels.attention.dense_fwd import FWD_ASSUME, dense_fwd_kernel
    from tests.passes.corpus import lower_jit

    kernel = lower_jit(dense_fwd_kernel, dim=64, causal=False, scale_log2=C.LOG2E / math.sqrt(64))
    report = verify_kernel(kernel, tuple(FWD_ASSUME))
    assert report.checked > 50 and report.proven == report.checked, \
        [(a.status, a.detail[:120]) for a in report.violations() + report.unknowns()]
