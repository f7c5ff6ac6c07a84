"""DeepSeek-V4 sparse attention backward (training), deterministic, on sm_90a.

Gradients of ``sparse_fwd.sparse_attention`` (shapes and masking rules there) from its inputs,
its outputs ``o``, ``lse`` and the output gradient ``do``. With ``scale`` the softmax scale,
``p_j = exp(scale q.kv_j - lse)`` per selected slot ``j`` (0 for a masked slot),
``p_sink = exp(sink - lse)``, ``delta = rowsum(o * do)`` (the sink has no value, so its
``dP`` is 0 and ``delta`` is the whole ``sum_j p_j dP_j``) and ``dS_j = p_j (do.kv_j - delta)``:

* ``dq = scale sum_j dS_j kv_j``;
* every slot ``j`` of token ``t``, head group ``g`` gives key ``idx[t, j]`` the row
  ``G = scale sum_h dS_hj q_h + sum_h p_hj do_h`` (key and value are the same row), and
  ``dkv[n]`` is the sum of the rows ``G`` of every (token, slot) whose index is ``n``;
* ``dsink[h] = -sum_{b, s} p_sink delta``.

Four kernels, no atomics (each output element is summed by one thread, in a fixed order):

1. ``delta`` (``sparse_bwd_delta_kernel``): per (token, head), d ascending per thread, then
   TileLang's reduce_sum across the threads of a row;
2. ``dsink`` (``sparse_bwd_sink_kernel``): one CTA per head; thread ``i`` adds the tokens
   ``i, i + 128, ...`` (flattened over batch and sequence, ascending), then TileLang's
   reduce_sum over the 128 threads;
3. per token (``sparse_bwd_token_kernel``): one CTA per (token, 64 heads) as in the forward.
   Key blocks of 32 slots in index-list order, then the window's; per block ``S = Q KV^T`` and
   ``dP = dO KV^T`` (wgmma, the 512 dims ascending in steps of 16), ``P`` and
   ``dS' = scale P (dP - delta)`` in fp32, rounded to bf16 for the GEMMs, ``dQ += dS' KV``
   (keys ascending in steps of 16, blocks in order), and the block's rows
   ``G = dS'^T Q + P^T dO`` (the 64 heads ascending in steps of 16, the dS' product first)
   written in fp32 to a scratch ``G [b, tokens, slots, head groups, 512]``;
4. per key (``sparse_bwd_dkv_kernel``): one CTA per (key row, batch) walks the key's entries
   of an inverse index and adds their ``G`` rows in ascending (token, slot) order, head groups
   ascending within an entry, into one fp32 row per thread column; it writes ``dkv`` (and,
   launched again, ``dwindow_kv``) in kv's dtype, 0 for a key no slot names.

The inverse index is built on the device with torch, exactly: each slot's sort key
``key * (s * slots) + (token * slots + slot)`` (int64, masked slots get the key ``n``, past
every row) is unique, so ``torch.sort`` orders it the same way on every run, and
``torch.searchsorted`` gives each key's range. Masked slots fall in no range: they contribute
nothing (their ``P`` and ``dS`` are 0 too).

Memory: the scratch ``G`` holds ``b * tokens * (k + w) * (h / 64) * 512`` fp32 values (4 MiB a
token at the model shape h 128, k 1024: 17 GB for s 4096, correctness first). Its elements are
indexed in int32, so the tokens run in chunks of at most ``SCRATCH_ELEMENTS`` scratch values
(3 chunks of 1366 tokens at the model shape, 5.7 GB of scratch): kernel 3 writes the chunk's
``G``, kernel 4 adds it to an fp32 ``dkv`` accumulator (from the chunk's part of each key's
range). The chunk boundaries do not change any sum: every ``dkv`` element is still one chain of
fp32 additions over its entries in ascending order, kept in fp32 between the launches.

Determinism contract: the same inputs give the same bits (the orders above are fixed by the
code, not by scheduling). ``dq`` of a token depends only on that token's inputs (batch-invariant
per token); ``dkv`` of batch ``b`` only on batch ``b``'s tokens, in ascending order, whatever the
batch size or chunking; ``dsink`` sums over every token of every batch (not per token).

Outputs: ``dq`` in q's dtype, ``dkv`` (and ``dwindow_kv``) in kv's dtype (bf16: one rounding
of the fp32 sums), ``dsink`` fp32 ``[h]``. Supported: h 64 / 128, d 512, k 512 / 1024 / 2048,
the window branch with ``w`` a multiple of 64, as the forward takes it (``dwindow_kv`` is returned then).

Bounds (``assume``): ``1 <= N, NW <= 2^30`` as the forward; q has at most 2^31 - 1 elements
(``check_tensor``) and h * 512 >= 2^15 of them a token, so its (batch, token) rows ``RT`` and
tokens ``S`` are at most 2^16 and its (batch, token, head) rows ``RH`` at most 2^22; a chunk has
``1 <= SC <= S`` tokens and starts at ``0 <= s0 <= 2^30``; the per-key kernel's index ranges and
entries, read from memory, are clamped into their tensors (the host builds them in range); the
scratch has at most 2^31 - 1 elements (the wrapper's chunks).

``tlx check`` (2026-12-02, CPU): every access proven in bounds (per token at h 128 k 1024: 181/181;
delta, dsink, per key: all), no launch condition beyond the assume lists, determinism verdicts
deterministic and batch-invariant for all four; races: delta, dsink and per key race-free, the
per-token kernel unknown (the race analysis' budget, as for the forward). GPU tests:
``tests/kernels/attention/test_sparse_bwd.py`` (``bench/RESULTS.md``, the test table).
"""

