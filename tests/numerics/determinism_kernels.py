"""Kernels for the determinism / batch-invariance checks: planted non-deterministic or
batch-variant constructs, and clean kernels that must not be flagged. ``M`` is symbolic
(the batch-like dimension) unless a factory says otherwise."""

import tilelang.language as T

from tests.tiled_gemm import tiled_gemm

BM, BN, BK = 64, 64, 32


def gemm(K: int = 256, N: int = 256, dtype: str = "float16"):
    """Plain GEMM: one block per output tile, K loop in a fixed order."""
    return tiled_gemm(T.dynamic("M"), N, K, BM, BN, BK, dtype)


def elementwise(N: int = 1024):
    M = T.dynamic("M")

    @T.prim_func
    def add(A: T.Tensor((M, N), "float32"), B: T.Tensor((M, N), "float32"), C: T.Tensor((M, N), "float32")):
        with T.Kernel(T.ceildiv(N, 256), M, threads=256) as (bx, by):
            for i in T.Parallel(256):
                C[by, bx * 256 + i] = A[by, bx * 256 + i] + B[by, bx * 256 + i]

    return add


def row_sum(tile_layout: str = "inferred"):
    """Row reduction over a symbolic K: the K loop's trip count depends on K only.

    ``tile_layout="by_row_block"`` annotates the tile with another legal fragment layout (warp
    w holds rows 16w..16w+15, lane j column j) than the one TileLang infers (rows strided by 4)."""
    M, K = T.dynamic("M"), T.dynamic("K")

    @T.prim_func
    def row_sum(A: T.Tensor((M, K), "float32"), out: T.Tensor((M,), "float32")):
        with T.Kernel(T.ceildiv(M, BM), threads=128) as bx:
            tile = T.alloc_fragment((BM, BK), "float32")
            part = T.alloc_fragment((BM,), "float32")
            acc = T.alloc_fragment((BM,), "float32")
            if tile_layout == "by_row_block":
                T.annotate_layout({tile: T.Fragment((BM, BK), forward_thread_fn=lambda i, j: i // 16 * 32 + j,
                                                    forward_index_fn=lambda i, j: i % 16)})  # fmt: skip
            T.clear(acc)
            for k in T.serial(T.ceildiv(K, BK)):
                T.copy(A[bx * BM, k * BK], tile)
                T.reduce_sum(tile, part, dim=1)
                for i in T.Parallel(BM):
                    acc[i] += part[i]
            T.copy(acc, out[bx * BM])

    return row_sum


def atomic_total(N: int = 1024):
    """Planted: every block adds its partial sum into one float with an atomic."""
    M = T.dynamic("M")

    @T.prim_func
    def atomic_total(A: T.Tensor((M, N), "float32"), total: T.Tensor((1,), "float32")):
        with T.Kernel(M, threads=128) as bx:
            row = T.alloc_fragment((N,), "float32")
            s = T.alloc_fragment((1,), "float32")
            T.copy(A[bx, 0], row)
            T.reduce_sum(row, s, dim=0)
            T.atomic_add(total[0], s[0])

    return atomic_total


