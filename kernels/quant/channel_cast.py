"""Per-channel cast with transpose (the weight-gradient path): ``[T, H]`` -> e4m3 ``[H, T]``
with one fp32 scale per 128 tokens of a channel, ``[H, ceil(T / 128)]`` (rules in ``reference.py``).

A CTA owns 128 tokens x 64 channels: 16-byte row loads go to shared memory transposed (rows
padded to an odd number of 4-byte words, so the column reads below are conflict-free); each
warp then reads 32 tokens of 32 channels, amax is combined across the 4 token quarters through
shared memory, and every thread writes its 32 e4m3 bytes with two 16-byte stores. T is
dynamic; a partial last block of tokens is allowed (T a multiple of 16, for aligned stores).
"""

import torch
import tilelang.language as T

import tlx
from kernels.quant.common import TARGET, TORCH_DTYPES, cast_e4m3, check_2d, check_cuda, group_scale

TOKENS = 128
CHANNELS = 64
CTA_THREADS = 256


@tlx.jit(target=TARGET)
def channel_cast_kernel(H: int, in_dtype: str, pow2: bool = False):
    # Tokens as [T / 16, 16] so the compiler proves the 16-byte stores of Q's rows aligned.
    T16 = T.dynamic("T16")
    Tn = T16 * 16
    lane = 16 // (2 if in_dtype == "bfloat16" else 4)  # elements per 16-byte load
    loads = 8 // lane  # 16-byte loads per 8-channel chunk
    pad = 2 if in_dtype == "bfloat16" else 1  # row length an odd number of 4-byte words

    @T.prim_func
    def kernel(X: T.Tensor((T16, 16, H), in_dtype), Q: T.Tensor((H, T16, 16), T.float8_e4m3fn),
               S: T.Tensor((H, T.ceildiv(T16, TOKENS // 16)), T.float32)):
        with T.Kernel(H // CHANNELS, T.ceildiv(Tn, TOKENS), threads=CTA_THREADS) as (bx, by):
            tx = T.get_thread_binding()
            tile = T.alloc_shared((CHANNELS, TOKENS + pad), in_dtype)
            red = T.alloc_shared((4, CHANNELS), T.float32)
            xv = T.alloc_local((8,), in_dtype)
            xf = T.alloc_local((32,), T.float32)
            qv = T.alloc_local((32,), T.float8_e4m3fn)
            amax = T.alloc_var(T.float32)
            total = T.alloc_var(T.float32)
            inv = T.alloc_var(T.float32)
            t0 = by * TOKENS
            h0 = bx * CHANNELS
            c8 = tx % 8
            for i in T.unroll(4):
                r = tx // 8 + 32 * i
                if t0 + r < Tn:
                    for l in T.unroll(loads):
                        for v in T.vectorized(lane):
                            xv[l * lane + v] = X[(t0 + r) // 16, r % 16, h0 + c8 * 8 + l * lane + v]
                else:
                    for v in T.unroll(8):
                        xv[v] = T.Cast(in_dtype, 0)
                for k in T.unroll(8):
                    tile[c8 * 8 + k, r] = xv[k]
            T.sync_threads()
            ch = tx // 32 % 2 * 32 + tx % 32
            p = tx // 64
            amax = T.float32(0)
            for j in T.unroll(32):
                xf[j] = T.Cast(T.float32, tile[ch, p * 32 + j])
                amax = T.max(amax, T.abs(xf[j]))
            red[p, ch] = amax
            T.sync_threads()
            total = T.max(T.max(red[0, ch], red[1, ch]), T.max(red[2, ch], red[3, ch]))
            scale, _ = group_scale(total, "e4m3", pow2)
            inv = T.float32(1.0) / scale
            for j in T.unroll(32):
                qv[j] = cast_e4m3(xf[j] * inv)
            for half in T.unroll(2):
                if t0 + p * 32 + half * 16 < Tn:
                    for v in T.vectorized(16):
                        Q[h0 + ch, (t0 + p * 32) // 16 + half, v] = qv[half * 16 + v]
            if p == 0:
                S[h0 + ch, by] = scale

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
