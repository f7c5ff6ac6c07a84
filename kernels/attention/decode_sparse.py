"""Sparse MLA decode: each query token attends to its own top-k keys only (DeepSeek-V4 decode).

Inputs as :func:`kernels.attention.decode_mla.mla_decode`, plus ``indices [B, T, K]`` int32
(K = 512 / 1024 / 2048: key positions in the sequence, e.g. the lightning indexer's top-k) and
``sink [H]`` fp32 (one logit per head, natural-log units, that joins the softmax without a
value). A slot is masked (contributes nothing) when its index is -1, or lies outside the keys
the token may see, ``0 <= index <= seq_lens[b] - T + t``; a masked slot's block-table entry is
not used and its values enter the products as zeros. A visible index whose table entry lies outside ``[0, P)`` makes the
token's rows NaN (documented guard; that page is not read).

Batch invariance: the K slots are cut into splits of ``min(K, split_slots)`` slots (2048 unless the
call says: a constant of the call, never the batch or the SM count); one CTA per (64 heads, split, token) runs the online softmax of
``kernels/attention/common.py`` over its slots in order, 64 at a time, gathering each slot's
key row through the block table (the rows found once per 64 slots, then 16-byte gathers; an
e4m3 cache's raw rows and scales by cp.async, dequantized by the consumers as in dense decode's
split) in a producer warpgroup, two chunks ahead of the consumers (:func:`sparse_split_kernel`);
:func:`decode_mla.mla_combine_kernel` combines the splits in order and adds the sink, or with one split (every default case: K <= 2048 slots a
split) the split kernel finishes its rows itself by the combine's arithmetic, the same bits.
"""

import math

import torch
import tilelang.language as T

import tlx
from kernels.attention import common as C
from kernels.attention.decode_mla import (D_PE, D_QK, D_V, DEQUANT_LAYOUT, GROUP, GROUPS, KV_DTYPES, MAX_PAGES, PAGE, ROWS,
                                          _check, _outputs, _zeros, dequant, lse_weight, mla_combine_kernel, nan,
                                          load_queries, reference_mla_decode)
from kernels.attention.indexer import table_entry

TOPKS = (512, 1024, 2048)
# slots per split (fewer when K is smaller): each split CTA loads its queries and writes fp32
# partials, so longer splits cost less at a large batch (H100, B128 H128 k 2048: 224.2 us at 2048
# slots against 270.9 at 1024) and fill fewer SMs at a small one
SPLIT_SLOTS = 2048
SPLIT_CHOICES = (512, 1024, 2048)  # slots per split a call may choose (a constant of the call: batch invariant)
STAGES = 2  # chunks of 64 slots in flight
REGISTERS = {False: (40, 232), True: (56, 224)}  # (producer, consumer) per thread, bf16 / e4m3 cache
RAW_REGISTERS = (96, 184)  # the same with dequant_by="consumers": the raw gather's addresses (at 56 / 224 it spilled 92 bytes)
CONSUMERS = ("independent", "shared")  # sparse_split_kernel's consumer schedules
DEQUANT_BY = ("producer", "consumers")  # who dequantizes an e4m3 cache's rows (sparse_split_kernel)
RAW_PIECES = D_QK // 16  # 16-byte pieces of a raw e4m3 row
RAW_BATCHES = 2  # a producer thread's 18 raw copies of a chunk go in batches (all at once spilled it)
RAW_BATCH = PAGE * RAW_PIECES // C.WARPGROUP // RAW_BATCHES
SHARED_BARRIER = C.NAMED_BARRIER + 1  # the shared consumers' named barrier (the producer's is C.NAMED_BARRIER)
MASKED_ROW = -1  # slot_row of a masked slot
BAD_ROW = -2  # slot_row of a visible slot whose table entry lies outside [0, P)