import math

import torch
import tilelang.language as T

import tlx

from kernels.attention import common as C
from kernels.attention.sparse_fwd import (DIM, ROWS_ASSUME, SUPPORTED_HEADS, check_inputs, check_kernel_shape, gather_block,
                                          slot_views)

HEADS_PER_CTA = 64
BLOCK_K = 32  # slots per step of the per-token kernel (its 64 x 512 dQ and 32 x 512 G accumulators fill the registers)
SCRATCH_ELEMENTS = C.INT32_LIMIT  # fp32 values of G per chunk of tokens (int32-indexed)
DELTA_ROWS = 32
SINK_THREADS = 128

batch = T.dynamic("B")
seq = T.dynamic("S")
n_kv = T.dynamic("N")
n_window_kv = T.dynamic("NW")
chunk = T.dynamic("SC")
rows = T.dynamic("R")
entries = T.dynamic("E")
n_rows = T.dynamic("RH")
n_tokens = T.dynamic("RT")


@tlx.jit(target=C.TARGET, assume=["RH <= 4194304"])
def sparse_bwd_delta_kernel(dtype: str = "bfloat16"):
    """``Delta [RH] = rowsum(O * dO)`` in fp32 (O, dO ``[RH, 512]``: (batch, token, head) rows)."""
    f32 = "float32"

    @T.prim_func
    def main(O: T.Tensor((n_rows, DIM), dtype), dO: T.Tensor((n_rows, DIM), dtype), Delta: T.Tensor((n_rows,), f32)):
        with T.Kernel(T.ceildiv(n_rows, DELTA_ROWS), threads=128) as bx:
            prod = T.alloc_fragment((DELTA_ROWS, DIM), f32)
            delta = T.alloc_fragment((DELTA_ROWS,), f32)
            for i, d in T.Parallel(DELTA_ROWS, DIM):
                r = bx * DELTA_ROWS + i
                prod[i, d] = T.if_then_else(r < n_rows, T.Cast(f32, O[T.min(r, n_rows - 1), d]) * T.Cast(f32, dO[T.min(r, n_rows - 1), d]),
                                            T.float32(0))
            T.reduce_sum(prod, delta, dim=1)
            for i in T.Parallel(DELTA_ROWS):
                if bx * DELTA_ROWS + i < n_rows:
                    Delta[bx * DELTA_ROWS + i] = delta[i]

    return main


