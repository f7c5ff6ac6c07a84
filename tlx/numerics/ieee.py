"""``tlx.ieee``: correctly rounded arithmetic and exact conversions for TileLang kernels.

Every function returns a TIR expression to use inside a ``@T.prim_func`` body.

Arithmetic (fp32 and fp64 operands of one dtype; ``rounding`` is ``"rn"`` to nearest even,
``"rz"`` toward zero, ``"ru"`` toward +inf, ``"rd"`` toward -inf). Each is one IEEE-754
operation rounded once; it is never contracted, split or replaced by fast math:

- ``add(x, y)``, ``sub(x, y)``, ``mul(x, y)``, ``div(x, y)``, ``fma(x, y, z)`` (x*y+z, one
  rounding), ``sqrt(x)``, ``rcp(x)`` (1/x). fp32 lowers to CUDA's ``__fadd_rn``…``__frcp_rd``,
  fp64 to ``__dadd_rn``…``__drcp_rd`` and ``__fma_r?`` (through TileLang's ``T.ieee_*``).

Conversions (fp32 input; all round to nearest, ties to even, except ``ue8m0_*``):

- ``cast_bf16(x)`` -> bfloat16. Overflow rounds to ±inf as IEEE RNE does; ±inf and ±0 are
  kept; every NaN becomes the canonical NaN 0x7FFF. Denormal inputs are rounded, not flushed.
- ``cast_fp8_e4m3(x)`` -> float8_e4m3fn, saturating: every |x| beyond 448 (±inf included)
  becomes ±448 (0x7E/0xFE); ±0 keeps its sign; every NaN becomes 0x7F.
- ``cast_fp8_e5m2(x)`` -> float8_e5m2, saturating: every |x| beyond 57344 (±inf included)
  becomes ±57344 (0x7B/0xFB), never inf; ±0 keeps its sign; every NaN becomes 0x7F.
- ``cast_fp4_e2m1(x)`` -> uint8 holding the 4-bit code (bit 3 sign, values 0, 0.5, 1, 1.5, 2,
  3, 4, 6) in its low nibble. Saturating: |x| beyond 6 (±inf included) becomes ±6; ±0 and values
  rounding to zero keep their sign (e.g. -0.25 -> 0x8); every NaN becomes +6 (0x7).
- ``ue8m0_code(x)`` -> uint8 UE8M0 exponent code of the smallest power of two >= |x| (round
  up): ``clamp(ceil(log2|x|), -127, 127) + 127``. ±0 and anything at or below 2^-127 give 0x00;
  anything above 2^127 (±inf included) saturates to 0xFE; NaN gives 0xFF. The sign of x is
  ignored.
- ``ue8m0_decode(code)`` -> fp32 2^(code-127) (code 0 is the denormal 2^-127); 0xFF -> NaN.
- ``ue8m0_scale(x)`` -> fp32 ``ue8m0_decode(ue8m0_code(x))``: the power-of-two scale for a
  block whose ``amax / format_max`` is x.

The conversions are device functions in :data:`PRELUDE`, each one CUDA intrinsic with exactly
these semantics (``__float2bfloat16_rn``, ``__nv_cvt_float_to_fp8(x, __NV_SATFINITE, ...)``,
``__nv_cvt_float_to_fp4(x, __NV_E2M1, cudaRoundNearest)``,
``__nv_cvt_float_to_e8m0(x, __NV_SATFINITE, cudaRoundPosInf)``). Kernels compiled by
``@tlx.jit`` get the prelude injected by the ``numerics_ieee_prelude`` pass; a kernel built with
plain TileLang passes ``T.Kernel(..., prelude=tlx.ieee.PRELUDE)``.
"""

from __future__ import annotations

from tilelang import language as T
from tilelang import tvm

__all__ = [
    "EXTERN_PREFIX",
    "PRELUDE",
    "ROUNDING_MODES",
    "add",
    "cast_bf16",
    "cast_fp4_e2m1",
    "cast_fp8_e4m3",
    "cast_fp8_e5m2",
    "div",
    "fma",
    "mul",
    "rcp",
    "sqrt",
    "sub",
    "ue8m0_code",
    "ue8m0_decode",
    "ue8m0_scale",
]

ROUNDING_MODES = ("rn", "rz", "ru", "rd")
EXTERN_PREFIX = "tlx_ieee_"

PRELUDE = r"""
#ifndef TLX_IEEE_PRELUDE_
#define TLX_IEEE_PRELUDE_
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_fp4.h>
__device__ __forceinline__ unsigned short tlx_ieee_bf16_bits(float x) {
  return __bfloat16_as_ushort(__float2bfloat16_rn(x));
}
__device__ __forceinline__ unsigned char tlx_ieee_fp8_e4m3_bits(float x) {
  return __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3);
}
__device__ __forceinline__ unsigned char tlx_ieee_fp8_e5m2_bits(float x) {
  return __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E5M2);
}
__device__ __forceinline__ unsigned char tlx_ieee_fp4_e2m1_bits(float x) {
  return __nv_cvt_float_to_fp4(x, __NV_E2M1, cudaRoundNearest);
}
__device__ __forceinline__ unsigned char tlx_ieee_ue8m0_code(float x) {
  return __nv_cvt_float_to_e8m0(x, __NV_SATFINITE, cudaRoundPosInf);
}
__device__ __forceinline__ float tlx_ieee_ue8m0_decode(unsigned char code) {
  unsigned bits = code == 0xFFu ? 0x7FFFFFFFu : code == 0u ? 0x00400000u : (unsigned)code << 23;
  return __uint_as_float(bits);
}
__device__ __forceinline__ float tlx_ieee_ue8m0_scale(float x) {
  return tlx_ieee_ue8m0_decode(tlx_ieee_ue8m0_code(x));
}
#endif
"""