def split_k_gemm(K: int = 1024, N: int = 256, splits: int = 4, dtype: str = "float16"):
    """Planted: split-K GEMM, blockIdx.z takes a K range and atomically adds its tile into C."""
    M = T.dynamic("M")
    k_per = K // splits

    @T.prim_func
    def split_k_gemm(A: T.Tensor((M, K), dtype), B: T.Tensor((K, N), dtype), C: T.Tensor((M, N), "float32")):
        with T.Kernel(T.ceildiv(N, BN), T.ceildiv(M, BM), splits, threads=128) as (bx, by, bz):
            A_s = T.alloc_shared((BM, BK), dtype)
            B_s = T.alloc_shared((BK, BN), dtype)
            C_l = T.alloc_fragment((BM, BN), "float32")
            T.clear(C_l)
            for k in T.Pipelined(k_per // BK, num_stages=2):
                T.copy(A[by * BM, bz * k_per + k * BK], A_s)
                T.copy(B[bz * k_per + k * BK, bx * BN], B_s)
                T.gemm(A_s, B_s, C_l)
            for i, j in T.Parallel(BM, BN):
                T.atomic_add(C[by * BM + i, bx * BN + j], C_l[i, j])

    return split_k_gemm


def _split_dot(y_shape, store, K: int = 1024, splits: int = 4):
    """``y`` gets the partial dot products of A's rows with x, one K chunk per block along
    ``blockIdx.y``, through ``store(y, row, bz, acc, M)`` (a macro: how each split adds its part)."""
    M = T.dynamic("M")
    k_per = K // splits

    @T.prim_func
    def split_dot(A: T.Tensor((M, K), "float32"), x: T.Tensor((K,), "float32"), y: T.Tensor(y_shape(M, splits), "float32")):
        with T.Kernel(T.ceildiv(M, 128), splits, threads=128) as (bx, bz):
            for i in T.Parallel(128):
                acc = T.alloc_var("float32")
                acc = 0.0
                for k in T.serial(k_per):
                    acc += A[bx * 128 + i, bz * k_per + k] * x[bz * k_per + k]
                store(y, bx * 128 + i, bz, acc, M)

    return split_dot


@T.macro
def _add_to_row(y, row, bz, acc, M):
    y[row] = y[row] + acc


@T.macro
def _add_block_in_condition(y, row, bz, acc, M):
    shifted = row + T.if_then_else(bz * 128 < M, 0, 1)
    y[shifted] = y[shifted] + acc


@T.macro
def _add_block_folded(y, row, bz, acc, M):
    if row < M:
        y[row + T.max(bz - M, 0)] = y[row + T.max(bz - M, 0)] + acc


@T.macro
def _add_to_own_partials(y, row, bz, acc, M):
    if row < M:
        y[bz, row] = y[bz, row] + acc


def split_k_racy():
    """Planted: split-K without atomics (read-modify-write of y from several blocks)."""
    return _split_dot(lambda M, splits: (M,), _add_to_row)


def split_k_block_in_condition():
    """Planted: split-K without atomics whose index names the split's block only inside a
    branch condition (as a loop extent ``bz < n ? ... : 0`` does): still the same element for
    every split."""
    return _split_dot(lambda M, splits: (M + 1,), _add_block_in_condition)


def split_k_block_folded():
    """Planted: split-K without atomics whose index uses the split's block arithmetically, but
    folds the splits onto one element whenever ``M >= 4`` (``max(bz - M, 0)`` is then 0 for all
    four; TVM cannot fold it away, M being a shape variable)."""
    return _split_dot(lambda M, splits: (M + 8,), _add_block_folded)


def split_partials_per_block():
    """Clean: each split read-modify-writes its own row of partial sums (``y[bz, m]``): no
    element is shared between blocks."""
    return _split_dot(lambda M, splits: (splits, M), _add_to_own_partials)


def batch_split_row_sum():
    """Planted: the K chunking is chosen from M (two chunks per step when M >= 64), so a
    row's summation order depends on how many rows are in the batch."""
    M, K = T.dynamic("M"), T.dynamic("K")

    @T.prim_func
    def batch_split_row_sum(A: T.Tensor((M, K), "float32"), out: T.Tensor((M,), "float32")):
        with T.Kernel(T.ceildiv(M, 128), threads=128) as bx:
            for i in T.Parallel(128):
                acc = T.alloc_var("float32")
                acc = 0.0
                step = T.if_then_else(M >= 64, 2, 1)
                for k in T.serial(T.ceildiv(K, step)):
                    pair = T.alloc_var("float32")
                    pair = 0.0
                    for kk in T.serial(step):
                        if k * step + kk < K:
                            pair += A[bx * 128 + i, k * step + kk]
                    acc += pair
                out[bx * 128 + i] = acc

    return batch_split_row_sum



def variable_split_row_sum():
    """Planted: a row's order of operations chosen from M (whether M is odd), kept in a thread variable
    (``T.alloc_var``) and not in a bound value: the analysis must follow the variable to what
    was stored in it."""
    M, K = T.dynamic("M"), T.dynamic("K")

    @T.prim_func
    def variable_split_row_sum(A: T.Tensor((M, K), "float32"), out: T.Tensor((M,), "float32")):
        with T.Kernel(T.ceildiv(M, 128), threads=128) as bx:
            for i in T.Parallel(128):
                acc = T.alloc_var("float32")
                step = T.alloc_var("int32")
                acc = 0.0
                step = M % 2 + 1  # with no comparison of M's own
                for k in T.serial(T.ceildiv(K, 2)):
                    if k % step == 0 and k < K:
                        acc += A[bx * 128 + i, k]
                    else:
                        acc = acc * 1.0 + A[bx * 128 + i, T.min(k, K - 1)]
                out[bx * 128 + i] = acc

    return variable_split_row_sum


def guarded_variable_row_scale(clamp_to_data: bool = False):
    """Clean: each block reads its row's scale into a thread variable behind a bounds guard on M
    (``bx < M``) or an index clamped to M (``min(bx, M - 1)``), and branches on it: neither makes
    the value depend on M. ``clamp_to_data``: the variable is a length read from memory and
    clamped to K (``min(L[bx], K)``, the decode kernels' ``seq_lens``): a dependence on K through
    data, unresolved."""
    M, K = T.dynamic("M"), T.dynamic("K")

    @T.prim_func
    def guarded_variable_row_scale(A: T.Tensor((M, K), "float32"), S: T.Tensor((M,), "float32"), L: T.Tensor((M,), "int32"),
                                   out: T.Tensor((M, K), "float32")):
        with T.Kernel(M, threads=128) as bx:
            s = T.alloc_var("float32")
            c = T.alloc_var("float32")
            n = T.alloc_var("int32")
            s = T.if_then_else(bx < M, S[bx], 0.0)
            c = S[T.min(bx, M - 1)]
            n = T.min(L[bx], K) if clamp_to_data else 4
            for j in T.serial(T.ceildiv(K, 128)):
                for i in T.Parallel(128):
                    if j * 128 + i < K:
                        if s > 0 and c > 0 and j * 128 + i < n:
                            out[bx, j * 128 + i] = A[bx, j * 128 + i] * s
                        else:
                            out[bx, j * 128 + i] = A[bx, j * 128 + i]

    return guarded_variable_row_scale

def ragged_row_sum(clamp_to_m: bool = True):
    """Each row sums its own segment ``A[row, off[row]:off[row + 1]]``. With ``clamp_to_m`` the
    loaded offsets are clamped to the tensor's M (a guard that a valid offsets vector never
    triggers), so M reaches the loop extent only through values read from memory; without it
    the extent is the segment length scaled by M itself (planted, batch-dependent)."""
    M, K = T.dynamic("M"), T.dynamic("K")

    @T.prim_func
    def ragged_row_sum(A: T.Tensor((M, K), "float32"), off: T.Tensor((M + 1,), "int32"), out: T.Tensor((M,), "float32")):
        with T.Kernel(M, threads=1) as row:
            acc = T.alloc_var("float32")
            acc = 0.0
            start = T.alloc_var("int32")
            start = T.min(T.max(off[row], 0), K)
            if clamp_to_m:
                length = T.min(off[row + 1], M) - T.min(off[row], M)
            else:
                length = (off[row + 1] - off[row]) * M // 4
            for k in T.serial(length):
                if start + k < K:
                    acc += A[row, start + k]
            out[row] = acc

    return ragged_row_sum


def shape_branch(sync_only: bool):
    """A row copy with a branch on the shape ``K > 0``: around a barrier wait only
    (``sync_only``: moves no data, batch invariance stays decidable), or around a store (a
    branch on a shape that is not a bounds guard: unresolved)."""
    M, K = T.dynamic("M"), T.dynamic("K")

    @T.prim_func
    def shape_branch(A: T.Tensor((M, K), "float32"), out: T.Tensor((M,), "float32")):
        with T.Kernel(M, threads=128) as bx:
            bar = T.alloc_barrier([128])
            out[bx] = T.float32(0)
            T.mbarrier_arrive(bar[0])
            if K > 0:
                if sync_only:
                    T.mbarrier_wait_parity(bar[0], 0)
                else:
                    out[bx] = A[bx, 0]

    return shape_branch
