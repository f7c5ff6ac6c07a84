"""FP8 grouped GEMM: e4m3 activations (1 x 128 fp32 scales) x e4m3 expert weights
(128 x 128 fp32 scales) -> bf16, the DeepGEMM recipe on sm_90a wgmma.

Per 128-wide K block the tensor cores accumulate the block's raw e4m3 products in fp32
(wgmma, K in steps of 32, starting from zero); the block result is then scaled by
``sa[row, kb] * sb[n // 128, kb]`` and added to the fp32 total with one fma
(``total = fma(block, scale, total)``), K blocks in ascending order; the total is rounded
to bf16 once. ``grouped_gemm.cu`` repeats this with hand-written wgmma (m64n64k32; the kernels
here issue m64n128k32 or m64n192k32, the same per-element sums, bitwise equal on the H200).

Layouts:

* contiguous: A [R, K] holds the experts' rows stacked, each expert padded to 128 rows
  (``metadata.routing_metadata``); ``block_expert[R // 128]`` names each row block's
  expert, -1 for blocks not computed (C rows left untouched).
* masked: A [E, M, K] with ``counts[E]`` (clamped to 0..M); row blocks wholly past ``counts[e]``
  are not computed; rows past the count inside a computed block hold A's (unspecified) rows'
  products.

Both layouts run one kernel scheduled by hand (``persistent_grouped_gemm``; see
``grouped_gemm_contiguous_kernel``): persistent CTAs, 128 x 192 tiles where N allows, A multicast
across a 2-CTA cluster, two consumer warpgroups of 64 rows (one wgmma chain per K step) and a TMA
producer; the layouts differ only in where a tile's rows live and which tiles a CTA takes.
The same kernel with a SwiGLU epilogue (``grouped_gemm_swiglu_kernel``: the MoE's L1 with the
SwiGLU + e4m3 cast fused in, bitwise equal to the two kernels it replaces) takes 128 x 128 tiles
of gate and up columns together and writes e4m3 with 1 x 128 scales instead of bf16.

``tlx check`` proves every access in bounds (under the launcher-checked ``R <= 2147483391``) and
reports "deterministic, batch-invariant"; its shared-memory race verdict is "unknown", because it
does not model the mbarrier / TMA / cluster-multicast synchronisation between the producer and
the consumers (nor indices read from ``block_expert``). The stage hand-off is the usual full /
empty mbarrier pair per stage; the GPU tests check the results bit for bit against the baseline.
"""

import functools

import tilelang.language as T
from tilelang.layout import make_swizzled_layout

import tlx
from kernels.device import sm_count
from kernels.quant.common import cast_e4m3, group_scale

BLOCK_M = 128
BLOCK_N = 128
WIDE_N = 192  # the wide tiles (see grouped_gemm_contiguous_kernel)
BLOCK_K = 128  # = the scale group: one fp32 promotion per K block

# Symbolic sizes (module level so the kernel sources see them): rows, row blocks, masked rows,
# experts (dynamic so that one compiled kernel serves every expert count of a shape).
nrows = T.dynamic("R")
nblocks = T.dynamic("NB")
mrows = T.dynamic("M")
nexp = T.dynamic("E")


