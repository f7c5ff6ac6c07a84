"""TileLang kernels applying tlx.ieee operations elementwise (shared by CPU and GPU tests).

Every kernel works on flat tensors of a symbolic length ``n``, so one compiled kernel serves
every chunk of a sweep; an arithmetic kernel writes all four rounding modes at once
(``out[r, i]`` for r = rn, rz, ru, rd) to keep the number of compiles small.
"""

import tilelang.language as T

from tlx import ieee

BLOCK = 256

# Operation codes shared with intrinsics_ref.cu's ``arith``.
ARITH_OPS = ("add", "sub", "mul", "div", "fma", "sqrt", "rcp")
UNARY_OPS = ("sqrt", "rcp")
BINARY_OPS = ("add", "sub", "mul", "div")

# Outputs of the conversion kernel, in the order intrinsics_ref.cu's ``convert_*`` takes them.
CONVERSIONS = (
    ("cast_bf16", "bfloat16"),
    ("cast_fp8_e4m3", "float8_e4m3fn"),
    ("cast_fp8_e5m2", "float8_e5m2"),
    ("cast_fp4_e2m1", "uint8"),
    ("ue8m0_code", "uint8"),
    ("ue8m0_scale", "float32"),
)
# The dtypes that hold intrinsics_ref.cu's raw output bits, one per conversion.
CONVERSION_BITS = ("int16", "uint8", "uint8", "uint8", "uint8", "float32")


def _apply(op, x, y, z, rounding):
    if op in UNARY_OPS:
        return getattr(ieee, op)(x, rounding)
    if op == "fma":
        return ieee.fma(x, y, z, rounding)
    return getattr(ieee, op)(x, y, rounding)


def arith(op: str, dtype: str = "float32"):
    """out[r, i] = op(x[i], y[i], z[i]) rounded in mode r (unary ops read x only)."""
    if op not in ARITH_OPS:
        raise ValueError(f"op: expected one of {ARITH_OPS}, got {op!r}")
    n = T.dynamic("n")

    @T.prim_func
    def ieee_arith(
        x: T.Tensor((n,), dtype), y: T.Tensor((n,), dtype), z: T.Tensor((n,), dtype), out: T.Tensor((4, n), dtype)
    ):
        with T.Kernel(T.ceildiv(n, BLOCK), threads=BLOCK) as bx:
            for i in T.Parallel(BLOCK):
                j = bx * BLOCK + i
                if j < n:
                    out[0, j] = _apply(op, x[j], y[j], z[j], "rn")
                    out[1, j] = _apply(op, x[j], y[j], z[j], "rz")
                    out[2, j] = _apply(op, x[j], y[j], z[j], "ru")
                    out[3, j] = _apply(op, x[j], y[j], z[j], "rd")

    return ieee_arith


def convert(with_prelude: bool = False):
    """All tlx.ieee conversions of x at once; ``with_prelude`` passes tlx.ieee.PRELUDE to
    ``T.Kernel`` itself (needed when the compile does not run tlx's prelude pass)."""
    n = T.dynamic("n")
    prelude = ieee.PRELUDE if with_prelude else None

    @T.prim_func
    def ieee_convert(
        x: T.Tensor((n,), "float32"),
        bf16: T.Tensor((n,), "bfloat16"),
        e4m3: T.Tensor((n,), "float8_e4m3fn"),
        e5m2: T.Tensor((n,), "float8_e5m2"),
        e2m1: T.Tensor((n,), "uint8"),
        ue8m0: T.Tensor((n,), "uint8"),
        scale: T.Tensor((n,), "float32"),
    ):
        with T.Kernel(T.ceildiv(n, BLOCK), threads=BLOCK, prelude=prelude) as bx:
            for i in T.Parallel(BLOCK):
                j = bx * BLOCK + i
                if j < n:
                    bf16[j] = ieee.cast_bf16(x[j])
                    e4m3[j] = ieee.cast_fp8_e4m3(x[j])
                    e5m2[j] = ieee.cast_fp8_e5m2(x[j])
                    e2m1[j] = ieee.cast_fp4_e2m1(x[j])
                    ue8m0[j] = ieee.ue8m0_code(x[j])
                    scale[j] = ieee.ue8m0_scale(x[j])

    return ieee_convert


def conversion_sweep(ref, chunk: int):
    """All 2^32 fp32 inputs through the conversion kernel, ``ref``'s CUDA intrinsics and its
    specification (every output poisoned first): yields ``(x, name, tlx_out, cuda_out, spec_out)``
    per chunk and conversion. The exhaustive test and the parity benchmark share this loop."""
    import torch

    import tlx
    from tlx.numerics.sweep import all_fp32_chunks, poisoned

    kernel = tlx.jit(convert)()
    dtypes = [getattr(torch, d) for _, d in CONVERSIONS]
    bit_dtypes = [getattr(torch, d) for d in CONVERSION_BITS]
    for x in all_fp32_chunks(chunk):
        got = [poisoned(chunk, d) for d in dtypes]
        cuda = [poisoned(chunk, d) for d in bit_dtypes]
        spec = [poisoned(chunk, d) for d in bit_dtypes]
        kernel(x, *got)
        ref.convert_cuda(x, *cuda)
        ref.convert_spec(x, *spec)
        for (name, _), g, c, s in zip(CONVERSIONS, got, cuda, spec):
            yield x, name, g, c, s