def splits_of(topk: int, split_slots: int = SPLIT_SLOTS) -> int:
    """The splits of a top-k of ``topk`` slots: ``split_slots`` slots each, or one split of all."""
    return max(topk // split_slots, 1)


def finishes(topk: int, consumers: str, split_slots: int) -> bool:
    """The split kernel finishes the rows itself (one split, shared consumers: ``finish``), or
    ``mla_combine_kernel`` combines its partials."""
    return splits_of(topk, split_slots) == 1 and consumers == "shared"


def check_schedule(consumers: str, split_slots: int, dequant_by: str) -> None:
    """``sparse_split_kernel``'s schedule options, each one of its choices (else a ValueError
    naming it)."""
    for name, value, choices in (("consumers", consumers, CONSUMERS), ("split_slots", split_slots, SPLIT_CHOICES),
                                 ("dequant_by", dequant_by, DEQUANT_BY)):
        if value not in choices:
            raise ValueError(f"{name}: expected one of {choices}, got {value!r}")


# a cache row (page * 64 + slot) is an int32: at most 2^25 pages (2.5 TB of bf16 cache)
@tlx.jit(target=C.TARGET, assume=["1 <= P", f"P <= {2 ** 31 // PAGE}", "1 <= MP", f"MP <= {MAX_PAGES}", "B <= 65535"])
def sparse_split_kernel(tokens: int, heads: int, topk: int, kv_dtype: str, softmax_scale: float,
                        consumers: str = "shared", split_slots: int = SPLIT_SLOTS, dequant_by: str = "producer",
                        finish: bool = False, with_sink: bool = False):
    """Partial attention of (64-row block of one token's heads, split, token): ``OP [B, NS,
    T*H, 512]`` normalised and ``LP [B, NS, T*H]`` log-sum-exp (-inf: every slot masked; NS =
    ``splits_of(K, split_slots)``), for ``mla_combine_kernel`` to combine.

    ``finish`` (one split, shared consumers): the split is the whole attention, so the kernel
    writes what the combine would, bit for bit, itself: ``OP [B, 1, T*H, 512]`` bf16 (the
    output ``o`` viewed so) and ``LP`` the final lse, the sink ``SINK [H]`` (natural-log units)
    joining each row's softmax when ``with_sink`` (else SINK is not read), by the combine's
    arithmetic (``lse_weight``, ``finish_with_sink``). That saves the fp32 partials' round trip
    through memory (512 x 4 bytes a row, written, read back) and the second launch.

    Warp-specialized: a producer warpgroup gathers the next chunks' key rows into shared memory
    (``STAGES`` chunks in flight: a bf16 row by predicated 16-byte cp.async, zeros for a masked
    slot; an e4m3 row by 8-byte loads, dequantized on the way) while the two consumer
    warpgroups compute on the current one.

    ``consumers="shared"`` (the default): the two consumers share each chunk as
    ``mla_split_kernel`` does (the score tile 32 keys each, FullCol; the softmax's row
    reductions across both; P through the chunk's rope-key slot, dead once both score products
    are done) and own 256 of the 512 output columns each, so the scores are computed once.
    ``consumers="independent"``: each consumer computes the whole 64 x 64 score tile and its
    softmax itself (the same instructions on the same data: the same values in both), so the
    consumers never wait for each other, at 1.5x the tensor work a chunk; its row sums are one
    64-key chain, the shared schedule's two 32-key chains added: other bits, the same values
    within rounding. On an H100 (2026-12-05, B128 H128 T1 k 2048 bf16, interleaved): shared
    270.9 against independent 296.2 us at 1024-slot splits, 224.2 against 256.3 at 2048.

    ``dequant_by`` (an e4m3 cache, shared consumers): "producer" dequantizes while gathering (two
    threads a slot, 8-byte loads, each waited for: the producer bounds the e4m3 kernel, 514.0
    against bf16's 210.1 us through the combine on an H200); "consumers" (``sparse_mla_decode``'s default: 289.3 us
    finished, B128 H128 T1 k 2048, H200, 2026-12-05) gathers the raw rows and their
    scales by cp.async into ``STAGES`` raw stages (no register holds them: every copy of a chunk
    in flight at once) and the consumers dequantize a chunk into the one bf16 tile before its
    products, as dense decode's e4m3 split does. The same dequantized values: the same bits."""
    check_schedule(consumers, split_slots, dequant_by)
    fp8 = kv_dtype == "float8_e4m3"
    if dequant_by == "consumers" and not (fp8 and consumers == "shared"):
        raise ValueError(f"dequant_by: expected one of {DEQUANT_BY} ('consumers' with an e4m3 cache and shared consumers), "
                         f"got {dequant_by!r} ({kv_dtype}, {consumers} consumers)")
    raw_gather = dequant_by == "consumers"  # the producer copies raw e4m3 rows; the consumers dequantize
    # With independent consumers, TileLang's storage sync put a bar.sync in both arms of the e4m3
    # producer's per-slot branch (gather or zeros): a warp whose slots differ in visibility (a
    # short sequence) diverged at it and hung (H100, 2026-12-06). Those two were the only
    # barriers it added to that build, and its rows need none (each thread stores its own
    # pieces; the stages are handed over by the mbarriers), so that build takes none of
    # TileLang's; a branch-free gather instead cost 1.78x (904.8 against 507.8 us, shared
    # consumers, H100).
    producer_gather_sync_off = fp8 and not raw_gather and consumers == "independent"
    head_blocks = -(-heads // ROWS)
    splits = splits_of(topk, split_slots)
    if finish and (splits != 1 or consumers != "shared"):
        raise ValueError(f"finish: expected one split and shared consumers, got {splits} splits, {consumers} consumers")
    if with_sink and not finish:
        raise ValueError("with_sink: the sink joins in the kernel only with finish=True (else in mla_combine_kernel)")
    chunks = topk // splits // PAGE
    scale_log2 = softmax_scale * C.LOG2E
    batch, pages, max_pages = T.dynamic("B"), T.dynamic("P"), T.dynamic("MP")
    f32, bf16 = "float32", "bfloat16"
    half = D_V // 2
    producer_regs, consumer_regs = RAW_REGISTERS if raw_gather else REGISTERS[fp8]

    def visible(IDX, b, t, slot, seq):
        """Slot ``slot`` of token t holds a key the token may see. Compared in int64: TileLang
        moves ``tokens - t`` to the index's side, and ``IDX + 1`` wraps for an index near 2^31
        (such an index counted as visible, and its token's output turned NaN)."""
        return T.And(0 <= IDX[b, t, slot], T.Cast("int64", IDX[b, t, slot]) <= T.Cast("int64", seq) - tokens + t)

    def slot_row(BT, IDX, b, t, slot, seq):
        """The cache row (page * 64 + position) of a slot's key; ``MASKED_ROW`` for a masked
        slot, ``BAD_ROW`` for a visible one whose table entry lies outside [0, P)."""
        entry = table_entry(BT, b, T.if_then_else(visible(IDX, b, t, slot, seq), IDX[b, t, slot] // PAGE, 0))
        return T.if_then_else(visible(IDX, b, t, slot, seq),
                              T.if_then_else(T.Or(entry < 0, entry >= pages), BAD_ROW, entry * PAGE + IDX[b, t, slot] % PAGE),
                              MASKED_ROW)

    def slot_visible(VIS_s, st, j):
        """Slot j of the chunk in stage ``st`` is visible (its ``slot_row`` is not ``MASKED_ROW``)."""
        return T.bitwise_and(T.shift_right(VIS_s[st, j // 32], T.Cast("uint32", j % 32)), T.uint32(1)) != T.uint32(0)

    def page_of(row):
        """The page of cache row ``row``, clamped into [0, P) for the bounds proof (it does not
        follow values read from memory; a masked slot's negative row is not read: its bf16
        copy is predicated off, its e4m3 load reads row 0 instead)."""
        return T.min(T.max(row // PAGE, 0), pages - 1)

    @T.macro
    def gather(KV, KVS, dst, raw, scale, row, st, j, col, dst_col):
        """Eight values of key row ``row`` (slot j) from column ``col`` into ``dst[st, j,
        dst_col:+8]``. bf16: zeros for a masked slot (the copy is predicated off). e4m3: values
        into ``raw``, their scale into ``scale``, then dequantized; the caller takes a masked
        slot (row < 0) to ``zero_piece`` instead, one branch per slot: a select per piece made
        every four values a branch (1.17-1.19x slower in dense decode, H200, 2026-12-04)."""
        if fp8:
            for v in T.vectorized(8):
                raw[v] = KV[page_of(T.max(row, 0)), T.max(row, 0) % PAGE, col + v]
            scale[0] = KVS[page_of(T.max(row, 0)), T.max(row, 0) % PAGE, col // GROUP]
            for v in T.vectorized(8):
                dst[st, j, dst_col + v] = dequant(raw[v], scale[0])
        else:
            T.ptx_cp_async(T.access_ptr(dst[st, j, dst_col], "w", 8), T.access_ptr(KV[page_of(row), row % PAGE, col], "r", 8),
                           8, predicate=row >= 0)

    @T.macro
    def zero_piece(dst, st, j, dst_col):
        """Zeros for eight values of a masked slot (whatever the cache holds there, NaN too)."""
        for v in T.vectorized(8):
            dst[st, j, dst_col + v] = T.Cast(bf16, 0)

    @T.macro
    def consume(Q_s, QP_s, KV_s, KP_s, VIS_s, BAD_s, full, empty, acc_s, p, acc_o, m, m_prev, m_scaled, alpha, l, row_sum,
                lse_rows, OP, LP, b, sp, t, h0, w: int):
        """Consumer warpgroup w: the online softmax over the split's chunks, output columns
        ``[256 w, 256 w + 256)``."""
        C.init_softmax(m, m_scaled, l, acc_o)
        for c in T.serial(chunks):
            T.mbarrier_wait_parity(full[c % STAGES], (c // STAGES) & 1)
            T.fence_proxy_async()  # the producer's rows (cp.async or stores) before this warpgroup's wgmma reads them
            # the scores sum the rope part first, then the 512 nope dims
            T.gemm(QP_s, KP_s[c % STAGES, :, :], acc_s, transpose_B=True, clear_accum=True)
            T.gemm(Q_s, KV_s[c % STAGES, :, :], acc_s, transpose_B=True)
            # the chunk's visible slots as two 32-bit words (the producer's ballots): two shared
            # loads a thread, where one per column stalled behind the producer's gathers
            for i, j in T.Parallel(ROWS, PAGE):
                acc_s[i, j] = T.if_then_else(slot_visible(VIS_s, c % STAGES, j), acc_s[i, j], C.neg_inf())
            C.softmax_step(acc_s, m, m_prev, m_scaled, alpha, l, row_sum, scale_log2, ROWS, PAGE)
            T.copy(acc_s, p)
            C.rescale_rows(acc_o, alpha, ROWS, half)
            T.gemm(p, KV_s[c % STAGES, :, w * half:(w + 1) * half], acc_o)
            T.mbarrier_arrive(empty[c % STAGES])
        C.finish_rows(acc_o, l, m_scaled, lse_rows, ROWS, half)
        # BAD_s: set by the producer before it marked a chunk full, and every chunk was waited for
        for i, d in T.Parallel(ROWS, half):
            if h0 + i < heads:
                OP[b, sp, t * heads + h0 + i, w * half + d] = T.if_then_else(BAD_s[0] == 0, acc_o[i, d], nan())
        if w == 0:
            for i in T.Parallel(ROWS):
                if h0 + i < heads:
                    LP[b, sp, t * heads + h0 + i] = T.if_then_else(BAD_s[0] == 0, lse_rows[i], nan())

    @T.macro
    def finish_with_sink(acc_o, lse_rows, mx, wgt, s, SINK, h0):
        """``mla_combine_kernel``'s arithmetic for one split (its ``mx``, ``s`` and weight, per
        row, in the dead softmax fragments ``mx``, ``s`` and ``wgt``) on the normalised
        ``acc_o`` and ``lse_rows``: ``acc_o`` becomes the output (``fma(wgt, o, 0)``; 0 for a
        row with neither keys nor sink), ``lse_rows`` the final lse. Rounded to bf16 by the store."""
        for i in T.Parallel(ROWS):
            mx[i] = SINK[T.min(h0 + i, heads - 1)] if with_sink else C.neg_inf()
            mx[i] = T.if_then_else(lse_rows[i] > mx[i], lse_rows[i], mx[i])
            s[i] = T.ieee_add(lse_weight(SINK[T.min(h0 + i, heads - 1)], mx[i]) if with_sink else T.float32(0),
                              lse_weight(lse_rows[i], mx[i]))
            wgt[i] = T.ieee_fdiv(lse_weight(lse_rows[i], mx[i]), s[i])
        for i, d in T.Parallel(ROWS, D_V):
            acc_o[i, d] = T.if_then_else(mx[i] == C.neg_inf(), T.float32(0), T.ieee_fmaf(wgt[i], acc_o[i, d], T.float32(0)))
        for i in T.Parallel(ROWS):
            lse_rows[i] = T.if_then_else(mx[i] == C.neg_inf(), C.neg_inf(), T.ieee_add(mx[i], T.log(s[i])))

    def tile_of(c):
        """The bf16 tile chunk c is computed from: its stage's, or with ``raw_gather`` the one
        tile its raw rows are dequantized into."""
        return 0 if raw_gather else c % STAGES

    @T.macro
    def dequant_chunk(RAW_s, SC_s, KV_s, KP_s, st):
        """The raw e4m3 chunk in stage ``st`` into the bf16 tiles by the project's rule (a masked
        slot's copies were predicated off: zero values and scale, so zeros)."""
        for i, d in T.Parallel(PAGE, D_V, loop_layout=DEQUANT_LAYOUT):
            KV_s[0, i, d] = dequant(RAW_s[st, i, d], SC_s[st, i, d // GROUP])
        for i, d in T.Parallel(PAGE, D_PE):
            KP_s[0, i, d] = dequant(RAW_s[st, i, D_V + d], SC_s[st, i, GROUPS - 1])

    @T.macro
    def consume_shared(Q_s, QP_s, KV_s, KP_s, RAW_s, SC_s, VIS_s, BAD_s, full, empty, acc_s, acc_o, m, m_prev, m_scaled,
                       alpha, l, row_sum, lse_rows, SINK, OP, LP, b, sp, t, h0):
        """Both consumer warpgroups on each chunk together (``consumers="shared"``): all 512
        output columns, the scores split between them by key. With ``raw_gather``, each chunk is
        first dequantized from its raw stage into the one bf16 tile (``KV_s[0]``, ``KP_s[0]``)."""
        C.init_softmax(m, m_scaled, l, acc_o)
        for c in T.serial(chunks):
            T.mbarrier_wait_parity(full[c % STAGES], (c // STAGES) & 1)
            if raw_gather:
                T.sync_threads(SHARED_BARRIER, 2 * C.WARPGROUP)  # both warpgroups' P V of the last chunk are done with the tile
                dequant_chunk(RAW_s, SC_s, KV_s, KP_s, c % STAGES)
            T.fence_proxy_async()  # the chunk's rows (the producer's cp.async or stores, or the dequant's) before wgmma reads them
            if raw_gather:
                T.sync_threads(SHARED_BARRIER, 2 * C.WARPGROUP)  # every thread's part of the tile
            # the rope product is issued without waiting for it: the nope product's wait covers both
            T.wgmma_gemm(QP_s, KP_s[tile_of(c), :, :], acc_s, transpose_B=True, clear_accum=True,
                         policy=T.GemmWarpPolicy.FullCol)
            T.gemm(Q_s, KV_s[tile_of(c), :, :], acc_s, transpose_B=True, policy=T.GemmWarpPolicy.FullCol)
            for i, j in T.Parallel(ROWS, PAGE):
                acc_s[i, j] = T.if_then_else(slot_visible(VIS_s, c % STAGES, j), acc_s[i, j], C.neg_inf())
            if raw_gather:
                T.mbarrier_arrive(empty[c % STAGES])  # the raw stage and its visible slots are read
            C.softmax_step(acc_s, m, m_prev, m_scaled, alpha, l, row_sum, scale_log2, ROWS, PAGE)
            # P into the rope slot: both warpgroups' score products are done (the row max's
            # cross-warpgroup exchange came after each one's wait)
            T.copy(acc_s, KP_s[tile_of(c), :, :])
            T.fence_proxy_async()  # plain stores, read by wgmma
            T.sync_threads(SHARED_BARRIER, 2 * C.WARPGROUP)
            C.rescale_rows(acc_o, alpha, ROWS, D_V)
            T.gemm(KP_s[tile_of(c), :, :], KV_s[tile_of(c), :, :], acc_o,
                   policy=T.GemmWarpPolicy.FullCol)
            if not raw_gather:
                T.mbarrier_arrive(empty[c % STAGES])
        C.finish_rows(acc_o, l, m_scaled, lse_rows, ROWS, D_V)
        if finish:
            finish_with_sink(acc_o, lse_rows, m_prev, alpha, row_sum, SINK, h0)
        for i, d in T.Parallel(ROWS, D_V):
            if h0 + i < heads:
                OP[b, sp, t * heads + h0 + i, d] = T.Cast(OP.dtype, T.if_then_else(BAD_s[0] == 0, acc_o[i, d], nan()))
        for i in T.Parallel(ROWS):
            if h0 + i < heads:
                LP[b, sp, t * heads + h0 + i] = T.if_then_else(BAD_s[0] == 0, lse_rows[i], nan())

    @T.prim_func
    def kernel(Q: T.Tensor((batch, tokens, heads, D_QK), bf16), KV: T.Tensor((pages, PAGE, D_QK), kv_dtype),
               KVS: T.Tensor((pages if fp8 else 1, PAGE, D_QK // GROUP), f32), BT: T.Tensor((batch, max_pages), "int32"),
               SL: T.Tensor((batch,), "int32"), IDX: T.Tensor((batch, tokens, topk), "int32"),
               SINK: T.Tensor((heads,), f32), OP: T.Tensor((batch, splits, tokens * heads, D_V), bf16 if finish else f32),
               LP: T.Tensor((batch, splits, tokens * heads), f32)):
        with T.Kernel(head_blocks, splits, batch * tokens, threads=3 * C.WARPGROUP) as (hb, sp, bt):
            Q_s = T.alloc_shared((ROWS, D_V), bf16)
            QP_s = T.alloc_shared((ROWS, D_PE), bf16)
            KV_s = T.alloc_shared((1 if raw_gather else STAGES, PAGE, D_V), bf16)
            KP_s = T.alloc_shared((1 if raw_gather else STAGES, PAGE, D_PE), bf16)
            RAW_s = T.alloc_shared((STAGES, PAGE, D_QK), kv_dtype) if raw_gather else None  # raw e4m3 rows
            SC_s = T.alloc_shared((STAGES, PAGE, GROUPS), f32) if raw_gather else None  # ... and their scales
            ROW_s = T.alloc_shared((STAGES, PAGE), "int32")  # each chunk's cache rows (slot_row)
            VIS_s = T.alloc_shared((STAGES, PAGE // 32), "uint32")  # bit j % 32 of word j // 32: slot j is visible
            BAD_s = T.alloc_shared((1,), "int32")  # 1: a visible slot's table entry lies outside [0, P)
            # full: the producer's 128 gathering threads and the 64 that wrote ROW_s; empty: both consumers
            full = T.alloc_barrier([C.WARPGROUP + PAGE] * STAGES)
            empty = T.alloc_barrier([2 * C.WARPGROUP] * STAGES)
            if consumers == "shared":  # the two consumers' shared scores, softmax state and output
                acc_s = T.alloc_fragment((ROWS, PAGE), f32)
                acc_o = T.alloc_fragment((ROWS, D_V), f32)
                rows_state = C.row_state(ROWS)
            else:  # each consumer's own scores, probabilities, softmax state and half of the output
                acc_s0 = T.alloc_fragment((ROWS, PAGE), f32)
                p0 = T.alloc_fragment((ROWS, PAGE), bf16)
                acc_o0 = T.alloc_fragment((ROWS, half), f32)
                m0, m_prev0, m_scaled0, alpha0, l0, row_sum0, lse_rows0 = C.row_state(ROWS)
                acc_s1 = T.alloc_fragment((ROWS, PAGE), f32)
                p1 = T.alloc_fragment((ROWS, PAGE), bf16)
                acc_o1 = T.alloc_fragment((ROWS, half), f32)
                m1, m_prev1, m_scaled1, alpha1, l1, row_sum1, lse_rows1 = C.row_state(ROWS)
            seq = T.alloc_var("int32")
            b = bt // tokens
            t = bt % tokens
            h0 = hb * ROWS
            tx = T.get_thread_binding()
            seq = T.min(SL[b], max_pages * PAGE)
            if not fp8 or raw_gather:
                # the consumers load the queries (`load_queries`), 18 16-byte pieces each, while the
                # producer starts gathering; bf16: 1.32x faster than TileLang's loop (H200,
                # 2026-12-03, interleaved, same bits), whose 4-byte pieces (54 loads a thread) were
                # 23% of the consumers' stall samples
                if tx < 2 * C.WARPGROUP:
                    load_queries(Q, Q_s, QP_s, b, tx, 2 * C.WARPGROUP, lambda i: (t, T.min(h0 + i, heads - 1), h0 + i < heads))
            else:
                # the producer's e4m3 dequant keeps the loop over all threads: the consumers' loads
                # ran 5% slower there (991 against 942 us in the same run, same bits; not profiled)
                for i, d in T.Parallel(ROWS, D_V):
                    Q_s[i, d] = T.if_then_else(h0 + i < heads, Q[b, t, T.min(h0 + i, heads - 1), d], T.Cast(bf16, 0))
                for i, d in T.Parallel(ROWS, D_PE):
                    QP_s[i, d] = T.if_then_else(h0 + i < heads, Q[b, t, T.min(h0 + i, heads - 1), D_V + d], T.Cast(bf16, 0))
            if tx == 0:
                BAD_s[0] = 0
            T.sync_threads()
            if consumers == "shared" and tx < 2 * C.WARPGROUP:
                T.set_max_nreg(consumer_regs, 1)
                consume_shared(Q_s, QP_s, KV_s, KP_s, RAW_s, SC_s, VIS_s, BAD_s, full, empty, acc_s, acc_o, *rows_state,
                               SINK, OP, LP, b, sp, t, h0)
            elif consumers == "independent" and tx < C.WARPGROUP:
                T.set_max_nreg(consumer_regs, 1)
                consume(Q_s, QP_s, KV_s, KP_s, VIS_s, BAD_s, full, empty, acc_s0, p0, acc_o0, m0, m_prev0, m_scaled0, alpha0,
                        l0, row_sum0, lse_rows0, OP, LP, b, sp, t, h0, 0)
            elif consumers == "independent" and tx < 2 * C.WARPGROUP:
                T.set_max_nreg(consumer_regs, 1)
                consume(Q_s, QP_s, KV_s, KP_s, VIS_s, BAD_s, full, empty, acc_s1, p1, acc_o1, m1, m_prev1, m_scaled1, alpha1,
                        l1, row_sum1, lse_rows1, OP, LP, b, sp, t, h0, 1)
            else:
                T.set_max_nreg(producer_regs, 0)
                g = tx - 2 * C.WARPGROUP
                raw = T.alloc_local((8,), kv_dtype)  # e4m3: one 8-value piece on its way to bf16
                scale = T.alloc_local((1,), f32)  # ... and its scale
                mine = T.alloc_var("int32")  # this thread's slot of the chunk (g < 64): its cache row
                visible_bits = T.alloc_var("uint32")  # ... its warp's ballot of visible slots
                bad_bits = T.alloc_var("uint32")  # ... and of slots with a table entry outside [0, P)
                rows = T.alloc_local((PAGE // 16,), "int32")  # the slots this thread gathers (bf16: four; e4m3: one)
                raw_rows = T.alloc_local((RAW_BATCH,), "int32") if raw_gather else None  # the row of each raw piece of a batch
                for c in T.serial(chunks):
                    # each slot's cache row, found once (not per element: every element of a slot
                    # waited for its index, then its table entry, then the value and its scale),
                    # and before the stage is free: those two loads wait beside the consumers' work
                    if g < PAGE:  # two whole warps: the ballots see all 32 lanes
                        mine = slot_row(BT, IDX, b, t, sp * (topk // splits) + c * PAGE + g, seq)
                        visible_bits = T.Cast("uint32", T.ballot_sync(mine != MASKED_ROW))
                        bad_bits = T.Cast("uint32", T.ballot_sync(mine == BAD_ROW))
                    T.mbarrier_wait_parity(empty[c % STAGES], ((c // STAGES) & 1) ^ 1)
                    if g < PAGE:
                        ROW_s[c % STAGES, g] = mine
                        if g % 32 == 0:
                            VIS_s[c % STAGES, g // 32] = visible_bits
                            if bad_bits != T.uint32(0):
                                BAD_s[0] = 1
                        T.mbarrier_arrive(full[c % STAGES])
                    T.sync_threads(C.NAMED_BARRIER, C.WARPGROUP)
                    if raw_gather:
                        # the chunk's raw rows as 16-byte cp.async, consecutive threads along a
                        # row (36 pieces a row), and each slot's 9 scales by its own thread (g < 64)
                        # in batches, each batch's rows read first (a shared read between two
                        # copies cost a barrier each; all 18 rows at once spilled the producer)
                        for h in T.unroll(RAW_BATCHES):
                            for k in T.unroll(RAW_BATCH):
                                raw_rows[k] = ROW_s[c % STAGES, ((h * RAW_BATCH + k) * C.WARPGROUP + g) // RAW_PIECES]
                            for k in T.unroll(RAW_BATCH):
                                T.ptx_cp_async(
                                    T.access_ptr(RAW_s[c % STAGES, ((h * RAW_BATCH + k) * C.WARPGROUP + g) // RAW_PIECES,
                                                       ((h * RAW_BATCH + k) * C.WARPGROUP + g) % RAW_PIECES * 16], "w", 16),
                                    T.access_ptr(KV[page_of(raw_rows[k]), raw_rows[k] % PAGE,
                                                    ((h * RAW_BATCH + k) * C.WARPGROUP + g) % RAW_PIECES * 16], "r", 16),
                                    16, predicate=raw_rows[k] >= 0)
                        if g < PAGE:
                            for k in T.unroll(GROUPS):
                                T.ptx_cp_async(T.access_ptr(SC_s[c % STAGES, g, k], "w", 1),
                                               T.access_ptr(KVS[page_of(mine), mine % PAGE, k], "r", 1), 1, predicate=mine >= 0)
                    elif fp8:
                        # two threads a slot, each its alternate 8-value pieces: one row a thread,
                        # so its 9 scales are 9 loads (eight threads a slot, below, made them 36:
                        # 1.4x slower, H200, 2026-12-03)
                        rows[0] = ROW_s[c % STAGES, g // 2]
                        # a warp's slots may differ in visibility (a short sequence): no barrier
                        # may stand in these arms (see `producer_gather_sync_off`)
                        if rows[0] >= 0:
                            for i in T.unroll(D_V // 16):
                                gather(KV, KVS, KV_s, raw, scale, rows[0], c % STAGES, g // 2, (2 * i + g % 2) * 8,
                                       (2 * i + g % 2) * 8)
                            for i in T.unroll(D_PE // 16):
                                gather(KV, KVS, KP_s, raw, scale, rows[0], c % STAGES, g // 2, D_V + (2 * i + g % 2) * 8,
                                       (2 * i + g % 2) * 8)
                        else:
                            for i in T.unroll(D_V // 16):
                                zero_piece(KV_s, c % STAGES, g // 2, (2 * i + g % 2) * 8)
                            for i in T.unroll(D_PE // 16):
                                zero_piece(KP_s, c % STAGES, g // 2, (2 * i + g % 2) * 8)
                    else:
                        # eight threads a slot, 16 slots at a time: a warp's cp.async reads 128
                        # contiguous bytes of each of 4 rows and stores whole 128-byte rows of the
                        # swizzled tiles (with 32 bytes of 16 rows, the gathers took four times the
                        # shared-memory wavefronts and stalled the consumers' shared loads behind
                        # them: 1.28x slower, H200, 2026-12-03)
                        for s in T.unroll(PAGE // 16):
                            rows[s] = ROW_s[c % STAGES, s * 16 + g // 8]
                        for s in T.unroll(PAGE // 16):
                            for i in T.unroll(D_V // 64):
                                gather(KV, KVS, KV_s, raw, scale, rows[s], c % STAGES, s * 16 + g // 8, i * 64 + g % 8 * 8,
                                       i * 64 + g % 8 * 8)
                            gather(KV, KVS, KP_s, raw, scale, rows[s], c % STAGES, s * 16 + g // 8, D_V + g % 8 * 8, g % 8 * 8)
                    if fp8 and not raw_gather:
                        T.fence_proxy_async()  # rows stored by threads, read by the consumers' wgmma
                        T.mbarrier_arrive(full[c % STAGES])
                    else:
                        T.cp_async_barrier_noinc(full[c % STAGES])

    if producer_gather_sync_off:
        return kernel.with_attr("tilelang_pass_configs", {"tl.disable_thread_storage_sync": True})
    return kernel



def sparse_mla_decode(q: torch.Tensor, kv_cache: torch.Tensor, block_table: torch.Tensor, seq_lens: torch.Tensor,
                      indices: torch.Tensor, sink: torch.Tensor | None = None, softmax_scale: float | None = None,
                      kv_scales: torch.Tensor | None = None, out=None, consumers: str = "shared",
                      split_slots: int = SPLIT_SLOTS, dequant_by: str | None = None, finish: bool = True):
    """(o ``[B, T, H, 512]`` bf16, lse ``[B, T, H]`` fp32 including the sink) of sparse MLA
    decode (module docstring); ``sink`` None: no sink; ``softmax_scale`` defaults to 576^-0.5;
    ``out``: an (o, lse) pair to write, else new tensors; ``consumers``: the split kernel's
    consumer schedule (``sparse_split_kernel``); ``split_slots``: slots per split CTA (fewer,
    longer splits write fewer partials, more and shorter ones fill more SMs at a small batch);
    ``dequant_by``: who dequantizes an e4m3 cache (``sparse_split_kernel``; ignored for bf16);
    None: the consumers where they can (shared consumers; H200, B128 H128 T1 k 2048 through the
    combine: 297.7 against the producer's 514.0 us, the same bits), else the producer; ``finish``: the split kernel
    finishes the rows where it can (``finishes``), else (False: always) ``mla_combine_kernel``
    combines its partials: the same bits."""
    if dequant_by is None:
        dequant_by = "consumers" if consumers == "shared" and kv_cache.dtype == torch.float8_e4m3fn else "producer"
    check_schedule(consumers, split_slots, dequant_by)
    C.check_tensor("q", q, (torch.bfloat16,), 4)
    b, t, h, _ = q.shape
    C.check_tensor("indices", indices, (torch.int32,), 3)
    if tuple(indices.shape[:2]) != (b, t) or indices.shape[2] not in TOPKS:
        raise ValueError(f"indices: expected [{b}, {t}, K] with K in {TOPKS}, got {tuple(indices.shape)}")
    more = dict(indices=indices)
    if sink is not None:
        C.check_tensor("sink", sink, (torch.float32,), 1)
        if sink.shape[0] != h:
            raise ValueError(f"sink: expected shape ({h},), got {tuple(sink.shape)}")
        more["sink"] = sink
    fp8 = _check(q, kv_cache, kv_scales, block_table, seq_lens, out, **more)
    k = indices.shape[2]
    scale = float(D_QK ** -0.5 if softmax_scale is None else softmax_scale)
    if not (math.isfinite(scale) and scale > 0):
        raise ValueError(f"softmax_scale: expected a positive finite number, got {softmax_scale}")
    dev = q.device
    o, lse = _outputs(q, out)
    if b == 0:
        return o, lse
    splits = splits_of(k, split_slots)
    scales = kv_scales if fp8 else _zeros(dev, (1, PAGE, D_QK // GROUP))
    sink_or_zeros = sink if sink is not None else _zeros(dev, (h,))
    schedule = (KV_DTYPES[kv_cache.dtype], scale, consumers, split_slots, dequant_by if fp8 else "producer")
    if finish and finishes(k, consumers, split_slots):
        sparse_split_kernel(t, h, k, *schedule, finish=True, with_sink=sink is not None)(
            q, kv_cache, scales, block_table, seq_lens, indices, sink_or_zeros, o.view(b, 1, t * h, D_V), lse.view(b, 1, t * h))
        return o, lse
    part_o = torch.empty((b, splits, t * h, D_V), dtype=torch.float32, device=dev)
    part_lse = torch.empty((b, splits, t * h), dtype=torch.float32, device=dev)
    sparse_split_kernel(t, h, k, *schedule)(q, kv_cache, scales, block_table, seq_lens, indices, sink_or_zeros, part_o,
                                            part_lse)
    mla_combine_kernel(t, h, splits, sink is not None)(block_table, seq_lens, part_o, part_lse, sink_or_zeros, o, lse)
    return o, lse


def reference_sparse_mla_decode(q, kv_cache, block_table, seq_lens, indices, sink=None, softmax_scale=None,
                                kv_scales=None):
    """fp32 torch reference: per token, dense attention over its visible selected keys (each
    slot counted once per occurrence), the sink as one more logit."""
    from kernels.attention.decode_mla import dequant_cache

    cache = dequant_cache(kv_cache, kv_scales) if kv_cache.dtype == torch.float8_e4m3fn else kv_cache
    b, t, h, _ = q.shape
    mp = block_table.shape[1]
    scale = D_QK ** -0.5 if softmax_scale is None else softmax_scale
    o = torch.zeros((b, t, h, D_V), dtype=torch.float32, device=q.device)
    lse = torch.full((b, t, h), float("-inf"), dtype=torch.float32, device=q.device)
    for i in range(b):
        seq = min(int(seq_lens[i]), mp * PAGE)
        for tt in range(t):
            idx = indices[i, tt].long()
            keep = (idx >= 0) & (idx <= seq - t + tt)
            idx = idx[keep]
            keys = cache[block_table[i, idx // PAGE].long(), idx % PAGE].float()
            s = (q[i, tt].float() @ keys.T) * scale  # [h, n]
            if sink is not None:
                s = torch.cat([s, sink[:, None].float()], dim=1)
            if s.shape[1] == 0:
                continue
            row_lse = torch.logsumexp(s, dim=-1)
            p = torch.exp(s - row_lse[:, None]).nan_to_num(0.0)
            o[i, tt] = p[:, :keys.shape[0]] @ keys[:, :D_V]
            lse[i, tt] = row_lse
    return o, lse


__all__ = ["sparse_mla_decode", "sparse_split_kernel", "splits_of", "reference_sparse_mla_decode", "reference_mla_decode"]
