"""Kernels that are in bounds for every shape their assumptions allow (the verifier must prove them)."""

import tilelang.language as T

import tlx
from tests.tiled_gemm import tiled_gemm

TARGET = {"kind": "cuda", "arch": "sm_90a"}


@tlx.jit(out_idx=[2], target=TARGET)
def add_dynamic(block=128):
    N = T.dynamic("N")

    @T.prim_func
    def main(A: T.Tensor((N,), "float32"), B: T.Tensor((N,), "float32"), C: T.Tensor((N,), "float32")):
        with T.Kernel(T.ceildiv(N, block), threads=block) as bx:
            for i in T.Parallel(block):
                C[bx * block + i] = A[bx * block + i] + B[bx * block + i]

    return main


@tlx.jit(out_idx=[1], target=TARGET)
def scale_static_tail(N=1000, block=256):
    @T.prim_func
    def main(A: T.Tensor((N,), "float16"), B: T.Tensor((N,), "float16")):
        with T.Kernel(T.ceildiv(N, block), threads=128) as bx:
            for i in T.Parallel(block):
                B[bx * block + i] = A[bx * block + i] * T.float16(2)

    return main


@tlx.jit(out_idx=[2], target=TARGET)
def gemm_pipelined(N=256, block_m=128, block_n=128, block_k=32):
    return tiled_gemm(T.dynamic("M"), N, T.dynamic("K"), block_m, block_n, block_k)


@tlx.jit(out_idx=[2], target=TARGET, pass_configs={"tl.disable_tma_lower": True, "tl.disable_warp_specialized": True})
def gemm_no_tma(M=200, N=192, K=72, block_m=64, block_n=64, block_k=32):
    return tiled_gemm(M, N, K, block_m, block_n, block_k)


@tlx.jit(out_idx=[1], target=TARGET)
def row_sum(N=512, block_m=4):
    M = T.dynamic("M")

    @T.prim_func
    def main(A: T.Tensor((M, N), "float32"), S: T.Tensor((M,), "float32")):
        with T.Kernel(T.ceildiv(M, block_m), threads=128) as bx:
            tile = T.alloc_fragment((block_m, N), "float32")
            acc = T.alloc_fragment((block_m,), "float32")
            T.copy(A[bx * block_m, 0], tile)
            T.reduce_sum(tile, acc, dim=1)
            T.copy(acc, S[bx * block_m])

    return main


@tlx.jit(out_idx=[1], target=TARGET)
def softmax_rows(N=256, block_m=2):
    M = T.dynamic("M")

    @T.prim_func
    def main(A: T.Tensor((M, N), "float32"), B: T.Tensor((M, N), "float32")):
        with T.Kernel(T.ceildiv(M, block_m), threads=128) as bx:
            tile = T.alloc_shared((block_m, N), "float32")
            x = T.alloc_fragment((block_m, N), "float32")
            mx = T.alloc_fragment((block_m,), "float32")
            sm = T.alloc_fragment((block_m,), "float32")
            T.copy(A[bx * block_m, 0], tile)
            T.copy(tile, x)
            T.reduce_max(x, mx, dim=1)
            for i, j in T.Parallel(block_m, N):
                x[i, j] = T.exp(x[i, j] - mx[i])
            T.reduce_sum(x, sm, dim=1)
            for i, j in T.Parallel(block_m, N):
                x[i, j] = x[i, j] / sm[i]
            T.copy(x, B[bx * block_m, 0])

    return main


