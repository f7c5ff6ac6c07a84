"""Cast back: e4m3 or e2m1 plus scales -> bf16/fp32 (``x = float(q) * scale``, one fp32
multiply, then round to nearest even), rules in ``reference.py``.

- :func:`dequant_e4m3`: e4m3 ``[M, N]`` with fp32 scales of ``1 x G`` groups (``[M, N/G]``)
  or of ``B x B`` blocks (``[M/B, N/B]``).
- :func:`dequant_e2m1`: MXFP4 ``[M, N/2]`` uint8 with UE8M0 codes ``[M, N/32]``.

A thread owns 16 consecutive elements (one 16-byte e4m3 or 8-byte e2m1 load, one scale) and
writes 32 or 64 bytes with 16-byte stores. M is dynamic.
"""

import torch
import tilelang.language as T

import tlx
from kernels.quant.common import EPT, TARGET, THREADS, TORCH_DTYPES, check_2d, check_cuda, e2m1_value, ue8m0_value

OUT_DTYPES = {torch.bfloat16: "bfloat16", torch.float32: "float32"}


@tlx.jit(target=TARGET)
def dequant_kernel(N: int, in_fmt: str, block_rows: int, block_cols: int, out_dtype: str):
    """``in_fmt`` "e4m3" (fp32 scales of ``block_rows x block_cols`` tiles) or "e2m1" (UE8M0 per 1x32)."""
    M = T.dynamic("M")
    cpr = N // EPT
    if in_fmt == "e2m1":
        q_shape, q_dtype, s_shape, s_dtype = (M, N // 2), T.uint8, (M, N // 32), T.uint8
    else:
        q_shape, q_dtype = (M, N), T.float8_e4m3fn
        s_shape, s_dtype = (T.ceildiv(M, block_rows), N // block_cols), T.float32

    @T.prim_func
    def kernel(Q: T.Tensor(q_shape, q_dtype), S: T.Tensor(s_shape, s_dtype), Y: T.Tensor((M, N), out_dtype)):
        with T.Kernel(T.ceildiv(M * cpr, THREADS), threads=THREADS) as bx:
            tx = T.get_thread_binding()
            yv = T.alloc_local((EPT,), out_dtype)
            sc = T.alloc_var(T.float32)
            c = bx * THREADS + tx
            row = c // cpr
            col = c % cpr * EPT
            if c < M * cpr:
                if in_fmt == "e2m1":
                    qb = T.alloc_local((EPT // 2,), T.uint8)
                    for v in T.vectorized(EPT // 2):
                        qb[v] = Q[row, col // 2 + v]
                    sc = ue8m0_value(T.Cast(T.uint32, S[row, col // 32]))
                    for v in T.unroll(EPT // 2):
                        yv[2 * v] = T.Cast(out_dtype, e2m1_value(T.Cast(T.uint32, qb[v]) & T.uint32(15)) * sc)
                        yv[2 * v + 1] = T.Cast(out_dtype, e2m1_value(T.Cast(T.uint32, qb[v]) >> T.uint32(4)) * sc)
                else:
                    qv = T.alloc_local((EPT,), T.float8_e4m3fn)
                    for v in T.vectorized(EPT):
                        qv[v] = Q[row, col + v]
                    sc = S[row // block_rows, col // block_cols]
                    for v in T.unroll(EPT):
                        yv[v] = T.Cast(out_dtype, T.Cast(T.float32, qv[v]) * sc)
                for v in T.vectorized(EPT):
                    Y[row, col + v] = yv[v]

    return kernel


def _out_dtype(out_dtype) -> str:
    if out_dtype not in OUT_DTYPES:
        raise TypeError(f"out_dtype: expected torch.bfloat16 or torch.float32, got {out_dtype}")
    return OUT_DTYPES[out_dtype]


def dequant_e4m3(q: torch.Tensor, s: torch.Tensor, block: tuple[int, int] = (1, 128), out_dtype=torch.bfloat16):
    """e4m3 ``[M, N]`` and fp32 scales ``[ceil(M / block[0]), N / block[1]]`` -> ``out_dtype`` ``[M, N]``."""
    out = _out_dtype(out_dtype)
    br, bc = block
    if br not in (1, 32, 128) or bc not in (32, 64, 128) or (br > 1 and br != bc):
        raise ValueError(f"block: expected (1, 32|64|128) or (32, 32) or (128, 128), got {block!r}")
    check_2d("q", q, (torch.float8_e4m3fn,), bc)
    m, n = q.shape
    check_2d("s", s, (torch.float32,))
    if tuple(s.shape) != ((m + br - 1) // br, n // bc):
        raise ValueError(f"s: expected shape {((m + br - 1) // br, n // bc)} for block {block}, got {tuple(s.shape)}")
    check_cuda(q=q, s=s)
    y = torch.empty((m, n), dtype=out_dtype, device=q.device)
    if m:
        dequant_kernel(n, "e4m3", br, bc, out)(q, s, y)
    return y


def dequant_e2m1(packed: torch.Tensor, codes: torch.Tensor, out_dtype=torch.bfloat16):
    """MXFP4 ``[M, N/2]`` uint8 and UE8M0 codes ``[M, N/32]`` uint8 -> ``out_dtype`` ``[M, N]``."""
    out = _out_dtype(out_dtype)
    check_2d("packed", packed, (torch.uint8,), 16)
    m, n = packed.shape[0], packed.shape[1] * 2
    check_2d("codes", codes, (torch.uint8,))
    if tuple(codes.shape) != (m, n // 32):
        raise ValueError(f"codes: expected shape {(m, n // 32)}, got {tuple(codes.shape)}")
    check_cuda(packed=packed, codes=codes)
    y = torch.empty((m, n), dtype=out_dtype, device=packed.device)
    if m:
        dequant_kernel(n, "e2m1", 1, 32, out)(packed, codes, y)
    return y
