"""Kernels with planted out-of-bounds bugs; each entry says which buffer the verifier must catch.

TileLang guards every global access it can analyse, so the planted bugs sit where it
does not: shared memory, data-dependent indices, and int32 arithmetic the user spelled
out. The verifier must report each with a counterexample, and the GPU replay under
compute-sanitizer must see the fault it predicts.
"""

import tilelang.language as T

import tlx

TARGET = {"kind": "cuda", "arch": "sm_90a"}


@tlx.jit(out_idx=[1], target=TARGET, verify="off")
def off_by_one_tail(N=1000, threads=128):
    """Shift through shared memory, writing one element past the tile's end."""

    @T.prim_func
    def main(A: T.Tensor((N,), "float32"), B: T.Tensor((N,), "float32")):
        with T.Kernel(T.ceildiv(N, threads), threads=threads) as bx:
            S = T.alloc_shared((threads,), "float32")
            tx = T.get_thread_binding()
            S[tx + 1] = A[bx * threads + tx]
            T.sync_threads()
            B[bx * threads + tx] = S[tx]

    return main


@tlx.jit(out_idx=[2], target=TARGET, verify="off")
def missing_guard(N=1024, bins=64, threads=128):
    """Scatter into a shared histogram at data-dependent bin ids without checking ``id < bins``."""

    @T.prim_func
    def main(ids: T.Tensor((N,), "int32"), W: T.Tensor((N,), "float32"), H: T.Tensor((N // threads, bins), "float32")):
        with T.Kernel(N // threads, threads=threads) as bx:
            tx = T.get_thread_binding()
            S = T.alloc_shared((bins,), "float32")
            if tx < bins:
                S[tx] = 0.0
            T.sync_threads()
            S[ids[bx * threads + tx]] = W[bx * threads + tx]
            T.sync_threads()
            if tx < bins:
                H[bx, tx] = S[tx]

    return main


@tlx.jit(out_idx=[1], target=TARGET, verify="off")
def wrong_ceildiv(K=100, chunk=32):
    """A shared staging buffer sized with K // chunk chunks while the loop runs ceildiv(K, chunk) chunks."""

    @T.prim_func
    def main(A: T.Tensor((K,), "float32"), B: T.Tensor((K,), "float32")):
        with T.Kernel(1, threads=chunk) as bx:
            tx = T.get_thread_binding()
            S = T.alloc_shared((K // chunk * chunk,), "float32")
            for k in T.serial(T.ceildiv(K, chunk)):
                if k * chunk + tx < K:
                    S[k * chunk + tx] = A[k * chunk + tx]
            T.sync_threads()
            for k in T.serial(K // chunk):
                B[k * chunk + tx] = S[k * chunk + tx]

    return main


@tlx.jit(out_idx=[1], target=TARGET, verify="off")
def wrong_stride(tile=32):
    """A tile x tile shared transpose indexed with the padded stride tile + 1 that the allocation lacks."""

    @T.prim_func
    def main(A: T.Tensor((tile, tile), "float32"), B: T.Tensor((tile, tile), "float32")):
        with T.Kernel(1, threads=tile) as bx:
            tx = T.get_thread_binding()
            S = T.alloc_shared((tile * tile,), "float32")
            for i in T.serial(tile):
                S[i * (tile + 1) + tx] = A[i, tx]
            T.sync_threads()
            for i in T.serial(tile):
                B[i, tx] = S[tx * (tile + 1) + i]

    return main


@tlx.jit(out_idx=[1], target=TARGET, verify="off")
def int32_overflow(N=65536, threads=256):
    """Row offsets computed in an int32 local variable overflow once M * N exceeds 2**31."""
    M = T.dynamic("M")

    @T.prim_func
    def main(A: T.Tensor((M, N), "float16"), B: T.Tensor((M,), "float16")):
        with T.Kernel(M, threads=threads) as bx:
            tx = T.get_thread_binding()
            off = T.alloc_local((1,), "int32")
            off[0] = bx * N
            if tx == 0:
                B[bx] = A[off[0] // N, off[0] % N]

    return main


# (name, jit function, parameters, assumptions, buffer the verifier must flag, kind)
BUGS = [
    ("off_by_one_tail", off_by_one_tail, {}, (), "S", "store"),
    ("missing_guard", missing_guard, {}, (), "S", "store"),
    ("wrong_ceildiv", wrong_ceildiv, {}, (), "S", "store"),
    ("wrong_stride", wrong_stride, {}, (), "S", "store"),
    ("int32_overflow", int32_overflow, {}, (), "off", "overflow"),
]
