"""TileLang kernels applying each tlx.ieee operation elementwise (shared by CPU and GPU tests).

Each factory takes the operation name (and rounding mode) and returns a ``@T.prim_func`` over
flat tensors of a symbolic length, so one compiled kernel serves every chunk of a sweep.
"""

import tilelang.language as T

import tlx
from tlx import ieee

BLOCK = 256

UNARY_ARITH = ("sqrt", "rcp")
BINARY_ARITH = ("add", "sub", "mul", "div")
# name -> (output dtype, builder)
CONVERSIONS = {
    "cast_bf16": ("bfloat16", ieee.cast_bf16),
    "cast_fp8_e4m3": ("float8_e4m3fn", ieee.cast_fp8_e4m3),
    "cast_fp8_e5m2": ("float8_e5m2", ieee.cast_fp8_e5m2),
    "cast_fp4_e2m1": ("uint8", ieee.cast_fp4_e2m1),
    "ue8m0_code": ("uint8", ieee.ue8m0_code),
    "ue8m0_scale": ("float32", ieee.ue8m0_scale),
}


def unary(op: str, rounding: str = "rn", dtype: str = "float32"):
    """out[i] = op(x[i]) for a tlx.ieee arithmetic op or conversion."""
    n = T.dynamic("n")
    if op in CONVERSIONS:
        out_dtype, build = CONVERSIONS[op]

        def fn(v):
            return build(v)
    else:
        out_dtype = dtype
        build = getattr(ieee, op)

        def fn(v):
            return build(v, rounding)

    @T.prim_func
    def ieee_unary(x: T.Tensor((n,), dtype), out: T.Tensor((n,), out_dtype)):
        with T.Kernel(T.ceildiv(n, BLOCK), threads=BLOCK) as bx:
            for i in T.Parallel(BLOCK):
                if bx * BLOCK + i < n:
                    out[bx * BLOCK + i] = fn(x[bx * BLOCK + i])

    return ieee_unary


def binary(op: str, rounding: str = "rn", dtype: str = "float32"):
    """out[i] = op(x[i], y[i]) rounded in ``rounding``."""
    n = T.dynamic("n")
    build = getattr(ieee, op)

    @T.prim_func
    def ieee_binary(x: T.Tensor((n,), dtype), y: T.Tensor((n,), dtype), out: T.Tensor((n,), dtype)):
        with T.Kernel(T.ceildiv(n, BLOCK), threads=BLOCK) as bx:
            for i in T.Parallel(BLOCK):
                if bx * BLOCK + i < n:
                    out[bx * BLOCK + i] = build(x[bx * BLOCK + i], y[bx * BLOCK + i], rounding)

    return ieee_binary


def fma(rounding: str = "rn", dtype: str = "float32"):
    """out[i] = x[i] * y[i] + z[i] with one rounding."""
    n = T.dynamic("n")

    @T.prim_func
    def ieee_fma(x: T.Tensor((n,), dtype), y: T.Tensor((n,), dtype), z: T.Tensor((n,), dtype), out: T.Tensor((n,), dtype)):
        with T.Kernel(T.ceildiv(n, BLOCK), threads=BLOCK) as bx:
            for i in T.Parallel(BLOCK):
                if bx * BLOCK + i < n:
                    out[bx * BLOCK + i] = ieee.fma(x[bx * BLOCK + i], y[bx * BLOCK + i], z[bx * BLOCK + i], rounding)

    return ieee_fma


def jit_unary(op: str, rounding: str = "rn", dtype: str = "float32", target=None):
    """The compiled ``unary`` kernel through ``@tlx.jit`` (output allocated and returned)."""
    return tlx.jit(out_idx=[1], target=target)(unary)(op, rounding, dtype)
