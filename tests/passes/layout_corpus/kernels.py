"""Kernels the layout analyses are tested on: correct ones, and planted bugs.

Each factory returns ``(prim_func, pass_configs)`` so a test lowers exactly what a user
would compile. TileLang reads ``@T.prim_func`` bodies from source, hence this module.
"""

import tilelang.language as T
from tilelang.layout import Layout

from tests.tiled_gemm import tiled_gemm

GEMM_TMA = {}  # Hopper defaults: TMA copies, wgmma, warp specialization
GEMM_SIMT_COPY = {"tl.disable_tma_lower": True, "tl.disable_warp_specialized": True, "tl.disable_wgmma": True}


def gemm(M=256, N=256, K=256, bm=128, bn=128, bk=32, dtype="float16", configs=GEMM_TMA):
    """A pipelined GEMM; shared tiles get TileLang's swizzled layouts."""
    return tiled_gemm(M, N, K, bm, bn, bk, dtype, out_dtype=dtype), dict(configs)


def row_sum(M=1024, N=512, bm=32, dtype="float32"):
    """A row reduction through a fragment (replicated reduction output)."""

    @T.prim_func
    def main(A: T.Tensor((M, N), dtype), S: T.Tensor((M,), dtype)):
        with T.Kernel(T.ceildiv(M, bm), threads=128) as bx:
            Af = T.alloc_fragment((bm, N), dtype)
            Sf = T.alloc_fragment((bm,), dtype)
            T.copy(A[bx * bm, 0], Af)
            T.reduce_sum(Af, Sf, dim=1)
            T.copy(Sf, S[bx * bm])

    return main, {}


def scale_add(M=1024, N=1024, bm=64, bn=64, dtype="float16"):
    """Elementwise ``C = 2 A + B`` through fragments."""

    @T.prim_func
    def main(A: T.Tensor((M, N), dtype), B: T.Tensor((M, N), dtype), C: T.Tensor((M, N), dtype)):
        with T.Kernel(T.ceildiv(N, bn), T.ceildiv(M, bm), threads=128) as (bx, by):
            for i, j in T.Parallel(bm, bn):
                C[by * bm + i, bx * bn + j] = A[by * bm + i, bx * bn + j] * T.cast(2, dtype) + B[by * bm + i, bx * bn + j]

    return main, {}