def operand_types(n: int, k: int, masked: bool):
    """The kernel parameters ``A, SA, B, SB, route, C`` of a layout (``route``: ``counts [E]``
    masked, ``block_expert [R / 128]`` contiguous)."""
    rows = (nexp, mrows) if masked else (nrows,)
    return (T.Tensor((*rows, k), "float8_e4m3"), T.Tensor((*rows, k // BLOCK_K), "float32"),
            T.Tensor((nexp, n, k), "float8_e4m3"), T.Tensor((nexp, n // 128, k // BLOCK_K), "float32"),
            T.Tensor((nexp,) if masked else (nblocks,), "int32"), T.Tensor((*rows, n), "bfloat16"))


def check_gemm_args(n: int, k: int):
    if k % BLOCK_K:
        raise ValueError(f"k: expected a multiple of {BLOCK_K}, got {k}")
    if n % BLOCK_N:
        raise ValueError(f"n: expected a multiple of {BLOCK_N}, got {n}")


def persistent_grouped_gemm(n: int, k: int, masked: bool, num_stages: int, cluster: int, num_sms: int,
                            block_n: int | None, unroll_stages: bool, swiglu_clamp: float | None = None,
                            wave: bool = False, row_mask: bool = False):
    """The kernel of ``grouped_gemm_contiguous_kernel`` (docstring there) for either layout;
    ``swiglu_clamp`` set: ``grouped_gemm_swiglu_kernel``'s epilogue (contiguous layout only);
    ``wave`` (with it): ``kernels.moe.mega.wave.wave_kernel``, its L1 tiles then the L2 tiles;
    ``row_mask``: a ``rows [R]`` parameter, and only C's rows whose entry is >= 0 are stored
    (plain contiguous layout only); a tile whose last 64 rows are padding then loads only its
    first 64 A rows (half the A bytes a stage: the V4 layers 1.02-1.055x faster as CUDA graphs,
    the same bits, H100 2026-12-06, at T = 8 / 64 / 512 / 2048 and V4-Pro T = 8 / 512)."""
    check_gemm_args(n, k)
    swiglu = swiglu_clamp is not None
    if row_mask and (masked or swiglu or wave):
        raise ValueError("row_mask: the row-masked store serves the plain contiguous layout only")
    if wave and not swiglu:
        raise ValueError("wave: the wave kernel's L1 tiles take the SwiGLU epilogue; expected a swiglu_clamp")
    if swiglu:
        if masked:
            raise ValueError("masked: the SwiGLU epilogue serves the contiguous layout only")
        if n % (2 * BLOCK_N):
            raise ValueError(f"n: expected 2I with I a multiple of {BLOCK_N} (gate and up halves), got {n}")
        if block_n not in (None, BLOCK_N):
            raise ValueError(f"block_n: the SwiGLU epilogue takes {BLOCK_N}-wide gate and up tiles, got {block_n}")
        block_n = BLOCK_N
    if block_n is None:
        block_n = WIDE_N if -(-n // WIDE_N) % cluster == 0 else BLOCK_N
    if block_n not in (BLOCK_N, WIDE_N):
        raise ValueError(f"block_n: expected {BLOCK_N} or {WIDE_N}, got {block_n}")
    # output columns: N, or the I = N / 2 SwiGLU columns (a tile's gate columns c0.. pair with the
    # up columns I + c0.. of the same rows)
    cols = n // 2 if swiglu else n
    nt = -(-cols // block_n)
    if nt % cluster or num_sms % cluster:
        raise ValueError(f"cluster: {cluster} must divide ceil(n / {block_n}) = {nt} and num_sms = {num_sms}")
    kblocks = k // BLOCK_K
    # wave: the L2 tiles (N = k = H, K = cols = I), 128 x 128 like the L1 ones
    nt2, kblocks2 = k // BLOCK_N, cols // BLOCK_K
    if wave and nt2 % cluster:
        raise ValueError(f"cluster: {cluster} must divide the L2 column tiles k / {BLOCK_N} = {nt2}")
    # the consumers' K loop unrolled over the stages where each tile's K blocks fill whole rounds of
    # them (every tile then starts at stage 0): stage indices and barrier addresses become constants
    whole_rounds = kblocks % num_stages == 0 and (not wave or kblocks2 % num_stages == 0)
    unroll = num_stages if unroll_stages and whole_rounds else 1
    nclusters = num_sms // cluster
    # row blocks: the contiguous layout's NB, or every expert's ceil(M / 128) in the masked one
    mblocks = T.ceildiv(mrows, BLOCK_M)
    nrb = nexp * mblocks if masked else nblocks
    groups = nt // cluster  # cluster tiles per row block
    groups2 = nt2 // cluster  # wave: L2 cluster tiles per row block (after all nrb * groups L1 ones)
    ncol = 2 if block_n > 128 or swiglu else 1  # scale groups a tile touches (SwiGLU: the gate's, the up's)

    # Cluster tile p of a CTA's loop step w; its row block and the CTA's column offset.
    def tile(w, pid):
        return w * nclusters + pid // cluster

    def row_block(w, pid):
        return tile(w, pid) // groups

    def col0(w, pid):
        return (tile(w, pid) % groups * cluster + pid % cluster) * block_n

    # The layouts differ only in where a tile's rows live: A / SA / C rows r0.. of the whole matrix
    # (contiguous) or of expert ``expert``'s matrix (masked; SA's row clamped below M: TMA zero-fills
    # A's rows past M and clips C's).
    def a_tile(A, expert, r0, kb, rows: int = BLOCK_M):
        ks = slice(kb * BLOCK_K, (kb + 1) * BLOCK_K)
        return A[expert, r0:r0 + rows, ks] if masked else A[r0:r0 + rows, ks]

    def sa_at(SA, expert, row, kb):
        return SA[expert, T.min(row, mrows - 1), kb] if masked else SA[row, kb]

    def c_tile(C, expert, r0, c0):
        return C[expert, r0:r0 + BLOCK_M, c0:c0 + block_n] if masked else C[r0:r0 + BLOCK_M, c0:c0 + block_n]

    def sb_group(c0, c):
        """B's scale row of the tile's scale group ``c``: the next 128 columns (clipped at N), or
        with SwiGLU the up half's group (``c`` = 1: columns I + c0..)."""
        return c0 // 128 + c * (cols // 128) if swiglu else T.min(c0 // 128 + c, n // 128 - 1)

    def tiles_of(count):
        """Cluster tiles of a masked expert with ``count`` rows (clamped to 0..M)."""
        return T.ceildiv(T.min(T.max(count, 0), mrows), BLOCK_M) * groups

    @T.macro
    def next_tile(w, pid, route, walk_e: T.Ref, walk_rem: T.Ref, expert: T.Ref, r0: T.Ref, c0: T.Ref):
        """The CTA's tile of loop step ``w``: its ``expert`` (-1: none), first row and column.

        Contiguous: cluster tile ``tile(w, pid)`` of the row blocks in order (``route`` =
        block_expert, -1 for blocks not computed). Masked: the cluster tiles of the experts' computed
        row blocks only (``route`` = counts), handed out in turn as above; the CTA walks the experts
        once (``walk_e``, and ``walk_rem``: its next tile's index among expert ``walk_e``'s), so
        every cluster gets the same share of work whichever row blocks are empty; once the walk
        has passed the last expert no tile follows, and the CTA leaves the tile loop."""
        if masked:
            while T.if_then_else(walk_e < nexp, walk_rem >= tiles_of(route[walk_e]), False):
                walk_rem = walk_rem - tiles_of(route[walk_e])
                walk_e = walk_e + 1
            # 0 <= walk_rem < the expert's tiles always holds here; written out for the bounds proof
            expert = T.if_then_else(walk_e < nexp, T.if_then_else(
                0 <= walk_rem and walk_rem < tiles_of(route[walk_e]), walk_e, -1), -1)
            r0 = T.if_then_else(expert >= 0, walk_rem // groups * BLOCK_M, 0)
            c0 = T.if_then_else(expert >= 0, (walk_rem % groups * cluster + pid % cluster) * block_n, 0)
            walk_rem = T.if_then_else(expert >= 0, walk_rem + nclusters, walk_rem)
            if expert < 0:
                T.loop_break()
        else:
            expert = T.if_then_else(tile(w, pid) < nrb * groups, route[row_block(w, pid)], -1)
            r0 = T.if_then_else(tile(w, pid) < nrb * groups, row_block(w, pid) * BLOCK_M, 0)
            c0 = col0(w, pid)

    @T.macro
    def next_wave_tile(w, pid, route, second: T.Ref, expert: T.Ref, r0: T.Ref, c0: T.Ref):
        """The wave kernel's tile of loop step ``w``: cluster tiles ``0 .. nrb * groups`` are the L1
        tiles of the row blocks in order, the next ``nrb * groups2`` their L2 tiles (``second`` = 1)."""
        second = T.if_then_else(tile(w, pid) >= nrb * groups, 1, 0)
        t = tile(w, pid) - second * (nrb * groups)
        g = T.if_then_else(second == 1, groups2, groups)
        expert = T.if_then_else(tile(w, pid) < nrb * (groups + groups2), route[T.min(t // g, nrb - 1)], -1)
        r0 = T.if_then_else(expert >= 0, t // g * BLOCK_M, 0)
        c0 = T.if_then_else(expert >= 0, (t % g * cluster + pid % cluster) * block_n, 0)

    @T.macro
    def promote(total, part, sf0, sf1, split):
        """total = fma(part, sa * sb, total); columns from ``split`` on take the second scale group."""
        for i, j in T.Parallel(BLOCK_M, block_n):
            if ncol == 1:
                total[i, j] = T.ieee_fmaf(part[i, j], sf0[i], total[i, j])
            else:
                total[i, j] = T.ieee_fmaf(part[i, j], T.if_then_else(j < split, sf0[i], sf1[i]), total[i, j])

    @T.macro
    def promote_one(total, part, sf):
        """total = fma(part, sa * sb, total) with one scale group (a SwiGLU half)."""
        for i, j in T.Parallel(BLOCK_M, block_n):
            total[i, j] = T.ieee_fmaf(part[i, j], sf[i], total[i, j])

    @T.macro
    def stage_round(split, it, full, empty, scale_s, sf0, sf1, A_s, B_s, Bu_s, part, total, total_up, tx, mode):
        """The consumers' next ``unroll`` K blocks, from block ``it`` of the CTA. ``mode`` "plain":
        one block_n-wide tile (``split``: see ``promote``); "swiglu": the gate block into ``total``,
        then the up block into ``total_up``; "single": one 128-wide tile of one scale group (the
        wave kernel's L2 tiles)."""
        for u in T.unroll(unroll):
            # unrolled, `it` is a multiple of num_stages here: stage u, one phase
            stage = u if unroll > 1 else it % num_stages
            T.mbarrier_wait_parity(full[stage], (it // num_stages) & 1)
            for i in T.Parallel(BLOCK_M):
                sf0[i] = scale_s[stage, 0, i]
                if ncol == 2 and mode != "single":
                    sf1[i] = scale_s[stage, 1, i]
            T.gemm(A_s[stage, :, :], B_s[stage, :, :], part, transpose_B=True,
                   policy=T.GemmWarpPolicy.FullRow, clear_accum=True)
            if mode == "swiglu":
                promote_one(total, part, sf0)
                T.gemm(A_s[stage, :, :], Bu_s[stage, :, :], part, transpose_B=True,
                       policy=T.GemmWarpPolicy.FullRow, clear_accum=True)
            # lane r of every consumer warp releases the stage in the cluster's CTA r
            if tx % 32 < cluster:
                T.mbarrier_arrive(empty[stage], cta_id=tx % 32)
            if mode == "swiglu":
                promote_one(total_up, part, sf1)
            elif mode == "single":
                promote_one(total, part, sf0)
            else:
                promote(total, part, sf0, sf1, split)

    @T.macro
    def load_a(A, expert, r0, kb, A_s, full, it: T.Ref, rows: int):
        """Stage ``it``'s first ``rows`` A rows of the tile, multicast over the cluster."""
        src = a_tile(A, expert, r0, kb, rows)
        dst = A_s[it % num_stages, 0:rows, :] if rows < BLOCK_M else A_s[it % num_stages, :, :]
        if cluster > 1:
            T.tma_copy(src, dst, barrier=full[it % num_stages], cluster_mask=(1 << cluster) - 1)
        else:
            T.tma_copy(src, dst, barrier=full[it % num_stages])

    @T.macro
    def produce(A, SA, B, SB, expert, r0, c0, it: T.Ref, next_sa, next_sb, A_s, B_s, Bu_s, scale_s, full, empty, tx,
                l2, half=None):
        """The producer's loads of one tile: per K block (after the cluster has released its stage)
        the A tile (multicast over the cluster), the B tile(s) and ``sa * sb`` of each scale group.
        ``l2``: a wave kernel's L2 tile (K = I, one B tile, one scale group), else the kernel's own.
        ``half`` (row_mask kernels): 1 where the tile's last 64 rows are padding: only its first 64
        A rows are loaded (the other half of the stage keeps stale values, whose products reach
        padding rows only, which the row-masked store skips); None: every row."""
        nk = kblocks2 if l2 else kblocks
        ng = 1 if l2 else ncol
        next_sa[0] = sa_at(SA, expert, r0 + tx - 256, 0)
        for c in T.unroll(ng):
            next_sb[c] = SB[expert, c0 // 128 if l2 else sb_group(c0, c), 0]
        for kb in T.serial(nk):
            T.mbarrier_wait_parity(empty[it % num_stages], ((it // num_stages) & 1) ^ 1)
            if half is None:
                load_a(A, expert, r0, kb, A_s, full, it, BLOCK_M)
            elif half == 1:
                load_a(A, expert, r0, kb, A_s, full, it, BLOCK_M // 2)
            else:
                load_a(A, expert, r0, kb, A_s, full, it, BLOCK_M)
            T.tma_copy(B[expert, c0:c0 + block_n, kb * BLOCK_K:(kb + 1) * BLOCK_K],
                       B_s[it % num_stages, :, :], barrier=full[it % num_stages])
            if swiglu and not l2:
                T.tma_copy(B[expert, cols + c0:cols + c0 + block_n, kb * BLOCK_K:(kb + 1) * BLOCK_K],
                           Bu_s[it % num_stages, :, :], barrier=full[it % num_stages])
            # this K block's scales were loaded one block ago (their latency off the
            # stage's critical path); load the next one's
            for c in T.unroll(ng):
                scale_s[it % num_stages, c, tx - 256] = next_sa[0] * next_sb[c]
            if kb + 1 < nk:
                next_sa[0] = sa_at(SA, expert, r0 + tx - 256, kb + 1)
                for c in T.unroll(ng):
                    next_sb[c] = SB[expert, c0 // 128 if l2 else sb_group(c0, c), kb + 1]
            T.mbarrier_arrive(full[it % num_stages])
            it = it + 1

    @T.macro
    def swiglu_epilogue(total, total_up, amax, Q_s, S, r0, c0):
        """``swiglu_cast`` of the tile's bf16-rounded gate and up totals (as L1 would have stored
        them), the same fp32 operations in the same order: into ``total`` in place, then its
        row's 1 x 128 amax, scale and e4m3 bytes into ``Q_s``; the scales straight to ``S``."""
        for i, j in T.Parallel(BLOCK_M, block_n):
            g = T.min(T.Cast("float32", T.Cast("bfloat16", total[i, j])), T.float32(swiglu_clamp))
            u = T.max(T.min(T.Cast("float32", T.Cast("bfloat16", total_up[i, j])), T.float32(swiglu_clamp)),
                      T.float32(-swiglu_clamp))
            total[i, j] = g / T.ieee_add(T.float32(1.0), T.exp(-g), "rn") * u  # no FMA contraction into expf
        T.reduce_absmax(total, amax, dim=1)
        for i, j in T.Parallel(BLOCK_M, block_n):
            Q_s[i, j] = cast_e4m3(total[i, j] * (T.float32(1.0) / group_scale(amax[i], "e4m3", False)[0]))
        for i in T.Parallel(BLOCK_M):
            S[r0 + i, c0 // 128] = group_scale(amax[i], "e4m3", False)[0]

    @T.macro
    def finish_tile(fill, total, total_up, amax, out_s, dst, S, r0, c0, live):
        """The consumers' epilogue: ``out_s`` filled from the totals (``fill`` "swiglu": by
        ``swiglu_epilogue``, else a bf16 copy) once the previous TMA store has read it, then stored
        to ``dst`` by TMA, which runs under the next tile's main loop. ``live`` (row_mask): the
        thread's row entry (threads 0..127: row ``tx``), the tile's entries in shared memory, C and
        tx; the consumers then store the rows whose entry is >= 0 themselves (TileLang 0.1.15
        lowers no TMA store of a part of the swizzled tile)."""
        # the previous tile's store has read out_s (a no-op in the other threads)
        T.tma_store_wait(0)
        T.sync_threads(1, 256)  # consumers only: the producer keeps loading
        if fill == "swiglu":
            swiglu_epilogue(total, total_up, amax, out_s, S, r0, c0)
        else:
            T.copy(total, out_s)
        if live is not None:
            entry, live_s, C, tx = live
            if tx < BLOCK_M:
                live_s[tx] = entry[0]
            T.sync_threads(1, 256)
            vpr = block_n // 8  # 16-byte pieces a row
            for p in T.unroll(BLOCK_M * vpr // 256):
                # a 192-wide tile may pass N (the TMA store clipped it)
                if live_s[(p * 256 + tx) // vpr] >= 0 and (c0 // 8 + (p * 256 + tx) % vpr) * 8 < cols:
                    # the column as 8 * (piece index) lets TileLang prove 16-byte alignment
                    for v in T.vectorized(8):
                        C[r0 + (p * 256 + tx) // vpr, (c0 // 8 + (p * 256 + tx) % vpr) * 8 + v] = \
                            out_s[(p * 256 + tx) // vpr, (p * 256 + tx) % vpr * 8 + v]
        else:
            T.fence_proxy_async()  # out_s's generic-proxy writes before the TMA reads them
            T.sync_threads(1, 256)
            T.tma_copy(out_s, dst)

    if wave:
        from kernels.moe.mega.protocol import FLAG_WORDS, RECORD_PRELUDE, STATUS, WAIT_L1, record_failure
        from kernels.moe.mega.sysflags import COUNTER_PRELUDE, PRELUDE, count_release, fence_proxy_async_global, wait_count

    @T.macro
    def wave_producer(A, SA, B, SB, S, route, L2, it: T.Ref, second: T.Ref, expert: T.Ref, r0: T.Ref, c0: T.Ref,
                      next_sa, next_sb, A_s, B_s, Bu_s, scale_s, full, empty, tx, pid):
        """The wave kernel's producer: an L2 tile's loads wait until its row block's L1 count has
        reached the ``nt`` L1 tiles (one thread acquires, with the rank's timeout; the producer
        warpgroup then syncs and fences the async proxy before TMA reads the rows). The L2 tiles'
        scales are read from ``S`` itself, the buffer the L1 tiles write: a read-only alias of it
        would be a ``const __restrict__`` pointer, which nvcc may read through the non-coherent
        cache."""
        QA, B2, SB2, counters, flags, rank, wave_id, timeout_ns = L2
        for w in T.serial(T.ceildiv(nrb * (groups + groups2), nclusters)):
            next_wave_tile(w, pid, route, second, expert, r0, c0)
            if expert >= 0:
                if second == 1:
                    if tx == 256:
                        if wait_count(counters, r0 // BLOCK_M, nt, flags[STATUS], timeout_ns) == 0:
                            record_failure(flags[STATUS], WAIT_L1, rank, wave_id, rank)
                    T.sync_threads(2, 128)  # the producer warpgroup only
                    fence_proxy_async_global()
                    produce(QA, S, B2, SB2, expert, r0, c0, it, next_sa, next_sb, A_s, B_s, Bu_s, scale_s, full,
                            empty, tx, True)
                else:
                    produce(A, SA, B, SB, expert, r0, c0, it, next_sa, next_sb, A_s, B_s, Bu_s, scale_s, full,
                            empty, tx, False)

    @T.macro
    def wave_consumers(C, S, route, L2, it: T.Ref, second: T.Ref, expert: T.Ref, r0: T.Ref, c0: T.Ref, full, empty,
                       scale_s, sf0, sf1, A_s, B_s, Bu_s, part, total, total_up, amax, C_s, Y_s, tx, pid):
        """The wave kernel's consumers: an L1 tile (SwiGLU epilogue into ``C`` / ``S``, then its row
        block's count raised once the tile's rows and scales are in global memory) or an L2 tile
        (bf16 into ``Y``)."""
        Y, counters = L2
        for w in T.serial(T.ceildiv(nrb * (groups + groups2), nclusters)):
            next_wave_tile(w, pid, route, second, expert, r0, c0)
            if expert >= 0:
                T.clear(total)
                if second == 1:
                    for kq in T.serial(kblocks2 // unroll):
                        stage_round(128, it, full, empty, scale_s, sf0, sf1, A_s, B_s, Bu_s, part, total, total_up,
                                    tx, "single")
                        it = it + unroll
                    finish_tile("copy", total, total_up, amax, Y_s, Y[r0:r0 + BLOCK_M, c0:c0 + block_n], S, r0, c0, None)
                else:
                    T.clear(total_up)
                    for kq in T.serial(kblocks // unroll):
                        stage_round(128, it, full, empty, scale_s, sf0, sf1, A_s, B_s, Bu_s, part, total, total_up,
                                    tx, "swiglu")
                        it = it + unroll
                    finish_tile("swiglu", total, total_up, amax, C_s, C[r0:r0 + BLOCK_M, c0:c0 + block_n], S, r0, c0, None)
                    # publish: the store complete (its issuing thread waits), the async proxy's global
                    # writes and every consumer's scale stores ordered before the count's release
                    T.tma_store_wait(0, read=False)
                    fence_proxy_async_global()
                    T.call_extern("handle", "__threadfence")
                    T.sync_threads(1, 256)
                    if tx == 0:
                        count_release(counters, r0 // BLOCK_M)
        T.tma_store_wait(0)  # C_s and Y_s stay valid until the last store has read them

    @T.macro
    def body(A, SA, B, SB, route, C, S, L2, rows):
        with T.ClusterKernel(num_sms, cluster_dims=(cluster, 1, 1), threads=384,
                             prelude=PRELUDE + RECORD_PRELUDE + COUNTER_PRELUDE if wave else None) as pid:
            A_s = T.alloc_shared((num_stages, BLOCK_M, BLOCK_K), "float8_e4m3")
            B_s = T.alloc_shared((num_stages, block_n, BLOCK_K), "float8_e4m3")
            # SwiGLU: the up half's B tiles, and the e4m3 output tile instead of the bf16 one
            Bu_s = T.alloc_shared((num_stages, block_n, BLOCK_K), "float8_e4m3") if swiglu else None
            scale_s = T.alloc_shared((num_stages, ncol, BLOCK_M), "float32")
            C_s = T.alloc_shared((BLOCK_M, block_n), "float8_e4m3" if swiglu else "bfloat16")
            if row_mask:  # no TMA store to give C_s its swizzle: without one, stmatrix conflicts 8-way
                T.annotate_layout({C_s: make_swizzled_layout(C_s)})
            Y_s = T.alloc_shared((BLOCK_M, block_n), "bfloat16") if wave else None  # the wave's L2 tiles
            sf0 = T.alloc_fragment((BLOCK_M,), "float32")
            sf1 = T.alloc_fragment((BLOCK_M,), "float32")
            part = T.alloc_fragment((BLOCK_M, block_n), "float32")
            total = T.alloc_fragment((BLOCK_M, block_n), "float32")
            total_up = T.alloc_fragment((BLOCK_M, block_n), "float32") if swiglu else None
            amax = T.alloc_fragment((BLOCK_M,), "float32") if swiglu else None
            full = T.alloc_barrier([128] * num_stages)  # the producer's 128 threads + the TMA bytes
            empty = T.alloc_cluster_barrier([8 * cluster] * num_stages)  # every consumer warp of the cluster
            it = T.alloc_var("int32", init=0)  # K blocks this CTA has passed: stage and phase
            # the current tile's expert, first row and first column, set once per tile (expressions
            # that TileLang would otherwise inline into every K step), and the masked layout's walk
            # over the experts (see next_tile)
            expert = T.alloc_var("int32")
            r0 = T.alloc_var("int32")
            c0 = T.alloc_var("int32")
            walk_e = T.alloc_var("int32", init=0)
            walk_rem = T.alloc_var("int32")
            half = T.alloc_var("int32") if row_mask else None  # row_mask: the tile's last 64 rows are padding
            second = T.alloc_var("int32") if wave else None  # the wave kernel's tile: 1 for an L2 tile
            next_sa = T.alloc_local((1,), "float32")  # the producer's scales of the next K block
            next_sb = T.alloc_local((ncol,), "float32")
            entry = T.alloc_local((1,), "int32") if row_mask else None  # row_mask: row tx's entry
            live_s = T.alloc_shared((BLOCK_M,), "int32") if row_mask else None  # the tile's row entries
            tx = T.get_thread_binding()
            walk_rem = pid // cluster
            T.cluster_sync()
            if wave:
                if tx >= 256:
                    T.set_max_nreg(40, 0)
                    wave_producer(A, SA, B, SB, S, route, L2[:3] + L2[4:], it, second, expert, r0, c0, next_sa,
                                  next_sb, A_s, B_s, Bu_s, scale_s, full, empty, tx, pid)
                else:
                    T.set_max_nreg(232, 1)
                    wave_consumers(C, S, route, L2[3:5], it, second, expert, r0, c0, full, empty, scale_s, sf0, sf1,
                                   A_s, B_s, Bu_s, part, total, total_up, amax, C_s, Y_s, tx, pid)
            elif tx >= 256:
                T.set_max_nreg(40, 0)
                for w in T.serial(T.ceildiv(nrb * groups, nclusters)):
                    next_tile(w, pid, route, walk_e, walk_rem, expert, r0, c0)
                    if expert >= 0:
                        if row_mask:
                            # an expert's rows come first in its blocks: a padding row at 64, padding from there on
                            half = T.if_then_else(rows[r0 + BLOCK_M // 2] < 0, 1, 0)
                        produce(A, SA, B, SB, expert, r0, c0, it, next_sa, next_sb, A_s, B_s, Bu_s, scale_s, full,
                                empty, tx, False, half)
            else:
                T.set_max_nreg(232, 1)
                for w in T.serial(T.ceildiv(nrb * groups, nclusters)):
                    next_tile(w, pid, route, walk_e, walk_rem, expert, r0, c0)
                    if expert >= 0:
                        if row_mask and tx < BLOCK_M:
                            entry[0] = rows[r0 + tx]  # used in the epilogue: its latency under the main loop
                        T.clear(total)
                        if swiglu:
                            T.clear(total_up)
                        for kq in T.serial(kblocks // unroll):
                            # the split column is fixed per branch, so the scale choice folds away
                            if ncol == 1 or swiglu or c0 % 128 == 0:
                                stage_round(128, it, full, empty, scale_s, sf0, sf1, A_s, B_s, Bu_s, part, total,
                                            total_up, tx, "swiglu" if swiglu else "plain")
                            else:
                                stage_round(64, it, full, empty, scale_s, sf0, sf1, A_s, B_s, Bu_s, part, total,
                                            total_up, tx, "plain")
                            it = it + unroll
                        finish_tile("swiglu" if swiglu else "copy", total, total_up, amax, C_s,
                                    c_tile(C, expert, r0, c0), S, r0, c0,
                                    (entry, live_s, C, tx) if row_mask else None)
                T.tma_store_wait(0)  # C_s stays valid until the last store has read it
            # no CTA leaves while a peer may still multicast into it or arrive on its barriers
            T.cluster_sync()

    A_t, SA_t, B_t, SB_t, route_t, C_t = operand_types(n, k, masked)

    def q_types():
        """Fresh ``(Q [R, I] e4m3, S [R, I/128] fp32)`` parameter types (one pair per parameter pair)."""
        return T.Tensor((nrows, cols), "float8_e4m3"), T.Tensor((nrows, cols // 128), "float32")

    Q_t, S_t = q_types()
    if wave:
        QA_t = q_types()[0]

        @T.prim_func
        def main(A: A_t, SA: SA_t, B: B_t, SB: SB_t, block_expert: route_t, Q: Q_t, S: S_t, QA: QA_t,
                 B2: T.Tensor((nexp, k, cols), "float8_e4m3"), SB2: T.Tensor((nexp, k // 128, cols // 128), "float32"),
                 Y: T.Tensor((nrows, k), "bfloat16"), counters: T.Tensor((nblocks,), "int32"),
                 flags: T.Tensor((FLAG_WORDS,), "int32"), rank: T.int32, wave_id: T.int32, timeout_ns: T.int64):
            body(A, SA, B, SB, block_expert, Q, S, (QA, B2, SB2, Y, counters, flags, rank, wave_id, timeout_ns), None)
    elif swiglu:
        @T.prim_func
        def main(A: A_t, SA: SA_t, B: B_t, SB: SB_t, block_expert: route_t, Q: Q_t, S: S_t):
            body(A, SA, B, SB, block_expert, Q, S, None, None)
    elif masked:
        @T.prim_func
        def main(A: A_t, SA: SA_t, B: B_t, SB: SB_t, counts: route_t, C: C_t):
            body(A, SA, B, SB, counts, C, None, None, None)
    elif row_mask:
        @T.prim_func
        def main(A: A_t, SA: SA_t, B: B_t, SB: SB_t, block_expert: route_t, rows: T.Tensor((nrows,), "int32"),
                 C: C_t):
            body(A, SA, B, SB, block_expert, C, None, None, rows)
    else:
        @T.prim_func
        def main(A: A_t, SA: SA_t, B: B_t, SB: SB_t, block_expert: route_t, C: C_t):
            body(A, SA, B, SB, block_expert, C, None, None, None)
    return main


@tlx.jit(target={"kind": "cuda", "arch": "sm_90a"},
         pass_configs={"tl.disable_warp_specialized": True, "tl.disable_thread_storage_sync": True},
         assume=("NB <= 16777214",))  # rows < 2^31 - 256: row_block * 128 + tx stays in int32
def grouped_gemm_contiguous_kernel(n: int, k: int, num_stages: int = 4, cluster: int = 2, num_sms: int = 132,
                                   block_n: int | None = None, unroll_stages: bool = True, row_mask: bool = False):
    """``(A [R, K], SA [R, K/128], B [E, N, K], SB [E, N/128, K/128], block_expert [R/128], C [R, N])``.

    ``num_sms`` persistent CTAs (one per SM) walk the output tiles row block by row block; the
    ``cluster`` CTAs of a cluster take neighbouring column tiles of the same rows, so the first
    one multicasts the A tile to all (half the L2 reads of A at cluster 2). Per CTA one TMA
    producer warpgroup (threads 256..383: TMA issue, then the 128 rows' ``sa * sb``) and two
    consumer warpgroups (64 rows each, one m64n{block_n}k32 chain per K step). A stage is
    refilled once every consumer warp of the cluster has released it (cluster-scope ``empty``
    barriers).

    ``block_n`` 128 or 192; by default 192 where the column tiles pair up in the clusters, else
    128: the H200 runs at its power limit here, and 192-wide tiles move fewer shared-memory bytes
    per flop (1213 against 1127 TFLOP/s on 8 x 4096 x 4096 x 7168). A 192-wide tile spans two
    128-column scale groups (two scales per row, split at column 128 or 64 by the tile's start)
    and the last one may pass N (TMA zero-fills B's missing rows and clips C's store).

    Epilogue: the consumers write the bf16 tile to ``C_s`` and one thread issues its TMA store;
    that thread waits for the store to have read ``C_s`` only before the next tile's epilogue
    writes it again, so the store runs under the next tile's main loop. Waiting at once cost
    ~2000 cycles per tile (ncu at 1.33 GHz on 4 x 8192 x 7168 x 4096: 1.87 against 1.96 ms,
    tensor pipe 73.5 against 69.6% active; H200 at its power limit 1057 against 995 TFLOP/s).

    ``unroll_stages``: where each tile's K blocks fill whole rounds of the ``num_stages`` stages
    (K a multiple of 512 at 4 stages), the consumers' K loop is unrolled over the stages, so stage
    indices, barrier addresses and wgmma descriptors are constants instead of being rebuilt from the
    running K-block count every step. ncu at a fixed 1.33 GHz, 8 x 4096 x 4096 x 7168: 1.80 -> 1.61
    ms (cuBLAS's blockwise _scaled_mm: 1.66); H200 at its power limit +3 to +11% where K is 2048,
    3072 or 7168, equal (-2 to 0%) at K = 4096, where the producer was the limit (below).

    The producer loads each K block's scales one block ahead (into registers, multiplied and stored
    to ``scale_s`` in the next step): loaded and used in the same step, their global-load latency
    paced the producer below the consumers at K = 4096 (ncu at 1.33 GHz, 4 x 8192 x 7168 x 4096:
    1.84 -> 1.62 ms; H200 at its power limit +11-12% at K = 4096, +1-3% elsewhere).

    Padding rows are computed like the others (their C rows hold A's padding rows' products).
    Session 5 tried skipping them (commits 7b56d54..9884aef: a warpgroup whose 64 rows are all
    padding waits for and releases each stage with no wgmma and no promotion, padding rows of C
    written as 0 from ``entry_of_row``): bitwise equal to a baseline with the same contract and the
    layer's output unchanged, but slower on every shape, unpadded ones included (H200 round 2,
    interleaved, old -> skip: 8 x 4096 x 4096 x 7168 1166 -> 1085 TFLOP/s, 4 x 8192 x 7168 x 4096
    1071 -> 917, V4-Flash L1 routed 804 -> 691; ncu at 1.33 GHz on V4-Flash L1 2.22 -> 2.47 ms,
    SM throughput 72 -> 55%; whole V4-Flash layer as a CUDA graph T = 8 366 -> 369 us, T = 512
    1904 -> 2013, T = 8192 3632 -> 4081). The consumers' SASS differs only by the branches around
    the wgmma / promotion and the epilogue's selects; where the time goes is not known yet.

    torch's ``_scaled_mm`` with the same block scales (cuBLAS on sm_90) computes each expert's rows
    to the same bits; on the dense shape it runs 1.66 ms at ncu's fixed 1.33 GHz where this kernel
    took 1.79-1.83 ms before the K loop was unrolled (8 x 4096 x 4096 x 7168). Neither A's multicast
    (L2 traffic), nor a banded tile order (DRAM traffic), nor ordering or staggering the two
    warpgroups' wgmma issue made it faster (the figures are in the git history of ``bench/grouped_gemm.py``).

    On the routed V4-Flash rows at T = 8192 (two row blocks an expert) the 128-wide kernel is bound by
    L2 bandwidth (ncu on an H100: L2 throughput 87%, DRAM 68-72%). Orders and cluster shapes that move
    fewer bytes were slower (H100, 2026-12-07, ``bench/RESULTS.md``'s MegaMoE section): a row-block pair
    a cluster with the weights multicast instead of A (L1 +2%), row blocks column-major in windows of
    4 / 8 (+3% at T = 4001, the SwiGLU form +30% at 8192), and clusters of 4 (A to four CTAs, or 2 x 2
    with A and the weights each multicast to two: 28% fewer L2 bytes, 1.4-1.9x slower; whether for the
    four-CTA barrier or for fewer 4-CTA clusters co-resident than the grid holds is not settled)."""
    return persistent_grouped_gemm(n, k, False, num_stages, cluster, num_sms, block_n, unroll_stages, row_mask=row_mask)


@tlx.jit(target={"kind": "cuda", "arch": "sm_90a"},
         pass_configs={"tl.disable_warp_specialized": True, "tl.disable_thread_storage_sync": True},
         assume=("NB <= 16777214",))  # as the contiguous kernel
def grouped_gemm_swiglu_kernel(n: int, k: int, clamp: float = 10.0, num_stages: int = 4, cluster: int | None = None,
                               num_sms: int = 132, unroll_stages: bool = True):
    """``(A [R, K], SA [R, K/128], B [E, 2I, K], SB [E, 2I/128, K/128], block_expert [R/128],
    Q [R, I] e4m3, S [R, I/128] fp32)``, ``n`` = 2I: the MoE's L1 GEMM with ``swiglu_cast`` as
    its epilogue, bitwise equal to ``grouped_gemm_contiguous`` followed by ``swiglu_cast(hidden,
    clamp=clamp)`` (unweighted, fp32 1 x 128 scales, row-major) on the computed row blocks; rows of
    blocks with expert -1 are not written. The bf16 hidden state [R, 2I] never reaches memory.

    The contiguous kernel's schedule (see there) with 128 x 128 output tiles: a tile's gate columns
    ``c0..c0+127`` of B (rows of ``w1``: gate first, ``kernels.moe.reference.swiglu_ref``) and its up
    columns ``I + c0..`` arrive in one stage (two B loads); per K block the consumers run the gate
    wgmma chain, promote it, run the up chain into the same ``part`` registers and promote that
    (part + gate total + up total = 192 fp32 registers per thread, as the 192-wide tile's part +
    total). Each total is the L1 kernel's to the bit: the same per-element wgmma sums, the same fma
    promotion with ``sa * sb`` of the element's own scale group, K blocks in order.

    Epilogue (``swiglu_epilogue``): each total rounded to bf16 (what L1 stores) and back, the gate
    clamped above and the up clamped both ways at ``clamp``, ``g / (1 + expf(-g)) * u`` with the IEEE
    quotient (``swiglu_cast`` takes a quotient equal to it bit for bit, checked over every bf16 g),
    the row's amax over its 128 values (max is exact in any order), ``scale = max(amax, C) / 448``,
    ``q = e4m3(v * (1 / scale))``: the operations of ``swiglu_cast`` in its order, so the same
    bits. The e4m3 tile leaves by TMA store like the bf16 one; the 128 scales by plain stores.

    ``cluster``: by default 2 where the I / 128 column tiles pair up, else 1."""
    if cluster is None:
        cluster = 2 if n // 2 % (2 * BLOCK_N) == 0 else 1
    return persistent_grouped_gemm(n, k, False, num_stages, cluster, num_sms, None, unroll_stages, float(clamp))


@tlx.jit(target={"kind": "cuda", "arch": "sm_90a"},
         pass_configs={"tl.disable_warp_specialized": True, "tl.disable_thread_storage_sync": True},
         assume=("E * ((M + 127) // 128) <= 16777214", "M <= 2147483392"))  # row blocks as NB above
def grouped_gemm_masked_kernel(n: int, k: int, num_stages: int = 4, cluster: int = 2, num_sms: int = 132,
                               block_n: int | None = None, unroll_stages: bool = True):
    """``(A [E, M, K], SA [E, M, K/128], B [E, N, K], SB [E, N/128, K/128], counts [E], C [E, M, N])``.

    The contiguous kernel (see there) over the cluster tiles of the experts' computed row blocks
    only: each CTA walks ``counts`` once, so empty row blocks cost nothing and every cluster gets
    the same share of tiles however the counts fall (see ``next_tile``). M need not be a multiple
    of 128 (TMA zero-fills A's rows past M and clips C's store; SA's row index is clamped).

    H200, 2026-11-30 (session 8), against session 6's one-CTA-per-tile 128 x 128 kernel on
    TileLang's automatic warp specialization, interleaved, bitwise equal: faster on all 80 shapes
    of a sweep (V4 Flash / Pro L1 and L2, 32 experts, M 256..2048, 5-90% of M filled), by 1.10x to
    1.51x (geometric mean 1.30x). Before the walk (tiles of every row block dealt out in turn, the
    empty ones skipped) the persistent kernel lost to it at decode and where the empty blocks fell
    on few clusters (M 768, 15% filled: 610 against 280 us)."""
    return persistent_grouped_gemm(n, k, True, num_stages, cluster, num_sms, block_n, unroll_stages)


def _check(name, t, dtype, shape):
    if t.dtype != dtype or tuple(t.shape) != tuple(shape):
        raise ValueError(f"{name}: expected {dtype} of shape {tuple(shape)}, got {t.dtype} of shape {tuple(t.shape)}")


def persistent_ctas(device_index: int) -> int:
    """One CTA per SM, an even count (2-CTA clusters)."""
    return sm_count(device_index) // 2 * 2


def _check_contiguous(a, sa, b, sb, block_expert):
    """(R, N, K) of the contiguous layout's operands, each checked."""
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
    return r, n, k


# GPUs (by a part of their name) on which the 128-wide routed-row tiles won at every batch size
# (``streaming_block_n``): an H100 has 0.7x an H200's bandwidth for the same tensor cores
NARROW_EVERYWHERE = ("H100",)


@functools.cache
def narrow_everywhere(device_index: int) -> bool:
    """Whether ``streaming_block_n`` takes the 128-wide tiles at every size on this device."""
    import torch

    return any(tag in torch.cuda.get_device_name(device_index) for tag in NARROW_EVERYWHERE)


def streaming_block_n(rows: int, n_experts: int, everywhere: bool = False) -> int | None:
    """``block_n`` of a contiguous GEMM over ``rows`` padded rows (a static bound, such as
    ``metadata.max_rows``) and ``n_experts`` experts: 128 where the bound is below one row block
    an expert (a decode batch: few experts active, few rows each) or ``everywhere`` (a device of
    ``NARROW_EVERYWHERE``), else None (the kernel's default: 192 where the column tiles pair up).
    The 128-wide kernel is the one that stores routed rows only (``row_mask``; at 192 wide its
    registers do not fit: V4-Flash T = 8192, 6185 against 4687 us a layer on an H100).

    The V4 layers as CUDA graphs, 2026-12-06, interleaved, the same bits, 128-wide tiles storing
    routed rows against 192-wide tiles storing every row: on an H200, V4-Flash T = 8 350 against
    378 us (1.08x), T = 512 1938 / 1940 (equal), T = 8192 3994 / 3696 (0.93x), V4-Pro T = 8192
    0.90x; on an H100 (less bandwidth a flop) 1.15x / 1.18x / 1.06x and V4-Pro T = 8192 1.25x,
    and 1.06-1.24x at each of 14 sizes of both models in a later sweep (``bench/moe_tile_width.py``),
    hence 128 at every size there."""
    return BLOCK_N if everywhere or rows < BLOCK_M * n_experts else None


def grouped_gemm_contiguous(a, sa, b, sb, block_expert, out=None, rows=None, tokens=None):
    """C [R, N] bf16 for the contiguous layout (see the module docstring); the tile width by
    ``streaming_block_n`` (either gives the same bits). ``rows`` (int32 [R], the metadata's
    ``entry_of_row``): C's rows whose entry is < 0 are unspecified; where the tiles are 128 wide
    (``streaming_block_n``) they are not written. The padding rows of a few-token batch are most of
    C (T = 8: 6144 rows, 48 routed), and storing them cost a tenth of the weights' bytes again.
    ``tokens`` (with ``rows``): the batch's token count, which bounds every expert's rows; where
    ``grouped_gemm_decode.decode_width`` takes it (up to 512 tokens) the weights-on-M decode kernel
    computes the routed rows (the same bits), in one chunk a block where its width holds ``tokens``."""
    import torch

    from kernels.moe import grouped_gemm_decode as decode

    r, n, k = _check_contiguous(a, sa, b, sb, block_expert)
    if rows is not None:
        _check("rows", rows, torch.int32, (r,))
    if tokens is not None and (not isinstance(tokens, int) or tokens < 1):
        raise ValueError(f"tokens: expected a positive int (the batch's token count), got {tokens!r}")
    if out is None:
        out = torch.empty(r, n, dtype=torch.bfloat16, device=a.device)
    width = decode.decode_width(tokens) if rows is not None else None
    if width is not None:
        bounded = decode.one_chunk(tokens, width)
        decode.grouped_gemm_decode_kernel(n, k, width, bounded=bounded)(a, sa, b, sb, block_expert, rows, out)
        return out
    block_n = streaming_block_n(r, b.shape[0], narrow_everywhere(a.device.index))
    row_mask = rows is not None and block_n == BLOCK_N
    kernel = grouped_gemm_contiguous_kernel(n, k, num_sms=persistent_ctas(a.device.index), block_n=block_n,
                                            row_mask=row_mask)
    kernel(a, sa, b, sb, block_expert, rows, out) if row_mask else kernel(a, sa, b, sb, block_expert, out)
    return out


def grouped_gemm_swiglu(a, sa, b, sb, block_expert, clamp: float = 10.0, out=None):
    """(Q [R, I] e4m3, S [R, I/128] fp32) = ``swiglu_cast(grouped_gemm_contiguous(a, sa, b, sb,
    block_expert), clamp=clamp)`` on the computed row blocks, in one kernel
    (``grouped_gemm_swiglu_kernel``); ``out``: a (Q, S) pair to write instead."""
    import torch

    r, n, k = _check_contiguous(a, sa, b, sb, block_expert)
    if out is None:
        out = (torch.empty(r, n // 2, dtype=torch.float8_e4m3fn, device=a.device),
               torch.empty(r, n // 2 // 128, dtype=torch.float32, device=a.device))
    if not isinstance(out, (tuple, list)) or len(out) != 2:
        raise ValueError(f"out: expected a (Q, S) pair of tensors, got {type(out).__name__}")
    _check("out[0]", out[0], torch.float8_e4m3fn, (r, n // 2))
    _check("out[1]", out[1], torch.float32, (r, n // 2 // 128))
    grouped_gemm_swiglu_kernel(n, k, float(clamp), num_sms=persistent_ctas(a.device.index))(a, sa, b, sb, block_expert,
                                                                                          *out)
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
        grouped_gemm_masked_kernel(n, k, num_sms=persistent_ctas(a.device.index))(a, sa, b, sb, counts, out)
    return out
