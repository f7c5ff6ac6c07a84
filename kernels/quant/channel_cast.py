"""Per-channel cast with transpose (the weight-gradient path): ``[T, H]`` -> e4m3 ``[H, T]``
with one fp32 scale per 128 tokens of a channel, ``[H, ceil(T / 128)]`` (rules in ``reference.py``).

A CTA owns 128 tokens x ``CH`` channels. Rows go to shared memory untransposed with 16-byte
accesses (all of a thread's loads issued first); a warp then reads one 16-token group, each
lane two adjacent channels per 4- or 8-byte shared load (a warp reads one contiguous row
segment: conflict-free). amax is combined across the 8 token groups through shared memory;
each thread quantizes 16 tokens of its channels into one 16-byte piece per channel. With
``stage`` the pieces are transposed through a swizzled shared tile so that every warp store
writes whole 128-byte lines of Q's rows. T is dynamic; a partial last block of tokens is
allowed (T a multiple of 16).
"""

import torch
import tilelang.language as T

import tlx
from kernels.quant.block_cast import PRELUDE, put_e4m3x4
from kernels.quant.common import TARGET, TORCH_DTYPES, check_2d, check_cuda, group_scale

TOKENS = 128
GROUP = 16  # tokens per thread: one 16-byte e4m3 piece of a channel row
CHANNELS = 64  # H must be a multiple of this
CTA_THREADS = 256