@tlx.jit(target=C.TARGET, assume=["RT <= 65536"])
def sparse_bwd_sink_kernel(heads: int):
    """``DSink [heads] = -sum_t exp(Sink - LSE[t]) * Delta[t]`` (LSE, Delta ``[RT, heads]``)."""
    if heads not in SUPPORTED_HEADS:
        raise ValueError(f"heads: expected one of {SUPPORTED_HEADS}, got {heads}")
    f32, nt = "float32", SINK_THREADS

    @T.prim_func
    def main(Sink: T.Tensor((heads,), f32), LSE: T.Tensor((n_tokens, heads), f32), Delta: T.Tensor((n_tokens, heads), f32),
             DSink: T.Tensor((heads,), f32)):
        with T.Kernel(heads, threads=nt) as bx:
            acc = T.alloc_fragment((nt,), f32)
            total = T.alloc_fragment((1,), f32)
            T.fill(acc, 0)
            for it in T.serial(T.ceildiv(n_tokens, nt)):
                for i in T.Parallel(nt):
                    r = T.min(it * nt + i, n_tokens - 1)
                    acc[i] = acc[i] + T.if_then_else(it * nt + i < n_tokens,
                                                     T.exp2((Sink[bx] - LSE[r, bx]) * T.float32(C.LOG2E)) * Delta[r, bx], T.float32(0))
            T.reduce_sum(acc, total, dim=0)
            DSink[bx] = -total[0]

    return main


@tlx.jit(target=C.TARGET, assume=["1 <= S", *ROWS_ASSUME, "SC <= S", "S <= 65536", "0 <= s0", "s0 <= 1073741824"])
def sparse_bwd_token_kernel(heads: int, topk: int, window: int, scale_log2: float, softmax_scale: float, dtype: str = "bfloat16"):
    """dQ of the tokens ``s0 + [0, SC)`` (those ``< S``) and their scratch rows ``G [B, SC, topk +
    window, heads / 64, 512]`` (fp32). Parameters ``Q [B, S, H, 512], KV [B, N, 512],
    Idx [B, S, topk] int32, WKV [B, NW, 512], WIdx [B, S, max(window, 1)] int32,
    dO [B, S, H, 512], LSE, Delta [B, S, H] fp32, dQ [B, S, H, 512], G, s0`` (``window`` 0: the
    window tensors are not read). Tokens past ``S`` (the last chunk's tail) recompute token
    ``S - 1`` into their own scratch rows, which no entry names, and write no dQ."""
    check_kernel_shape(heads, topk, window, BLOCK_K)
    hb, bk, f32 = HEADS_PER_CTA, BLOCK_K, "float32"
    groups, slots = heads // hb, topk + window
    n_top, n_blocks = topk // bk, slots // bk

    @T.macro
    def block_grads(KV_s, Q_s, dO_s, P_s, dS_s, valid, acc_s, acc_dp, acc_dq, acc_g, lse_r, delta_r, G_rows):
        """One gathered block: P and dS, dQ += dS KV, and the block's dKV rows dS^T Q + P^T dO into ``G_rows``."""
        T.gemm(Q_s, KV_s, acc_s, transpose_B=True, clear_accum=True, policy=T.GemmWarpPolicy.FullCol)
        T.gemm(dO_s, KV_s, acc_dp, transpose_B=True, clear_accum=True, policy=T.GemmWarpPolicy.FullCol)
        for i, j in T.Parallel(hb, bk):
            acc_s[i, j] = T.if_then_else(valid[j] == 1, T.exp2(T.ieee_fmaf(acc_s[i, j], T.float32(scale_log2), -lse_r[i])),
                                         T.float32(0))
            acc_dp[i, j] = T.ieee_mul(acc_s[i, j] * (acc_dp[i, j] - delta_r[i]), T.float32(softmax_scale))
        T.copy(acc_s, P_s)
        T.copy(acc_dp, dS_s)
        T.gemm(dS_s, KV_s, acc_dq, policy=T.GemmWarpPolicy.FullCol)
        T.gemm(dS_s, Q_s, acc_g, transpose_A=True, clear_accum=True, policy=T.GemmWarpPolicy.FullCol)
        T.gemm(P_s, dO_s, acc_g, transpose_A=True, policy=T.GemmWarpPolicy.FullCol)
        T.copy(acc_g, G_rows)

    @T.prim_func
    def main(Q: T.Tensor((batch, seq, heads, DIM), dtype), KV: T.Tensor((batch, n_kv, DIM), dtype),
             Idx: T.Tensor((batch, seq, topk), "int32"), WKV: T.Tensor((batch, n_window_kv, DIM), dtype),
             WIdx: T.Tensor((batch, seq, max(window, 1)), "int32"), dO: T.Tensor((batch, seq, heads, DIM), dtype),
             LSE: T.Tensor((batch, seq, heads), f32), Delta: T.Tensor((batch, seq, heads), f32),
             dQ: T.Tensor((batch, seq, heads, DIM), dtype), G: T.Tensor((batch, chunk, slots, groups, DIM), f32), s0: T.int32):
        with T.Kernel(chunk, groups, batch, threads=256) as (bx, by, bz):
            Q_s = T.alloc_shared((hb, DIM), dtype)
            dO_s = T.alloc_shared((hb, DIM), dtype)
            KV_s = T.alloc_shared((bk, DIM), dtype)
            P_s = T.alloc_shared((hb, bk), dtype)
            dS_s = T.alloc_shared((hb, bk), dtype)
            valid = T.alloc_shared((bk,), "int32")
            acc_s = T.alloc_fragment((hb, bk), f32)
            acc_dp = T.alloc_fragment((hb, bk), f32)
            acc_dq = T.alloc_fragment((hb, DIM), f32)
            acc_g = T.alloc_fragment((bk, DIM), f32)
            lse_r = T.alloc_fragment((hb,), f32)
            delta_r = T.alloc_fragment((hb,), f32)

            T.assume(T.And(seq >= 1, s0 >= 0))  # the launcher's preconditions, for TileLang: t below is a row of Idx
            t = T.min(s0 + bx, seq - 1)
            T.copy(Q[bz, t, by * hb:(by + 1) * hb, :], Q_s)
            T.copy(dO[bz, t, by * hb:(by + 1) * hb, :], dO_s)
            for i in T.Parallel(hb):
                lse_r[i] = T.ieee_mul(LSE[bz, t, by * hb + i], T.float32(C.LOG2E))
                delta_r[i] = Delta[bz, t, by * hb + i]
            T.fill(acc_dq, 0)
            KVb, Ib, WKVb, WIb = slot_views(KV, Idx, WKV, WIdx, bz, t)
            # the top-k list's blocks, then the window's, as two loops: each loop's copies are
            # then unconditional, which TileLang issues as cp.async (not under a branch)
            for keys, idx, first, count in ((KVb, Ib, 0, n_top), (WKVb, WIb, n_top, n_blocks - n_top)):
                for kb in T.Pipelined(count, num_stages=2):
                    gather_block(valid, KV_s, keys, idx, kb, bk)
                    block_grads(KV_s, Q_s, dO_s, P_s, dS_s, valid, acc_s, acc_dp, acc_dq, acc_g, lse_r, delta_r,
                                G[bz, bx, (first + kb) * bk:(first + kb + 1) * bk, by, :])
            for i, d in T.Parallel(hb, DIM):
                if s0 + bx < seq:
                    dQ[bz, t, by * hb + i, d] = T.Cast(dtype, acc_dq[i, d])

    return main


