"""DeepSeek-V4 sparse attention forward (prefill), on sm_90a.

Per token ``(b, s)`` and head ``h``: attention over the ``k`` entries of one shared
(MQA-style) ``kv [b, n, 512]`` named by ``indices[b, s, :]`` (int32; -1, or any index outside
``[0, n)``, marks a masked slot), the value being the key row itself, plus a learned per-head
attention sink: a logit ``sink[h]`` (natural-log units, not scaled) that joins the softmax's
denominator and has no value. Optionally a sliding-window branch: ``window_indices [b, s, w]``
into a second ``window_kv [b, n_w, 512]``, whose keys join the same softmax (the online-softmax
merge of the two branches is the merge of their partial results by LSE). Outputs
``o [b, s, h, 512]`` and ``lse [b, s, h]`` (natural log, the sink included: a token whose slots
are all masked gets ``o = 0`` and ``lse = sink``).

One CTA per (token, 64 heads): the 64 heads share every gathered key, so ``S = Q KV^T`` is a
64 x 64 block per step (two warpgroups, 32 keys each) and ``O += P KV`` a 64 x 512 block (two
warpgroups, 256 columns each, P through shared memory). Keys in blocks of 64 slots in index-list
order, then the window's; the online softmax of ``common.py``; the sink enters the sum last,
``l += exp2(fma(sink, log2 e, -m_scaled))``. ``sparse_fwd_producer_kernel`` (the default,
``schedule="producer"``) gathers each block in a producer warpgroup by 16-byte cp.async, two
blocks ahead of the two consumer warpgroups, and its consumers stage the output in the query tile
and store whole rows; ``sparse_fwd_kernel`` (``schedule="pipelined"``, TileLang's V4 example's
design) has the two warpgroups gather a block themselves, ``T.Pipelined`` issuing that gather one
block ahead. Both run the same consumer instructions, so they give the same bits. On an H100
(2026-12-06 23:31, b 1, s 4096, h 128, k 1024, interleaved) the producer schedule ran at 388
TFLOP/s, its form before the staged output 350 and the pipelined one 318 (k 2048: 390 against 333;
on an H200 on 2026-12-03, before the producer's queries were loaded in 16-byte pieces, 251 against
286). Under ncu (the pipelined kernel, H200) the L2 is 15% busy and the schedulers issue in 34% of
cycles: both consumer warpgroups step through the same block in lockstep (scores, cross-warpgroup
softmax reductions, then P V), so the tensor cores idle through every softmax.
``schedule="independent"`` lets the two warpgroups drift apart: each computes every block's whole
score tile and its own softmax (the scores twice, no cross-warpgroup step), so that one's softmax
can run under the other's products; its row sums are one chain per thread, the baseline's
``one_chain`` order. It ran at 334 TFLOP/s (H100; 240 on the H200 before): the second score product
costs about what the overlap gains. ``schedule="alternate"`` (FlashMLA's layout) computes the scores
once: the warpgroups own alternate blocks, hand the softmax state and P over through shared memory,
and both add every block into their own output columns; its arithmetic is the independent
schedule's, step for step. It ran at 299 TFLOP/s (H100; 226 on the H200): the chain of softmax steps
passes from one warpgroup to the other at every block.

Fixed orders, the contract with the CUDA baseline ``sparse_fwd.cu`` (bit for bit): S = Q KV^T
by wgmma with the 512 dims ascending in steps of 16; per block, common.py's softmax steps with
the row sum in TileLang's reduce order (mla_tile.cuh spells it out: shared with decode_mla's
baseline, whose TileLang kernel has the same tile; the "independent" schedule's order is its
``kOneChain``, the baseline's ``one_chain``); P rounded to bf16; O += P KV with keys
ascending in steps of 16; blocks in index-list order, then the window's; the sink added last;
o = O * (1 / l) (one IEEE division per row, then a rounded multiply: a division per value cost 8%
of the kernel's time on an H200, 2026-12-03).
A masked slot still loads the kv row of its index clamped into ``[0, n)``: its score is -inf,
its P 0, and 0 times that finite row adds nothing (a NaN in it would give NaN in both).
"""

import math

import torch
import tilelang.language as T
from tilelang.layout import make_swizzled_layout

import tlx

from kernels.attention import common as C

DIM = 512
HEADS_PER_CTA = 64
BLOCK_K = 64
SUPPORTED_HEADS = (64, 128)
SUPPORTED_TOPK = (512, 1024, 2048)

