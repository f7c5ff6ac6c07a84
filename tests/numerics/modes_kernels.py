"""An elementwise kernel whose bits depend on the numerics mode: a*b + c*c contracts to FMAs
under nvcc's defaults and not under ``numerics="strict"`` (``--fmad=false``)."""

import tilelang.language as T


def mix():
    n = T.dynamic("n")

    @T.prim_func
    def mix(a: T.Tensor((n,), "float32"), b: T.Tensor((n,), "float32"), c: T.Tensor((n,), "float32"), out: T.Tensor((n,), "float32")):
        with T.Kernel(T.ceildiv(n, 256), threads=256) as bx:
            for i in T.Parallel(256):
                j = bx * 256 + i
                if j < n:
                    out[j] = a[j] * b[j] + c[j] * c[j] + a[j] / b[j] + T.sqrt(T.abs(c[j]))

    return mix
