"""A ``@tlx.jit`` factory whose program declares its own pass configs (``tilelang_pass_configs``):
the tlx CLI must analyse and print the build ``@tlx.jit`` compiles, with them merged in."""

import tilelang.language as T

import tlx


@tlx.jit(target={"kind": "cuda", "arch": "sm_90a"})
def gather(n: int = 1024, unguarded: bool = True):
    """Y[i] = X[I[i]]. TileLang guards the data-dependent load unless the program turns its
    safe-memory legalization off (``unguarded``): then the load may leave X."""

    @T.prim_func
    def main(X: T.Tensor((n,), "float32"), I: T.Tensor((n,), "int32"), Y: T.Tensor((n,), "float32")):
        with T.Kernel(n // 128, threads=128) as bx:
            for i in T.Parallel(128):
                Y[bx * 128 + i] = X[I[bx * 128 + i]]

    return main.with_attr("tilelang_pass_configs", {"tl.disable_safe_memory_legalize": True}) if unguarded else main
