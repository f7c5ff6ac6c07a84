"""A kernel with a planted off-by-one in shared memory (TileLang guards global accesses, not shared ones)."""

import tilelang.language as T

import tlx


@tlx.jit(target={"kind": "cuda", "arch": "sm_90a"}, verify="off")
def shifted_copy(M, threads=128):
    @T.prim_func
    def main(A: T.Tensor((M,), "float32"), B: T.Tensor((M,), "float32")):
        with T.Kernel(T.ceildiv(M, threads), threads=threads) as bx:
            S = T.alloc_shared((threads,), "float32")
            tx = T.get_thread_binding()
            S[tx + 1] = A[bx * threads + tx]
            T.sync_threads()
            B[bx * threads + tx] = S[tx]

    return main
