"""Per-channel cast with transpose (the weight-gradient path): ``[T, H]`` -> e4m3 ``[H, T]``
with one fp32 scale per 128 tokens of a channel, ``[H, ceil(T / 128)]`` (rules in ``reference.py``).

A CTA owns 64 channels and ``BLOCKS`` (2) consecutive blocks of 128 tokens. All its
blocks are copied at the start, untransposed, into a shared tile each with 16-byte ``cp.async``
(no registers hold them, so 4 CTAs fit an SM in 64 registers: 8 blocks, 128 KB, in flight per
SM); per block, warp ``g`` then reads token group ``g`` (16 tokens), each lane two adjacent
channels per 4- or 8-byte shared load (a warp reads one contiguous row segment: conflict-free).
amax is combined across the 8 token groups through shared memory, each thread derives the scales
of its two channels, and quantizes its 16 tokens of two channels into one 16-byte piece per
channel. The pieces are transposed through a padded shared tile so that every warp store writes
whole 128-byte lines of Q's rows (16-byte stores straight from registers, 32 rows per warp
store, ran at 55% of copy instead of 87%). The CTA's scales leave together at the end, a warp
storing ``32 / BLOCKS`` channels' adjacent scales instead of 32 scattered words per block.
Measured on H200 at T = 16384, H = 7168. Session 3, blocks staged through registers (3 CTAs per
SM): one block per CTA 86% of copy, two 88.7%, three or four 86.6%, 128 channels per CTA 80%,
streaming (``st.global.cs``) stores no gain. Session 4: cp.async 93.6 us (88.7%) against 93.7 us
for the register staging at boost clocks, but 89.9 against 95.7 us under ncu's locked 1.4 GHz
SM clock (DRAM 78% against 74% busy); 3 CTAs per SM the same, 3 blocks per CTA 94.2 us. Worse
than this grid of short CTAs: persistent CTAs walking the blocks 82% (the last round of blocks
runs on a fraction of them), blocks taken token-first in groups of 16 or 64 (4 KB runs of Q's
rows, 3 KB of X's) 75%, TMA loads into 2-4 stage rings of persistent CTAs 78-79%.
T is dynamic; a partial last block of tokens is allowed (T a multiple of 16).
"""

import torch
import tilelang.language as T

import tlx
from kernels.quant.block_cast import PRELUDE, put_e4m3x4
from kernels.quant.common import TARGET, TORCH_DTYPES, check_2d, check_cuda, group_scale

TOKENS = 128
GROUP = 16  # tokens per thread: one 16-byte e4m3 piece of a channel row
CHANNELS = 64  # per CTA; H must be a multiple of this
BLOCKS = 2  # 128-token blocks per CTA
CTA_THREADS = 256


