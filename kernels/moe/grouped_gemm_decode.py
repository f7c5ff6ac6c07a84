"""FP8 grouped GEMM for decode batches: the expert weights on the MMA's M side ("swap AB").

At a decode batch an expert holds a few routed rows (T = 8: about one) in a 128-row block of the
contiguous layout, so the GEMM is a stream of weight bytes. ``grouped_gemm_contiguous_kernel``
puts the rows on wgmma's M side (64 rows a warpgroup, nearly all padding) and reads each weight
row in 128-byte pieces, one K block a stage; the weight-bound V4 GEMMs ran at 82-88% of the copy
rate that way (H100, 2026-12-06), where a plain read of the same bytes reaches 96-100%. Here the
roles swap: a CTA computes ``C^T = B A^T`` for ``block_n`` weight rows (wgmma's M side, one
consumer warpgroup) and the block's first ``tokens`` rows (its N side: m64n{tokens}k32), so no
tensor-core work goes to padding rows beyond ``tokens``, the accumulators take ``tokens`` registers
a thread (two or three CTAs share an SM), and a stage holds ``group`` consecutive K blocks, their
TMA loads issued together (each weight row read as ``128 * group`` contiguous bytes).

The same bits as ``grouped_gemm_contiguous_kernel`` and ``grouped_gemm.cu`` on every routed row:
per 128-wide K block the products are summed in fp32 by a wgmma chain over K in steps of 32 from
zero (each output element is the same 32-product dot-product step whichever operand is on M), and
the block result is added to the total with ``fma(block, sa[row, kb] * sb[n // 128, kb], total)``,
K blocks ascending; the total is rounded to bf16 once. Only rows whose ``rows`` entry is >= 0 are
stored. Precondition of the call (``grouped_gemm_contiguous`` checks it): no expert holds more
than ``tokens`` rows, i.e. ``tokens`` bounds the batch's token count (an expert takes a token at
most once).
"""

import tilelang.language as T

import tlx
from kernels.moe.grouped_gemm import BLOCK_K, BLOCK_M, check_gemm_args, nblocks, nexp, nrows

TOKENS = (8, 16, 32, 64)  # the N sides this kernel takes (a bound on an expert's rows)
# Up to this many tokens a call takes this kernel by default (``decode_width``). On an H100
# (2026-12-07, ``bench/decode_gemm.py``, the same bits): at T = 8 the V4-Flash GEMMs read the weights
# at 98.5% / 97.3% of the copy rate against the persistent kernel's 93.1% / 91.1% (the layer as a
# CUDA graph 377.0 against 396.8 us, V4-Pro 1061.7 against 1098.4); at T = 64 L1 98.5% against 96.6%
# but L2 93.2% against 96.4%, the layer equal (1768.2 against 1760.5 us); 16 and 32 not yet timed.
DEFAULT_MAX_TOKENS = 8


def decode_width(tokens: int | None) -> int | None:
    """The N side (``TOKENS``) the layer's GEMMs take for a batch of ``tokens`` tokens, or None where
    the persistent kernel serves it better (above ``DEFAULT_MAX_TOKENS``) or the count is unknown."""
    if tokens is None or tokens > DEFAULT_MAX_TOKENS:
        return None
    return next(w for w in TOKENS if tokens <= w)


@tlx.jit(target={"kind": "cuda", "arch": "sm_90a"},
         pass_configs={"tl.disable_warp_specialized": True, "tl.disable_thread_storage_sync": True},
         assume=("NB <= 16777214", "R == NB * 128"))
