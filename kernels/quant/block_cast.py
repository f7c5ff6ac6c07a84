"""Per-block FP8 cast of weights: ``[N, K]`` -> e4m3 ``[N, K]`` plus one fp32 scale per
``block x block`` tile (128 or 32), rules in ``reference.py``; also the FP4 -> FP8 re-blocking
of MXFP4 weights into such tiles.

A CTA owns a ``block x 128`` strip: 16 lanes cover a 128-wide row (8 elements each, 16-byte
loads), a thread keeps ``block / 16`` rows in registers, amax is reduced with ``shfl_xor`` over
the lanes of one tile and across the 8 warps through shared memory, then every thread derives
the tile's scale itself (no second barrier) and stores its rows, four e4m3 per conversion pair.
One pass over the data; N is dynamic.

MXFP4 input is decoded exactly to fp16 pairs (``dequant.e2m1_f16_pair``). A row whose UE8M0
code is at most 252 cannot overflow fp32 in ``x = v * 2^(code-127)``, so ``x * inv`` equals
``v * (2^(code-127) * inv)``: one fp16 multiply by that power of two (exact for every product
e4m3 can hold; smaller ones round to e4m3 zero either way) and one fp16 -> e4m3 conversion per
pair. Rows with codes 253..255 take the rule as written in fp32.
"""

import torch
import tilelang.language as T

import tlx
from kernels.quant.common import TARGET, TORCH_DTYPES, check_2d, check_cuda, group_scale, ue8m0_value
from kernels.quant.dequant import e2m1_f16_pair, f16_half, word
from kernels.quant.reference import E4M3_CLAMP, E4M3_MAX

BLOCKS = (32, 128)
WIDTH = 128  # columns per CTA
LANE_ELEMS = 8
CTA_THREADS = 256

# Four fp32 -> four e4m3 bytes in two conversions (cvt.rn.satfinite.e4m3x2.f32), written as
# one 32-bit word: the same rounding, saturation and NaN rule as tlx.ieee.cast_fp8_e4m3, element
# by element, without the byte shuffling of four scalar conversions.
PRELUDE = r"""
#ifndef QUANT_E4M3X4_
#define QUANT_E4M3X4_
#include <cuda_fp8.h>
__device__ __forceinline__ void quant_put_e4m3x4(void* q, float a, float b, float c, float d) {
  unsigned lo = __nv_cvt_float2_to_fp8x2(make_float2(a, b), __NV_SATFINITE, __NV_E4M3);
  unsigned hi = __nv_cvt_float2_to_fp8x2(make_float2(c, d), __NV_SATFINITE, __NV_E4M3);
  *static_cast<unsigned*>(q) = lo | hi << 16;
}
#endif
#ifndef QUANT_E2M1_F16_
#define QUANT_E2M1_F16_
#include <cuda_fp16.h>
// Largest |value| of the fp16 pairs p0..p3 (exact e2m1 values, no NaN), as fp32.
__device__ __forceinline__ float quant_absmax_f16x8(unsigned p0, unsigned p1, unsigned p2, unsigned p3) {
  __half2 a = __hmax2(__habs2(*reinterpret_cast<__half2*>(&p0)), __habs2(*reinterpret_cast<__half2*>(&p1)));
  __half2 b = __hmax2(__habs2(*reinterpret_cast<__half2*>(&p2)), __habs2(*reinterpret_cast<__half2*>(&p3)));
  __half2 m = __hmax2(a, b);
  return fmaxf(__low2float(m), __high2float(m));
}
// q[0:8] = e4m3(v * m) for the fp16 pairs p_h = (v_h, v_h+4): one fp16 multiply per value,
// exact while v * m is an fp16 normal (m a power of two, |v * m| <= 448; smaller products
// become e4m3 zeros either way), m clamped to a finite fp16.
__device__ __forceinline__ void quant_put_e4m3x8_f16(void* q, unsigned p0, unsigned p1, unsigned p2, unsigned p3, float m) {
  __half2 m2 = __half2half2(__float2half_rn(fminf(m, 65504.0f)));
  unsigned p[4] = {p0, p1, p2, p3}, r[4];
  #pragma unroll
  for (int h = 0; h < 4; ++h) {
    __half2 v = __hmul2(*reinterpret_cast<__half2*>(&p[h]), m2);
    r[h] = __nv_cvt_halfraw2_to_fp8x2(static_cast<__half2_raw>(v), __NV_SATFINITE, __NV_E4M3);
  }
  unsigned a = r[0] | r[1] << 16, b = r[2] | r[3] << 16;  // bytes v0 v4 v1 v5 | v2 v6 v3 v7
  static_cast<unsigned*>(q)[0] = __byte_perm(a, b, 0x6420);
  static_cast<unsigned*>(q)[1] = __byte_perm(a, b, 0x7531);
}
#endif
"""


