"""FP8 grouped GEMM: e4m3 activations (1 x 128 fp32 scales) x e4m3 expert weights
(128 x 128 fp32 scales) -> bf16, the DeepGEMM recipe on sm_90a wgmma.

Per 128-wide K block the tensor cores accumulate the block's raw e4m3 products in fp32
(wgmma, K in steps of 32, starting from zero); the block result is then scaled by
``sa[row, kb] * sb[n // 128, kb]`` and added to the fp32 total with one fma
(``total = fma(block, scale, total)``), K blocks in ascending order; the total is rounded
to bf16 once. ``grouped_gemm.cu`` repeats this with hand-written wgmma (m64n64k32; the kernels
here issue m64n128k32, the same per-element sums, bitwise equal on the H200).

Layouts:

* contiguous: A [R, K] holds the experts' rows stacked, each expert padded to 128 rows
  (``metadata.routing_metadata``); ``block_expert[R // 128]`` names each row block's
  expert, -1 for blocks not computed (C rows left untouched).
* masked: A [E, M, K] with ``counts[E]``; row blocks wholly past ``counts[e]`` are not
  computed; rows past the count inside a computed block hold A's (unspecified) rows' products.

Both kernels: 128 x 128 output tiles, two consumer warpgroups of 64 rows (one m64n128k32 chain
per K step), a TMA producer, each thread's two row scales read into registers before the stage
is released. The contiguous kernel is scheduled by hand (persistent, A multicast across a
2-CTA cluster, see ``grouped_gemm_contiguous_kernel``); the masked one uses TileLang's
automatic warp specialization.
"""

import functools

import tilelang.language as T

import tlx

BLOCK_M = 128
BLOCK_N = 128
BLOCK_K = 128  # = the scale group: one fp32 promotion per K block

# Symbolic sizes (module level so the kernel sources see them): rows, row blocks, masked rows,
# experts (dynamic so that one compiled kernel serves every expert count of a shape).
nrows = T.dynamic("R")
nblocks = T.dynamic("NB")
mrows = T.dynamic("M")
nexp = T.dynamic("E")


def check_gemm_args(n: int, k: int):
    if k % BLOCK_K:
        raise ValueError(f"k: expected a multiple of {BLOCK_K}, got {k}")
    if n % BLOCK_N:
        raise ValueError(f"n: expected a multiple of {BLOCK_N}, got {n}")


