"""Hand-scheduled TMA + mbarrier pipelines for the race analysis: one correct, three planted bugs.

A producer warpgroup (threads 128..255) loads stage ``k % stages`` of A and B with TMA, the
copy completing on ``full[stage]``; the consumer warpgroup (threads 0..127) waits on
``full[stage]``, multiplies with wgmma, and releases the stage by arriving on
``empty[stage]``, which the producer waits on before it overwrites the stage. Each bug
removes or breaks exactly one of those orderings (``bug``):

- ``"read_before_wait"``: the consumer multiplies before it waits on ``full``;
- ``"overwrite_before_release"``: the producer never waits on ``empty``;
- ``"wrong_phase"``: the consumer waits for the parity of the previous round.

Also: a shared-atomics histogram (:func:`shared_histogram`), stores then wgmma
(:func:`staged_then_wgmma`), a shared tile written and TMA-stored round after round
(:func:`tma_store_rounds`), warpgroups staging rows behind their own named barriers in a loop
(:func:`warpgroup_staging`), and the lowered-kernel rewrites that plant a missing barrier, move a
proxy fence or drop a call (:func:`drop_block_barrier`, :func:`move_proxy_fence`, :func:`drop_call`).
"""

import tilelang.language as T

BUGS = ("read_before_wait", "overwrite_before_release", "wrong_phase")


