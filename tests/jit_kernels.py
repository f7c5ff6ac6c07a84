"""Kernels in TileLang's own styles (lazy factory, eager T.const/T.empty, autotuned) for the
drop-in tests of ``@tlx.jit`` (tests/test_jit.py)."""

import tilelang.language as T

import tlx

SM90 = {"kind": "cuda", "arch": "sm_90a"}


@tlx.jit(out_idx=[-1], target=SM90)
def scale(N, block=128, factor=2.0, dtype="float32"):
    @T.prim_func
    def main(X: T.Tensor((N,), dtype), Y: T.Tensor((N,), dtype)):
        with T.Kernel(T.ceildiv(N, block), threads=block) as bx:
            for i in T.Parallel(block):
                Y[bx * block + i] = X[bx * block + i] * factor

    return main


@tlx.jit(target=SM90)
def eager_add(A, B, block_M: int = 32, block_N: int = 64):
    M, N = T.const("M, N")
    A: T.Tensor[[M, N], T.float32]
    B: T.Tensor[[M, N], T.float32]
    C = T.empty((M, N), T.float32)
    with T.Kernel(T.ceildiv(N, block_N), T.ceildiv(M, block_M), threads=128) as (bx, by):
        for i, j in T.Parallel(block_M, block_N):
            C[by * block_M + i, bx * block_N + j] = A[by * block_M + i, bx * block_N + j] + B[by * block_M + i, bx * block_N + j]
    return C


TUNING_CONFIGS = [{"block": 64}, {"block": 128}]


@tlx.jit(out_idx=[-1], target=SM90)
def tunable_scale(N, block=None):
    @T.prim_func
    def main(X: T.Tensor((N,), "float32"), Y: T.Tensor((N,), "float32")):
        with T.Kernel(T.ceildiv(N, block), threads=block) as bx:
            for i in T.Parallel(block):
                Y[bx * block + i] = X[bx * block + i] * 3.0

    return main