def pow2_scale(amax):
    """(scale, 1 / scale) of an e4m3 tile with power-of-two scales, equal to ``group_scale(amax,
    "e4m3", True)`` and its IEEE reciprocal, by integer ops: ``s = max(amax, C) / F`` is a positive
    normal or +inf, so its round-up code is the exponent plus one when any mantissa bit is set,
    saturated at 254; ``1 / 2^(code - 127)`` has exponent ``254 - code`` (2^-127, a denormal, for 254)."""
    u = T.uint32
    s = T.max(amax, T.float32(E4M3_CLAMP)) / T.float32(E4M3_MAX)
    bits = T.reinterpret(s, u)
    code = T.min((bits >> u(23)) + T.Cast(u, (bits & u(0x7FFFFF)) != u(0)), u(254))
    inv = T.if_then_else(code == u(254), u(0x00400000), (u(254) - code) << u(23))
    return T.reinterpret(code << u(23), T.float32), T.reinterpret(inv, T.float32)


def absmax_f16x8(pr, at):
    """fp32 max |v| over the fp16 pairs ``pr[at:at + 4]`` (``prelude=PRELUDE``)."""
    return T.call_extern("float32", "quant_absmax_f16x8", pr[at], pr[at + 1], pr[at + 2], pr[at + 3])


def put_e4m3x8_f16(q, at, pr, pat, m):
    """``q[at:at + 8]`` = e4m3 of the pairs ``pr[pat:pat + 4]`` times ``m`` (``prelude=PRELUDE``)."""
    return T.evaluate(T.call_extern("handle", "quant_put_e4m3x8_f16", T.address_of(q[at]), pr[pat], pr[pat + 1], pr[pat + 2], pr[pat + 3], m))


def put_e4m3x4(q, at, a, b, c, d):
    """``q[at:at + 4] = e4m3(a, b, c, d)``; ``at`` a multiple of 4, the kernel built with ``prelude=PRELUDE``."""
    return T.evaluate(T.call_extern("handle", "quant_put_e4m3x4", T.address_of(q[at]), a, b, c, d))