_ARITH_DTYPES = ("float32", "float64")


def _operands(op: str, *xs):
    exprs = [tvm.tirx.convert(x) for x in xs]
    dtypes = {str(e.dtype) for e in exprs}
    if len(dtypes) != 1 or next(iter(dtypes)) not in _ARITH_DTYPES:
        got = ", ".join(str(e.dtype) for e in exprs)
        raise TypeError(f"tlx.ieee.{op}: expected operands all float32 or all float64, got ({got})")
    return exprs


def _rounding(op: str, rounding: str) -> str:
    if rounding not in ROUNDING_MODES:
        raise ValueError(f"tlx.ieee.{op}: rounding expected one of {ROUNDING_MODES}, got {rounding!r}")
    return rounding


def add(x, y, rounding: str = "rn"):
    """x + y rounded once in ``rounding``."""
    return T.ieee_add(*_operands("add", x, y), _rounding("add", rounding))


def sub(x, y, rounding: str = "rn"):
    """x - y rounded once in ``rounding``."""
    return T.ieee_sub(*_operands("sub", x, y), _rounding("sub", rounding))


def mul(x, y, rounding: str = "rn"):
    """x * y rounded once in ``rounding``."""
    return T.ieee_mul(*_operands("mul", x, y), _rounding("mul", rounding))


def div(x, y, rounding: str = "rn"):
    """x / y rounded once in ``rounding`` (IEEE division, whatever the fast-math settings)."""
    return T.ieee_fdiv(*_operands("div", x, y), _rounding("div", rounding))


def fma(x, y, z, rounding: str = "rn"):
    """x * y + z with a single rounding in ``rounding``."""
    return T.ieee_fmaf(*_operands("fma", x, y, z), _rounding("fma", rounding))


def sqrt(x, rounding: str = "rn"):
    """Square root rounded once in ``rounding``."""
    return T.ieee_fsqrt(*_operands("sqrt", x), _rounding("sqrt", rounding))


def rcp(x, rounding: str = "rn"):
    """1 / x rounded once in ``rounding``."""
    return T.ieee_frcp(*_operands("rcp", x), _rounding("rcp", rounding))


def _fp32(op: str, x):
    e = tvm.tirx.convert(x)
    if str(e.dtype) != "float32":
        raise TypeError(f"tlx.ieee.{op}: expected a float32 operand, got {e.dtype}")
    return e


def _extern(dtype: str, name: str, *args):
    return T.call_extern(dtype, EXTERN_PREFIX + name, *args)


def cast_bf16(x):
    """fp32 -> bfloat16, round to nearest even (see the module docstring for specials)."""
    return T.reinterpret(_extern("uint16", "bf16_bits", _fp32("cast_bf16", x)), "bfloat16")


def cast_fp8_e4m3(x):
    """fp32 -> float8_e4m3fn, round to nearest even, saturating to ±448; NaN -> 0x7F."""
    return T.reinterpret(_extern("uint8", "fp8_e4m3_bits", _fp32("cast_fp8_e4m3", x)), "float8_e4m3fn")


def cast_fp8_e5m2(x):
    """fp32 -> float8_e5m2, round to nearest even, saturating to ±57344; NaN -> 0x7F."""
    return T.reinterpret(_extern("uint8", "fp8_e5m2_bits", _fp32("cast_fp8_e5m2", x)), "float8_e5m2")


def cast_fp4_e2m1(x):
    """fp32 -> e2m1 code in the low nibble of a uint8, RNE, saturating to ±6; NaN -> 0x7."""
    return _extern("uint8", "fp4_e2m1_bits", _fp32("cast_fp4_e2m1", x))


def ue8m0_code(x):
    """The UE8M0 code (uint8) of the smallest power of two >= |x|; NaN -> 0xFF."""
    return _extern("uint8", "ue8m0_code", _fp32("ue8m0_code", x))


def ue8m0_decode(code):
    """A UE8M0 code (uint8) as the fp32 power of two it stands for; 0xFF -> NaN."""
    e = tvm.tirx.convert(code)
    if str(e.dtype) != "uint8":
        raise TypeError(f"tlx.ieee.ue8m0_decode: expected a uint8 code, got {e.dtype}")
    return _extern("float32", "ue8m0_decode", e)


def ue8m0_scale(x):
    """The fp32 power of two ``ue8m0_decode(ue8m0_code(x))``: a block scale rounded up."""
    return _extern("float32", "ue8m0_scale", _fp32("ue8m0_scale", x))
