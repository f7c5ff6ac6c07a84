"""Hand-scheduled TMA + mbarrier pipelines for the race analysis: one correct, three planted bugs.

A producer warpgroup (threads 128..255) loads stage ``k % stages`` of A and B with TMA, the
copy completing on ``full[stage]``; the consumer warpgroup (threads 0..127) waits on
``full[stage]``, multiplies with wgmma, and releases the stage by arriving on
``empty[stage]``, which the producer waits on before it overwrites the stage. Each bug
removes or breaks exactly one of those orderings (``bug``):

- ``"read_before_wait"``: the consumer multiplies before it waits on ``full``;
- ``"overwrite_before_release"``: the producer never waits on ``empty``;
- ``"wrong_phase"``: the consumer waits for the parity of the previous round.
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
