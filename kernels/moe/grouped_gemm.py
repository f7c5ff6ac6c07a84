"""FP8 grouped GEMM: e4m3 activations (1 x 128 fp32 scales) x e4m3 expert weights
(128 x 128 fp32 scales) -> bf16, the DeepGEMM recipe on sm_90a wgmma.

Per 128-wide K block the tensor cores accumulate the block's raw e4m3 products in fp32
(wgmma, K in steps of 32, starting from zero); the block result is then scaled by
``sa[row, kb] * sb[n // 128, kb]`` and added to the fp32 total with one fma
(``total = fma(block, scale, total)``), K blocks in ascending order; the total is rounded
to bf16 once. ``grouped_gemm.cu`` repeats this with hand-written wgmma of the same shape.

Layouts:

* contiguous: A [R, K] holds the experts' rows stacked, each expert padded to 128 rows
  (``metadata.routing_metadata``); ``block_expert[R // 128]`` names each row block's
  expert, -1 for blocks past the end (not computed, C rows left untouched).
* masked: A [E, M, K] with ``counts[E]``; row blocks wholly past ``counts[e]`` are not
  computed; rows past the count inside a computed block hold A's (unspecified) rows' products.
"""


import tilelang.language as T

import tlx

BLOCK_M = 128
BLOCK_K = 128  # = the scale group: one fp32 promotion per K block

# Symbolic sizes (module level so the kernel sources see them): rows, row blocks, masked rows,
# experts (dynamic so that one compiled kernel serves every expert count of a shape).
nrows = T.dynamic("R")
nblocks = T.dynamic("NB")
mrows = T.dynamic("M")
nexp = T.dynamic("E")


def check_gemm_args(n: int, k: int, block_n: int):
    if k % BLOCK_K:
        raise ValueError(f"k: expected a multiple of {BLOCK_K}, got {k}")
    if n % 128 or block_n not in (64, 128):
        raise ValueError(f"n/block_n: expected n a multiple of 128 and block_n in (64, 128), got {n}/{block_n}")


