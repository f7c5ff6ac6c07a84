"""TIR building blocks shared by the quantization kernels (rules in ``reference.py``).

Each function returns a TIR expression for a ``@T.prim_func`` body. The reference conversions
come from ``tlx.ieee`` (CUDA's own fp8/fp4/e8m0 conversions, injected by ``@tlx.jit``); the CUDA
baselines spell the same operations in the same order (``quant_common.cuh``). The faster blocks
(``e2m1_nibble``, ``e2m1_pair_bf16``, ``e2m1_e4m3_table``, ``pow2_scale``,
``cast_e4m3x4``; their device helpers in ``QUANT_PRELUDE``) compute the same bits with fewer
instructions; ``tests/kernels/quant/test_quant_bits_gpu.py`` checks each against CUDA's own over
all its inputs.
"""

from __future__ import annotations

import torch
import tilelang.language as T

from tlx.numerics import determinism, ieee

from kernels.quant.reference import E2M1_CLAMP, E2M1_MAX, E4M3_CLAMP, E4M3_MAX

TARGET = {"kind": "cuda", "arch": "sm_90a"}
THREADS = 256
EPT = 16  # elements per thread: 32 bytes of bf16 / 64 of fp32 in flight, one 16-byte e4m3 store
INT32_LIMIT = 2**31 - 1

TORCH_DTYPES = {torch.bfloat16: "bfloat16", torch.float32: "float32"}


def fp32(v: float):
    return T.float32(v)


def group_scale(amax, fmt: str, pow2: bool):
    """(fp32 scale, uint8 UE8M0 code or None) for a group with ``amax`` (rules 2 and 3)."""
    clamp, fmax = (E4M3_CLAMP, E4M3_MAX) if fmt == "e4m3" else (E2M1_CLAMP, E2M1_MAX)
    s = T.max(amax, fp32(clamp)) / fp32(fmax)
    if not pow2:
        return s, None
    code = ieee.ue8m0_code(s)  # rounded up; s is a positive normal number, so codes 1..254
    return ieee.ue8m0_decode(code), code


def pow2_scale(amax, fmt: str):
    """(fp32 scale, uint32 UE8M0 code, fp32 1/scale) of a power-of-two group scale, equal to
    :func:`group_scale` with ``pow2`` and to the IEEE reciprocal, in a few integer ops.

    ``s = max(amax, C) / F`` is a positive normal fp32 or +inf (amax is never NaN), so its
    round-up code is its exponent plus one when any mantissa bit is set, saturated at 254 (what
    ``ue8m0_code`` returns); ``1 / 2^(code-127) = 2^(127-code)`` is exact: exponent ``254 - code``,
    or the denormal 2^-127 for code 254."""
    u = T.uint32
    clamp, fmax = (E4M3_CLAMP, E4M3_MAX) if fmt == "e4m3" else (E2M1_CLAMP, E2M1_MAX)
    s = T.max(amax, fp32(clamp)) / fp32(fmax)
    code = T.min(((T.reinterpret(s, u) & u(0x7FFFFFFF)) + u(0x7FFFFF)) >> u(23), u(254))  # sign bit is 0
    inv = T.if_then_else(code == u(254), u(0x00400000), (u(254) - code) << u(23))
    return T.reinterpret(code << u(23), T.float32), code, T.reinterpret(inv, T.float32)


def cast_e4m3(v):
    """fp32 -> e4m3: RNE, saturating to ±448, NaN -> 0x7F (``tlx.ieee``)."""
    return ieee.cast_fp8_e4m3(v)


def e2m1_code(v):
    """fp32 -> e2m1 code in a uint8: RNE (ties to the even code), saturating, NaN -> 0x7 (``tlx.ieee``)."""
    return ieee.cast_fp4_e2m1(v)