def transpose(N=1024, pad=1, sync=True):
    """Transpose through a 32x(32+pad) float32 shared tile: rows written, columns read.

    ``pad=0`` is the planted "padding column removed" bug (32-way bank conflicts on the
    column reads); ``sync=False`` drops TileLang's barrier insertion (a planted race).
    """

    @T.prim_func
    def main(A: T.Tensor((N, N), "float32"), B: T.Tensor((N, N), "float32")):
        with T.Kernel(N // 32, N // 32, threads=(32, 8)) as (bx, by):
            S = T.alloc_shared((32, 32 + pad), "float32")
            tx = T.get_thread_binding(0)
            ty = T.get_thread_binding(1)
            for r in T.serial(4):
                S[ty + r * 8, tx] = A[by * 32 + ty + r * 8, bx * 32 + tx]
            for r in T.serial(4):
                B[bx * 32 + ty + r * 8, by * 32 + tx] = S[tx, ty + r * 8]

    return main, ({} if sync else {"tl.disable_thread_storage_sync": True})


def swizzled_copy(M=1024, N=64, wrong_mask=False):
    """Stage rows through a shared tile with a hand-written XOR swizzle.

    The correct swizzle XORs the 8-element chunk index with ``row % 8``; the planted bug
    masks the result with 3 instead of 7, so chunks 0 and 4 of a row collide.
    """
    mask = 3 if wrong_mask else 7

    def swz(i, j):
        return [i, ((j // 8) ^ (i % 8)) % 8 * 8 + j % 8] if not wrong_mask else [i, T.bitwise_and((j // 8) ^ (i % 8), mask) * 8 + j % 8]

    @T.prim_func
    def main(A: T.Tensor((M, N), "float16"), B: T.Tensor((M, N), "float16")):
        with T.Kernel(M // 64, threads=128) as bx:
            S = T.alloc_shared((64, N), "float16")
            T.annotate_layout({S: Layout((64, N), swz)})
            T.copy(A[bx * 64, 0], S)
            T.copy(S, B[bx * 64, 0])

    return main, {}


def shifted_vector_copy(N=1024, shift=1):
    """Copies ``A[i*4 + shift : +4]`` as one 4-wide vector: misaligned unless shift % 4 == 0."""

    @T.prim_func
    def main(A: T.Tensor((N + 4,), "float32"), B: T.Tensor((N,), "float32")):
        with T.Kernel(N // 512, threads=128) as bx:
            for t in T.Parallel(128):
                for v in T.vectorized(4):
                    B[bx * 512 + t * 4 + v] = A[bx * 512 + t * 4 + v + shift]

    return main, {}


def strided_shared(stride=2, vec=1, n_blocks=4):
    """One warp per block writes ``S[(tx * stride) * vec + v]`` (``vec`` float32 per lane), then,
    after a barrier, reads its neighbour lane's slot: the same addresses, so the same degree.

    The bank-conflict degree follows from ``stride`` and the access width (4/8/16 bytes):
    a small family whose Nsight Compute counters the static model must predict. (Reading the
    thread's own slot let nvcc forward the stored value and drop the load: Nsight Compute then
    counted no load conflicts, H200, 2026-11-30.)
    """
    span = 32 * stride * vec

    @T.prim_func
    def main(A: T.Tensor((n_blocks * span,), "float32"), B: T.Tensor((n_blocks * span,), "float32")):
        with T.Kernel(n_blocks, threads=32) as bx:
            S = T.alloc_shared((span,), "float32")
            tx = T.get_thread_binding(0)
            for v in T.vectorized(vec):
                S[tx * stride * vec + v] = A[bx * span + tx * stride * vec + v]
            T.sync_threads()
            for v in T.vectorized(vec):
                B[bx * span + tx * stride * vec + v] = S[(tx + 1) % 32 * stride * vec + v] + 1.0

    return main, {}


# Kernels whose every shared-memory LSU access the bank analysis sees (no library collectives),
# used to compare the static prediction with Nsight Compute on the GPU.
NCU_CASES = {
    "transpose_padded": lambda: transpose(N=256, pad=1),
    "transpose_unpadded": lambda: transpose(N=256, pad=0),
    "strided_4B_s2": lambda: strided_shared(stride=2, vec=1),
    "strided_8B_s2": lambda: strided_shared(stride=2, vec=2),
    "strided_16B_s4": lambda: strided_shared(stride=4, vec=4),
    "strided_4B_s3": lambda: strided_shared(stride=3, vec=1),
    "gemm_ldmatrix": lambda: gemm(configs=GEMM_SIMT_COPY),
}



def masked_row_scale(branch_per_step=False, M=4096, N=64, rows=16, steps=4):
    """``B = fp16(float(A) * S[row])`` for rows below ``L[0]``, zeros past it, ``steps`` blocks of
    ``rows`` a CTA in a serial loop. The test per value (``if_then_else`` over each vector) is a
    branch per vector in CUDA; ``branch_per_step`` tests once a step whether the whole block is
    below ``L[0]`` and keeps the per-value test for a block that is not."""

    @T.prim_func
    def main(A: T.Tensor((M, N), "float16"), S: T.Tensor((M,), "float32"), L: T.Tensor((1,), "int32"),
             B: T.Tensor((M, N), "float16")):
        with T.Kernel(M // (rows * steps), threads=128) as bx:
            for s in T.serial(steps):
                r0 = (bx * steps + s) * rows
                if branch_per_step and r0 + rows <= L[0]:
                    for i, j in T.Parallel(rows, N):
                        B[r0 + i, j] = T.Cast("float16", T.Cast("float32", A[r0 + i, j]) * S[r0 + i])
                else:
                    for i, j in T.Parallel(rows, N):
                        B[r0 + i, j] = T.if_then_else(r0 + i < L[0], T.Cast("float16", T.Cast("float32", A[r0 + i, j]) * S[r0 + i]),
                                                      T.Cast("float16", 0))

    return main, {}