batch = T.dynamic("B")
seq = T.dynamic("S")
n_kv = T.dynamic("N")
n_window_kv = T.dynamic("NW")
MAX_KV_ROWS = 1 << 21  # kv and window_kv rows per sequence (slot_views)
ROWS_ASSUME = ["1 <= N", f"N <= {MAX_KV_ROWS}", "1 <= NW", f"NW <= {MAX_KV_ROWS}"]


def check_kernel_shape(heads: int, topk: int, window: int, block: int) -> None:
    """A kernel factory's head count, and its top-k and window in whole blocks of ``block`` slots."""
    if heads not in SUPPORTED_HEADS:
        raise ValueError(f"heads: expected one of {SUPPORTED_HEADS}, got {heads}")
    if topk % block or topk <= 0:
        raise ValueError(f"topk: expected a positive multiple of {block}, got {topk}")
    if window % block or window < 0:
        raise ValueError(f"window: expected 0 or a multiple of {block}, got {window}")


def slot_views(KV, Idx, WKV, WIdx, b, t):
    """Views of the rows one token gathers from: ``KV[b]``, ``Idx[b, t]``, ``WKV[b]``,
    ``WIdx[b, t]``. Offsets from these bases fit 32 bits (row * 512 + column < 2^31 for at most
    ``MAX_KV_ROWS`` rows, which the kernels assume and the launcher checks) where offsets from the
    tensors' starts take 64-bit arithmetic: 4% of the forward's time on an H200 (2026-12-03)."""
    return (T.make_tensor_from_addr(T.address_of(KV[b, 0, 0]), (KV.shape[1], DIM), KV.dtype),
            T.make_tensor_from_addr(T.address_of(Idx[b, t, 0]), (Idx.shape[2],), "int32"),
            T.make_tensor_from_addr(T.address_of(WKV[b, 0, 0]), (WKV.shape[1], DIM), WKV.dtype),
            T.make_tensor_from_addr(T.address_of(WIdx[b, t, 0]), (WIdx.shape[2],), "int32"))


@T.macro
def gather_block(valid, KV_s, rows, idx, kb, bk: int):
    """Block ``kb`` of ``bk`` slots of the index list ``idx`` over the key rows ``rows`` (a pair
    of ``slot_views``; the forward and the backward gather through it, so both read the same
    rows for the same slots; each runs the top-k list and the window as two loops, whose copies
    are then unconditional and become cp.async: TileLang issues a copy under a branch as
    synchronous loads): ``valid[j]`` 1 where slot j names a row, and that row (the index clamped
    into ``rows`` for a masked slot) in ``KV_s[j, :]``. (The clamp's ``MAX_KV_ROWS - 1`` changes
    nothing for the shapes the kernels accept; it bounds the offset for TileLang, which then keeps
    it in 32 bits.)"""
    for j in T.Parallel(bk):
        valid[j] = T.if_then_else(T.And(idx[kb * bk + j] >= 0, idx[kb * bk + j] < rows.shape[0]), 1, 0)
    for j, d in T.Parallel(bk, DIM):
        KV_s[j, d] = rows[T.min(T.max(idx[kb * bk + j], 0), T.min(rows.shape[0] - 1, MAX_KV_ROWS - 1)), d]


@T.macro
def block_step(Q_s, K_tile, V_tile, valid, stage, acc_s, p, acc_o, rows, scale_log2: float, split: bool):
    """A consumer's step on one gathered key block: S = Q K^T (``split``: the two warpgroups 32
    keys each, FullCol; else this warpgroup the whole tile), masked where ``valid`` (row
    ``stage`` of it, or all of it for ``stage`` None) is 0, the softmax step of common.py, P
    rounded into ``p`` (shared memory or a fragment), O *= alpha, O += P V over ``V_tile``'s
    columns."""
    m, m_prev, m_scaled, alpha, l, row_sum, _ = rows
    hb, bk = acc_s.shape
    if split:
        T.gemm(Q_s, K_tile, acc_s, transpose_B=True, clear_accum=True, policy=T.GemmWarpPolicy.FullCol)
    else:
        T.gemm(Q_s, K_tile, acc_s, transpose_B=True, clear_accum=True)
    for i, j in T.Parallel(hb, bk):
        acc_s[i, j] = T.if_then_else((valid[j] if stage is None else valid[stage, j]) == 1, acc_s[i, j], C.neg_inf())
    C.softmax_step(acc_s, m, m_prev, m_scaled, alpha, l, row_sum, scale_log2, hb, bk)
    T.copy(acc_s, p)
    C.rescale_rows(acc_o, alpha, hb, acc_o.shape[1])
    if split:
        T.gemm(p, V_tile, acc_o, policy=T.GemmWarpPolicy.FullCol)
    else:
        T.gemm(p, V_tile, acc_o)