def e2m1_value(code):
    """4-bit e2m1 code (uint32) -> exact fp32, built from bits: 0.5 for code 1, 2^(m/2-1)*(1+m%2/2) above."""
    m = code & T.uint32(7)
    mag = T.if_then_else(
        m >= T.uint32(2),
        ((m >> T.uint32(1)) + T.uint32(126)) << T.uint32(23) | ((m & T.uint32(1)) << T.uint32(22)),
        T.if_then_else(m == T.uint32(1), T.uint32(0x3F000000), T.uint32(0)),
    )
    return T.reinterpret(mag | ((code & T.uint32(8)) << T.uint32(28)), T.float32)


def e2m1_nibble(v):
    """fp32 -> uint32 whose low 4 bits are the e2m1 code of ``v``, bit-identical to
    :func:`e2m1_code` (checked on all 2^32 inputs) but in ten ALU instructions, not CUDA's
    branchy fp64 path (sm_90 has no e2m1 cvt); bits 4 and up are zero.

    ``c`` clamps to ±6 (NaN -> +6: fminf keeps the number). A magic ``m`` with the sign of ``c``
    and the exponent of ``2^22 * max(|c|, 1)`` makes the fp32 add ``c + m`` round ``|c|`` to the
    e2m1 spacing of its binade (0.5 below 2, 1 below 4, then 2), ties to even; ``m``'s mantissa
    (16, 18, 20 for the three binades) turns the rounded quotient into ``16 + code``, and bit 3
    takes the sign from ``s >> 28``."""
    u = T.uint32
    c = T.max(T.min(v, fp32(6.0)), fp32(-6.0))
    # sign of c over the exponent 127, 128 or 129 of max(|c|, 1): the sign's 256 in e puts
    # m's sign bit on and 512 more ulps in its mantissa, which change neither rounding nor code
    e = ((T.reinterpret(c, u) & u(0x80000000)) | T.reinterpret(T.max(T.abs(c), fp32(1.0)), u)) >> u(23)
    m = e * u(0x800002) + u(0x0AFFFF12)
    s = T.reinterpret(c + T.reinterpret(m, T.float32), u)
    return (s & u(7)) | ((s >> u(28)) & u(8))


def pack_nibble(acc, nibble):
    """``acc >> 4`` with the low 4 bits of ``nibble`` on top (one funnel shift): eight calls
    pack eight codes, the first in the lowest nibble."""
    return T.call_extern("uint32", "__funnelshift_r", acc, nibble, 4)


def bf16_word_half(w, hi):
    """Half ``hi`` of a uint32 holding two bf16 values, as the exact fp32 (one ALU op)."""
    u = T.uint32
    return T.reinterpret(T.if_then_else(hi == 1, w & u(0xFFFF0000), w << u(16)), T.float32)


def cast_e4m3x4(a, b, c, d):
    """Four fp32 -> four e4m3 bytes (``a`` lowest) in a uint32, two per cvt instruction: the same
    conversion as :func:`cast_e4m3` (``QUANT_PRELUDE``)."""
    u = T.uint32
    lo = T.Cast(u, T.call_extern("uint16", "tlx_quant_e4m3x2", a, b))
    hi = T.Cast(u, T.call_extern("uint16", "tlx_quant_e4m3x2", c, d))
    return lo | (hi << u(16))


