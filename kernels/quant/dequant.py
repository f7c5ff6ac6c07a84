"""Cast back: e4m3 or e2m1 plus scales -> bf16/fp32 (``x = float(q) * scale``, one fp32
multiply, then round to nearest even), rules in ``reference.py``.

- :func:`dequant_e4m3`: e4m3 ``[M, N]`` with fp32 scales of ``1 x G`` groups (``[M, N/G]``)
  or of ``B x B`` blocks (``[M/B, N/B]``).
- :func:`dequant_e2m1`: MXFP4 ``[M, N/2]`` uint8 with UE8M0 codes ``[M, N/32]``.

A thread owns ``CHUNKS`` pieces of 16 output bytes (8 bf16 / 4 fp32; e2m1: whole 32-bit code
words, 8 elements), a CTA-wide stride apart, so each warp store covers 512 contiguous bytes; all
loads (values and scales) are issued before the first store. On the H200 this reached 89-92% of
copy bandwidth where one 16-byte load and two 16-byte stores 32 bytes apart per thread reached
80%; 2 pieces measured best (1, 4, 8 within 3%). Tried for MXFP4 on the H200 (session 4, against
77.3-77.6 us here, 89.7% of copy): persistent CTAs walking the tiles with the next tile's loads
issued before the current stores, 61-66%; warps owning 64-128 consecutive pieces whose UE8M0
bytes arrive in one coalesced load and reach the pieces by shuffle (a warp here reads 8 bytes of
a scale sector), 77.1-78.1 us with L2 throughput unchanged (86% under ncu). M is dynamic.
"""

import torch
import tilelang.language as T

import tlx
from kernels.quant.common import TARGET, THREADS, TORCH_DTYPES, check_2d, check_cuda, ue8m0_value

OUT_DTYPES = {torch.bfloat16: "bfloat16", torch.float32: "float32"}
CHUNKS = 2

# The high bytes of the fp16 values of the e2m1 magnitudes 0, 0.5, 1, 1.5 | 2, 3, 4, 6 (their
# low bytes are all zero): a byte-permute table indexed by the 3-bit magnitude code.
E2M1_F16_TABLE = (0x3E3C3800, 0x46444240)


def byte_perm(a, b, sel):
    """CUDA ``__byte_perm`` (PRMT): byte ``n`` of the result is byte ``sel[4n:4n+3]`` of ``b:a``."""
    return T.call_extern("uint32", "__byte_perm", a, b, sel)


def e2m1_f16_pair(w, i):
    """uint32 holding the exact fp16 values of e2m1 codes ``i`` (low half) and ``i + 4`` (high
    half) of the 8 codes packed in ``w`` (code ``k`` in bits ``4k..4k+3``), ``0 <= i < 4``.

    The bytes of ``w`` are reordered to 0, 2, 1, 3 so that the magnitudes of codes i and i + 4
    sit 8 bits apart and index the fp16 table in one PRMT; their sign bits, 16 apart in ``w``,
    land on bits 15 and 31 with one shift."""
    u = T.uint32
    x = byte_perm(w, u(0), u(0x3120))
    y = T.if_then_else(i < 2, x << u(4), x >> u(12))
    mag = byte_perm(u(E2M1_F16_TABLE[0]), u(E2M1_F16_TABLE[1]), (y >> T.Cast("uint32", 4 * (i % 2))) & u(0x7070))
    return mag | ((w << T.Cast("uint32", 12 - 4 * i)) & u(0x80008000))


def f16_half(p, hi: int):
    """Half ``hi`` of a uint32 holding two fp16 values, as an exact fp32."""
    return T.Cast(T.float32, T.reinterpret(T.Cast(T.uint16, (p >> T.uint32(16 * hi)) & T.uint32(0xFFFF)), T.float16))


def word(b, at):
    """Little-endian uint32 from 4 uint8 of the local array ``b`` starting at ``at``."""
    return (T.Cast(T.uint32, b[at]) | (T.Cast(T.uint32, b[at + 1]) << T.uint32(8))
            | (T.Cast(T.uint32, b[at + 2]) << T.uint32(16)) | (T.Cast(T.uint32, b[at + 3]) << T.uint32(24)))


@tlx.jit(target=TARGET)
def dequant_kernel(N: int, in_fmt: str, block_rows: int, block_cols: int, out_dtype: str):
    """``in_fmt`` "e4m3" (fp32 scales of ``block_rows x block_cols`` tiles) or "e2m1" (UE8M0 per 1x32)."""
    M = T.dynamic("M")
    chunks = CHUNKS
    vec = 8 if in_fmt == "e2m1" or out_dtype == "bfloat16" else 4  # elements per piece
    cpr = N // vec
    if in_fmt == "e2m1":
        q_shape, q_dtype, s_shape, s_dtype = (M, N // 2), T.uint8, (M, N // 32), T.uint8
        qn = vec // 2
    else:
        q_shape, q_dtype = (M, N), T.float8_e4m3fn
        s_shape, s_dtype = (T.ceildiv(M, block_rows), N // block_cols), T.float32
        qn = vec

    @T.prim_func
    def kernel(Q: T.Tensor(q_shape, q_dtype), S: T.Tensor(s_shape, s_dtype), Y: T.Tensor((M, N), out_dtype)):
        with T.Kernel(T.ceildiv(M * cpr, THREADS * chunks), threads=THREADS) as bx:
            tx = T.get_thread_binding()
            qv = T.alloc_local((chunks * qn,), q_dtype)
            sv = T.alloc_local((chunks,), s_dtype)
            yv = T.alloc_local((vec,), out_dtype)
            for j in T.unroll(chunks):
                c = (bx * chunks + j) * THREADS + tx
                if c < M * cpr:
                    for v in T.vectorized(qn):
                        qv[j * qn + v] = Q[c // cpr, c % cpr * qn + v]
                    if in_fmt == "e2m1":
                        sv[j] = S[c // cpr, c % cpr * vec // 32]
                    else:
                        sv[j] = S[c // cpr // block_rows, c % cpr * vec // block_cols]
            for j in T.unroll(chunks):
                c = (bx * chunks + j) * THREADS + tx
                if c < M * cpr:
                    if in_fmt == "e2m1":
                        sc = ue8m0_value(T.Cast(T.uint32, sv[j]))
                        for i in T.unroll(vec // 8):
                            for h in T.unroll(4):
                                pair = e2m1_f16_pair(word(qv, j * qn + i * 4), h)
                                yv[i * 8 + h] = T.Cast(out_dtype, f16_half(pair, 0) * sc)
                                yv[i * 8 + h + 4] = T.Cast(out_dtype, f16_half(pair, 1) * sc)
                    else:
                        for v in T.unroll(vec):
                            yv[v] = T.Cast(out_dtype, T.Cast(T.float32, qv[j * qn + v]) * sv[j])
                    for v in T.vectorized(vec):
                        Y[c // cpr, c % cpr * vec + v] = yv[v]

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