@tlx.jit(target=C.TARGET, assume=["1 <= N", "N <= 1073741824", "1 <= R", "1 <= E"])
def sparse_bwd_dkv_kernel(groups: int, dtype: str = "bfloat16"):
    """One chunk's part of ``dkv`` (or ``dwindow_kv``): per key row ``n`` of batch ``b`` the scratch
    rows ``G [B, R, groups, 512]`` (R = chunk tokens x slots) named by the entries
    ``Ent[b, Lo[b, n]:Hi[b, n]]`` (flattened (token, slot) positions in the chunk, ascending), each
    entry's head groups ascending, added to the running fp32 sum: ``first`` (0 / 1) starts it at 0
    instead of reading ``Acc [B, N, 512]``, ``last`` writes it to ``dKV [B, N, 512]`` (dtype)
    instead of ``Acc``."""
    if groups not in (1, 2):
        raise ValueError(f"groups: expected 1 or 2 head groups of {HEADS_PER_CTA}, got {groups}")
    f32 = "float32"

    @T.prim_func
    def main(G: T.Tensor((batch, rows, groups, DIM), f32), Ent: T.Tensor((batch, entries), "int32"),
             Lo: T.Tensor((batch, n_kv), "int32"), Hi: T.Tensor((batch, n_kv), "int32"),
             Acc: T.Tensor((batch, n_kv, DIM), f32), dKV: T.Tensor((batch, n_kv, DIM), dtype),
             first: T.int32, last: T.int32):
        with T.Kernel(n_kv, batch, threads=128) as (bx, by):
            acc = T.alloc_fragment((DIM,), f32)
            for d in T.Parallel(DIM):
                acc[d] = T.if_then_else(first == 1, T.float32(0), Acc[by, bx, d])
            lo = T.min(T.max(Lo[by, bx], 0), entries)  # clamped as read: the host builds them in range
            hi = T.min(T.max(Hi[by, bx], lo), entries)
            for e in T.serial(hi - lo):
                r = T.min(T.max(Ent[by, lo + e], 0), rows - 1)
                for g in T.unroll(groups):
                    for d in T.Parallel(DIM):
                        acc[d] = acc[d] + G[by, r, g, d]
            if last == 1:
                for d in T.Parallel(DIM):
                    dKV[by, bx, d] = T.Cast(dtype, acc[d])
            else:
                for d in T.Parallel(DIM):
                    Acc[by, bx, d] = acc[d]

    return main