QUANT_PRELUDE = r"""
#ifndef TLX_QUANT_PRELUDE_
#define TLX_QUANT_PRELUDE_
#include <cuda_fp8.h>
// lo -> low byte, hi -> high byte; the cvt of tlx.ieee.cast_fp8_e4m3 on two values at once.
__device__ __forceinline__ unsigned short tlx_quant_e4m3x2(float lo, float hi) {
  return __nv_cvt_float2_to_fp8x2(make_float2(lo, hi), __NV_SATFINITE, __NV_E4M3);
}
// One PTX instruction each on two bf16 packed in a 32-bit word: IEEE, round to nearest even,
// subnormals kept; min/max return the non-NaN operand; absmax = max.xorsign.abs (|result| is
// max(|a|, |b|), its sign the xor of the signs).
#define TLX_QUANT_BF16X2(name, op)                                       \
  __device__ __forceinline__ unsigned tlx_quant_bf16x2_##name(unsigned a, unsigned b) { \
    unsigned d;                                                          \
    asm(op " %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));                   \
    return d;                                                            \
  }
TLX_QUANT_BF16X2(mul, "mul.rn.bf16x2")
TLX_QUANT_BF16X2(add, "add.rn.bf16x2")
TLX_QUANT_BF16X2(min, "min.bf16x2")
TLX_QUANT_BF16X2(max, "max.bf16x2")
TLX_QUANT_BF16X2(absmax, "max.xorsign.abs.bf16x2")
#undef TLX_QUANT_BF16X2
#endif
"""
# Register-only helpers: the determinism analysis may treat their calls as arithmetic.
determinism.declare_pure("tlx_quant_e4m3x2", *(f"tlx_quant_bf16x2_{op}" for op in ("mul", "add", "min", "max", "absmax")))


def bf16x2(op: str, a, b):
    """``op`` ("mul", "add", "min", "max", "absmax") on two bf16 packed in uint32 words, one PTX
    instruction (``QUANT_PRELUDE``)."""
    return T.call_extern("uint32", f"tlx_quant_bf16x2_{op}", a, b)


def e2m1_pair_bf16(x2, inv2):
    """Two bf16 ``x2`` times the power of two ``inv2`` (bf16, both halves) -> uint32 ``s`` whose
    low byte holds both e2m1 codes but the high code's sign bit (bit 7 must get bit 31 of ``s``),
    as :func:`e2m1_nibble` does it on fp32 values, two at a time.

    ``x * inv`` is exact in bf16 as in fp32 (8 significant bits times a power of two) unless it
    is below 2^-126, where both give a zero code of the same sign. The magic ``m`` is that of
    :func:`e2m1_nibble` for bf16 (exponent of ``2^6 * max(|c|, 1)``, mantissa 16 + 2 per binade,
    sign of ``c``), built for both halves by one IMAD; ``s = c + m`` then holds the code in its
    mantissa bits 0..2 and the sign in bit 15 of each half."""
    u = T.uint32
    c = bf16x2("max", bf16x2("min", bf16x2("mul", x2, inv2), u(0x40C040C0)), u(0xC0C0C0C0))  # ±6; NaN -> 6
    e = (bf16x2("absmax", c, u(0x3F803F80)) >> u(7)) & u(0x00FF00FF)  # exponents of max(|c|, 1)
    m = e * u(0x82) + ((c & u(0x80008000)) | u(0x02120212))
    s = bf16x2("add", c, m)
    return s


def e2m1_byte(s):
    """Low byte: the two codes of :func:`e2m1_pair_bf16`'s ``s``, the high one still without its
    sign (bits 8 and up are garbage)."""
    u = T.uint32
    return (s & u(0x07)) | ((s >> u(12)) & u(0xFFFFFFF8))


def sign_bytes(s0, s1, s2, s3):
    """Byte ``k`` all ones when ``s_k`` is negative (PRMT sign replication of its byte 3)."""
    u = T.uint32
    lo = T.call_extern("uint32", "__byte_perm", s0, s1, u(0x00FB))
    hi = T.call_extern("uint32", "__byte_perm", s2, s3, u(0x00FB))
    return T.call_extern("uint32", "__byte_perm", lo, hi, u(0x5410))


def ue8m0_value(code):
    """UE8M0 code (uint32, 1..254) -> fp32 2^(code-127)."""
    return T.reinterpret(code << T.uint32(23), T.float32)