@T.macro
def write_rows(acc_o, rows, Sink, h0, O_tile, LSE_tile):
    """The sink into the sum, O * (1 / l) into ``O_tile`` and the lse into ``LSE_tile`` (None: not written
    here)."""
    m, m_prev, m_scaled, alpha, l, row_sum, lse_rows = rows
    hb, cols = acc_o.shape
    for i in T.Parallel(hb):
        l[i] = l[i] + T.exp2(T.ieee_fmaf(Sink[h0 + i], T.float32(C.LOG2E), -m_scaled[i]))
    C.finish_rows(acc_o, l, m_scaled, lse_rows, hb, cols, reciprocal=True)
    T.copy(acc_o, O_tile)
    if LSE_tile is not None:
        T.copy(lse_rows, LSE_tile)


@tlx.jit(target=C.TARGET, assume=ROWS_ASSUME)
def sparse_fwd_kernel(heads: int, topk: int, window: int, scale_log2: float, dtype: str = "bfloat16"):
    """Parameters ``Q [B, S, H, 512], KV [B, N, 512], Idx [B, S, topk] int32, Sink [H] fp32,
    WKV [B, NW, 512], WIdx [B, S, max(window, 1)] int32, O [B, S, H, 512], LSE [B, S, H] fp32``
    (``window`` 0: the window tensors are not read). A token's head groups are neighbours in the
    grid (they gather the same rows, which then come from L2) and the output leaves through
    shared memory in one TMA store: 1% and 2% on an H200 (2026-12-03, bench/sparse_fwd_bisect.py)."""
    check_kernel_shape(heads, topk, window, BLOCK_K)
    hb, bk, f32 = HEADS_PER_CTA, BLOCK_K, "float32"
    n_top, n_blocks = topk // bk, (topk + window) // bk

    @T.prim_func
    def main(Q: T.Tensor((batch, seq, heads, DIM), dtype), KV: T.Tensor((batch, n_kv, DIM), dtype),
             Idx: T.Tensor((batch, seq, topk), "int32"), Sink: T.Tensor((heads,), f32),
             WKV: T.Tensor((batch, n_window_kv, DIM), dtype), WIdx: T.Tensor((batch, seq, max(window, 1)), "int32"),
             O: T.Tensor((batch, seq, heads, DIM), dtype), LSE: T.Tensor((batch, seq, heads), f32)):
        with T.Kernel(heads // hb, seq, batch, threads=256) as (by, bx, bz):
            Q_s = T.alloc_shared((hb, DIM), dtype)
            KV_s = T.alloc_shared((bk, DIM), dtype)
            P_s = T.alloc_shared((hb, bk), dtype)
            O_s = T.alloc_shared((hb, DIM), dtype)
            # swizzled: the plain [64, 512] tile took the accumulator's stmatrix stores 8-way
            # (tlx check's banks analysis); its TMA store then goes out in 64-column boxes
            T.annotate_layout({O_s: make_swizzled_layout(O_s)})
            valid = T.alloc_shared((bk,), "int32")
            acc_s = T.alloc_fragment((hb, bk), f32)
            acc_o = T.alloc_fragment((hb, DIM), f32)
            rows = C.row_state(hb)
            KVb, Ib, WKVb, WIb = slot_views(KV, Idx, WKV, WIdx, bz, bx)

            T.copy(Q[bz, bx, by * hb:(by + 1) * hb, :], Q_s)
            C.init_softmax(rows[0], rows[2], rows[4], acc_o)
            for kb in T.Pipelined(n_top, num_stages=2):
                gather_block(valid, KV_s, KVb, Ib, kb, bk)
                block_step(Q_s, KV_s, KV_s, valid, None, acc_s, P_s, acc_o, rows, scale_log2, True)
            for kb in T.Pipelined(n_blocks - n_top, num_stages=2):
                gather_block(valid, KV_s, WKVb, WIb, kb, bk)
                block_step(Q_s, KV_s, KV_s, valid, None, acc_s, P_s, acc_o, rows, scale_log2, True)
            write_rows(acc_o, rows, Sink, by * hb, O_s, LSE[bz, bx, by * hb:(by + 1) * hb])
            T.copy(O_s, O[bz, bx, by * hb:(by + 1) * hb, :])

    return main


STAGES = 2  # gathered key blocks in flight (producer schedule)
OUTPUT_BARRIER = C.NAMED_BARRIER  # the producer schedule's consumers around the output staged in Q_s


@tlx.jit(target=C.TARGET, assume=["1 <= N", "N <= 1073741824", "1 <= NW", "NW <= 1073741824"])
def sparse_fwd_producer_kernel(heads: int, topk: int, window: int, scale_log2: float, dtype: str = "bfloat16",
                               consumers: str = "shared"):
    """``sparse_fwd_kernel``'s computation (same parameters, the same instructions in the same
    order on the consumers: the same bits) with the gather moved into a producer warpgroup:
    it finds each block's 64 rows (the slots' validity into ``valid``, before the stage frees),
    then copies them by 16-byte cp.async, ``STAGES`` blocks ahead of the two consumer warpgroups,
    which wait on an mbarrier instead of loading the rows themselves; the default schedule (module
    docstring: 1.22x the pipelined kernel on an H100). Its consumers stage the output in ``Q_s``
    once both have computed their last scores, then store whole 1 KB rows in 16-byte pieces (the
    accumulator's own stores fill half of each 32-byte sector) with a token's head groups next to
    each other in the grid, as ``sparse_fwd_kernel`` has them.

    ``consumers="independent"`` (``schedule="independent"``): each consumer warpgroup computes the whole
    64 x 64 score tile of every block itself and runs its own softmax (no cross-warpgroup
    reduction, P stays in registers), then its 256 output columns, so the two warpgroups never
    wait for each other and one's softmax can run under the other's products, at the price of
    computing the scores twice. Its row sums take TileLang's order for one warpgroup's 64-key
    tile (one chain over the thread's 16 scores), not the default's (two 32-key chains added):
    other bits than the other schedules, those of ``sparse_fwd.cu`` with ``one_chain``.

    ``consumers="alternate"`` (``schedule="alternate"``, FlashMLA's layout): warpgroup w owns the
    blocks ``j % 2 == w``. It computes block j's whole score tile (m64n64, once), waits for the
    softmax state after block j - 1 (row max, scaled max, row sum: from the other warpgroup,
    through shared memory), runs block j's softmax step and hands P_j (bf16) and the state after
    j over in slot ``j % 2``; then both warpgroups add first the other's block j - 1 and then
    block j into their own 256 output columns (O *= alpha, O += P V, P from shared memory). The
    softmax steps thus run in block order, one warpgroup's under the other's products, and the
    arithmetic is the independent schedule's step for step: the bits of ``sparse_fwd.cu`` with
    ``one_chain``. mbarriers: ``ready[s]`` (the owner's 128 threads: P_j and the state after j
    are in slot s = j % 2), ``free[s]`` (the other's: it has read slot s for block j, so block
    j + 2 may overwrite it)."""
    if consumers not in ("shared", "independent", "alternate"):
        raise ValueError(f"consumers: expected 'shared', 'independent' or 'alternate', got {consumers!r}")
    check_kernel_shape(heads, topk, window, BLOCK_K)
    hb, bk, f32 = HEADS_PER_CTA, BLOCK_K, "float32"
    n_top, n_blocks = topk // bk, (topk + window) // bk
    consumer_threads, half = 2 * C.WARPGROUP, DIM // 2

    @T.macro
    def row_copy(dst, st, src, b, row, j, piece):
        """16 bytes (8 values) ``piece`` of row ``row`` of ``src[b]`` into ``dst[st, j]``."""
        T.ptx_cp_async(T.access_ptr(dst[st, j, piece * 8], "w", 8), T.access_ptr(src[b, row, piece * 8], "r", 8), 8)

    @T.macro
    def consume(Q_s, KV_s, valid, full, empty, acc_s, p, acc_o, rows, Sink, O, LSE, bz, bx, by, w: int, split: bool):
        """A consumer warpgroup over every block: ``split``, the two warpgroups share each block
        (the default's instructions, P through shared memory ``p``, all 512 output columns);
        else warpgroup w alone (its own scores and softmax, P in the fragment ``p``, output
        columns ``[256 w, 256 w + 256)``)."""
        cols = DIM if split else half
        C.init_softmax(rows[0], rows[2], rows[4], acc_o)
        for kb in T.serial(n_blocks):
            T.mbarrier_wait_parity(full[kb % STAGES], (kb // STAGES) & 1)
            T.fence_proxy_async()  # the producer's cp.async rows before the wgmma reads them
            block_step(Q_s, KV_s[kb % STAGES, :, :], KV_s[kb % STAGES, :, w * cols:(w + 1) * cols], valid,
                       kb % STAGES, acc_s, p, acc_o, rows, scale_log2, split)
            T.mbarrier_arrive(empty[kb % STAGES])
        if split:
            # the output through Q_s (swizzled: conflict-free), then whole rows of 16-byte stores;
            # the accumulator's own stores put 4 bytes a thread, 16 a row a quad, in each 32-byte sector
            T.sync_threads(OUTPUT_BARRIER, consumer_threads)  # both warpgroups' last scores have read Q_s
            write_rows(acc_o, rows, Sink, by * hb, Q_s, LSE[bz, bx, by * hb:(by + 1) * hb])
            T.sync_threads(OUTPUT_BARRIER, consumer_threads)
            tx = T.get_thread_binding()
            for k in T.unroll(hb * DIM // 8 // consumer_threads):
                for v in T.vectorized(8):
                    O[bz, bx, by * hb + k * (consumer_threads // 64) + tx // 64, tx % 64 * 8 + v] = Q_s[
                        k * (consumer_threads // 64) + tx // 64, tx % 64 * 8 + v]
        else:
            write_rows(acc_o, rows, Sink, by * hb, O[bz, bx, by * hb:(by + 1) * hb, w * cols:(w + 1) * cols],
                       LSE[bz, bx, by * hb:(by + 1) * hb] if w == 0 else None)

    @T.macro
    def add_block(acc_o, state_s, P_s, KV_s, kb, w: int):
        """O *= alpha, O += P V over block ``kb``'s keys, into this warpgroup's 256 columns (P and
        alpha of the block from slot ``kb % 2``)."""
        for i, d in T.Parallel(hb, half):
            acc_o[i, d] = acc_o[i, d] * state_s[kb % 2, 3, i]
        T.gemm(P_s[kb % 2, :, :], KV_s[kb % STAGES, :, w * half:(w + 1) * half], acc_o)

    @T.macro
    def consume_alternate(Q_s, KV_s, valid, full, empty, ready, free, P_s, state_s, acc_s, acc_o, rows, Sink, O, LSE,
                          bz, bx, by, w: int):
        """Consumer warpgroup w of the alternate layout (docstring): its own blocks' scores and
        softmax steps, every block's products into its output columns, in block order."""
        m, m_prev, m_scaled, alpha, l, row_sum, _ = rows
        T.fill(acc_o, 0)
        for step in T.serial((n_blocks - w + 1) // 2):
            j = 2 * step + w
            T.mbarrier_wait_parity(full[j % STAGES], (j // STAGES) & 1)
            T.fence_proxy_async()  # the producer's cp.async rows before the wgmma reads them
            T.gemm(Q_s, KV_s[j % STAGES, :, :], acc_s, transpose_B=True, clear_accum=True)
            for i, c in T.Parallel(hb, bk):
                acc_s[i, c] = T.if_then_else(valid[j % STAGES, c] == 1, acc_s[i, c], C.neg_inf())
            if j == 0:
                T.fill(m, C.neg_inf())
                T.fill(m_scaled, 0)
                T.fill(l, 0)
            else:  # the state after block j - 1, handed over by the other warpgroup
                T.mbarrier_wait_parity(ready[(j - 1) % 2], ((j - 1) // 2) & 1)
                T.fence_proxy_async()  # block j - 1's rows and P, which this thread's wgmma reads below
                for i in T.Parallel(hb):
                    m[i] = state_s[(j - 1) % 2, 0, i]
                    m_scaled[i] = state_s[(j - 1) % 2, 1, i]
                    l[i] = state_s[(j - 1) % 2, 2, i]
            C.softmax_step(acc_s, m, m_prev, m_scaled, alpha, l, row_sum, scale_log2, hb, bk)
            if j >= 2:  # the other warpgroup has added block j - 2 from this slot
                T.mbarrier_wait_parity(free[j % 2], ((j - 2) // 2) & 1)
            T.copy(acc_s, P_s[j % 2, :, :])
            for i in T.Parallel(hb):
                state_s[j % 2, 0, i] = m[i]
                state_s[j % 2, 1, i] = m_scaled[i]
                state_s[j % 2, 2, i] = l[i]
                state_s[j % 2, 3, i] = alpha[i]
            T.fence_proxy_async()  # P's generic stores before the other warpgroup's wgmma reads them
            T.mbarrier_arrive(ready[j % 2])
            if j > 0:  # the other warpgroup's block j - 1 first: the products in block order
                add_block(acc_o, state_s, P_s, KV_s, j - 1, w)
                T.mbarrier_arrive(free[(j - 1) % 2])
                T.mbarrier_arrive(empty[(j - 1) % STAGES])
            add_block(acc_o, state_s, P_s, KV_s, j, w)
            T.mbarrier_arrive(empty[j % STAGES])
        if (n_blocks - 1) % 2 != w:  # the other's last block, after this warpgroup's last one
            T.mbarrier_wait_parity(ready[(n_blocks - 1) % 2], ((n_blocks - 1) // 2) & 1)
            T.fence_proxy_async()
            add_block(acc_o, state_s, P_s, KV_s, n_blocks - 1, w)
            T.mbarrier_arrive(empty[(n_blocks - 1) % STAGES])
            for i in T.Parallel(hb):
                m_scaled[i] = state_s[(n_blocks - 1) % 2, 1, i]
                l[i] = state_s[(n_blocks - 1) % 2, 2, i]
        write_rows(acc_o, rows, Sink, by * hb, O[bz, bx, by * hb:(by + 1) * hb, w * half:(w + 1) * half],
                   LSE[bz, bx, by * hb:(by + 1) * hb] if w == 0 else None)

    @T.macro
    def produce(KV, Idx, WKV, WIdx, KV_s, valid, full, empty, bz, bx, g):
        """The producer warpgroup (thread g of it): each block's slot validity and rows, ``STAGES``
        blocks ahead."""
        index = T.alloc_var("int32")  # the index of this thread's slot of the block
        row = T.alloc_var("int32")  # the row being copied, clamped into its tensor
        for kb in T.serial(n_blocks):
            # lanes l and l + 16 of warp w hold slot 16 w + l % 16's index, read before the
            # stage is free: that load waits beside the consumers
            index = T.if_then_else(kb < n_top, Idx[bz, bx, T.min(kb, n_top - 1) * bk + g // 32 * 16 + g % 16],
                                   WIdx[bz, bx, T.max(kb - n_top, 0) * bk + g // 32 * 16 + g % 16])
            T.mbarrier_wait_parity(empty[kb % STAGES], ((kb // STAGES) & 1) ^ 1)
            if g % 32 < 16:
                valid[kb % STAGES, g // 32 * 16 + g % 16] = T.if_then_else(
                    T.And(index >= 0, index < T.if_then_else(kb < n_top, KV.shape[1], WKV.shape[1])), 1, 0)
                T.mbarrier_arrive(full[kb % STAGES])
            # a warp copies its 16 rows, 512 contiguous bytes of one row per instruction (two
            # threads a row, 32 bytes each, ran 1.55x slower); the row comes from the lane that
            # read its index, clamped again (the shuffle is opaque to tlx check). A masked slot
            # still loads the row of its index clamped into the tensor (module docstring).
            if kb < n_top:
                for q in T.unroll(32):
                    row = T.min(T.max(T.shfl_sync(index, q // 2), 0), KV.shape[1] - 1)
                    row_copy(KV_s, kb % STAGES, KV, bz, row, g // 32 * 16 + q // 2, q % 2 * 32 + g % 32)
            else:
                for q in T.unroll(32):
                    row = T.min(T.max(T.shfl_sync(index, q // 2), 0), WKV.shape[1] - 1)
                    row_copy(KV_s, kb % STAGES, WKV, bz, row, g // 32 * 16 + q // 2, q % 2 * 32 + g % 32)
            T.cp_async_barrier_noinc(full[kb % STAGES])

    @T.prim_func
    def main(Q: T.Tensor((batch, seq, heads, DIM), dtype), KV: T.Tensor((batch, n_kv, DIM), dtype),
             Idx: T.Tensor((batch, seq, topk), "int32"), Sink: T.Tensor((heads,), f32),
             WKV: T.Tensor((batch, n_window_kv, DIM), dtype), WIdx: T.Tensor((batch, seq, max(window, 1)), "int32"),
             O: T.Tensor((batch, seq, heads, DIM), dtype), LSE: T.Tensor((batch, seq, heads), f32)):
        # a token's head groups next to each other in the grid, as in sparse_fwd_kernel
        with T.Kernel(heads // hb, seq, batch, threads=consumer_threads + C.WARPGROUP) as (by, bx, bz):
            Q_s = T.alloc_shared((hb, DIM), dtype)
            KV_s = T.alloc_shared((STAGES, bk, DIM), dtype)
            valid = T.alloc_shared((STAGES, bk), "int32")
            if consumers == "independent":  # each consumer's own scores, probabilities, softmax state and output half
                state = [(T.alloc_fragment((hb, bk), f32), T.alloc_fragment((hb, bk), dtype),
                          T.alloc_fragment((hb, half), f32), C.row_state(hb)) for _ in range(2)]
            elif consumers == "alternate":  # each consumer's scores, output half and softmax state; P and the state handed over
                P_s = T.alloc_shared((2, hb, bk), dtype)
                state_s = T.alloc_shared((2, 4, hb), f32)  # per slot: row max, scaled max, row sum, alpha
                state = [(T.alloc_fragment((hb, bk), f32), T.alloc_fragment((hb, half), f32), C.row_state(hb)) for _ in range(2)]
                ready = T.alloc_barrier([C.WARPGROUP] * 2)
                free = T.alloc_barrier([C.WARPGROUP] * 2)
            else:
                P_s = T.alloc_shared((hb, bk), dtype)
                acc_s = T.alloc_fragment((hb, bk), f32)
                acc_o = T.alloc_fragment((hb, DIM), f32)
                rows = C.row_state(hb)
            # full: the producer's 128 copying threads and the 64 that wrote `valid`; empty: the consumers
            full = T.alloc_barrier([C.WARPGROUP + bk] * STAGES)
            empty = T.alloc_barrier([consumer_threads] * STAGES)
            tx = T.get_thread_binding()
            # the consumers load the queries in 16-byte pieces, 16 a thread, all in flight at once
            # (TileLang's loop over the 384 threads made 43 four-byte loads a thread: in sparse
            # decode the same pattern cost the e4m3 kernel 1.19x, H200, 2026-12-05)
            if tx < consumer_threads:
                for k in T.unroll(hb * DIM // 8 // consumer_threads):
                    for v in T.vectorized(8):
                        Q_s[k * (consumer_threads // 64) + tx // 64, tx % 64 * 8 + v] = Q[
                            bz, bx, by * hb + k * (consumer_threads // 64) + tx // 64, tx % 64 * 8 + v]
            T.sync_threads()
            if consumers == "alternate":
                if tx < C.WARPGROUP:
                    T.set_max_nreg(240, 1)
                    consume_alternate(Q_s, KV_s, valid, full, empty, ready, free, P_s, state_s, *state[0], Sink, O, LSE, bz, bx, by, 0)
                elif tx < consumer_threads:
                    T.set_max_nreg(240, 1)
                    consume_alternate(Q_s, KV_s, valid, full, empty, ready, free, P_s, state_s, *state[1], Sink, O, LSE, bz, bx, by, 1)
                else:
                    T.set_max_nreg(24, 0)
                    produce(KV, Idx, WKV, WIdx, KV_s, valid, full, empty, bz, bx, tx - consumer_threads)
            elif consumers == "independent":
                if tx < C.WARPGROUP:
                    T.set_max_nreg(240, 1)
                    consume(Q_s, KV_s, valid, full, empty, *state[0], Sink, O, LSE, bz, bx, by, 0, False)
                elif tx < consumer_threads:
                    T.set_max_nreg(240, 1)
                    consume(Q_s, KV_s, valid, full, empty, *state[1], Sink, O, LSE, bz, bx, by, 1, False)
                else:
                    T.set_max_nreg(24, 0)
                    produce(KV, Idx, WKV, WIdx, KV_s, valid, full, empty, bz, bx, tx - consumer_threads)
            else:
                if tx < consumer_threads:
                    T.set_max_nreg(240, 1)
                    consume(Q_s, KV_s, valid, full, empty, acc_s, P_s, acc_o, rows, Sink, O, LSE, bz, bx, by, 0, True)
                else:
                    T.set_max_nreg(24, 0)
                    produce(KV, Idx, WKV, WIdx, KV_s, valid, full, empty, bz, bx, tx - consumer_threads)

    return main


SCHEDULES = {"pipelined": sparse_fwd_kernel, "producer": sparse_fwd_producer_kernel,
             "independent": lambda *a: sparse_fwd_producer_kernel(*a, consumers="independent"),
             "alternate": lambda *a: sparse_fwd_producer_kernel(*a, consumers="alternate")}
ONE_CHAIN = frozenset({"independent", "alternate"})  # schedules whose row sums are one chain (sparse_fwd.cu's one_chain)


def check_index(name: str, t) -> None:
    if not isinstance(t, torch.Tensor) or t.dtype != torch.int32:
        raise TypeError(f"{name}: expected an int32 tensor, got {getattr(t, 'dtype', type(t).__name__)}")
    C.check_tensor(name, t, (torch.int32,), 3)


def check_inputs(q, kv, indices, sink, window_kv, window_indices):
    """The checks of the forward's inputs (the backward's too): ``(b, s, h, window, window_kv,
    window_indices)``, the window tensors replaced by stand-ins of the right rank (never read)
    when there is no window."""
    C.check_tensor("q", q, (torch.bfloat16,), 4)
    C.check_tensor("kv", kv, (torch.bfloat16,), 3)
    check_index("indices", indices)
    C.check_tensor("sink", sink, (torch.float32,), 1)
    b, s, h, d = q.shape
    if d != DIM:
        raise ValueError(f"q: head dim expected {DIM}, got {d}")
    if h not in SUPPORTED_HEADS:
        raise ValueError(f"q: head count expected one of {SUPPORTED_HEADS}, got {h}")
    C.check_dim("kv", kv, 0, b, "the batch of q")
    C.check_dim("kv", kv, 2, DIM, "the head dim")
    if kv.shape[1] > MAX_KV_ROWS:
        raise ValueError(f"kv: expected at most {MAX_KV_ROWS} rows per sequence, got {kv.shape[1]}")
    C.check_dim("indices", indices, 0, b, "the batch of q")
    C.check_dim("indices", indices, 1, s, "the tokens of q")
    if indices.shape[2] not in SUPPORTED_TOPK:
        raise ValueError(f"indices: top-k expected one of {SUPPORTED_TOPK}, got {indices.shape[2]}")
    C.check_dim("sink", sink, 0, h, "the head count of q")
    if (window_kv is None) != (window_indices is None):
        raise ValueError("window_kv, window_indices: expected both or neither")
    if window_kv is None:
        return b, s, h, 0, kv, indices[:, :, :1].contiguous()
    C.check_tensor("window_kv", window_kv, (torch.bfloat16,), 3)
    check_index("window_indices", window_indices)
    C.check_dim("window_kv", window_kv, 0, b, "the batch of q")
    C.check_dim("window_kv", window_kv, 2, DIM, "the head dim")
    if window_kv.shape[1] > MAX_KV_ROWS:
        raise ValueError(f"window_kv: expected at most {MAX_KV_ROWS} rows per sequence, got {window_kv.shape[1]}")
    if tuple(window_indices.shape[:2]) != (b, s) or window_indices.shape[2] % BLOCK_K:
        raise ValueError(f"window_indices: expected [{b}, {s}, a multiple of {BLOCK_K}], got {tuple(window_indices.shape)}")
    return b, s, h, window_indices.shape[2], window_kv, window_indices


def sparse_attention(q, kv, indices, sink, *, softmax_scale: float | None = None, window_kv=None, window_indices=None,
                     schedule: str = "producer"):
    """``(o, lse)`` of DeepSeek-V4 sparse attention (module docstring): ``q [b, s, h, 512]``
    (bf16), ``kv [b, n, 512]``, ``indices [b, s, k]`` int32, ``sink [h]`` fp32; optional window
    ``window_kv [b, n_w, 512]`` with ``window_indices [b, s, w]``. ``softmax_scale`` defaults to
    ``1 / sqrt(512)``. ``schedule``: "producer" (``sparse_fwd_producer_kernel``), "pipelined"
    (``sparse_fwd_kernel``: the same bits), "independent" (the producer kernel's
    ``consumers="independent"`` form: other row-sum bits) or "alternate" (``consumers="alternate"``:
    the independent schedule's bits); their speeds: the module docstring."""
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule: expected one of {tuple(SCHEDULES)}, got {schedule!r}")
    b, s, h, window, window_kv, window_indices = check_inputs(q, kv, indices, sink, window_kv, window_indices)
    scale = 1.0 / math.sqrt(DIM) if softmax_scale is None else float(softmax_scale)
    C.check_cuda(q=q, kv=kv, indices=indices, sink=sink, window_kv=window_kv, window_indices=window_indices)
    o = torch.empty_like(q)
    lse = torch.empty((b, s, h), dtype=torch.float32, device=q.device)
    if b and s and kv.shape[1] and window_kv.shape[1]:
        SCHEDULES[schedule](h, indices.shape[2], window, scale * C.LOG2E)(q, kv, indices, sink, window_kv, window_indices,
                                                                          o, lse)
    return o, lse