def inverse_index(indices: torch.Tensor, n: int, slots: int, offset: int):
    """The key-major view of one branch's index list: ``(entries, sort_keys)``, both ``[b, s * k]``.
    ``entries[b]`` lists the flattened scratch positions ``token * slots + offset + j`` of the
    slots ``j`` of ``indices [b, s, k]``, by key ascending and, for one key, by position
    ascending; masked slots (index outside ``[0, n)``) come last. ``sort_keys`` are the sorted
    unique int64 keys ``key * (s * slots) + position`` that ``key_ranges`` searches."""
    b, s, k = indices.shape
    span = s * slots
    pos = (torch.arange(s, device=indices.device, dtype=torch.int64)[:, None] * slots + offset
           + torch.arange(k, device=indices.device, dtype=torch.int64)[None, :])
    idx = indices.long()
    key = torch.where((idx >= 0) & (idx < n), idx, n)
    sort_keys = torch.sort((key * span + pos).reshape(b, s * k), dim=1).values
    return (sort_keys % span).to(torch.int32), sort_keys


def key_ranges(sort_keys: torch.Tensor, n: int, span: int, lo_pos: int, hi_pos: int):
    """``(lo, hi)`` int32 ``[b, n]``: key ``m``'s entries with positions in ``[lo_pos, hi_pos)``
    are ``entries[:, lo:hi]`` (``inverse_index``; ``span`` = s * slots)."""
    keys = torch.arange(n, device=sort_keys.device, dtype=torch.int64)[None, :].expand(sort_keys.shape[0], n) * span
    lo = torch.searchsorted(sort_keys, (keys + lo_pos).contiguous())
    hi = torch.searchsorted(sort_keys, (keys + hi_pos).contiguous())
    return lo.to(torch.int32), hi.to(torch.int32)