def check_2d(name: str, t: torch.Tensor, dtypes, cols_multiple: int = 1) -> None:
    """Clear errors for a kernel wrapper's input: dtype, 2-D, contiguous, width, alignment, size."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in dtypes:
        raise TypeError(f"{name}: expected dtype in {[str(d) for d in dtypes]}, got {t.dtype}")
    if t.dim() != 2:
        raise ValueError(f"{name}: expected a 2-D tensor, got shape {tuple(t.shape)}")
    if not t.is_contiguous():
        raise ValueError(f"{name}: expected a contiguous tensor, got strides {t.stride()}")
    if t.shape[1] % cols_multiple:
        raise ValueError(f"{name}: width {t.shape[1]} is not a multiple of {cols_multiple}")
    if t.data_ptr() % 16:
        raise ValueError(f"{name}: data pointer 0x{t.data_ptr():x} is not 16-byte aligned (the kernels use 16-byte vector accesses)")
    if t.numel() > INT32_LIMIT:
        raise ValueError(f"{name}: {t.numel()} elements exceed the int32 index range of these kernels")


def check_cuda(**tensors: torch.Tensor) -> None:
    """All inputs on one CUDA device (checked last, so argument errors show first)."""
    devices = {t.device for t in tensors.values()}
    for name, t in tensors.items():
        if t.device.type != "cuda":
            raise ValueError(f"{name}: expected a CUDA tensor, got device {t.device}")
    if len(devices) > 1:
        raise ValueError(f"expected all inputs on one device, got {sorted(map(str, devices))}")


# --- MXFP4 -> e4m3 re-blocking with power-of-two scales, on integer bits -------------------------
# A block's UE8M0 code depends on its amax only through ceil(log2(amax / 448)) (rules 2, 3), and
# the ceiling is monotonic, so the block's code is the largest per-group code: a group with UE8M0
# code c whose largest |e2m1| has class k (below) needs c + k - 10 (max|v| / 7 lies in
# (2^(k-5), 2^(k-4)], never on a power of two, not even after the fp32 rounding of / 448).
# Every output byte is then the e4m3 of v * 2^(c - s): a byte-permute table per group.
# (Tests on these uint32 values compare int32 casts: TVM's bound solver cannot negate uint32.)


def _i32(v):
    return T.Cast(T.int32, v)


def e2m1_class(w0, w1):
    """Class of the largest magnitude among the 16 e2m1 codes of ``w0``, ``w1``: 0 (all zero),
    1 (0.5), 2 (1, 1.5), 3 (2, 3), 4 (4, 6). Magnitude bits m2 m1 m0 of each nibble: class 4 is
    m2 & m1 in some nibble, 3 is m2, 2 is m1, 1 is m0."""
    u = T.uint32
    o = w0 | w1
    p = (w0 & ((w0 & u(0x33333333)) << u(1))) | (w1 & ((w1 & u(0x33333333)) << u(1)))  # bit 2 of a nibble: m2 & m1
    return T.if_then_else(
        _i32(p & u(0x44444444)) != 0, u(4),
        T.if_then_else(_i32(o & u(0x44444444)) != 0, u(3),
                       T.if_then_else(_i32(o & u(0x22222222)) != 0, u(2),
                                      T.if_then_else(_i32(o & u(0x11111111)) != 0, u(1), u(0)))))


def e2m1_block_key(c, cls):
    """A group's bid for its block's UE8M0 code (blocks take the max): 0 for an all-zero group,
    ``c + cls`` for UE8M0 code ``c`` (uint32), 512 for code 255 (scale inf: amax inf). A key of
    257 or more means an fp32 ``v * 2^(c-127)`` overflows (``max|v| >= 2^(cls-2)``)."""
    u = T.uint32
    return T.if_then_else(cls == u(0), u(0), T.if_then_else(_i32(c) == 255, u(512), c + cls))


def e2m1_block_code(key):
    """UE8M0 code of the e4m3 block scale from the max :func:`e2m1_block_key`: ``key - 10``,
    at least 105 (the code of ``C / 448``: rule 2's clamp), 254 when the amax is inf (rule 3)."""
    u = T.uint32
    return T.min(T.if_then_else(key >= u(257), u(254), T.max(key, u(115)) - u(10)), u(254))  # min: a bound for the verifier


@T.macro
def e2m1_e4m3_table(tab, xw, at, c, s):
    """``tab[0:2]``: the e4m3 bytes of the 8 e2m1 magnitudes times ``2^(c-127)`` (UE8M0 code
    ``c``) times ``1 / 2^(s-127)`` (block code ``s``), byte ``m`` for magnitude code ``m``.

    When ``c <= 252`` and ``d = c - s >= -5`` every product ``v * 2^d`` is exact and, where the
    block can hold it, an e4m3 normal: the bytes of ``d = 0`` plus ``8 d`` each (zero stays 0;
    bytes of magnitudes the group does not hold may be garbage). Otherwise the rule as written
    (fp32 products, e4m3 cvt), and for code 255 (``0 * inf`` is NaN, e4m3 0x7F whatever its sign)
    the sign bits of zero codes in ``xw[at:at + 2]`` are cleared."""
    u = T.uint32
    c, s = T.min(c, u(255)), T.min(s, u(254))  # no-ops: bounds for the verifier
    d5 = _i32(c) + 5 - _i32(s)  # d + 5
    if _i32(c) <= 252 and d5 >= 0:
        e = T.Cast(u, T.min(d5, 15))  # larger d only for all-zero groups
        tab[0] = u(0x14100800) + e * u(0x08080800)
        tab[1] = u(0x24201C18) + e * u(0x08080808)
    else:
        sc = ue8m0_value(c)
        inv = T.reinterpret(T.if_then_else(_i32(s) == 254, u(0x00400000), T.Cast(u, 254 - _i32(s)) << u(23)), T.float32)
        tab[0] = (cast_e4m3x4(fp32(0.0), fp32(0.5) * sc * inv, fp32(1.0) * sc * inv, fp32(1.5) * sc * inv)
                  | T.if_then_else(_i32(c) == 255, u(0x7F), u(0)))
        tab[1] = cast_e4m3x4(fp32(2.0) * sc * inv, fp32(3.0) * sc * inv, fp32(4.0) * sc * inv, fp32(6.0) * sc * inv)
        if _i32(c) == 255:
            for k in T.unroll(2):
                xw[at + k] = e2m1_unsign_zeros(xw[at + k])


def e2m1_unsign_zeros(w):
    """The 8 e2m1 codes of ``w`` with -0 turned into +0: under scale inf (code 255) a zero
    decodes to NaN, which the rules convert without its sign (e4m3 0x7F, CUDA's canonical NaN)."""
    u = T.uint32
    nz = (w | (w >> u(1)) | (w >> u(2))) & u(0x11111111)  # bit 0 of a nibble: magnitude != 0
    return w & (u(0x77777777) | (nz << u(3)))


def e2m1_e4m3_word(w, tab, hi: int):
    """Codes ``4 hi .. 4 hi + 3`` of the uint32 ``w`` as four e4m3 bytes (:func:`e2m1_e4m3_table`):
    the magnitudes index the table (one PRMT), the signs come from a sign-replicating PRMT of
    ``w`` and ``w << 4`` (a code's sign bit is the top bit of a byte of one of them); the shift is
    a funnel shift: its discarded bits are meant, not an overflow."""
    u = T.uint32
    mag = (w >> u(16)) & u(0x7777) if hi else w & u(0x7777)
    w4 = T.call_extern("uint32", "__funnelshift_l", u(0), w, 4)  # w << 4
    signs = T.call_extern("uint32", "__byte_perm", w4, w, u(0xFBEA if hi else 0xD9C8))
    return T.call_extern("uint32", "__byte_perm", tab[0], tab[1], mag) | (signs & u(0x80808080))