@tlx.jit(target={"kind": "cuda", "arch": "sm_90a"}, pass_configs={"tl.disable_warp_specialized": True})
def grouped_gemm_contiguous_kernel(n: int, k: int, num_stages: int = 4, cluster: int = 2, num_sms: int = 132,
                                   block_n: int = 128, dual: bool = True, unroll: int = 4, band: int = 1, split: bool = False):
    """``(A [R, K], SA [R, K/128], B [E, N, K], SB [E, N/128, K/128], block_expert [R/128], C [R, N])``.

    ``num_sms`` persistent CTAs (one per SM) walk the output tiles row block by row block; the
    ``cluster`` CTAs of a cluster take neighbouring column tiles of the same rows, so the first
    one multicasts the A tile to all (half the L2 reads of A at cluster 2). Per CTA one TMA
    producer warpgroup (threads 256..383: TMA issue, then the 128 rows' ``sa * sb``) and two
    consumer warpgroups (64 rows each). A stage is refilled once every consumer warp of the
    cluster has released it (cluster-scope ``empty`` barriers).

    ``block_n`` columns per tile (m64n{block_n}k32 per consumer warpgroup); a tile wider than
    128 spans two 128-column scale groups (two scales per row) and the last one may pass N
    (TMA zero-fills B's missing rows and clips C's store). ``dual``: two wgmma accumulators,
    the next K block's wgmma runs while the previous block is promoted."""
    check_gemm_args(n, k)
    if block_n % 64 or not 64 <= block_n <= 256 or (dual and block_n > 128):
        raise ValueError(f"block_n: expected 64..256 in steps of 64 (<= 128 with dual), got {block_n}")
    nt = -(-n // block_n)
    if nt % cluster or num_sms % cluster:
        raise ValueError(f"cluster: {cluster} must divide ceil(n / {block_n}) = {nt} and num_sms = {num_sms}")
    kblocks = k // BLOCK_K
    if dual and split:
        raise ValueError("dual and split exclude each other")
    if dual or split:
        unroll = max(u for u in range(1, unroll + 1) if kblocks % u == 0)
    half = block_n // 2
    nclusters = num_sms // cluster
    groups = nt // cluster  # cluster tiles per row block
    ncol = 2 if block_n > 128 else 1  # scale groups a tile touches
    nsg = n // 128

    # Cluster tile p of a CTA's loop step w; its row block and the CTA's column offset.
    def tile(w, pid):
        return w * nclusters + pid // cluster

    # Cluster tiles run in bands of `band` row blocks, column groups outer within a band, so
    # the clusters at work at one time share fewer A and B tiles (L2 reuse).
    def band_rows(w, pid):
        return T.min(band, nblocks - tile(w, pid) // (band * groups) * band)

    def row_block(w, pid):
        if band == 1:
            return tile(w, pid) // groups
        b0 = tile(w, pid) // (band * groups) * band
        return b0 + (tile(w, pid) - b0 * groups) % band_rows(w, pid)

    def col0(w, pid):
        if band == 1:
            g = tile(w, pid) % groups
        else:
            g = (tile(w, pid) - tile(w, pid) // (band * groups) * band * groups) // band_rows(w, pid)
        return (g * cluster + pid % cluster) * block_n

    @T.macro
    def load_scales(scale_s, stage, c, sf):
        for i in T.Parallel(BLOCK_M):
            sf[i] = scale_s[stage, c, i]

    @T.macro
    def issue(A_s, B_s, stage, acc):
        T.wgmma_gemm(A_s[stage, :, :], B_s[stage, :, :], acc, transpose_B=True, policy=T.GemmWarpPolicy.FullRow,
                     clear_accum=True)

    @T.macro
    def release(empty, stage, tx):
        # lane r of every consumer warp releases the stage in the cluster's CTA r
        if tx % 32 < cluster:
            T.mbarrier_arrive(empty[stage], cta_id=tx % 32)

    @T.macro
    def promote(total, acc, sa_sb):
        for i, j in T.Parallel(BLOCK_M, block_n):
            total[i, j] = T.ieee_fmaf(acc[i, j], sa_sb[i], total[i, j])

    @T.macro
    def overlap(A_s, B_s, scale_s, full, empty, it, tx, total, acc_next, sf_next, acc, sf):
        """Issue K block it + 1 into acc_next, then promote block it (in acc) once it is done."""
        T.mbarrier_wait_parity(full[(it + 1) % num_stages], ((it + 1) // num_stages) & 1)
        load_scales(scale_s, (it + 1) % num_stages, 0, sf_next)
        issue(A_s, B_s, (it + 1) % num_stages, acc_next)
        T.wait_wgmma(1)
        release(empty, it % num_stages, tx)
        T.warpgroup_fence_operand(acc, num_regs=BLOCK_M * block_n // 256)
        promote(total, acc, sf)

    @T.macro
    def issue_half(A_s, B_s, stage, h, acc):
        T.wgmma_gemm(A_s[stage, :, :], B_s[stage, h * half:(h + 1) * half, :], acc, transpose_B=True,
                     policy=T.GemmWarpPolicy.FullRow, clear_accum=True)

    @T.macro
    def promote_half(tot, acc, s0, s1, h, even):
        """Half h of the tile; its columns below 128 - col0 % 128 take scale group 0, the rest group 1."""
        T.warpgroup_fence_operand(acc, num_regs=BLOCK_M * half // 256)
        if ncol == 1:
            for i, j in T.Parallel(BLOCK_M, half):
                tot[i, j] = T.ieee_fmaf(acc[i, j], s0[i], tot[i, j])
        elif even:
            for i, j in T.Parallel(BLOCK_M, half):
                tot[i, j] = T.ieee_fmaf(acc[i, j], T.if_then_else(j + h * half < 128, s0[i], s1[i]), tot[i, j])
        else:
            for i, j in T.Parallel(BLOCK_M, half):
                tot[i, j] = T.ieee_fmaf(acc[i, j], T.if_then_else(j + h * half < 64, s0[i], s1[i]), tot[i, j])

    @T.macro
    def split_step(A_s, B_s, scale_s, full, empty, it, tx, px, py, hx, hy, c0, c1, n0, n1, even):
        """Block it's halves are in flight: promote each while the next block's half runs."""
        T.wait_wgmma(1)
        promote_half(hx, px, c0, c1, 0, even)
        T.mbarrier_wait_parity(full[(it + 1) % num_stages], ((it + 1) // num_stages) & 1)
        load_scales(scale_s, (it + 1) % num_stages, 0, n0)
        if ncol == 2:
            load_scales(scale_s, (it + 1) % num_stages, 1, n1)
        issue_half(A_s, B_s, (it + 1) % num_stages, 0, px)
        T.wait_wgmma(1)
        release(empty, it % num_stages, tx)
        promote_half(hy, py, c0, c1, 1, even)
        issue_half(A_s, B_s, (it + 1) % num_stages, 1, py)

    @T.macro
    def promote2(total, acc, sf0, sf1, split):
        for i, j in T.Parallel(BLOCK_M, block_n):
            total[i, j] = T.ieee_fmaf(acc[i, j], T.if_then_else(j < split, sf0[i], sf1[i]), total[i, j])

    @T.prim_func
    def main(
        A: T.Tensor((nrows, k), "float8_e4m3"),
        SA: T.Tensor((nrows, k // BLOCK_K), "float32"),
        B: T.Tensor((nexp, n, k), "float8_e4m3"),
        SB: T.Tensor((nexp, n // 128, k // BLOCK_K), "float32"),
        block_expert: T.Tensor((nblocks,), "int32"),
        C: T.Tensor((nrows, n), "bfloat16"),
    ):
        with T.ClusterKernel(num_sms, cluster_dims=(cluster, 1, 1), threads=384) as pid:
            A_s = T.alloc_shared((num_stages, BLOCK_M, BLOCK_K), "float8_e4m3")
            B_s = T.alloc_shared((num_stages, block_n, BLOCK_K), "float8_e4m3")
            scale_s = T.alloc_shared((num_stages, ncol, BLOCK_M), "float32")
            C_s = T.alloc_shared((BLOCK_M, block_n), "bfloat16")
            sf0 = T.alloc_fragment((BLOCK_M,), "float32")
            sf1 = T.alloc_fragment((BLOCK_M,), "float32")
            part = T.alloc_fragment((BLOCK_M, block_n), "float32")
            part1 = T.alloc_fragment((BLOCK_M, block_n), "float32")
            total = T.alloc_fragment((BLOCK_M, block_n), "float32")
            # split: each K block as two half-width wgmma groups, one promoted while the other runs
            px = T.alloc_fragment((BLOCK_M, half), "float32")
            py = T.alloc_fragment((BLOCK_M, half), "float32")
            hx = T.alloc_fragment((BLOCK_M, half), "float32")
            hy = T.alloc_fragment((BLOCK_M, half), "float32")
            sg0 = T.alloc_fragment((BLOCK_M,), "float32")
            sg1 = T.alloc_fragment((BLOCK_M,), "float32")
            full = T.alloc_barrier([128] * num_stages)  # the producer's 128 threads + the TMA bytes
            empty = T.alloc_cluster_barrier([8 * cluster] * num_stages)  # every consumer warp of the cluster
            it = T.alloc_var("int32", init=0)  # K blocks this CTA has passed: stage and phase
            tx = T.get_thread_binding()

            T.cluster_sync()
            if tx >= 256:
                T.set_max_nreg(40, 0)
                for w in T.serial(T.ceildiv(nblocks * groups, nclusters)):
                    if tile(w, pid) < nblocks * groups:
                        if block_expert[row_block(w, pid)] >= 0:
                            for kb in T.serial(kblocks):
                                T.mbarrier_wait_parity(empty[it % num_stages], ((it // num_stages) & 1) ^ 1)
                                if cluster > 1:
                                    T.tma_copy(A[row_block(w, pid) * BLOCK_M:row_block(w, pid) * BLOCK_M + BLOCK_M,
                                                 kb * BLOCK_K:(kb + 1) * BLOCK_K],
                                               A_s[it % num_stages, :, :], barrier=full[it % num_stages],
                                               cluster_mask=(1 << cluster) - 1)
                                else:
                                    T.tma_copy(A[row_block(w, pid) * BLOCK_M:row_block(w, pid) * BLOCK_M + BLOCK_M,
                                                 kb * BLOCK_K:(kb + 1) * BLOCK_K],
                                               A_s[it % num_stages, :, :], barrier=full[it % num_stages])
                                T.tma_copy(B[block_expert[row_block(w, pid)], col0(w, pid):col0(w, pid) + block_n,
                                             kb * BLOCK_K:(kb + 1) * BLOCK_K],
                                           B_s[it % num_stages, :, :], barrier=full[it % num_stages])
                                # the scales' global loads overlap the TMA transfers
                                for c in T.unroll(ncol):
                                    scale_s[it % num_stages, c, tx - 256] = (
                                        SA[row_block(w, pid) * BLOCK_M + tx - 256, kb]
                                        * SB[block_expert[row_block(w, pid)], T.min(col0(w, pid) // 128 + c, nsg - 1), kb])
                                T.mbarrier_arrive(full[it % num_stages])
                                it = it + 1
            else:
                T.set_max_nreg(232, 1)
                for w in T.serial(T.ceildiv(nblocks * groups, nclusters)):
                    if tile(w, pid) < nblocks * groups:
                        if block_expert[row_block(w, pid)] >= 0:
                            if split:
                                T.clear(hx)
                                T.clear(hy)
                            else:
                                T.clear(total)
                            if dual:
                                # U K blocks per step: block i + 1's wgmma runs while block i is promoted;
                                # nothing stays in flight across the loop's back edge (ptxas would
                                # serialize every wgmma otherwise)
                                for kq in T.serial(kblocks // unroll):
                                    T.mbarrier_wait_parity(full[it % num_stages], (it // num_stages) & 1)
                                    load_scales(scale_s, it % num_stages, 0, sf0)
                                    issue(A_s, B_s, it % num_stages, part)
                                    for h in T.unroll(unroll - 1):
                                        if h % 2 == 0:
                                            overlap(A_s, B_s, scale_s, full, empty, it, tx, total, part1, sf1, part, sf0)
                                        else:
                                            overlap(A_s, B_s, scale_s, full, empty, it, tx, total, part, sf0, part1, sf1)
                                        it = it + 1
                                    T.wait_wgmma(0)
                                    release(empty, it % num_stages, tx)
                                    if unroll % 2 == 0:
                                        T.warpgroup_fence_operand(part1, num_regs=BLOCK_M * block_n // 256)
                                        promote(total, part1, sf1)
                                    else:
                                        T.warpgroup_fence_operand(part, num_regs=BLOCK_M * block_n // 256)
                                        promote(total, part, sf0)
                                    it = it + 1
                            elif split:
                                even = col0(w, pid) % 128 == 0
                                for kq in T.serial(kblocks // unroll):
                                    T.mbarrier_wait_parity(full[it % num_stages], (it // num_stages) & 1)
                                    load_scales(scale_s, it % num_stages, 0, sf0)
                                    if ncol == 2:
                                        load_scales(scale_s, it % num_stages, 1, sf1)
                                    issue_half(A_s, B_s, it % num_stages, 0, px)
                                    issue_half(A_s, B_s, it % num_stages, 1, py)
                                    for h in T.unroll(unroll - 1):
                                        if h % 2 == 0:
                                            split_step(A_s, B_s, scale_s, full, empty, it, tx, px, py, hx, hy,
                                                       sf0, sf1, sg0, sg1, even)
                                        else:
                                            split_step(A_s, B_s, scale_s, full, empty, it, tx, px, py, hx, hy,
                                                       sg0, sg1, sf0, sf1, even)
                                        it = it + 1
                                    T.wait_wgmma(1)
                                    if unroll % 2 == 1:
                                        promote_half(hx, px, sf0, sf1, 0, even)
                                        T.wait_wgmma(0)
                                        release(empty, it % num_stages, tx)
                                        promote_half(hy, py, sf0, sf1, 1, even)
                                    else:
                                        promote_half(hx, px, sg0, sg1, 0, even)
                                        T.wait_wgmma(0)
                                        release(empty, it % num_stages, tx)
                                        promote_half(hy, py, sg0, sg1, 1, even)
                                    it = it + 1
                            else:
                                for kb in T.serial(kblocks):
                                    T.mbarrier_wait_parity(full[it % num_stages], (it // num_stages) & 1)
                                    load_scales(scale_s, it % num_stages, 0, sf0)
                                    if ncol == 2:
                                        load_scales(scale_s, it % num_stages, 1, sf1)
                                    T.gemm(A_s[it % num_stages, :, :], B_s[it % num_stages, :, :], part, transpose_B=True,
                                           policy=T.GemmWarpPolicy.FullRow, clear_accum=True)
                                    release(empty, it % num_stages, tx)
                                    if ncol == 1:
                                        promote(total, part, sf0)
                                    elif col0(w, pid) % 128 == 0:
                                        promote2(total, part, sf0, sf1, 128)
                                    else:
                                        promote2(total, part, sf0, sf1, 64)
                                    it = it + 1
                            if split:
                                T.copy(hx, C_s[:, 0:half])
                                T.copy(hy, C_s[:, half:block_n])
                            else:
                                T.copy(total, C_s)
                            T.copy(C_s, C[row_block(w, pid) * BLOCK_M, col0(w, pid)])
            # no CTA leaves while a peer may still multicast into it or arrive on its barriers
            T.cluster_sync()

    return main


@tlx.jit(target={"kind": "cuda", "arch": "sm_90a"})
def grouped_gemm_masked_kernel(n: int, k: int, num_stages: int = 4):
    """``(A [E, M, K], SA [E, M, K/128], B [E, N, K], SB [E, N/128, K/128], counts [E], C [E, M, N])``."""
    check_gemm_args(n, k)

    @T.prim_func
    def main(
        A: T.Tensor((nexp, mrows, k), "float8_e4m3"),
        SA: T.Tensor((nexp, mrows, k // BLOCK_K), "float32"),
        B: T.Tensor((nexp, n, k), "float8_e4m3"),
        SB: T.Tensor((nexp, n // 128, k // BLOCK_K), "float32"),
        counts: T.Tensor((nexp,), "int32"),
        C: T.Tensor((nexp, mrows, n), "bfloat16"),
    ):
        with T.Kernel(n // BLOCK_N, T.ceildiv(mrows, BLOCK_M), nexp, threads=256) as (bx, by, bz):
            if by * BLOCK_M < counts[bz]:
                A_s = T.alloc_shared((BLOCK_M, BLOCK_K), "float8_e4m3")
                B_s = T.alloc_shared((BLOCK_N, BLOCK_K), "float8_e4m3")
                C_s = T.alloc_shared((BLOCK_M, BLOCK_N), "bfloat16")
                scale_s = T.alloc_shared((BLOCK_M,), "float32")
                scale_f = T.alloc_fragment((BLOCK_M,), "float32")
                part = T.alloc_fragment((BLOCK_M, BLOCK_N), "float32")
                total = T.alloc_fragment((BLOCK_M, BLOCK_N), "float32")
                # The producer side also stages the scales (plain loads), so TileLang does not
                # rebalance registers by itself; without these hints ptxas spills the consumers'
                # accumulators. 256 * 40 + 256 * 208 fits the register file.
                T.annotate_producer_reg_dealloc(40)
                T.annotate_consumer_reg_alloc(208)
                T.clear(total)
                for kb in T.Pipelined(k // BLOCK_K, num_stages=num_stages):
                    T.copy(A[bz, by * BLOCK_M, kb * BLOCK_K], A_s)
                    T.copy(B[bz, bx * BLOCK_N, kb * BLOCK_K], B_s)
                    for i in T.Parallel(BLOCK_M):
                        scale_s[i] = SA[bz, by * BLOCK_M + i, kb] * SB[bz, bx * BLOCK_N // 128, kb]
                    T.clear(part)
                    # read before the gemm, whose completion releases the stage to the producer
                    for i in T.Parallel(BLOCK_M):
                        scale_f[i] = scale_s[i]
                    T.gemm(A_s, B_s, part, transpose_B=True, policy=T.GemmWarpPolicy.FullRow)
                    for i, j in T.Parallel(BLOCK_M, BLOCK_N):
                        total[i, j] = T.ieee_fmaf(part[i, j], scale_f[i], total[i, j])
                T.copy(total, C_s)
                T.copy(C_s, C[bz, by * BLOCK_M, bx * BLOCK_N])

    return main


def _check(name, t, dtype, shape):
    if t.dtype != dtype or tuple(t.shape) != tuple(shape):
        raise ValueError(f"{name}: expected {dtype} of shape {tuple(shape)}, got {t.dtype} of shape {tuple(t.shape)}")


@functools.cache
def persistent_ctas(device_index: int) -> int:
    """One CTA per SM, an even count (2-CTA clusters)."""
    import torch

    return torch.cuda.get_device_properties(device_index).multi_processor_count // 2 * 2


def grouped_gemm_contiguous(a, sa, b, sb, block_expert, out=None):
    """C [R, N] bf16 for the contiguous layout (see the module docstring)."""
    import torch

    r, k = a.shape
    e, n, _ = b.shape
    _check("a", a, torch.float8_e4m3fn, (r, k))
    _check("sa", sa, torch.float32, (r, k // BLOCK_K))
    _check("b", b, torch.float8_e4m3fn, (e, n, k))
    _check("sb", sb, torch.float32, (e, n // 128, k // BLOCK_K))
    _check("block_expert", block_expert, torch.int32, (r // BLOCK_M,))
    if r % BLOCK_M:
        raise ValueError(f"a: expected rows a multiple of {BLOCK_M}, got {r}")
    if out is None:
        out = torch.empty(r, n, dtype=torch.bfloat16, device=a.device)
    kernel = grouped_gemm_contiguous_kernel(n, k, num_sms=persistent_ctas(a.device.index))
    kernel(a, sa, b, sb, block_expert, out)
    return out


def grouped_gemm_masked(a, sa, b, sb, counts, out=None):
    """C [E, M, N] bf16 for the masked layout (see the module docstring)."""
    import torch

    e, m, k = a.shape
    n = b.shape[1]
    _check("a", a, torch.float8_e4m3fn, (e, m, k))
    _check("sa", sa, torch.float32, (e, m, k // BLOCK_K))
    _check("b", b, torch.float8_e4m3fn, (e, n, k))
    _check("sb", sb, torch.float32, (e, n // 128, k // BLOCK_K))
    _check("counts", counts, torch.int32, (e,))
    if out is None:
        out = torch.empty(e, m, n, dtype=torch.bfloat16, device=a.device)
    if e and m:
        grouped_gemm_masked_kernel(n, k)(a, sa, b, sb, counts, out)
    return out