def grouped_gemm_decode_kernel(n: int, k: int, tokens: int, block_n: int = 128, group: int = 2, num_stages: int = 3):
    """``(A [R, K], SA [R, K/128], B [E, N, K], SB [E, N/128, K/128], block_expert [R/128],
    rows [R], C [R, N])``: the contiguous layout's routed rows (entry >= 0) of C, for row blocks
    whose routed rows are among their first ``tokens``.

    Grid: (N / ``block_n``, row blocks); a CTA whose block has no expert (-1) leaves at once.
    Threads 0..127 are the consumer warpgroup (``block_n / 64`` m64n{tokens}k32 chains a K step,
    the promotion fma, the epilogue), thread 128 issues the TMA loads of a stage (``group`` K
    blocks of B's ``block_n`` rows and of A's first ``tokens`` rows) and threads 128.. below
    128 + ``tokens`` store the stage's ``sa * sb``. Epilogue: C^T transposed into ``C_s`` (bf16),
    then 16-byte stores of the routed rows."""
    check_gemm_args(n, k)
    if tokens not in TOKENS:
        raise ValueError(f"tokens: expected one of {TOKENS}, got {tokens}")
    if block_n not in (64, 128):
        raise ValueError(f"block_n: expected 64 or 128, got {block_n}")
    if n % block_n:
        raise ValueError(f"n: expected a multiple of block_n = {block_n}, got {n}")
    kblocks = k // BLOCK_K
    if group < 1 or kblocks % group:
        raise ValueError(f"group: expected a divisor of the {kblocks} K blocks, got {group}")
    if num_stages < 1:
        raise ValueError(f"num_stages: expected >= 1, got {num_stages}")
    steps = kblocks // group
    S = num_stages
    pieces = tokens * block_n // 8  # 16-byte pieces of the output tile
    vpr = block_n // 8  # 16-byte pieces a row

    @T.prim_func
    def main(A: T.Tensor((nrows, k), "float8_e4m3"), SA: T.Tensor((nrows, k // BLOCK_K), "float32"),
             B: T.Tensor((nexp, n, k), "float8_e4m3"), SB: T.Tensor((nexp, n // 128, k // BLOCK_K), "float32"),
             block_expert: T.Tensor((nblocks,), "int32"), rows: T.Tensor((nrows,), "int32"),
             C: T.Tensor((nrows, n), "bfloat16")):
        with T.Kernel(n // block_n, nblocks, threads=256) as (bx, by):
            W_s = T.alloc_shared((S, group, block_n, BLOCK_K), "float8_e4m3")
            X_s = T.alloc_shared((S, group, tokens, BLOCK_K), "float8_e4m3")
            scale_s = T.alloc_shared((S, group, tokens), "float32")
            C_s = T.alloc_shared((tokens, block_n), "bfloat16")
            part = T.alloc_fragment((block_n, tokens), "float32")
            total = T.alloc_fragment((block_n, tokens), "float32")
            full = T.alloc_barrier([128] * S)  # the producer warpgroup's 128 threads + the TMA bytes
            empty = T.alloc_barrier([4] * S)  # lane 0 of each consumer warp
            tx = T.get_thread_binding()
            expert = block_expert[by]
            r0 = by * BLOCK_M
            n0 = bx * block_n
            if expert >= 0:
                if tx >= 128:
                    for kq in T.serial(steps):
                        T.mbarrier_wait_parity(empty[kq % S], ((kq // S) & 1) ^ 1)
                        for u in T.unroll(group):
                            kb = kq * group + u
                            T.tma_copy(B[expert, n0:n0 + block_n, kb * BLOCK_K:(kb + 1) * BLOCK_K], W_s[kq % S, u, :, :],
                                       barrier=full[kq % S])
                            T.tma_copy(A[r0:r0 + tokens, kb * BLOCK_K:(kb + 1) * BLOCK_K], X_s[kq % S, u, :, :],
                                       barrier=full[kq % S])
                        if tx - 128 < tokens:
                            for u in T.unroll(group):
                                scale_s[kq % S, u, tx - 128] = (SA[r0 + tx - 128, kq * group + u]
                                                                * SB[expert, n0 // 128, kq * group + u])
                        T.mbarrier_arrive(full[kq % S])
                else:
                    T.clear(total)
                    for kq in T.serial(steps):
                        T.mbarrier_wait_parity(full[kq % S], (kq // S) & 1)
                        for u in T.unroll(group):
                            T.gemm(W_s[kq % S, u, :, :], X_s[kq % S, u, :, :], part, transpose_B=True,
                                   clear_accum=True, policy=T.GemmWarpPolicy.FullRow)
                            for i, j in T.Parallel(block_n, tokens):
                                total[i, j] = T.ieee_fmaf(part[i, j], scale_s[kq % S, u, j], total[i, j])
                        if tx % 32 == 0:
                            T.mbarrier_arrive(empty[kq % S])
                    for i, j in T.Parallel(block_n, tokens):
                        C_s[j, i] = T.Cast("bfloat16", total[i, j])
                    T.sync_threads(1, 128)  # the consumers only
                    for p in T.unroll(T.ceildiv(pieces, 128)):
                        if p * 128 + tx < pieces:
                            if rows[r0 + (p * 128 + tx) // vpr] >= 0:
                                for v in T.vectorized(8):
                                    C[r0 + (p * 128 + tx) // vpr, n0 + (p * 128 + tx) % vpr * 8 + v] = \
                                        C_s[(p * 128 + tx) // vpr, (p * 128 + tx) % vpr * 8 + v]

    return main