@tlx.jit(out_idx=[3], target=TARGET)
def attention_like(seq=256, dim=64, block_m=64, block_n=64):
    B = T.dynamic("B")
    scale = 1.0 / dim**0.5

    @T.prim_func
    def main(
        Q: T.Tensor((B, seq, dim), "float16"),
        K: T.Tensor((B, seq, dim), "float16"),
        V: T.Tensor((B, seq, dim), "float16"),
        O: T.Tensor((B, seq, dim), "float16"),
    ):
        with T.Kernel(T.ceildiv(seq, block_m), B, threads=128) as (bx, bz):
            Qs = T.alloc_shared((block_m, dim), "float16")
            Ks = T.alloc_shared((block_n, dim), "float16")
            Vs = T.alloc_shared((block_n, dim), "float16")
            Ps = T.alloc_shared((block_m, block_n), "float16")
            S = T.alloc_fragment((block_m, block_n), "float32")
            acc = T.alloc_fragment((block_m, dim), "float32")
            m = T.alloc_fragment((block_m,), "float32")
            m_prev = T.alloc_fragment((block_m,), "float32")
            l = T.alloc_fragment((block_m,), "float32")
            rs = T.alloc_fragment((block_m,), "float32")
            T.copy(Q[bz, bx * block_m : (bx + 1) * block_m, :], Qs)
            T.fill(acc, 0)
            T.fill(l, 0)
            T.fill(m, -T.infinity("float32"))
            for kb in T.Pipelined(T.ceildiv(seq, block_n), num_stages=1):
                T.copy(K[bz, kb * block_n : (kb + 1) * block_n, :], Ks)
                T.clear(S)
                T.gemm(Qs, Ks, S, transpose_B=True)
                T.copy(m, m_prev)
                T.reduce_max(S, m, dim=1, clear=False)
                for i, j in T.Parallel(block_m, block_n):
                    S[i, j] = T.exp2((S[i, j] - m[i]) * scale)
                for i in T.Parallel(block_m):
                    rs[i] = T.exp2((m_prev[i] - m[i]) * scale)
                for i, j in T.Parallel(block_m, dim):
                    acc[i, j] = acc[i, j] * rs[i]
                T.reduce_sum(S, m_prev, dim=1)
                for i in T.Parallel(block_m):
                    l[i] = l[i] * rs[i] + m_prev[i]
                T.copy(S, Ps)
                T.copy(V[bz, kb * block_n : (kb + 1) * block_n, :], Vs)
                T.gemm(Ps, Vs, acc)
            for i, j in T.Parallel(block_m, dim):
                acc[i, j] = acc[i, j] / l[i]
            T.copy(acc, O[bz, bx * block_m : (bx + 1) * block_m, :])

    return main


@tlx.jit(out_idx=[1], target=TARGET)
def guarded_threads(threads=128):
    """Explicit thread code with the user's own tail guard (dynamic N)."""
    N = T.dynamic("N")

    @T.prim_func
    def main(A: T.Tensor((N,), "int32"), B: T.Tensor((N,), "int32")):
        with T.Kernel(T.ceildiv(N, threads), threads=threads) as bx:
            tx = T.get_thread_binding()
            if bx * threads + tx < N:
                B[bx * threads + tx] = A[bx * threads + tx] + 1

    return main


@tlx.jit(out_idx=[1], target=TARGET)
def transpose_shared(M=256, N=192, tile=32):
    @T.prim_func
    def main(A: T.Tensor((M, N), "float32"), B: T.Tensor((N, M), "float32")):
        with T.Kernel(T.ceildiv(N, tile), T.ceildiv(M, tile), threads=128) as (bx, by):
            S = T.alloc_shared((tile, tile), "float32")
            T.copy(A[by * tile, bx * tile], S)
            for i, j in T.Parallel(tile, tile):
                B[bx * tile + i, by * tile + j] = S[j, i]

    return main


@tlx.jit(out_idx=[1], target=TARGET)
def segment_walk(threads=128):
    """Each thread finds the segment its index falls in by walking the (negative: empty) segment
    lengths in a while loop: ``seg`` is a counter (start 0, only incremented), so it stays >= 0
    though the loop has no trip count, and the condition's ``seg`` is the body's."""
    E = T.dynamic("E")

    @T.prim_func
    def main(lengths: T.Tensor((E,), "int32"), Seg: T.Tensor((threads,), "int32")):
        with T.Kernel(1, threads=threads):
            tx = T.get_thread_binding()
            seg = T.alloc_var("int32", init=0)
            rem = T.alloc_var("int32")
            rem = tx
            while T.if_then_else(seg < E, rem >= T.max(lengths[seg], 0), False):
                rem = rem - T.max(lengths[seg], 0)  # no int32 overflow: 0 <= length <= rem
                seg = seg + 1
            Seg[tx] = T.if_then_else(seg < E, lengths[seg], -1)

    return main


# (name, jit function, parameters, assumptions)
CORRECT = [
    ("add_dynamic", add_dynamic, {}, ()),
    ("scale_static_tail", scale_static_tail, {}, ()),
    ("gemm_pipelined", gemm_pipelined, {}, ("K % 32 == 0",)),
    ("gemm_no_tma", gemm_no_tma, {}, ()),
    ("row_sum", row_sum, {}, ()),
    ("softmax_rows", softmax_rows, {}, ()),
    ("attention_like", attention_like, {}, ()),
    ("guarded_threads", guarded_threads, {}, ()),
    ("transpose_shared", transpose_shared, {}, ()),
    ("segment_walk", segment_walk, {}, ()),
]