@tlx.jit(target=TARGET)
def channel_cast_kernel(H: int, in_dtype: str, pow2: bool = False, CH: int = 64, stage: bool = True):
    # Tokens as [T / 16, 16] so the compiler proves the 16-byte stores of Q's rows aligned.
    T16 = T.dynamic("T16")
    Tn = T16 * 16
    lane = 16 // (2 if in_dtype == "bfloat16" else 4)  # elements per 16-byte load
    row_lanes = CH // lane  # threads per token row in the load phase
    passes = TOKENS * row_lanes // CTA_THREADS
    pairs = CH // 2 // 32  # channel pairs per thread (a warp covers 32 pairs)
    groups = TOKENS // GROUP  # 8 = warps: warp w reads token group w
    pieces = CH * groups // CTA_THREADS  # 16-byte output pieces per thread in the staged store

    def widen(x, at):
        """Exact fp32 of element ``at`` of the local array ``x`` (bf16: its bits in the high half,
        taken from the 32-bit word of its pair)."""
        if in_dtype == "bfloat16":
            w = T.reinterpret(x[T.Ramp(at // 2 * 2, 1, 2)], T.uint32)
            return T.reinterpret(T.if_then_else(at % 2 == 0, w << T.uint32(16), w & T.uint32(0xFFFF0000)), T.float32)
        return x[at]

    @T.prim_func
    def kernel(X: T.Tensor((T16, 16, H), in_dtype), Q: T.Tensor((H, T16, 16), T.float8_e4m3fn),
               S: T.Tensor((H, T.ceildiv(T16, TOKENS // 16)), T.float32)):
        with T.Kernel(H // CH, T.ceildiv(Tn, TOKENS), threads=CTA_THREADS, prelude=PRELUDE) as (bx, by):
            tx = T.get_thread_binding()
            tile = T.alloc_shared((TOKENS, CH), in_dtype)
            red = T.alloc_shared((groups, CH), T.float32)
            inv_s = T.alloc_shared((CH,), T.float32)
            out = T.alloc_shared((CH, TOKENS), T.float8_e4m3fn)
            xv = T.alloc_local((passes * lane,), in_dtype)
            xp = T.alloc_local((GROUP * 2,), in_dtype)
            xf = T.alloc_local((pairs * 2 * GROUP,), T.float32)
            qv = T.alloc_local((GROUP,), T.float8_e4m3fn)
            amax = T.alloc_var(T.float32)
            total = T.alloc_var(T.float32)
            inv = T.alloc_var(T.float32)
            t0 = by * TOKENS
            h0 = bx * CH
            for i in T.unroll(passes):
                r = tx // row_lanes + CTA_THREADS // row_lanes * i
                if t0 + r < Tn:
                    for v in T.vectorized(lane):
                        xv[i * lane + v] = X[(t0 + r) // 16, r % 16, h0 + tx % row_lanes * lane + v]
                else:
                    for v in T.vectorized(lane):
                        xv[i * lane + v] = T.Cast(in_dtype, 0)
            for i in T.unroll(passes):
                for v in T.vectorized(lane):
                    tile[tx // row_lanes + CTA_THREADS // row_lanes * i, tx % row_lanes * lane + v] = xv[i * lane + v]
            T.sync_threads()
            g = tx // 32
            for k in T.unroll(pairs):
                cp = tx % 32 + 32 * k
                for j in T.unroll(GROUP):
                    for v in T.vectorized(2):
                        xp[j * 2 + v] = tile[g * GROUP + j, cp * 2 + v]
                for j in T.unroll(GROUP):
                    for v in T.unroll(2):
                        xf[(k * 2 + v) * GROUP + j] = widen(xp, j * 2 + v)
                for v in T.unroll(2):
                    amax = T.float32(0)
                    for j in T.unroll(GROUP):
                        amax = T.max(amax, T.abs(xf[(k * 2 + v) * GROUP + j]))
                    red[g, cp * 2 + v] = amax
            T.sync_threads()
            if tx < CH:  # one thread per channel: the scale and its reciprocal
                total = T.float32(0)
                for w in T.unroll(groups):
                    total = T.max(total, red[w, tx])
                scale, _ = group_scale(total, "e4m3", pow2)
                inv_s[tx] = T.float32(1.0) / scale
                S[h0 + tx, by] = scale
            T.sync_threads()
            for k in T.unroll(pairs):
                cp = tx % 32 + 32 * k
                for v in T.unroll(2):
                    ch = cp * 2 + v
                    inv = inv_s[ch]
                    for j in T.unroll(GROUP // 4):
                        put_e4m3x4(qv, 4 * j, *[xf[(k * 2 + v) * GROUP + 4 * j + e] * inv for e in range(4)])
                    if stage:
                        # piece g of row ch at slot g ^ (ch / 2 % 8): conflict-free for both access patterns
                        for j in T.vectorized(GROUP):
                            out[ch, (g ^ (ch // 2 % 8)) * GROUP + j] = qv[j]
                    elif t0 + g * GROUP < Tn:
                        for j in T.vectorized(GROUP):
                            Q[h0 + ch, t0 // 16 + g, j] = qv[j]
            if stage:
                T.sync_threads()
                for i in T.unroll(pieces):
                    ch = tx // groups + CTA_THREADS // groups * i
                    p = tx % groups
                    if t0 + p * GROUP < Tn:
                        for j in T.vectorized(GROUP):
                            Q[h0 + ch, t0 // 16 + p, j] = out[ch, (p ^ (ch // 2 % 8)) * GROUP + j]

    return kernel


def per_channel_cast_transpose(x: torch.Tensor, pow2: bool = False):
    """bf16/fp32 ``[T, H]`` -> (e4m3 ``[H, T]``, fp32 scales ``[H, ceil(T / 128)]``).

    H must be a multiple of 64 and T of 16 (16-byte aligned rows of the transposed output).
    """
    check_2d("x", x, TORCH_DTYPES, CHANNELS)
    t, h = x.shape
    if t % 16:
        raise ValueError(f"x: {t} tokens is not a multiple of 16 (rows of the [H, T] output must stay 16-byte aligned)")
    check_cuda(x=x)
    q = torch.empty((h, t), dtype=torch.float8_e4m3fn, device=x.device)
    s = torch.empty((h, (t + TOKENS - 1) // TOKENS), dtype=torch.float32, device=x.device)
    if t:
        channel_cast_kernel(h, TORCH_DTYPES[x.dtype], bool(pow2))(x.view(t // 16, 16, h), q.view(h, t // 16, 16), s)
    return q, s