@T.macro
def _tile(A, SA, B, SB, C, lead, e, row0, col0, k, block_n, num_stages):
    """One (128-row block, block_n columns) output tile: the DeepGEMM promotion loop over K
    blocks, then one rounding to bf16. ``lead`` indexes the expert dimension of A/SA/C in the
    masked layout and is empty in the contiguous one."""
    A_s = T.alloc_shared((BLOCK_M, BLOCK_K), "float8_e4m3")
    B_s = T.alloc_shared((block_n, BLOCK_K), "float8_e4m3")
    C_s = T.alloc_shared((BLOCK_M, block_n), "bfloat16")
    scale_s = T.alloc_shared((BLOCK_M,), "float32")
    part = T.alloc_fragment((BLOCK_M, block_n), "float32")
    total = T.alloc_fragment((BLOCK_M, block_n), "float32")
    # The producer side also stages the scales (plain loads), so TileLang does not rebalance
    # registers by itself; without these hints ptxas spills the consumers' accumulators
    # (96 bytes per thread at block_n = 128). 256 * 40 + 256 * 208 fits the register file.
    T.annotate_producer_reg_dealloc(40)
    T.annotate_consumer_reg_alloc(208)
    T.clear(total)
    for kb in T.Pipelined(k // BLOCK_K, num_stages=num_stages):
        T.copy(A[(*lead, row0, kb * BLOCK_K)], A_s)
        T.copy(B[e, col0, kb * BLOCK_K], B_s)
        for i in T.Parallel(BLOCK_M):
            scale_s[i] = SA[(*lead, row0 + i, kb)] * SB[e, col0 // 128, kb]
        T.clear(part)
        T.gemm(A_s, B_s, part, transpose_B=True)
        for i, j in T.Parallel(BLOCK_M, block_n):
            total[i, j] = T.ieee_fmaf(part[i, j], scale_s[i], total[i, j])
    T.copy(total, C_s)
    T.copy(C_s, C[(*lead, row0, col0)])


@tlx.jit(target={"kind": "cuda", "arch": "sm_90a"})
def grouped_gemm_contiguous_kernel(n: int, k: int, block_n: int = 128, num_stages: int = 4,
                                   threads: int = 256):
    """``(A [R, K], SA [R, K/128], B [E, N, K], SB [E, N/128, K/128], block_expert [R/128], C [R, N])``."""
    check_gemm_args(n, k, block_n)

    @T.prim_func
    def main(
        A: T.Tensor((nrows, k), "float8_e4m3"),
        SA: T.Tensor((nrows, k // BLOCK_K), "float32"),
        B: T.Tensor((nexp, n, k), "float8_e4m3"),
        SB: T.Tensor((nexp, n // 128, k // BLOCK_K), "float32"),
        block_expert: T.Tensor((nblocks,), "int32"),
        C: T.Tensor((nrows, n), "bfloat16"),
    ):
        with T.Kernel(n // block_n, nblocks, threads=threads) as (bx, by):
            # block_expert[by] is re-read rather than bound to a name: a bound scalar breaks
            # TileLang 0.1.15's warp specialization (used before its definition).
            if block_expert[by] >= 0:
                _tile(A, SA, B, SB, C, (), block_expert[by], by * BLOCK_M, bx * block_n, k, block_n, num_stages)

    return main


@tlx.jit(target={"kind": "cuda", "arch": "sm_90a"})
def grouped_gemm_masked_kernel(n: int, k: int, block_n: int = 128, num_stages: int = 4,
                               threads: int = 256):
    """``(A [E, M, K], SA [E, M, K/128], B [E, N, K], SB [E, N/128, K/128], counts [E], C [E, M, N])``."""
    check_gemm_args(n, k, block_n)

    @T.prim_func
    def main(
        A: T.Tensor((nexp, mrows, k), "float8_e4m3"),
        SA: T.Tensor((nexp, mrows, k // BLOCK_K), "float32"),
        B: T.Tensor((nexp, n, k), "float8_e4m3"),
        SB: T.Tensor((nexp, n // 128, k // BLOCK_K), "float32"),
        counts: T.Tensor((nexp,), "int32"),
        C: T.Tensor((nexp, mrows, n), "bfloat16"),
    ):
        with T.Kernel(n // block_n, T.ceildiv(mrows, BLOCK_M), nexp, threads=threads) as (bx, by, bz):
            if by * BLOCK_M < counts[bz]:
                _tile(A, SA, B, SB, C, (bz,), bz, by * BLOCK_M, bx * block_n, k, block_n, num_stages)

    return main


def _check(name, t, dtype, shape):
    if t.dtype != dtype or tuple(t.shape) != tuple(shape):
        raise ValueError(f"{name}: expected {dtype} of shape {tuple(shape)}, got {t.dtype} of shape {tuple(t.shape)}")


def grouped_gemm_contiguous(a, sa, b, sb, block_expert, out=None):
    """C [R, N] bf16 for the contiguous layout (see the module docstring)."""
    import torch

    r, k = a.shape
    e, n, _ = b.shape
    _check("a", a, torch.float8_e4m3fn, (r, k))
    _check("sa", sa, torch.float32, (r, k // BLOCK_K))
    _check("b", b, torch.float8_e4m3fn, (e, n, k))
    _check("sb", sb, torch.float32, (e, n // 128, k // BLOCK_K))
    _check("block_expert", block_expert, torch.int32, (r // BLOCK_M,))
    if r % BLOCK_M:
        raise ValueError(f"a: expected rows a multiple of {BLOCK_M}, got {r}")
    if out is None:
        out = torch.empty(r, n, dtype=torch.bfloat16, device=a.device)
    grouped_gemm_contiguous_kernel(n, k)(a, sa, b, sb, block_expert, out)
    return out


def grouped_gemm_masked(a, sa, b, sb, counts, out=None):
    """C [E, M, N] bf16 for the masked layout (see the module docstring)."""
    import torch

    e, m, k = a.shape
    n = b.shape[1]
    _check("a", a, torch.float8_e4m3fn, (e, m, k))
    _check("sa", sa, torch.float32, (e, m, k // BLOCK_K))
    _check("b", b, torch.float8_e4m3fn, (e, n, k))
    _check("sb", sb, torch.float32, (e, n // 128, k // BLOCK_K))
    _check("counts", counts, torch.int32, (e,))
    if out is None:
        out = torch.empty(e, m, n, dtype=torch.bfloat16, device=a.device)
    if e and m:
        grouped_gemm_masked_kernel(n, k)(a, sa, b, sb, counts, out)
    return out