@tlx.jit(target=TARGET)
def channel_cast_kernel(H: int, in_dtype: str, pow2: bool = False):
    """X ``[T, H]`` -> Q ``[H, T]``, S ``[H, ceil(T / 128)]``; a CTA casts ``BLOCKS`` consecutive
    128-token blocks of its 64 channels. bf16 asks nvcc for 4 resident CTAs per SM
    (``__launch_bounds__``: 64 registers; uncapped it takes 72, 3 per SM); fp32 asks nothing (its
    tiles take 77 KB of shared memory: 2 per SM)."""
    # Tokens as [T / 16, 16] so the compiler proves the 16-byte stores of Q's rows aligned.
    T16 = T.dynamic("T16")
    min_blocks = 4 if in_dtype == "bfloat16" else 0  # the bf16 tiles take 44.5 KB of shared memory
    CH = CHANNELS
    NB = BLOCKS
    Tn = T16 * 16
    lane = 16 // (2 if in_dtype == "bfloat16" else 4)  # elements per 16-byte load
    row_lanes = CH // lane  # threads per token row in the load phase
    passes = TOKENS * row_lanes // CTA_THREADS
    groups = TOKENS // GROUP  # 8 = warps: warp w reads token group w
    pieces = CH * groups // CTA_THREADS  # 16-byte output pieces per thread in the staged store
    n_sc = CH * NB  # scales per CTA

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
        with T.Kernel(H // CH, T.ceildiv(Tn, TOKENS * NB), threads=CTA_THREADS, prelude=PRELUDE) as (bx, by):
            if min_blocks:
                T.annotate_min_blocks_per_sm(min_blocks)
            tx = T.get_thread_binding()
            tile = T.alloc_shared((NB, TOKENS, CH), in_dtype)  # one tile per block
            red = T.alloc_shared((groups, CH), T.float32)
            out = T.alloc_shared((CH, TOKENS + GROUP), T.float8_e4m3fn)  # rows padded by one piece
            sc = T.alloc_shared((n_sc,), T.float32)  # [channel, block]
            xp = T.alloc_local((GROUP * 2,), in_dtype)
            xf = T.alloc_local((2 * GROUP,), T.float32)
            qv = T.alloc_local((GROUP,), T.float8_e4m3fn)
            amax = T.alloc_local((2,), T.float32)
            part = T.alloc_local((2,), T.float32)
            inv = T.alloc_local((2,), T.float32)
            h0 = bx * CH
            g = tx // 32  # token group of this warp
            cp = tx % 32  # channel pair of this lane
            for k in T.unroll(NB):  # every block in flight at once: one cp.async group each
                for i in T.unroll(passes):
                    r = tx // row_lanes + CTA_THREADS // row_lanes * i
                    if (by * NB + k) * TOKENS + r < Tn:
                        T.ptx_cp_async(T.access_ptr(tile[k, r, tx % row_lanes * lane], "w", extent=lane),
                                       T.access_ptr(X[((by * NB + k) * TOKENS + r) // 16, r % 16, h0 + tx % row_lanes * lane],
                                                    "r", extent=lane), lane)
                    else:  # past T: zeros
                        for v in T.vectorized(lane):
                            tile[k, r, tx % row_lanes * lane + v] = T.Cast(in_dtype, 0)
                T.ptx_commit_group()
            for k in T.unroll(NB):
                t0 = (by * NB + k) * TOKENS
                if k + 1 < NB:  # block k's group is done when at most one is pending (an immediate count)
                    T.ptx_wait_group(1)
                else:
                    T.ptx_wait_group(0)
                T.sync_threads()
                for j in T.unroll(GROUP):
                    for v in T.vectorized(2):
                        xp[j * 2 + v] = tile[k, g * GROUP + j, cp * 2 + v]
                for j in T.unroll(GROUP):
                    for v in T.unroll(2):
                        xf[v * GROUP + j] = widen(xp, j * 2 + v)
                for v in T.unroll(2):
                    amax[v] = T.float32(0)
                    for j in T.unroll(GROUP):
                        amax[v] = T.max(amax[v], T.abs(xf[v * GROUP + j]))
                for v in T.vectorized(2):
                    red[g, cp * 2 + v] = amax[v]
                T.sync_threads()
                for v in T.unroll(2):
                    amax[v] = T.float32(0)
                for w in T.unroll(groups):
                    for v in T.vectorized(2):
                        part[v] = red[w, cp * 2 + v]
                    for v in T.unroll(2):
                        amax[v] = T.max(amax[v], part[v])
                for v in T.unroll(2):
                    scale, _ = group_scale(amax[v], "e4m3", pow2)
                    inv[v] = T.float32(1.0) / scale
                    if g == 0:
                        sc[(cp * 2 + v) * NB + k] = scale
                for v in T.unroll(2):
                    for j in T.unroll(GROUP // 4):
                        put_e4m3x4(qv, 4 * j, *[xf[v * GROUP + 4 * j + e] * inv[v] for e in range(4)])
                    # a quarter-warp's stores (rows 2 apart, pitch 9 pieces) share a bank group pairwise at most
                    for j in T.vectorized(GROUP):
                        out[cp * 2 + v, g * GROUP + j] = qv[j]
                T.sync_threads()
                for i in T.unroll(pieces):
                    ch = tx // groups + CTA_THREADS // groups * i
                    p = tx % groups
                    if t0 + p * GROUP < Tn:
                        for j in T.vectorized(GROUP):
                            Q[h0 + ch, t0 // 16 + p, j] = out[ch, p * GROUP + j]
            # the scales leave together: a warp writes 32 / NB channels' NB adjacent scales
            for i in T.unroll(-(-n_sc // CTA_THREADS)):
                e = tx + CTA_THREADS * i
                if e < n_sc and (by * NB + e % NB) * TOKENS < Tn:
                    S[h0 + e // NB, by * NB + e % NB] = sc[e]

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