def backward_builds(heads: int, topk: int, window: int, softmax_scale: float, dtype: str = "bfloat16") -> dict:
    """name -> a call that builds that kernel of ``sparse_attention_backward``: "delta", "sink",
    "token", "dkv" (one kernel a call, so that a tool can take any one: scripts/verdict-share)."""
    return {"delta": lambda: sparse_bwd_delta_kernel(dtype), "sink": lambda: sparse_bwd_sink_kernel(heads),
            "token": lambda: sparse_bwd_token_kernel(heads, topk, window, softmax_scale * C.LOG2E, softmax_scale, dtype),
            "dkv": lambda: sparse_bwd_dkv_kernel(heads // HEADS_PER_CTA, dtype)}


def backward_kernels(heads: int, topk: int, window: int, softmax_scale: float, dtype: str = "bfloat16") -> list:
    """The kernels ``sparse_attention_backward`` launches: delta, dsink, per token, per key (also
    what a precompile step builds)."""
    return [build() for build in backward_builds(heads, topk, window, softmax_scale, dtype).values()]


def sparse_attention_backward(q, kv, indices, sink, o, lse, do, *, softmax_scale: float | None = None, window_kv=None,
                              window_indices=None, out=None):
    """``(dq, dkv, dsink)``, with a window ``(dq, dkv, dsink, dwindow_kv)``, of
    ``sparse_fwd.sparse_attention`` (same arguments; ``o``, ``lse`` what it returned, ``do`` the
    gradient of ``o``). Deterministic (module docstring). ``dq`` in q's dtype, ``dkv`` and
    ``dwindow_kv`` in kv's, ``dsink`` fp32. ``out`` (a tuple of those, contiguous) is written
    instead of new tensors and returned."""
    b, s, h, window, window_kv, window_indices = check_inputs(q, kv, indices, sink, window_kv, window_indices)
    topk = indices.shape[2]
    for name, rows in (("kv", kv), ("window_kv", window_kv)):
        if rows.shape[1] < 1:
            raise ValueError(f"{name}: expected at least one row")
    for name, t in (("o", o), ("do", do)):
        C.check_tensor(name, t, (q.dtype,), 4)
        if tuple(t.shape) != tuple(q.shape):
            raise ValueError(f"{name}: expected the shape of q {tuple(q.shape)}, got {tuple(t.shape)}")
    C.check_tensor("lse", lse, (torch.float32,), 3)
    if tuple(lse.shape) != (b, s, h):
        raise ValueError(f"lse: expected shape {(b, s, h)}, got {tuple(lse.shape)}")
    branches = [(kv, indices)] + ([(window_kv, window_indices)] if window else [])
    slots, groups = topk + window, h // HEADS_PER_CTA
    per_token = b * slots * groups * DIM
    if per_token > SCRATCH_ELEMENTS or s * slots > C.INT32_LIMIT:
        raise ValueError(f"q: batch {b} x tokens {s} x {slots} slots exceed the int32-indexed scratch of this kernel")
    likes = [(q.shape, q.dtype), (kv.shape, kv.dtype), ((h,), torch.float32)] + ([(window_kv.shape, window_kv.dtype)] if window else [])
    if out is not None:
        if not isinstance(out, (tuple, list)) or len(out) != len(likes):
            raise ValueError(f"out: expected a tuple of {len(likes)} tensors (dq, dkv, dsink{', dwindow_kv' if window else ''}), "
                             f"got {type(out).__name__}")
        for i, (given, (shape, dtype)) in enumerate(zip(out, likes)):
            C.check_tensor(f"out[{i}]", given, (dtype,), len(shape))
            if tuple(given.shape) != tuple(shape):
                raise ValueError(f"out[{i}]: expected shape {tuple(shape)}, got {tuple(given.shape)}")
    scale = 1.0 / math.sqrt(DIM) if softmax_scale is None else float(softmax_scale)
    C.check_cuda(q=q, kv=kv, indices=indices, sink=sink, o=o, lse=lse, do=do, window_kv=window_kv, window_indices=window_indices,
                 **{f"out[{i}]": given for i, given in enumerate(out or ())})
    grads = list(out) if out is not None else [torch.empty(shape, dtype=dtype, device=q.device) for shape, dtype in likes]
    if b == 0 or s == 0:
        for g in grads:
            g.zero_()
        return tuple(grads)

    delta_k, sink_k, token_k, dkv_k = backward_kernels(h, topk, window, scale)
    delta = torch.empty((b, s, h), dtype=torch.float32, device=q.device)
    delta_k(o.view(-1, DIM), do.view(-1, DIM), delta.view(-1))
    sink_k(sink, lse.view(-1, h), delta.view(-1, h), grads[2])

    n_chunks = -(-s // (SCRATCH_ELEMENTS // per_token))
    sc = -(-s // n_chunks)
    scratch = torch.empty((b, sc, slots, groups, DIM), dtype=torch.float32, device=q.device)
    span = s * slots
    keyed = [(src.shape[1], *inverse_index(idx, src.shape[1], slots, off), grad)
             for (src, idx), off, grad in zip(branches, (0, topk), (grads[1], grads[3] if window else None))]
    accs = [torch.empty((b, n, DIM), dtype=torch.float32, device=q.device) for n, *_ in keyed]  # read and written between chunks only
    for c in range(n_chunks):
        s0 = c * sc
        token_k(q, kv, indices, window_kv, window_indices, do, lse, delta, grads[0], scratch, s0)
        for (n, entries_, sort_keys, grad), acc in zip(keyed, accs):
            lo, hi = key_ranges(sort_keys, n, span, s0 * slots, min(s, s0 + sc) * slots)
            dkv_k(scratch.view(b, sc * slots, groups, DIM), entries_ - s0 * slots, lo, hi, acc, grad, int(c == 0), int(c == n_chunks - 1))
    return tuple(grads)