@tlx.jit(target=TARGET)
def block_cast_kernel(K: int, block: int, in_dtype: str, pow2: bool = False, min_blocks: int = 0, tiles: int = 1):
    """``in_dtype`` "bfloat16"/"float32" (X ``[N, K]``) or "e2m1" (MXFP4: X ``[N, K/2]`` uint8 and
    UE8M0 codes C ``[N, K/32]``, re-blocked with power-of-two scales). ``min_blocks`` > 0 asks
    nvcc for that many resident CTAs per SM (``__launch_bounds__``), capping registers; an e2m1
    CTA re-blocks ``tiles`` tiles down the rows, issuing all their loads first."""
    N = T.dynamic("N")
    rows = block // 16  # rows per thread, 16 apart
    nb = WIDTH // block  # tiles per CTA
    col_bits = (block // LANE_ELEMS).bit_length() - 1  # lane bits 0..col_bits-1 and bit 4 share a tile (max 4)
    elems = rows * LANE_ELEMS

    @T.macro
    def tile_amax(amax_in, red, t, tx, cb):
        """Each warp's max over tile ``cb`` into ``red[t, warp, cb]``, then a CTA barrier."""
        amax = T.alloc_var(T.float32)
        amax = amax_in
        for k in T.unroll(min(col_bits, 4) + 1):
            amax = T.max(amax, T.shfl_xor(amax, T.if_then_else(k < col_bits, 1 << k, 16)))
        if tx % 32 < 16 and tx % (block // LANE_ELEMS) == 0:
            red[t, tx // 32, cb] = amax
        T.sync_threads()

    def scale_inv(total):
        """(scale, 1 / scale) of a tile with amax ``total``: every thread derives them itself."""
        if pow2:
            return pow2_scale(total)
        scale, _ = group_scale(total, "e4m3", False)
        return scale, T.float32(1.0) / scale

    @T.macro
    def store(qv, Q, r0, c0):
        for i in T.unroll(rows):
            for v in T.vectorized(LANE_ELEMS):
                Q[r0 + 16 * i, c0 + v] = qv[i * LANE_ELEMS + v]

    if in_dtype == "e2m1":
        nt = N // block  # tiles down the rows

        @T.prim_func
        def kernel(X: T.Tensor((N, K // 2), T.uint8), C: T.Tensor((N, K // 32), T.uint8),
                   Q: T.Tensor((N, K), T.float8_e4m3fn), S: T.Tensor((N // block, K // block), T.float32)):
            with T.Kernel(K // WIDTH, T.ceildiv(nt, tiles), threads=CTA_THREADS, prelude=PRELUDE) as (bx, by):
                if min_blocks:
                    T.annotate_min_blocks_per_sm(min_blocks)
                tx = T.get_thread_binding()
                red = T.alloc_shared((tiles, CTA_THREADS // 32, nb), T.float32)
                xb = T.alloc_local((tiles * rows * 4,), T.uint8)
                cv = T.alloc_local((tiles * rows,), T.uint8)
                pr = T.alloc_local((rows * 4,), T.uint32)
                qv = T.alloc_local((elems,), T.float8_e4m3fn)
                amax = T.alloc_var(T.float32)
                total = T.alloc_var(T.float32)
                c0 = bx * WIDTH + tx % 16 * LANE_ELEMS
                cb = tx % 16 * LANE_ELEMS // block
                for t in T.unroll(tiles):  # every tile's loads first
                    if by * tiles + t < nt:
                        for i in T.unroll(rows):
                            for v in T.vectorized(4):
                                xb[(t * rows + i) * 4 + v] = X[(by * tiles + t) * block + tx // 16 + 16 * i, c0 // 2 + v]
                            cv[t * rows + i] = C[(by * tiles + t) * block + tx // 16 + 16 * i, c0 // 32]
                for t in T.unroll(tiles):
                    if by * tiles + t < nt:
                        amax = T.float32(0)
                        for i in T.unroll(rows):
                            for h in T.unroll(4):
                                pr[i * 4 + h] = e2m1_f16_pair(word(xb, (t * rows + i) * 4), h)
                            # max |v * sc| of the row = max|v| * sc: the rounding is monotonic, sc >= 0
                            amax = T.max(amax, absmax_f16x8(pr, i * 4) * ue8m0_value(T.Cast(T.uint32, cv[t * rows + i])))
                        tile_amax(amax, red, t, tx, cb)
                        total = T.float32(0)
                        for w in T.unroll(CTA_THREADS // 32):
                            total = T.max(total, red[t, w, cb])
                        scale, inv = scale_inv(total)
                        if tx < 16 and tx % (block // LANE_ELEMS) == 0:
                            S[by * tiles + t, bx * nb + cb] = scale
                        for i in T.unroll(rows):
                            sc = ue8m0_value(T.Cast(T.uint32, cv[t * rows + i]))
                            if cv[t * rows + i] <= T.uint8(252):
                                put_e4m3x8_f16(qv, i * 8, pr, i * 4, sc * inv)
                            else:
                                for e in T.unroll(2):
                                    put_e4m3x4(qv, i * 8 + e * 4, *[f16_half(pr[i * 4 + h], e) * sc * inv for h in range(4)])
                        store(qv, Q, (by * tiles + t) * block + tx // 16, c0)

        return kernel

    @T.prim_func
    def kernel(X: T.Tensor((N, K), in_dtype), Q: T.Tensor((N, K), T.float8_e4m3fn), S: T.Tensor((N // block, K // block), T.float32)):
        with T.Kernel(K // WIDTH, N // block, threads=CTA_THREADS, prelude=PRELUDE) as (bx, by):
            if min_blocks:
                T.annotate_min_blocks_per_sm(min_blocks)
            tx = T.get_thread_binding()
            red = T.alloc_shared((1, CTA_THREADS // 32, nb), T.float32)
            xv = T.alloc_local((elems,), in_dtype)
            xf = T.alloc_local((elems,), T.float32)
            qv = T.alloc_local((elems,), T.float8_e4m3fn)
            amax = T.alloc_var(T.float32)
            total = T.alloc_var(T.float32)
            r0 = by * block + tx // 16
            c0 = bx * WIDTH + tx % 16 * LANE_ELEMS
            for i in T.unroll(rows):
                for v in T.vectorized(LANE_ELEMS):
                    xv[i * LANE_ELEMS + v] = X[r0 + 16 * i, c0 + v]
            amax = T.float32(0)
            for v in T.unroll(elems):
                xf[v] = T.Cast(T.float32, xv[v])
                amax = T.max(amax, T.abs(xf[v]))
            cb = tx % 16 * LANE_ELEMS // block
            tile_amax(amax, red, 0, tx, cb)
            total = T.float32(0)
            for w in T.unroll(CTA_THREADS // 32):
                total = T.max(total, red[0, w, cb])
            scale, inv = scale_inv(total)
            if tx < 16 and tx % (block // LANE_ELEMS) == 0:
                S[by, bx * nb + cb] = scale
            for v in T.unroll(elems // 4):
                put_e4m3x4(qv, 4 * v, *[xf[4 * v + e] * inv for e in range(4)])
            store(qv, Q, r0, c0)

    return kernel


def per_block_cast(w: torch.Tensor, block: int = 128, pow2: bool = False):
    """bf16/fp32 ``[N, K]`` -> (e4m3 ``[N, K]``, fp32 scales ``[N / block, K / block]``).

    N must be a multiple of ``block`` and K a multiple of 128 (weights are padded upstream).
    """
    if block not in BLOCKS:
        raise ValueError(f"block: expected one of {BLOCKS}, got {block!r}")
    check_2d("w", w, TORCH_DTYPES, WIDTH)
    n, k = w.shape
    if n % block:
        raise ValueError(f"w: {n} rows is not a multiple of block {block}")
    check_cuda(w=w)
    q = torch.empty((n, k), dtype=torch.float8_e4m3fn, device=w.device)
    s = torch.empty((n // block, k // block), dtype=torch.float32, device=w.device)
    if n:
        block_cast_kernel(k, block, TORCH_DTYPES[w.dtype], bool(pow2))(w, q, s)
    return q, s


def fp4_to_fp8_blocks(packed: torch.Tensor, codes: torch.Tensor, block: int = 128):
    """MXFP4 (``[N, K/2]`` uint8, ``[N, K/32]`` UE8M0) -> e4m3 ``[N, K]`` with power-of-two
    fp32 scales per ``block x block`` tile (lossless re-blocking of FP4 expert weights for Hopper)."""
    if block not in BLOCKS:
        raise ValueError(f"block: expected one of {BLOCKS}, got {block!r}")
    check_2d("packed", packed, (torch.uint8,), WIDTH // 2)
    n, k = packed.shape[0], packed.shape[1] * 2
    check_2d("codes", codes, (torch.uint8,))
    if tuple(codes.shape) != (n, k // 32):
        raise ValueError(f"codes: expected shape {(n, k // 32)}, got {tuple(codes.shape)}")
    if n % block:
        raise ValueError(f"packed: {n} rows is not a multiple of block {block}")
    check_cuda(packed=packed, codes=codes)
    q = torch.empty((n, k), dtype=torch.float8_e4m3fn, device=packed.device)
    s = torch.empty((n // block, k // block), dtype=torch.float32, device=packed.device)
    if n:
        block_cast_kernel(k, block, "e2m1", True)(packed, codes, q, s)
    return q, s
