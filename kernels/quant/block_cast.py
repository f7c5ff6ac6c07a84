"""Per-block FP8 cast of weights: ``[N, K]`` -> e4m3 ``[N, K]`` plus one fp32 scale per
``block x block`` tile (128 or 32), rules in ``reference.py``; also the FP4 -> FP8 re-blocking
of MXFP4 weights into such tiles.

A CTA owns a ``block x 128`` strip: 16 lanes cover a 128-wide row (8 elements each, 16-byte
loads), a thread keeps ``block / 16`` rows in registers, amax is reduced with ``shfl_xor`` over
the lanes of one tile and across the 8 warps through shared memory, then every thread derives
the tile's scale itself (no second barrier) and stores its rows, four e4m3 per conversion pair.
One pass over the data; N is dynamic.

MXFP4 input never leaves the integers (``common.e2m1_e4m3_table``): a tile's UE8M0 code is the
max over its 16-code half groups of a key from their UE8M0 code and largest magnitude class, and
every output byte is a byte permute of a per-row table of the 8 e4m3 magnitudes at that row's
exponent offset, plus the code's sign. A CTA owns 128 rows x 256 columns: 16 lanes per row, 8
bytes in and 16 out each, so every warp access covers whole 128-byte lines; all loads issued
first (512 threads for 128x128 tiles, else 256; K not a multiple of 256: 128 columns).
"""

import torch
import tilelang.language as T

import tlx
from kernels.quant.common import (
    QUANT_PRELUDE, TARGET, TORCH_DTYPES, check_2d, check_cuda, e2m1_block_code, e2m1_block_key, e2m1_class,
    e2m1_e4m3_table, e2m1_e4m3_word, group_scale, ue8m0_value,
)
from kernels.quant.reference import E4M3_CLAMP, E4M3_MAX

BLOCKS = (32, 128)
WIDTH = 128  # columns per CTA
LANE_ELEMS = 8
CTA_THREADS = 256
E2M1_ROWS = 128  # rows per CTA of the MXFP4 path
E2M1_THREADS = 512  # 128x128 tiles at width 256: 4 rows per thread (H200: 256 threads 1.4% slower; 32x32 tiles or width 128: 13-24% faster with 256)

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


def put_e4m3x4(q, at, a, b, c, d):
    """``q[at:at + 4] = e4m3(a, b, c, d)``; ``at`` a multiple of 4, the kernel built with ``prelude=PRELUDE``."""
    return T.evaluate(T.call_extern("handle", "quant_put_e4m3x4", T.address_of(q[at]), a, b, c, d))


@tlx.jit(target=TARGET)
def block_cast_kernel(K: int, block: int, in_dtype: str, pow2: bool = False):
    """``in_dtype`` "bfloat16"/"float32" (X ``[N, K]``) or "e2m1" (MXFP4: X ``[N, K/2]`` uint8 and
    UE8M0 codes C ``[N, K/32]``, re-blocked with power-of-two scales)."""
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
        u = T.uint32
        width = 256 if K % 256 == 0 else WIDTH  # columns per CTA: 128-byte input rows when K allows
        lpr = width // 16  # lanes per row, 16 codes each: 8 bytes in, 16 bytes out
        threads = E2M1_THREADS if block == 128 and width == 256 else 256  # H200: 512 slower for the others
        passes = threads // lpr  # rows one pass of the CTA covers
        rpt = E2M1_ROWS // passes  # rows per thread
        nrt, nct = E2M1_ROWS // block, width // block  # tiles per CTA, down and across
        ipt = block // passes  # a thread's rows in one tile
        lpt = block // 16  # lanes of one tile row
        nt = N // block

        @T.prim_func
        def kernel(X: T.Tensor((N, K // 2), T.uint8), C: T.Tensor((N, K // 32), T.uint8),
                   Q: T.Tensor((N, K), T.float8_e4m3fn), S: T.Tensor((N // block, K // block), T.float32)):
            with T.Kernel(K // width, T.ceildiv(N, E2M1_ROWS), threads=threads, prelude=QUANT_PRELUDE) as (bx, by):
                tx = T.get_thread_binding()
                red = T.alloc_shared((nrt, nct, threads // 32), u)
                xw = T.alloc_local((2 * rpt,), u)
                cv = T.alloc_local((rpt,), T.uint8)
                tab = T.alloc_local((2,), u)
                qw = T.alloc_local((4,), u)
                rk = T.alloc_local((threads // 32,), u)
                key = T.alloc_var(u)
                cls = T.alloc_var(u)
                code = T.alloc_var(u)
                Xw = T.view(X, (N, K // 8), u)
                Qw = T.view(Q, (N, K // 4), u)
                j = tx % lpr
                r0 = by * E2M1_ROWS + tx // lpr
                for i in T.unroll(rpt):  # every load first
                    if by * nrt + i // ipt < nt:
                        for v in T.vectorized(2):
                            xw[2 * i + v] = Xw[r0 + passes * i, bx * (width // 8) + 2 * j + v]
                        cv[i] = C[r0 + passes * i, bx * (width // 32) + j // 2]
                    else:
                        for v in T.vectorized(2):
                            xw[2 * i + v] = u(0)
                        cv[i] = T.uint8(0)
                for t in T.unroll(nrt):
                    key = u(0)
                    for i in T.unroll(ipt):
                        cls = e2m1_class(xw[2 * (t * ipt + i)], xw[2 * (t * ipt + i) + 1])
                        key = T.max(key, e2m1_block_key(T.Cast(u, cv[t * ipt + i]), cls))
                    for k in T.unroll((lpt.bit_length() - 1) + (32 // lpr).bit_length() - 1):  # the tile's lanes, then rows
                        key = T.max(key, T.shfl_xor(key, T.if_then_else(k < lpt.bit_length() - 1, 1 << k, lpr << (k - (lpt.bit_length() - 1)))))
                    if tx % 32 < lpr and j % lpt == 0:
                        red[t, j // lpt, tx // 32] = key
                T.sync_threads()
                for t in T.unroll(nrt):
                    for w in T.vectorized(threads // 32):
                        rk[w] = red[t, j // lpt, w]
                    key = u(0)
                    for w in T.unroll(threads // 32):
                        key = T.max(key, rk[w])
                    code = e2m1_block_code(key)
                    if by * nrt + t < nt:
                        if tx < lpr and j % lpt == 0:
                            S[by * nrt + t, bx * nct + j // lpt] = ue8m0_value(code)
                        for i in T.unroll(ipt):
                            e2m1_e4m3_table(tab, xw, 2 * (t * ipt + i), T.Cast(u, cv[t * ipt + i]), code)
                            for k in T.unroll(2):
                                qw[2 * k] = e2m1_e4m3_word(xw[2 * (t * ipt + i) + k], tab, 0)
                                qw[2 * k + 1] = e2m1_e4m3_word(xw[2 * (t * ipt + i) + k], tab, 1)
                            for v in T.vectorized(4):
                                Qw[r0 + passes * (t * ipt + i), bx * (width // 4) + 4 * j + v] = qw[v]

        return kernel

    @T.prim_func
    def kernel(X: T.Tensor((N, K), in_dtype), Q: T.Tensor((N, K), T.float8_e4m3fn), S: T.Tensor((N // block, K // block), T.float32)):
        with T.Kernel(K // WIDTH, N // block, threads=CTA_THREADS, prelude=PRELUDE) as (bx, by):
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
