"""Small kernels that exercise the launcher generator: plain, scalar args, symbolic dims, TMA."""

import tilelang.language as T

import tlx
from tests.tiled_gemm import tiled_gemm

SM90 = {"kind": "cuda", "arch": "sm_90a"}


@tlx.jit(out_idx=[-1], target=SM90)
def add(M, N, block_M=32, block_N=128, dtype="float32"):
    @T.prim_func
    def main(A: T.Tensor((M, N), dtype), B: T.Tensor((M, N), dtype), C: T.Tensor((M, N), dtype)):
        with T.Kernel(T.ceildiv(N, block_N), T.ceildiv(M, block_M), threads=128) as (bx, by):
            for i, j in T.Parallel(block_M, block_N):
                C[by * block_M + i, bx * block_N + j] = A[by * block_M + i, bx * block_N + j] + B[by * block_M + i, bx * block_N + j]

    return main


@tlx.jit(target=SM90)
def axpy(N, block=256, dtype="float32"):
    @T.prim_func
    def main(X: T.Tensor((N,), dtype), Y: T.Tensor((N,), dtype), alpha: T.float32):
        with T.Kernel(T.ceildiv(N, block), threads=block) as bx:
            for i in T.Parallel(block):
                Y[bx * block + i] = alpha * X[bx * block + i] + Y[bx * block + i]

    return main


@tlx.jit(out_idx=[-1], target=SM90)
def gemm(M, N, K, block_M=128, block_N=128, block_K=64, dtype="float16"):
    return tiled_gemm(M, N, K, block_M, block_N, block_K, dtype, out_dtype=dtype, num_stages=3)


@tlx.jit(target=SM90)
def empty(N):
    """Near the launch floor: one block of 32 threads, each storing one float."""

    @T.prim_func
    def main(X: T.Tensor((N,), "float32")):
        with T.Kernel(1, threads=32) as bx:
            tx = T.get_thread_binding()
            X[tx] = 1.0

    return main
