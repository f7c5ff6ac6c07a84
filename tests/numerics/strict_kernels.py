"""Elementwise kernels for strict-mode tests: approximate intrinsics planted in each way a
kernel can reach them, and an exact kernel that strict mode must accept."""

import tilelang.language as T

from tlx import ieee

N = 1024


def _elementwise(body, prelude=None):
    @T.prim_func
    def strict_probe(x: T.Tensor((N,), "float32"), y: T.Tensor((N,), "float32"), out: T.Tensor((N,), "float32")):
        with T.Kernel(N // 128, threads=128, prelude=prelude) as bx:
            for i in T.Parallel(128):
                out[bx * 128 + i] = body(x[bx * 128 + i], y[bx * 128 + i])

    return strict_probe


def fast_exp():
    return _elementwise(lambda a, b: T.__exp(a) + b)


def fast_sin_and_log():
    return _elementwise(lambda a, b: T.__sin(a) * T.__log(b))


def fast_rcp():
    return _elementwise(lambda a, b: T.fast_rcp(a) + b)


def extern_fdividef():
    return _elementwise(lambda a, b: T.call_extern("float32", "__fdividef", a, b))


def exact():
    return _elementwise(lambda a, b: T.exp(a) + ieee.div(a, b) + ieee.rcp(b, "rz"))


# prelude helpers: one runs an approximate instruction itself, one through another helper, one
# runs none (a rounding-mode conversion)
PRELUDE = r"""
__device__ __forceinline__ float probe_ex2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
__device__ __forceinline__ float probe_through(float x) { return probe_ex2(x) + 1.0f; }
__device__ __forceinline__ float probe_exact(float x) {
  float y;
  asm("cvt.rz.f32.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
"""


def prelude_helper(name: str):
    """``out = name(x) + y`` with the helper ``name`` of ``PRELUDE``."""
    return _elementwise(lambda a, b: T.call_extern("float32", name, a) + b, PRELUDE)
