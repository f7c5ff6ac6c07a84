"""Sparse MLA decode: each query token attends to its own top-k keys only (DeepSeek-V4 decode).

Inputs as :func:`kernels.attention.decode_mla.mla_decode`, plus ``indices [B, T, K]`` int32
(K = 512 / 1024 / 2048: key positions in the sequence, e.g. the lightning indexer's top-k) and
``sink [H]`` fp32 (one logit per head, natural-log units, that joins the softmax without a
value). A slot is masked (contributes nothing) when its index is -1, or lies outside the keys
the token may see, ``0 <= index <= seq_lens[b] - T + t``; a masked slot's block-table entry is
not used and its values enter the products as zeros. A visible index whose table entry lies outside ``[0, P)`` makes the
token's rows NaN (documented guard; that page is not read).

Batch invariance: the K slots are cut into ``K / 512`` splits (a constant of the call, never
the batch or the SM count); one CTA per (64 heads, split, token) runs the online softmax of
``kernels/attention/common.py`` over its slots in order, 64 at a time, gathering each slot's
key row through the block table (the rows found once per 64 slots, then 16-byte gathers; the
e4m3 cache dequantized on the way as in dense decode); :func:`decode_mla.mla_combine_kernel`
combines the splits in order and adds the sink.
"""

import math

import torch
import tilelang.language as T

import tlx
from kernels.attention import common as C
from kernels.attention.decode_mla import (D_PE, D_QK, D_V, DEQUANT_LAYOUT, GROUP, KV_DTYPES, MAX_PAGES, PAGE, ROWS,
                                          _check, _outputs, _zeros, dequant, mla_combine_kernel, nan,
                                          reference_mla_decode)
from kernels.attention.indexer import table_entry

TOPKS = (512, 1024, 2048)
SPLIT_SLOTS = 512
MASKED_ROW = -1  # slot_row of a masked slot
BAD_ROW = -2  # slot_row of a visible slot whose table entry lies outside [0, P)