def tma_pipeline(M=256, N=256, K=512, bm=128, bn=128, bk=64, stages=3, bug=None, full_count=128):
    """``C = A @ B.T`` through a ``stages``-deep TMA ring; returns ``(prim_func, pass_configs)``.

    ``full_count`` is the arrival count ``full`` is initialised with: the 128 producer threads
    arrive, so any other count makes a phase complete at the wrong time.
    """
    if bug not in (None, *BUGS):
        raise ValueError(f"bug: expected None or one of {BUGS}, got {bug!r}")
    flip = 1 if bug == "wrong_phase" else 0

    @T.prim_func
    def main(A: T.Tensor((M, K), "float16"), B: T.Tensor((N, K), "float16"), C: T.Tensor((M, N), "float32")):
        with T.Kernel(N // bn, M // bm, threads=256) as (bx, by):
            A_s = T.alloc_shared((stages, bm, bk), "float16")
            B_s = T.alloc_shared((stages, bn, bk), "float16")
            C_l = T.alloc_fragment((bm, bn), "float32")
            full = T.alloc_barrier([full_count] * stages)  # every producer thread arrives; the TMA bytes too
            empty = T.alloc_barrier([128] * stages)
            tx = T.get_thread_binding()
            if tx >= 128:
                for k in T.serial(K // bk):
                    if bug != "overwrite_before_release":
                        T.mbarrier_wait_parity(empty[k % stages], ((k // stages) & 1) ^ 1)
                    T.tma_copy(A[by * bm:(by + 1) * bm, k * bk:(k + 1) * bk], A_s[k % stages, :, :], barrier=full[k % stages])
                    T.tma_copy(B[bx * bn:(bx + 1) * bn, k * bk:(k + 1) * bk], B_s[k % stages, :, :], barrier=full[k % stages])
                    T.mbarrier_arrive(full[k % stages])
            else:
                T.clear(C_l)
                for k in T.serial(K // bk):
                    if bug == "read_before_wait":
                        T.gemm(A_s[k % stages, :, :], B_s[k % stages, :, :], C_l, transpose_B=True)
                        T.mbarrier_wait_parity(full[k % stages], (k // stages) & 1)
                    else:
                        T.mbarrier_wait_parity(full[k % stages], ((k // stages) & 1) ^ flip)
                        T.gemm(A_s[k % stages, :, :], B_s[k % stages, :, :], C_l, transpose_B=True)
                    T.mbarrier_arrive(empty[k % stages])
                T.copy(C_l, C[by * bm, bx * bn])

    return main, {"tl.disable_warp_specialized": True}


def staged_then_wgmma():
    """Shared tiles written by plain stores, then read by wgmma in a loop; TileLang fences the
    async proxy in the writing threads just before the barrier. Returns ``(prim_func, configs)``."""

    @T.prim_func
    def main(A: T.Tensor((64, 64), "float16"), B: T.Tensor((64, 64), "float16"), C: T.Tensor((64, 64), "float32")):
        with T.Kernel(1, threads=128) as bx:
            A_s = T.alloc_shared((64, 64), "float16")
            B_s = T.alloc_shared((64, 64), "float16")
            C_l = T.alloc_fragment((64, 64), "float32")
            T.copy(A, A_s)
            T.copy(B, B_s)
            T.clear(C_l)
            for k in T.serial(2):
                T.gemm(A_s, B_s, C_l, transpose_B=True)
            T.copy(C_l, C)

    return main, {"tl.disable_tma_lower": True}


def shared_histogram(from_input=False, bins=16, threads=128):
    """Counts into a shared histogram with atomics, then each bin is read by one thread: clear,
    barrier, atomics, barrier, read (TileLang places both barriers itself; a planted bug drops
    one from the lowered kernel with :func:`drop_block_barrier`). The bin is ``tx % bins``, or
    with ``from_input`` a value read from the input ``ids``. Returns ``(prim_func, configs)``."""

    @T.prim_func
    def main(ids: T.Tensor((threads,), "int32"), out: T.Tensor((bins,), "int32")):
        with T.Kernel(1, threads=threads) as bx:
            hist = T.alloc_shared((bins,), "int32")
            tx = T.get_thread_binding()
            if tx < bins:
                hist[tx] = 0
            if from_input:
                T.atomic_add(hist[T.max(T.min(ids[tx], bins - 1), 0)], 1)
            else:
                T.atomic_add(hist[tx % bins], 1)
            if tx < bins:
                out[tx] = hist[tx]

    return main, {}


def warpgroup_staging(buffers=2, across=False, steps=4, groups=3):
    """Each warpgroup, step after step, writes its 128 values into shared ``S[step % buffers]``,
    passes its own named barrier (``bar.sync 2 + tx / 128, 128``, in the loop), then reads
    another of its threads' values (``across``: one of the next warpgroup's, which its barrier
    does not order). Two buffers order step t's reads before step t + 2's writes through step
    t + 1's barrier; one buffer leaves step t's reads racing step t + 1's writes (the indexer's
    per-consumer staging, ``kernels/attention/indexer.py``). Returns ``(prim_func, configs)``."""
    threads = 128 * groups

    @T.prim_func
    def main(X: T.Tensor((steps, threads), "float32"), Y: T.Tensor((steps, threads), "float32")):
        with T.Kernel(1, threads=threads) as bx:
            S = T.alloc_shared((buffers, threads), "float32")
            tx = T.get_thread_binding()
            for t in T.serial(steps):
                S[t % buffers, tx] = X[t, tx]
                T.sync_threads(2 + tx // 128, 128)
                other = (tx + 128) % threads if across else tx // 128 * 128 + 127 - tx % 128
                Y[t, tx] = S[t % buffers, other]

    return main, {"tl.disable_thread_storage_sync": True}


def tma_store_rounds(rounds=2, n=64):
    """Each round the threads write the shared tile ``S``, then ``T.copy`` stores it with TMA
    (sm_90a): TileLang puts a barrier before the writes and one after them, and in the elected
    thread ``fence.proxy.async``, the stores, ``tma_store_arrive`` and ``tma_store_wait(0)``, so
    the next round's writes come after the previous round's stores have read the tile."""

    @T.prim_func
    def main(X: T.Tensor((rounds * n, n), "float32"), Y: T.Tensor((rounds * n, n), "float32")):
        with T.Kernel(1, threads=128):
            S = T.alloc_shared((n, n), "float32")
            for r in T.serial(rounds):
                for i, j in T.Parallel(n, n):
                    S[i, j] = X[r * n + i, j] * 2.0
                T.copy(S, Y[r * n, 0])

    return main, {}


def tile_once_pipeline(wait_at=0, steps=4, bm=64, bn=64, bk=64):
    """A and B tiles loaded once by TMA before the loop (barrier ``ready``); the consumer waits
    on ``ready`` only in iteration ``wait_at`` (``if k == wait_at``) but multiplies the tiles in
    every iteration, then overwrites ``A_s`` after the loop. ``wait_at=0``: every read and the
    overwrite follow the wait; ``wait_at > 0``: the reads of the iterations before it race with
    the TMA writes."""

    @T.prim_func
    def main(A: T.Tensor((bm, bk), "float16"), B: T.Tensor((bn, bk), "float16"), C: T.Tensor((bm, bn), "float32")):
        with T.Kernel(1, threads=256):
            A_s = T.alloc_shared((bm, bk), "float16")
            B_s = T.alloc_shared((bn, bk), "float16")
            C_l = T.alloc_fragment((bm, bn), "float32")
            ready = T.alloc_barrier([128])
            tx = T.get_thread_binding()
            if tx >= 128:
                T.tma_copy(A, A_s, barrier=ready)
                T.tma_copy(B, B_s, barrier=ready)
                T.mbarrier_arrive(ready)
            else:
                T.clear(C_l)
                for k in T.serial(steps):
                    if k == wait_at:
                        T.mbarrier_wait_parity(ready, 0)
                    T.gemm(A_s, B_s, C_l, transpose_B=True)
                for i, j in T.Parallel(bm, bk):
                    A_s[i, j] = T.Cast("float16", C_l[i, j])
                T.copy(C_l, C)

    return main, {"tl.disable_warp_specialized": True}


def _rewrite_device(kernel, postorder, node_type: str):
    """``kernel`` with TVM's ``ir_transform`` callback ``postorder`` (a new node, or None to keep
    it) applied to every ``node_type`` node of its device functions."""
    from tilelang import tvm

    funcs = {gv: f.with_body(tvm.tirx.stmt_functor.ir_transform(f.body, None, postorder, [node_type]))
             for gv, f in kernel.device_mod.functions.items()}
    return kernel.with_device_mod(tvm.IRModule(funcs))


def _evaluated(stmt):
    """The call an ``Evaluate`` statement runs, else None."""
    from tilelang import tvm

    call = stmt.value if isinstance(stmt, tvm.tirx.Evaluate) else None
    return call if isinstance(call, tvm.tirx.Call) else None


def _call_name(stmt) -> str:
    call = _evaluated(stmt)
    return getattr(call.op, "name", "") if call is not None else ""


def drop_call(kernel, name: str, nargs: int | None = None):
    """``kernel`` with every ``Evaluate`` of the intrinsic ``name`` (e.g. ``"tl.tma_store_wait"``;
    with ``nargs``, only the calls of that many arguments: ``tvm_storage_sync`` with 3 is a named
    barrier) removed; refuses a kernel that has none."""
    from tilelang import tvm

    seen = []

    def drop(node):
        if _call_name(node) == name and nargs in (None, len(_evaluated(node).args)):
            seen.append(node)
            return tvm.tirx.Evaluate(0)
        return None

    rewritten = _rewrite_device(kernel, drop, "tirx.Evaluate")
    if not seen:
        raise ValueError(f"name: the kernel has no {name} call")
    return rewritten


def rename_call(kernel, name: str, to: str):
    """``kernel`` with every call of the intrinsic ``name`` made a call of ``to``, same arguments
    (``tl.warpgroup_wait`` -> ``tl.wait_wgmma``, the same wait spelled as ``T.wait_wgmma``)."""
    from tilelang import tvm

    seen = []

    def rename(node):
        if getattr(node.op, "name", "") == name:
            seen.append(node)
            return tvm.tirx.Call(node.dtype, tvm.ir.Op.get(to), node.args)
        return None

    rewritten = _rewrite_device(kernel, rename, "tirx.Call")
    if not seen:
        raise ValueError(f"name: the kernel has no {name} call")
    return rewritten


def drop_block_barrier(kernel, which: int):
    """``kernel`` with its ``which``-th ``__syncthreads()`` (in program order) removed: a planted
    missing barrier that TileLang's own barrier insertion cannot put back."""
    from tilelang import tvm

    seen = []

    def drop(node):
        if _call_name(node) == "tirx.tvm_storage_sync" and len(_evaluated(node).args) == 1:
            seen.append(node)
            if len(seen) - 1 == which:
                return tvm.tirx.Evaluate(0)
        return None

    rewritten = _rewrite_device(kernel, drop, "tirx.Evaluate")
    if len(seen) <= which:
        raise ValueError(f"which: the kernel has {len(seen)} block barriers, got {which}")
    return rewritten


def move_proxy_fence(kernel, to: str):
    """``kernel`` (from :func:`staged_then_wgmma`) with its writers' ``fence.proxy.async ;
    __syncthreads()`` rewritten: ``to="reader"`` puts the fence after the barrier, then another
    barrier (every reader fences in an earlier epoch than its wgmma); ``to="none"`` drops it."""
    from tilelang import tvm

    if to not in ("reader", "none"):
        raise ValueError(f"to: expected 'reader' or 'none', got {to!r}")
    moved = []

    def rewrite(node):
        seq = list(node.seq)
        for i in range(len(seq) - 1):
            if _call_name(seq[i]) == "tl.fence_proxy_async" and _call_name(seq[i + 1]) == "tirx.tvm_storage_sync":
                moved.append(i)
                fence, barrier = seq[i], seq[i + 1]
                seq[i:i + 2] = [barrier, fence, barrier] if to == "reader" else [barrier]
                return tvm.tirx.SeqStmt(seq)
        return None

    rewritten = _rewrite_device(kernel, rewrite, "tirx.SeqStmt")
    if not moved:
        raise ValueError("kernel: no fence.proxy.async right before a block barrier")
    return rewritten


def staged_rows_pipeline(release_early: bool, rows=64, dim=64):
    """TileLang's own warp-specialized ``T.Pipelined`` loop of a symbolic trip count whose producer
    stages TMA tiles (X_s, Y_s) and rows written with plain stores (r_s); returns ``(prim_func, {})``.

    TileLang writes r_s after the back-pressure wait of the first TMA copy, and the consumer
    releases that stage after its last use of that copy's buffer. ``release_early`` copies X first,
    whose last use (the first GEMM) precedes the read of r_s: the producer refills r_s two steps
    ahead while it is read (the d 256 dV race of dense_bwd). Otherwise Y, which feeds the last
    GEMM, is copied first and the stage is released after r_s is read.
    """
    n = T.dynamic("n")

    @T.prim_func
    def main(X: T.Tensor((n * rows, dim), "bfloat16"), Y: T.Tensor((n * rows, dim), "bfloat16"), R: T.Tensor((n * rows,), "float32"),
             W: T.Tensor((rows, dim), "bfloat16"), out: T.Tensor((rows, dim), "float32")):
        with T.Kernel(1, threads=128):
            W_s = T.alloc_shared((rows, dim), "bfloat16")
            X_s = T.alloc_shared((rows, dim), "bfloat16")
            Y_s = T.alloc_shared((rows, dim), "bfloat16")
            r_s = T.alloc_shared((rows,), "float32")
            s = T.alloc_fragment((rows, rows), "float32")
            p = T.alloc_fragment((rows, rows), "bfloat16")
            acc = T.alloc_fragment((rows, dim), "float32")
            if n > 0:  # loaded before the loop with plain copies (not a TMA waited for inside it)
                T.copy(W, W_s)
            T.fill(acc, 0)
            for step in T.Pipelined(n, num_stages=2):
                if release_early:
                    T.copy(X[step * rows:(step + 1) * rows, :], X_s)
                T.copy(Y[step * rows:(step + 1) * rows, :], Y_s)
                if not release_early:
                    T.copy(X[step * rows:(step + 1) * rows, :], X_s)
                for j in T.Parallel(rows):
                    r_s[j] = R[step * rows + j] * T.float32(2)  # plain stores (a bare copy would be cp.async)
                T.gemm(W_s, X_s, s, transpose_B=True, clear_accum=True, policy=T.GemmWarpPolicy.FullRow)
                for i, j in T.Parallel(rows, rows):
                    s[i, j] = T.exp2(s[i, j] - r_s[j])
                T.copy(s, p)
                T.gemm(p, Y_s, acc, policy=T.GemmWarpPolicy.FullRow)
            T.copy(acc, out)

    return main, {}
