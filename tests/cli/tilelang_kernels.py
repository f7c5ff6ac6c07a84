"""Plain TileLang kernels (a @tilelang.jit factory and a bare @T.prim_func) for the tlx CLI."""

import tilelang
import tilelang.language as T


@tilelang.jit(out_idx=[-1])
def scale(N, block=128):
    @T.prim_func
    def main(X: T.Tensor((N,), "float32"), Y: T.Tensor((N,), "float32")):
        with T.Kernel(T.ceildiv(N, block), threads=block) as bx:
            for i in T.Parallel(block):
                Y[bx * block + i] = X[bx * block + i] * 2.0

    return main


@T.prim_func
def copy256(X: T.Tensor((256,), "float32"), Y: T.Tensor((256,), "float32")):
    with T.Kernel(2, threads=128) as bx:
        for i in T.Parallel(128):
            Y[bx * 128 + i] = X[bx * 128 + i]


@tilelang.jit(pass_configs={"tl.disable_safe_memory_legalize": True})
def unguarded_gather(n=1024):
    """Y[i] = X[I[i]], the data-dependent load left unguarded by the decorator's pass configs."""

    @T.prim_func
    def main(X: T.Tensor((n,), "float32"), I: T.Tensor((n,), "int32"), Y: T.Tensor((n,), "float32")):
        with T.Kernel(n // 128, threads=128) as bx:
            for i in T.Parallel(128):
                Y[bx * 128 + i] = X[I[bx * 128 + i]]

    return main
