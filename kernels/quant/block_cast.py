"""Per-block FP8 cast of weights: ``[N, K]`` -> e4m3 ``[N, K]`` plus one fp32 scale per
``block x block`` tile (128 or 32), rules in ``reference.py``.

A CTA owns a ``block x 128`` strip: 16 lanes cover a 128-wide row (8 elements each, 16-byte
loads), a thread keeps ``block / 16`` rows in registers, amax is reduced with ``shfl_xor`` over
the lanes of one tile and across the 8 warps through shared memory, then the strip is scaled
and stored. One pass over the data; N is dynamic.
"""

import torch
import tilelang.language as T

import tlx
from kernels.quant.common import TARGET, TORCH_DTYPES, cast_e4m3, check_2d, check_cuda, e2m1_value, group_scale, ue8m0_value

BLOCKS = (32, 128)
WIDTH = 128  # columns per CTA
LANE_ELEMS = 8
CTA_THREADS = 256


@tlx.jit(target=TARGET)
def block_cast_kernel(K: int, block: int, in_dtype: str, pow2: bool = False):
    """``in_dtype`` "bfloat16"/"float32" (X ``[N, K]``) or "e2m1" (MXFP4: X ``[N, K/2]`` uint8 and
    UE8M0 codes C ``[N, K/32]``, decoded exactly: FP4 -> FP8 re-blocking into 128x128 tiles)."""
    N = T.dynamic("N")
    rows = block // 16  # rows per thread
    nb = WIDTH // block  # tiles per CTA
    col_bits = (block // LANE_ELEMS).bit_length() - 1  # lane bits 0..col_bits-1 and bit 4 share a tile (max 4)
    elems = rows * LANE_ELEMS

    @T.macro
    def finish(xf, Q, S, tx, bx, by, r0, c0, cb):
        red = T.alloc_shared((CTA_THREADS // 32, nb), T.float32)
        qv = T.alloc_local((elems,), T.float8_e4m3fn)
        amax = T.alloc_var(T.float32)
        total = T.alloc_var(T.float32)
        inv = T.alloc_var(T.float32)
        amax = T.float32(0)
        for v in T.unroll(elems):
            amax = T.max(amax, T.abs(xf[v]))
        for k in T.unroll(min(col_bits, 4) + 1):
            amax = T.max(amax, T.shfl_xor(amax, T.if_then_else(k < col_bits, 1 << k, 16)))
        if tx % 32 < 16 and tx % (block // LANE_ELEMS) == 0:
            red[tx // 32, cb] = amax
        T.sync_threads()
        total = T.float32(0)
        for w in T.unroll(CTA_THREADS // 32):
            total = T.max(total, red[w, cb])
        scale, _ = group_scale(total, "e4m3", pow2)
        inv = T.float32(1.0) / scale
        for v in T.unroll(elems):
            qv[v] = cast_e4m3(xf[v] * inv)
        for i in T.unroll(rows):
            for v in T.vectorized(LANE_ELEMS):
                Q[r0 + 16 * i, c0 + v] = qv[i * LANE_ELEMS + v]
        if tx < 16 and tx % (block // LANE_ELEMS) == 0:
            S[by, bx * nb + cb] = scale

    if in_dtype == "e2m1":

        @T.prim_func
        def kernel(X: T.Tensor((N, K // 2), T.uint8), C: T.Tensor((N, K // 32), T.uint8),
                   Q: T.Tensor((N, K), T.float8_e4m3fn), S: T.Tensor((N // block, K // block), T.float32)):
            with T.Kernel(K // WIDTH, N // block, threads=CTA_THREADS) as (bx, by):
                tx = T.get_thread_binding()
                xb = T.alloc_local((rows * LANE_ELEMS // 2,), T.uint8)
                xf = T.alloc_local((elems,), T.float32)
                sc = T.alloc_var(T.float32)
                r0 = by * block + tx // 16
                c0 = bx * WIDTH + tx % 16 * LANE_ELEMS
                for i in T.unroll(rows):
                    for v in T.vectorized(LANE_ELEMS // 2):
                        xb[i * LANE_ELEMS // 2 + v] = X[r0 + 16 * i, c0 // 2 + v]
                    sc = ue8m0_value(T.Cast(T.uint32, C[r0 + 16 * i, c0 // 32]))
                    for v in T.unroll(LANE_ELEMS // 2):
                        xf[i * LANE_ELEMS + 2 * v] = e2m1_value(T.Cast(T.uint32, xb[i * LANE_ELEMS // 2 + v]) & T.uint32(15)) * sc
                        xf[i * LANE_ELEMS + 2 * v + 1] = e2m1_value(T.Cast(T.uint32, xb[i * LANE_ELEMS // 2 + v]) >> T.uint32(4)) * sc
                finish(xf, Q, S, tx, bx, by, r0, c0, tx % 16 * LANE_ELEMS // block)

        return kernel

    @T.prim_func
    def kernel(X: T.Tensor((N, K), in_dtype), Q: T.Tensor((N, K), T.float8_e4m3fn), S: T.Tensor((N // block, K // block), T.float32)):
        with T.Kernel(K // WIDTH, N // block, threads=CTA_THREADS) as (bx, by):
            tx = T.get_thread_binding()
            xv = T.alloc_local((elems,), in_dtype)
            xf = T.alloc_local((elems,), T.float32)
            r0 = by * block + tx // 16
            c0 = bx * WIDTH + tx % 16 * LANE_ELEMS
            for i in T.unroll(rows):
                for v in T.vectorized(LANE_ELEMS):
                    xv[i * LANE_ELEMS + v] = X[r0 + 16 * i, c0 + v]
            for v in T.unroll(elems):
                xf[v] = T.Cast(T.float32, xv[v])
            finish(xf, Q, S, tx, bx, by, r0, c0, tx % 16 * LANE_ELEMS // block)

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