@tlx.jit(target=C.TARGET, assume=["1 <= P", "1 <= MP", f"MP <= {MAX_PAGES}", "B <= 65535"])
def sparse_split_kernel(tokens: int, heads: int, topk: int, kv_dtype: str, softmax_scale: float):
    """Partial attention of (64-row block of one token's heads, split, token): ``OP [B, K/512,
    T*H, 512]`` normalised and ``LP [B, K/512, T*H]`` log-sum-exp (-inf: every slot masked)."""
    fp8 = kv_dtype == "float8_e4m3"
    head_blocks = -(-heads // ROWS)
    splits = topk // SPLIT_SLOTS
    scale_log2 = softmax_scale * C.LOG2E
    batch, pages, max_pages = T.dynamic("B"), T.dynamic("P"), T.dynamic("MP")
    f32, bf16 = "float32", "bfloat16"

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

    def row_value(KV, KVS, row, d):
        """Column d of cache row ``row`` (>= 0) as bf16, an e4m3 value dequantized; the page
        clamped into [0, P) for the bounds proof (it does not follow values read from memory)."""
        pg = T.min(T.max(row // PAGE, 0), pages - 1)
        if fp8:
            return dequant(KV[pg, row % PAGE, d], KVS[pg, row % PAGE, d // GROUP])
        return KV[pg, row % PAGE, d]

    @T.prim_func
    def kernel(Q: T.Tensor((batch, tokens, heads, D_QK), bf16), KV: T.Tensor((pages, PAGE, D_QK), kv_dtype),
               KVS: T.Tensor((pages if fp8 else 1, PAGE, D_QK // GROUP), f32), BT: T.Tensor((batch, max_pages), "int32"),
               SL: T.Tensor((batch,), "int32"), IDX: T.Tensor((batch, tokens, topk), "int32"),
               OP: T.Tensor((batch, splits, tokens * heads, D_V), f32), LP: T.Tensor((batch, splits, tokens * heads), f32)):
        with T.Kernel(head_blocks, splits, batch * tokens, threads=256) as (hb, sp, bt):
            Q_s = T.alloc_shared((ROWS, D_V), bf16)
            QP_s = T.alloc_shared((ROWS, D_PE), bf16)
            KV_s = T.alloc_shared((PAGE, D_V), bf16)
            KP_s = T.alloc_shared((PAGE, D_PE), bf16)
            P_s = T.alloc_shared((ROWS, PAGE), bf16)
            ROW_s = T.alloc_shared((PAGE,), "int32")  # the chunk's cache rows (slot_row)
            acc_s = T.alloc_fragment((ROWS, PAGE), f32)
            acc_o = T.alloc_fragment((ROWS, D_V), f32)
            m = T.alloc_fragment((ROWS,), f32)
            m_prev = T.alloc_fragment((ROWS,), f32)
            m_scaled = T.alloc_fragment((ROWS,), f32)
            alpha = T.alloc_fragment((ROWS,), f32)
            l = T.alloc_fragment((ROWS,), f32)
            row_sum = T.alloc_fragment((ROWS,), f32)
            lse_rows = T.alloc_fragment((ROWS,), f32)
            bad = T.alloc_var("int32")  # a visible slot's table entry lies outside [0, P)
            seq = T.alloc_var("int32")
            b = bt // tokens
            t = bt % tokens
            h0 = hb * ROWS
            seq = T.min(SL[b], max_pages * PAGE)
            for i, d in T.Parallel(ROWS, D_V):
                Q_s[i, d] = T.if_then_else(h0 + i < heads, Q[b, t, T.min(h0 + i, heads - 1), d], T.Cast(bf16, 0))
            for i, d in T.Parallel(ROWS, D_PE):
                QP_s[i, d] = T.if_then_else(h0 + i < heads, Q[b, t, T.min(h0 + i, heads - 1), D_V + d], T.Cast(bf16, 0))
            C.init_softmax(m, m_scaled, l, acc_o)
            bad = 0
            for c in T.Pipelined(SPLIT_SLOTS // PAGE, num_stages=1):
                s0 = sp * SPLIT_SLOTS + c * PAGE
                # each slot's cache row, found once (not per element: every element of a slot
                # waited for its index, then its table entry, then the value and its scale)
                for j in T.Parallel(PAGE):
                    ROW_s[j] = slot_row(BT, IDX, b, t, s0 + j, seq)
                for j in T.serial(PAGE):
                    bad = T.if_then_else(ROW_s[j] == BAD_ROW, 1, bad)
                # a masked slot's values are zeros (whatever the cache holds there, NaN too)
                for j, d in T.Parallel(PAGE, D_V, loop_layout=DEQUANT_LAYOUT):
                    KV_s[j, d] = T.if_then_else(ROW_s[j] >= 0, row_value(KV, KVS, ROW_s[j], d), T.Cast(bf16, 0))
                for j, d in T.Parallel(PAGE, D_PE):
                    KP_s[j, d] = T.if_then_else(ROW_s[j] >= 0, row_value(KV, KVS, ROW_s[j], D_V + d), T.Cast(bf16, 0))
                # the scores sum the rope part first, then the 512 nope dims (the gathers are
                # plain 16-byte stores now: TileLang's barrier and fence.proxy.async precede both)
                T.gemm(QP_s, KP_s, acc_s, transpose_B=True, clear_accum=True, policy=T.GemmWarpPolicy.FullCol)
                T.gemm(Q_s, KV_s, acc_s, transpose_B=True, policy=T.GemmWarpPolicy.FullCol)
                for i, j in T.Parallel(ROWS, PAGE):
                    acc_s[i, j] = T.if_then_else(ROW_s[j] != MASKED_ROW, acc_s[i, j], C.neg_inf())
                C.softmax_step(acc_s, m, m_prev, m_scaled, alpha, l, row_sum, scale_log2, ROWS, PAGE)
                T.copy(acc_s, P_s)
                C.rescale_rows(acc_o, alpha, ROWS, D_V)
                T.gemm(P_s, KV_s, acc_o, policy=T.GemmWarpPolicy.FullCol)
            C.finish_rows(acc_o, l, m_scaled, lse_rows, ROWS, D_V)
            for i, d in T.Parallel(ROWS, D_V):
                if h0 + i < heads:
                    OP[b, sp, t * heads + h0 + i, d] = T.if_then_else(bad == 0, acc_o[i, d], nan())
            for i in T.Parallel(ROWS):
                if h0 + i < heads:
                    LP[b, sp, t * heads + h0 + i] = T.if_then_else(bad == 0, lse_rows[i], nan())

    return kernel


def sparse_mla_decode(q: torch.Tensor, kv_cache: torch.Tensor, block_table: torch.Tensor, seq_lens: torch.Tensor,
                      indices: torch.Tensor, sink: torch.Tensor | None = None, softmax_scale: float | None = None,
                      kv_scales: torch.Tensor | None = None, out=None):
    """(o ``[B, T, H, 512]`` bf16, lse ``[B, T, H]`` fp32 including the sink) of sparse MLA
    decode (module docstring); ``sink`` None: no sink; ``softmax_scale`` defaults to 576^-0.5;
    ``out``: an (o, lse) pair to write, else new tensors."""
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
    splits = k // SPLIT_SLOTS
    part_o = torch.empty((b, splits, t * h, D_V), dtype=torch.float32, device=dev)
    part_lse = torch.empty((b, splits, t * h), dtype=torch.float32, device=dev)
    scales = kv_scales if fp8 else _zeros(dev, (1, PAGE, D_QK // GROUP))
    sparse_split_kernel(t, h, k, KV_DTYPES[kv_cache.dtype], scale)(q, kv_cache, scales, block_table, seq_lens,
                                                                     indices, part_o, part_lse)
    mla_combine_kernel(t, h, splits, sink is not None)(block_table, seq_lens, part_o, part_lse,
                                                       sink if sink is not None else _zeros(dev, (h,)), o, lse)
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


__all__ = ["sparse_mla_decode", "sparse_split_kernel", "reference_sparse_mla_decode", "reference_mla_decode"]
