"""Small kernels that exercise the launcher generator: plain, scalar args, symbolic dims, TMA."""

import tilelang.language as T

import tlx
from tests.shared_read import offset_read
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


@tlx.jit(out_idx=[-2, -1], target=SM90)
def two_boxes(M, K=256, dtype="float16"):
    """Two TMA loads of one tensor with different boxes (128 x 64 and 128 x 32), two descriptors
    that lowering names alike. Over the 64-column blocks k in order: ``B += A[:, 64k:64k+64]``,
    ``C += A[:, 64k:64k+32]``, in fp32."""

    @T.prim_func
    def main(A: T.Tensor((M, K), dtype), B: T.Tensor((M, 64), "float32"), C: T.Tensor((M, 32), "float32")):
        with T.Kernel(T.ceildiv(M, 128), threads=128) as bx:
            wide = T.alloc_shared((128, 64), dtype)
            narrow = T.alloc_shared((128, 32), dtype)
            acc = T.alloc_fragment((128, 64), "float32")
            acc_narrow = T.alloc_fragment((128, 32), "float32")
            T.clear(acc)
            T.clear(acc_narrow)
            for k in T.Pipelined(K // 64, num_stages=2):
                T.copy(A[bx * 128, k * 64], wide)
                T.copy(A[bx * 128, k * 64], narrow)
                for i, j in T.Parallel(128, 64):
                    acc[i, j] += wide[i, j]
                for i, j in T.Parallel(128, 32):
                    acc_narrow[i, j] += narrow[i, j]
            T.copy(acc, B[bx * 128, 0])
            T.copy(acc_narrow, C[bx * 128, 0])

    return main


@tlx.jit(target=SM90)
def staged(N, stage_bytes=1024, stages=2):
    """``stages`` shared buffers of ``stage_bytes`` (dynamic shared memory) behind an mbarrier per
    stage (static shared memory): sized past the per-block limit, it must not compile."""

    @T.prim_func
    def main(A: T.Tensor((N, stage_bytes), "uint8"), B: T.Tensor((N, stage_bytes), "uint8")):
        with T.Kernel(N, threads=128) as bx:
            S = T.alloc_shared((stages, stage_bytes), "uint8")
            full = T.alloc_barrier([128] * stages)
            for s in T.serial(stages):
                T.copy(A[bx, :], S[s, :])
                T.mbarrier_arrive(full[s])
                T.mbarrier_wait_parity(full[s], 0)
            T.copy(S[stages - 1, :], B[bx, :])

    return main


@tlx.jit(target=SM90)
def scaled_rows(M, block=32):
    """Scalars of both kinds and a grid whose y extent grows with a dynamic M."""

    @T.prim_func
    def main(A: T.Tensor((M,), "float32"), B: T.Tensor((M,), "float32"), bias: T.int32, scale: T.float32):
        with T.Kernel(1, T.ceildiv(M, block), threads=block) as (bx, by):
            for i in T.Parallel(block):
                if by * block + i < M:
                    B[by * block + i] = A[by * block + i] * scale + T.Cast("float32", bias)

    return main


@tlx.jit(target=SM90)
def offset_window(threads=32):
    """A window of ``threads`` elements of a shared copy of A, at a scalar offset: the verifier
    derives ``0 <= off <= 256 - threads`` as preconditions the launcher checks."""
    return offset_read(threads)


@tlx.jit(target=SM90)
def assumed_rows(M, block=32):
    """A program that states ``T.assume(M >= 64)`` (as TileLang code does to drop bounds guards):
    TileLang lowers it to a host assert, which the launcher checks."""

    @T.prim_func
    def main(A: T.Tensor((M,), "float32"), B: T.Tensor((M,), "float32")):
        with T.Kernel(T.ceildiv(M, block), threads=block) as bx:
            T.assume(M >= 64)
            for i in T.Parallel(block):
                B[bx * block + i] = A[bx * block + i]

    return main


@tlx.jit(target=SM90, assume=["1 <= N"])
def gathered_rows(N, rows=64, D=64):
    """Rows of X named by Idx, gathered into shared memory by 16-byte cp.async (a pipelined
    gather), then stored to Y."""

    @T.prim_func
    def main(X: T.Tensor((N, D), "float16"), Idx: T.Tensor((2, rows), "int32"), Y: T.Tensor((2, rows, D), "float16")):
        with T.Kernel(1, threads=128) as bx:
            S = T.alloc_shared((rows, D), "float16")
            for k in T.Pipelined(2, num_stages=2):
                for j, d in T.Parallel(rows, D):
                    S[j, d] = X[T.min(T.max(Idx[k, j], 0), N - 1), d]
                T.copy(S, Y[k, :, :])

    return main


@tlx.jit(out_idx=[-2, -1], target=SM90)
def copy_pairs(N, block=128):
    """``Y = X``, ``Y2 = X2`` through one loop over the pairs: TileLang names the buffers after the
    loop variables, so the four parameters are called src, src, dst, dst (the two dst are
    outputs: the allocating call names its tensors too)."""

    @T.prim_func
    def main(X: T.Tensor((N,), "float32"), X2: T.Tensor((N,), "float32"), Y: T.Tensor((N,), "float32"),
             Y2: T.Tensor((N,), "float32")):
        with T.Kernel(T.ceildiv(N, block), threads=block) as bx:
            for src, dst in ((X, Y), (X2, Y2)):
                for i in T.Parallel(block):
                    dst[bx * block + i] = src[bx * block + i]

    return main


@tlx.jit(target=SM90)
def tf32_rows(M, N=64, block=32):
    """A tfloat32 argument (TileLang's custom type, as in DeepSeek's mHC GEMM): its tensors hold float32."""

    @T.prim_func
    def main(W: T.Tensor((M, N), T.tfloat32), Y: T.Tensor((M, N), T.float32)):
        with T.Kernel(T.ceildiv(M, block), threads=128) as bx:
            for i, j in T.Parallel(block, N):
                Y[bx * block + i, j] = W[bx * block + i, j]

    return main


@tlx.jit(out_idx=[-1], target=SM90)
def fp4_quantize(M, N=64, block=32):
    """bfloat16 rows clamped to [-6, 6] and rounded to fp4, whose output is packed two per byte."""

    @T.prim_func
    def main(X: T.Tensor((M, N), T.bfloat16), Q: T.Tensor((M, N), T.float4_e2m1fn)):
        with T.Kernel(T.ceildiv(M, block), threads=128) as bx:
            q = T.alloc_fragment((block, N), T.float4_e2m1fn)
            for i, j in T.Parallel(block, N):
                q[i, j] = T.clamp(X[bx * block + i, j], -6.0, 6.0)
            T.copy(q, Q[bx * block, 0], disable_tma=True)

    return main


@tlx.jit(target=SM90)
def fp4_flag(N):
    """An fp4 argument of any length N (it only sets a flag): packed storage of N / 2 bytes."""

    @T.prim_func
    def main(Q: T.Tensor((N,), T.float4_e2m1fn), Y: T.Tensor((1,), T.float32)):
        with T.Kernel(1, threads=32):
            Y[0] = 1.0

    return main


@tlx.jit(out_idx=[-2, -1], target=SM90)
def split_row_stats(M, N, splits=4, block=128):
    """Per row of X: the sum, and the largest entry rounded to float16, in two kernels through
    two global workspaces (float32 and float16) that the launcher allocates per call. The first
    kernel writes one partial result per (row, split) (``sums`` row-major, ``peaks``
    split-major); the second combines the splits in order."""
    chunk = N // splits

    @T.prim_func
    def main(X: T.Tensor((M, N), "float32"), total: T.Tensor((M,), "float32"), peak: T.Tensor((M,), "float16")):
        sums = T.alloc_global((M, splits), "float32")
        peaks = T.alloc_global((splits, M), "float16")
        with T.Kernel(splits, T.ceildiv(M, block), threads=block) as (s, b):
            row = b * block + T.get_thread_binding()
            if row < M:
                acc = T.alloc_var("float32")
                top = T.alloc_var("float16")
                acc = 0.0
                top = -T.infinity("float16")
                for k in T.serial(chunk):
                    acc += X[row, s * chunk + k]
                    top = T.max(top, T.Cast("float16", X[row, s * chunk + k]))
                sums[row, s] = acc
                peaks[s, row] = top
        with T.Kernel(T.ceildiv(M, block), threads=block) as b:
            row = b * block + T.get_thread_binding()
            if row < M:
                acc = T.alloc_var("float32")
                top = T.alloc_var("float16")
                acc = 0.0
                top = -T.infinity("float16")
                for s in T.serial(splits):
                    acc += sums[row, s]
                    top = T.max(top, peaks[s, row])
                total[row] = acc
                peak[row] = top

    return main


@tlx.jit(target=SM90)
def weighted_copies(N, block=128):
    """``Y = sum(r * X for r in range(reps))``, summed in order of r, through a workspace of
    ``reps * N`` floats: its size comes from a scalar, so a negative ``reps`` is a bad size the
    launcher must refuse before touching the GPU."""

    @T.prim_func
    def main(X: T.Tensor((N,), "float32"), Y: T.Tensor((N,), "float32"), reps: T.int32):
        copies = T.alloc_global((reps * N,), "float32")
        with T.Kernel(T.ceildiv(N, block), threads=block) as b:
            i = b * block + T.get_thread_binding()
            if i < N:
                for r in T.serial(reps):
                    copies[r * N + i] = X[i] * r
        with T.Kernel(T.ceildiv(N, block), threads=block) as b:
            i = b * block + T.get_thread_binding()
            if i < N:
                acc = T.alloc_var("float32")
                acc = 0.0
                for r in T.serial(reps):
                    acc += copies[r * N + i]
                Y[i] = acc

    return main


@tlx.jit(out_idx=[-1], target=SM90)
def doubled_through_workspace(M, N=64, block=64):
    """``Y = 2 * X + X`` in float16, in two kernels: the first stores ``2 * X`` tile by tile into a
    workspace, the second loads it back beside X; both copies of the workspace go through TMA
    descriptors over its data pointer."""

    @T.prim_func
    def main(X: T.Tensor((M, N), "float16"), Y: T.Tensor((M, N), "float16")):
        doubled = T.alloc_global((M, N), "float16")
        with T.Kernel(T.ceildiv(M, block), threads=128) as bx:
            tile = T.alloc_shared((block, N), "float16")
            twice = T.alloc_shared((block, N), "float16")
            T.copy(X[bx * block, 0], tile)
            for i, j in T.Parallel(block, N):
                twice[i, j] = tile[i, j] * T.float16(2)
            T.copy(twice, doubled[bx * block, 0])
        with T.Kernel(T.ceildiv(M, block), threads=128) as bx:
            tile = T.alloc_shared((block, N), "float16")
            back = T.alloc_shared((block, N), "float16")
            out = T.alloc_shared((block, N), "float16")
            T.copy(X[bx * block, 0], tile)
            T.copy(doubled[bx * block, 0], back)
            for i, j in T.Parallel(block, N):
                out[i, j] = back[i, j] + tile[i, j]
            T.copy(out, Y[bx * block, 0])

    return main


@tlx.jit(out_idx=[-1], target=SM90)
def chained_through_workspace(N, block=128):
    """``Y = 3 * X + X`` in two kernels: the first stores ``3 * X`` into a workspace and lets its
    dependents start (``T.pdl_trigger``), the second waits on it (``T.pdl_sync``) before it reads
    the workspace, so its launch is a programmatic dependent one."""

    @T.prim_func
    def main(X: T.Tensor((N,), "float32"), Y: T.Tensor((N,), "float32")):
        tripled = T.alloc_global((N,), "float32")
        with T.Kernel(T.ceildiv(N, block), threads=block) as b:
            i = b * block + T.get_thread_binding()
            if i < N:
                tripled[i] = X[i] * T.float32(3)
            T.pdl_trigger()
        with T.Kernel(T.ceildiv(N, block), threads=block) as b:
            T.pdl_sync()
            i = b * block + T.get_thread_binding()
            if i < N:
                Y[i] = tripled[i] + X[i]

    return main


@tlx.jit(target=SM90)
def strided_rows(M, N=32, block_M=4):
    """``Y[i, j] = 2 X[i, j]`` over an X whose row stride ``S`` no dimension gives (TileLang's
    ``StridedTensor``, as DeepSeek's TileKernels take their scale tensors): the launcher binds
    ``S`` from X's stride."""
    S = T.dynamic("S")

    @T.prim_func
    def main(X: T.StridedTensor((M, N), (S, 1), "float32"), Y: T.Tensor((M, N), "float32")):
        with T.Kernel(T.ceildiv(M, block_M), threads=128) as bx:
            for i, j in T.Parallel(block_M, N):
                if bx * block_M + i < M:
                    Y[bx * block_M + i, j] = X[bx * block_M + i, j] * 2.0

    return main
