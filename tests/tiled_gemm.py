"""The tiled GEMM the test corpora share (hostgen, passes, numerics): ``C = A @ B`` through
shared-memory tiles and a float32 fragment, K in a pipelined loop. ``M`` and ``K`` may be
symbolic (``T.dynamic``); TileLang's defaults for the target decide TMA, wgmma and warp
specialization unless the caller's pass configs turn them off."""

import tilelang.language as T


def tiled_gemm(M, N, K, bm=128, bn=128, bk=32, dtype="float16", out_dtype="float32", num_stages=2):
    @T.prim_func
    def main(A: T.Tensor((M, K), dtype), B: T.Tensor((K, N), dtype), C: T.Tensor((M, N), out_dtype)):
        with T.Kernel(T.ceildiv(N, bn), T.ceildiv(M, bm), threads=128) as (bx, by):
            A_s = T.alloc_shared((bm, bk), dtype)
            B_s = T.alloc_shared((bk, bn), dtype)
            C_l = T.alloc_fragment((bm, bn), "float32")
            T.clear(C_l)
            for k in T.Pipelined(T.ceildiv(K, bk), num_stages=num_stages):
                T.copy(A[by * bm, k * bk], A_s)
                T.copy(B[k * bk, bx * bn], B_s)
                T.gemm(A_s, B_s, C_l)
            T.copy(C_l, C[by * bm, bx * bn])

    return main
