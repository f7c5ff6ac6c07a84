"""The d 256 dV-only kernel of kernels/attention/dense_bwd.py as it was before commit 023f2a5 (a test
fixture of the race analysis; never launched): it copied Q first, so TileLang's warp-specialized
pipeline released the stage of lse_s after the first GEMM, before P was computed from lse_s, and the
producer overwrote lse_s two steps ahead while it was read (dV wrong and different on every run on
the H200). tests/passes/test_staged_races.py checks that the race analysis reports that race."""

import tilelang.language as T

import tlx

from kernels.attention import common as C
from kernels.attention.dense_bwd import SUPPORTED_DIMS, _valid
from kernels.attention.dense_fwd import sequence_rows

BLOCK = 64  # query and key tile

total_q = T.dynamic("TQ")
total_k = T.dynamic("TK")
n_offsets = T.dynamic("NB")
heads = T.dynamic("H")
kv_heads = T.dynamic("HK")


@tlx.jit(target=C.TARGET, assume=["2 <= NB", "1 <= HK", "HK <= H", "H % HK == 0", "1 <= k_tiles", "k_tiles * 64 <= TK + 63",
                                   "TQ <= 1073741568", "TK <= 1073741568", "H * TQ <= 33554431", "HK * TK <= 33554431"])
def bwd_dkdv_kernel(dim: int, causal: bool, scale_log2: float, softmax_scale: float, dtype: str = "bfloat16",
                    grads: str = "dkdv"):
    """dK, dV [TK, HK, D] (grid: k_tiles x HK x (NB - 1), k_tiles >= ceil(max len_k / 64));
    ``H * TQ, HK * TK <= 33554431`` hold as q and k have at most 2^31 - 1 elements (``check_tensor``)
    and d >= 64: the steps of the flat loop (heads x query blocks) stay within int32 and the
    int64 offsets of every row provably in range.
    ``grads`` names what it writes: "dkdv" both, "dv" or "dk" one of them (the d = 256 split;
    the other output is not touched)."""
    C.check_head_dim("dim", dim, SUPPORTED_DIMS)
    if grads not in ("dkdv", "dk", "dv"):
        raise ValueError(f"grads: expected 'dkdv', 'dk' or 'dv', got {grads!r}")
    with_dk, with_dv = grads != "dv", grads != "dk"
    bm = bn = BLOCK
    f32 = "float32"

    @T.prim_func
    def main(Q: T.Tensor((total_q, heads, dim), dtype), K: T.Tensor((total_k, kv_heads, dim), dtype),
             V: T.Tensor((total_k, kv_heads, dim), dtype), dO: T.Tensor((total_q, heads, dim), dtype),
             LSE: T.Tensor((heads, total_q), f32), Delta: T.Tensor((heads, total_q), f32),
             cu_q: T.Tensor((n_offsets,), "int32"), cu_k: T.Tensor((n_offsets,), "int32"),
             dK: T.Tensor((total_k, kv_heads, dim), dtype), dV: T.Tensor((total_k, kv_heads, dim), dtype),
             k_tiles: T.int32):
        with T.Kernel(k_tiles, kv_heads, n_offsets - 1, threads=128) as (bx, by, bz):
            K_s = T.alloc_shared((bn, dim), dtype)
            V_s = T.alloc_shared((bn, dim), dtype)
            Q_s = T.alloc_shared((bm, dim), dtype)
            dO_s = T.alloc_shared((bm, dim), dtype)
            lse_s = T.alloc_shared((bm,), f32)
            delta_s = T.alloc_shared((bm,), f32)
            out_s = T.alloc_shared((bn, dim), dtype)
            s_t = T.alloc_fragment((bn, bm), f32)
            dp_t = T.alloc_fragment((bn, bm), f32)
            p_t = T.alloc_fragment((bn, bm), dtype)
            ds_t = T.alloc_fragment((bn, bm), dtype)
            dv = T.alloc_fragment((bn, dim), f32)
            dk = T.alloc_fragment((bn, dim), f32)

            q0, len_q = sequence_rows(cu_q, bz, total_q)
            k0, len_k = sequence_rows(cu_k, bz, total_k)
            col0 = bx * bn
            groups = heads // kv_heads
            # causal: the first query block with a row that sees this tile's first key
            first = T.max(col0 - (len_k - len_q), 0) // bm if causal else 0
            n_qb = T.if_then_else(col0 < len_k, T.max(T.ceildiv(len_q, bm) - first, 0), 0)  # query blocks per head

            # loaded only when waited for (TileLang waits inside the loop): a TMA load still in flight
            # at the epilogue would land on out_s, which shares K_s's memory
            if n_qb > 0:
                T.copy(K[k0 + col0:k0 + col0 + bn, by, :], K_s)
                if with_dk:
                    T.copy(V[k0 + col0:k0 + col0 + bn, by, :], V_s)
            if with_dv:
                T.fill(dv, 0)
            if with_dk:
                T.fill(dk, 0)
            # one flat loop over (head of the group, query block): TileLang's warp specialization
            # re-runs the consumer's code ahead of an inner pipelined loop (the zero fill of dK, dV)
            # on every iteration of an outer loop, which kept only the group's last head
            for step in T.Pipelined(groups * n_qb, num_stages=2):
                hq = by * groups + step // T.max(n_qb, 1)
                qb = first + step % T.max(n_qb, 1)
                T.copy(Q[q0 + qb * bm:q0 + (qb + 1) * bm, hq, :], Q_s)
                T.copy(dO[q0 + qb * bm:q0 + (qb + 1) * bm, hq, :], dO_s)
                for j in T.Parallel(bm):
                    r = T.min(q0 + qb * bm + j, total_q - 1)
                    lse_s[j] = T.ieee_mul(LSE[hq, r], T.float32(C.LOG2E))
                    if with_dk:
                        delta_s[j] = Delta[hq, r]
                T.gemm(K_s, Q_s, s_t, transpose_B=True, clear_accum=True, policy=T.GemmWarpPolicy.FullRow)
                if with_dk:
                    T.gemm(V_s, dO_s, dp_t, transpose_B=True, clear_accum=True, policy=T.GemmWarpPolicy.FullRow)
                for i, j in T.Parallel(bn, bm):
                    s_t[i, j] = T.if_then_else(_valid(causal, qb * bm + j, col0 + i, len_q, len_k),
                                               T.exp2(T.ieee_fmaf(s_t[i, j], T.float32(scale_log2), -lse_s[j])), T.float32(0))
                if with_dv:
                    T.copy(s_t, p_t)
                    T.gemm(p_t, dO_s, dv, policy=T.GemmWarpPolicy.FullRow)
                if with_dk:
                    for i, j in T.Parallel(bn, bm):
                        ds_t[i, j] = s_t[i, j] * (dp_t[i, j] - delta_s[j])
                    T.gemm(ds_t, Q_s, dk, policy=T.GemmWarpPolicy.FullRow)
            if with_dk:
                for i, j in T.Parallel(bn, dim):
                    dk[i, j] = dk[i, j] * T.float32(softmax_scale)
                T.copy(dk, out_s)
                for i, j in T.Parallel(bn, dim):
                    if col0 + i < len_k:
                        dK[k0 + col0 + i, by, j] = out_s[i, j]
            if with_dv:
                T.copy(dv, out_s)
                for i, j in T.Parallel(bn, dim):
                    if col0 + i < len_k:
                        dV[k0 + col0 + i, by, j] = out_s[i, j]

    return main

