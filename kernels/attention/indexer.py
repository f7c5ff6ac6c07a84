"""FP8 lightning indexer: the scores that pick each query's top-k keys for sparse attention.

``logits[s, n] = (Σ_h w[s, h] · relu(q[s, h] · k[n])) · k_scale[n]`` for keys visible to the query,
``-inf`` for the others. ``q`` and ``k`` are e4m3 with per-token fp32 scales: ``k_scale [n]``
multiplies the sum, the query's scale is folded into ``w`` by the caller (one fp32 per token and
head either way).

Two forms:

* prefill (:func:`indexer_logits`): q ``[S, H, D]``, k ``[N, D]``; key ``n`` is visible to query
  ``s`` when ``n <= pos[s]`` (``pos`` int32 [S], e.g. ``N - S + s`` for a causal prefill).
* decode (:func:`indexer_logits_paged`): q ``[B, T, 64, D]`` (T = 1..4 next tokens), k in a paged
  cache ``[P, 64, D]`` with ``k_scale [P, 64]`` and a block table ``[B, MP]``; token ``t`` of
  sequence ``b`` (``seq_lens[b]`` keys, the T new ones last) sees keys ``j <= seq_lens[b] - T + t``.
  A block-table entry outside ``[0, P)`` is never read (documented guard): the logits of its
  64 keys are NaN, so the fault shows downstream instead of a wild read.

Numerics (the CUDA baseline ``indexer.cu`` repeats them, so the two agree bit for bit):

1. ``dot = q[s, h] · k[n]``: one chain of wgmma ``k32.f32.e4m3.e4m3`` steps over D, ascending,
   from zero (the tensor cores' fp32 accumulation);
2. ``r = dot > 0 ? dot : +0``;
3. ``acc = fma(r, w[s, h], acc)`` over h = 0 .. H-1 in ascending order, from +0;
4. ``logit = acc · k_scale[n]`` (one rounded multiply).

Kernel: a CTA owns ``128 / H`` query tokens (128 rows of q x heads, resident in shared memory)
and walks the visible key tiles (128 keys, or one 64-key page) with a pipelined copy; the tile's
scores go from the wgmma accumulator to shared memory, where each thread sums the heads of one
(query, key) pair in the fixed order above. Every logit is computed by one thread from its own
inputs only: the result does not depend on the batch, the grid or the other queries.
"""

import torch
import tilelang.language as T

import tlx
from kernels.attention.common import check_cuda, check_tensor

TARGET = {"kind": "cuda", "arch": "sm_90a"}
THREADS = 256
ROWS = 128  # query rows (tokens x heads) of one CTA's score tile
PAGE = 64  # tokens per KV page
PAD = 8  # fp32 padding of a score-tile row in shared memory: conflict-free accumulator stores
E4M3 = torch.float8_e4m3fn
MAX_KEYS = 1 << 24
PAGES_PER_CTA = 16  # decode: the pages (1024 keys) one CTA scores
INDEX_HEADS = 64


def table_entry(BT, b, slot):
    """``BT[b, slot]`` for a slot the caller keeps below the table's width (clamped once more,
    for the bounds proof: the caller's bound comes from a variable the prover does not track)."""
    return BT[b, T.min(slot, BT.shape[1] - 1)]


def clamped_page(BT, b, slot, pages):
    """Block-table entry ``BT[b, slot]`` clamped into ``[0, pages)``: a page that may be read
    (an entry outside is flagged by the caller, its data never used)."""
    return T.min(T.max(table_entry(BT, b, slot), 0), pages - 1)


@T.macro
def head_sum(S_s, W_s, q, j, heads: int, acc: T.Ref):
    """Steps 2-3 of the module docstring for query ``q`` of the tile and key ``j``:
    ``S_s [bq * heads, keys]`` holds the raw dots, ``W_s [bq, heads]`` the weights."""
    acc = T.float32(0)
    for h in T.serial(heads):
        d = S_s[q * heads + h, j]
        acc = T.ieee_fmaf(T.if_then_else(d > T.float32(0), d, T.float32(0)), W_s[q, h], acc)


@tlx.jit(target=TARGET, assume=["1 <= S", "1 <= N", f"N <= {MAX_KEYS}", "S * N <= 2147483647"])
def indexer_kernel(heads: int, dim: int, block_n: int = 128, num_stages: int = 2):
    """Prefill form: ``Logits [S, N]`` from ``Q [S, heads, dim]``, ``K [N, dim]``, ``KS [N]``,
    ``W [S, heads]``, ``Pos [S]``."""
    bq = ROWS // heads
    seqs = T.dynamic("S")
    keys = T.dynamic("N")

    @T.prim_func
    def kernel(Q: T.Tensor((seqs, heads, dim), "float8_e4m3"), K: T.Tensor((keys, dim), "float8_e4m3"),
               KS: T.Tensor((keys,), "float32"), W: T.Tensor((seqs, heads), "float32"),
               Pos: T.Tensor((seqs,), "int32"), Logits: T.Tensor((seqs, keys), "float32")):
        with T.Kernel(T.ceildiv(seqs, bq), threads=THREADS) as bx:
            tx = T.get_thread_binding()
            Q_s = T.alloc_shared((ROWS, dim), "float8_e4m3")
            K_s = T.alloc_shared((block_n, dim), "float8_e4m3")
            W_s = T.alloc_shared((bq, heads), "float32")
            S_s = T.alloc_shared((ROWS, block_n + PAD), "float32")
            S_f = T.alloc_fragment((ROWS, block_n), "float32")
            acc = T.alloc_var("float32")
            last = T.alloc_var("int32")  # the last key any of the CTA's queries sees, -1 for none
            s0 = bx * bq
            for i, d in T.Parallel(ROWS, dim):
                Q_s[i, d] = T.if_then_else(s0 + i // heads < seqs, Q[T.min(s0 + i // heads, seqs - 1), i % heads, d],
                                           T.Cast("float8_e4m3", 0))
            for q, h in T.Parallel(bq, heads):
                W_s[q, h] = T.if_then_else(s0 + q < seqs, W[T.min(s0 + q, seqs - 1), h], T.float32(0))
            last = -1
            for q in T.serial(bq):
                if s0 + q < seqs:
                    last = T.max(last, T.min(Pos[s0 + q], keys - 1))
            # clamped again although the loop above keeps last in [-1, keys - 1]: the bounds
            # verifier does not follow values through variables, and proves the tiles from this
            tiles = T.ceildiv(T.min(T.max(last, -1), keys - 1) + 1, block_n)
            for t in T.Pipelined(tiles, num_stages=num_stages):
                T.copy(K[t * block_n:(t + 1) * block_n, :], K_s)
                T.gemm(Q_s, K_s, S_f, transpose_B=True, clear_accum=True, policy=T.GemmWarpPolicy.FullRow)
                for i, j in T.Parallel(ROWS, block_n):
                    S_s[i, j] = S_f[i, j]
                for o in T.serial(T.ceildiv(bq * block_n, THREADS)):
                    q = (o * THREADS + tx) // block_n
                    n = t * block_n + (o * THREADS + tx) % block_n
                    if q < bq and s0 + q < seqs and n < keys:
                        head_sum(S_s, W_s, q, n - t * block_n, heads, acc)
                        Logits[s0 + q, n] = T.if_then_else(n <= Pos[s0 + q], T.ieee_mul(acc, KS[n]),
                                                           -T.infinity("float32"))
            # keys past every query's last visible key: -inf without computing them
            for c in T.serial(T.ceildiv(keys - tiles * block_n, THREADS)):
                n = tiles * block_n + c * THREADS + tx
                if n < keys:
                    for q in T.serial(bq):
                        if s0 + q < seqs:
                            Logits[s0 + q, n] = -T.infinity("float32")

    return kernel


@tlx.jit(target=TARGET, assume=["1 <= P", "1 <= MP", f"MP <= {MAX_KEYS // PAGE}", "B * MP * 256 <= 2147483647"])
def indexer_paged_kernel(tokens: int, dim: int, num_stages: int = 2):
    """Decode form: ``Logits [B, tokens, MP * 64]`` from ``Q [B, tokens, 64, dim]``, the paged
    ``KC [P, 64, dim]`` / ``KSC [P, 64]``, ``BT [B, MP]``, ``SL [B]`` and ``W [B, tokens, 64]``.
    CTA (c, b) scores pages ``16c .. 16c + 15`` of sequence b."""
    heads = INDEX_HEADS
    rows = tokens * heads
    batch = T.dynamic("B")
    pages = T.dynamic("P")
    max_pages = T.dynamic("MP")

    @T.prim_func
    def kernel(Q: T.Tensor((batch, tokens, heads, dim), "float8_e4m3"),
               KC: T.Tensor((pages, PAGE, dim), "float8_e4m3"), KSC: T.Tensor((pages, PAGE), "float32"),
               BT: T.Tensor((batch, max_pages), "int32"), SL: T.Tensor((batch,), "int32"),
               W: T.Tensor((batch, tokens, heads), "float32"),
               Logits: T.Tensor((batch, tokens, max_pages * PAGE), "float32")):
        with T.Kernel(T.ceildiv(max_pages, PAGES_PER_CTA), batch, threads=THREADS) as (cx, b):
            tx = T.get_thread_binding()
            Q_s = T.alloc_shared((rows, dim), "float8_e4m3")
            K_s = T.alloc_shared((PAGE, dim), "float8_e4m3")
            W_s = T.alloc_shared((tokens, heads), "float32")
            S_s = T.alloc_shared((rows, PAGE + PAD), "float32")
            S_f = T.alloc_fragment((rows, PAGE), "float32")
            acc = T.alloc_var("float32")
            scored = T.alloc_var("int32")  # pages of this CTA that hold keys of the sequence
            p0 = cx * PAGES_PER_CTA
            seq = T.min(SL[b], max_pages * PAGE)  # keys past the block table's pages do not exist
            for i, d in T.Parallel(rows, dim):
                Q_s[i, d] = Q[b, i // heads, i % heads, d]
            for q, h in T.Parallel(tokens, heads):
                W_s[q, h] = W[b, q, h]
            scored = T.max(T.min(seq // PAGE + T.if_then_else(seq % PAGE > 0, 1, 0) - p0, PAGES_PER_CTA), 0)
            for t in T.Pipelined(scored, num_stages=num_stages):
                # the table entry is read where it is used (not kept in a variable): the copy
                # runs in TileLang's producer warps, which do not see the consumers' variables
                T.copy(KC[clamped_page(BT, b, p0 + t, pages), :, :], K_s)
                T.gemm(Q_s, K_s, S_f, transpose_B=True, clear_accum=True, policy=T.GemmWarpPolicy.FullRow)
                for i, j in T.Parallel(rows, PAGE):
                    S_s[i, j] = S_f[i, j]
                q = tx // PAGE
                j = tx % PAGE
                if q < tokens:
                    head_sum(S_s, W_s, q, j, heads, acc)
                    Logits[b, q, (p0 + t) * PAGE + j] = T.if_then_else(
                        0 <= table_entry(BT, b, p0 + t) and table_entry(BT, b, p0 + t) < pages,
                        T.if_then_else((p0 + t) * PAGE + j <= seq - tokens + q,
                                       T.ieee_mul(acc, KSC[clamped_page(BT, b, p0 + t, pages), j]),
                                       -T.infinity("float32")),
                        T.reinterpret(T.uint32(0x7FC00000), T.float32))
            # the CTA's pages past the sequence: -inf without reading them
            for c in T.serial(T.ceildiv((PAGES_PER_CTA - scored) * PAGE, THREADS)):
                key = (p0 + scored) * PAGE + c * THREADS + tx
                if key < T.min(p0 + PAGES_PER_CTA, max_pages) * PAGE:
                    for q in T.serial(tokens):
                        Logits[b, q, key] = -T.infinity("float32")

    return kernel


def _check_fp8(name: str, t, ndim: int, dim_sizes: dict):
    check_tensor(name, t, (E4M3,), ndim)
    for d, (size, what) in dim_sizes.items():
        if t.shape[d] != size:
            raise ValueError(f"{name}: shape[{d}] expected {size} ({what}), got {t.shape[d]}")


def _check_f32(name: str, t, shape: tuple, dtype=torch.float32):
    check_tensor(name, t, (dtype,), len(shape))
    if tuple(t.shape) != shape:
        raise ValueError(f"{name}: expected shape {shape}, got {tuple(t.shape)}")


def indexer_logits(q: torch.Tensor, k: torch.Tensor, k_scale: torch.Tensor, w: torch.Tensor,
                   pos: torch.Tensor) -> torch.Tensor:
    """Prefill form: fp32 ``[S, N]`` logits of q ``[S, H, D]`` e4m3 (H 32 or 64, D 64 or 128)
    against k ``[N, D]`` e4m3 with ``k_scale [N]`` fp32, weights ``w [S, H]`` fp32; key n is
    visible to query s when ``n <= pos[s]`` (int32 [S]), else -inf."""
    check_tensor("q", q, (E4M3,), 3)
    s, h, d = q.shape
    if h not in (32, 64):
        raise ValueError(f"q: heads expected 32 or 64, got {h}")
    if d not in (64, 128):
        raise ValueError(f"q: head dim expected 64 or 128, got {d}")
    _check_fp8("k", k, 2, {1: (d, "q's head dim")})
    n = k.shape[0]
    if not 1 <= n <= MAX_KEYS or s * n > 2**31 - 1:
        raise ValueError(f"k: expected 1 <= N <= {MAX_KEYS} and S * N < 2^31, got N = {n}, S = {s}")
    _check_f32("k_scale", k_scale, (n,))
    _check_f32("w", w, (s, h))
    _check_f32("pos", pos, (s,), torch.int32)
    check_cuda(q=q, k=k, k_scale=k_scale, w=w, pos=pos)
    out = torch.empty((s, n), dtype=torch.float32, device=q.device)
    if s:
        indexer_kernel(h, d)(q, k, k_scale, w, pos, out)
    return out


def indexer_logits_paged(q: torch.Tensor, k_cache: torch.Tensor, k_scale_cache: torch.Tensor,
                         block_table: torch.Tensor, seq_lens: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Decode form: fp32 ``[B, T, MP * 64]`` logits of q ``[B, T, 64, 128]`` e4m3 (T 1..4)
    against the paged ``k_cache [P, 64, 128]`` e4m3 / ``k_scale_cache [P, 64]`` fp32 through
    ``block_table [B, MP]`` int32, ``seq_lens [B]`` int32 (clamped to ``MP * 64``), weights
    ``w [B, T, 64]``. Token t sees keys ``j <= seq_lens[b] - T + t``; others are -inf; the keys
    of a block-table entry outside ``[0, P)`` are NaN (never read)."""
    check_tensor("q", q, (E4M3,), 4)
    b, t, h, d = q.shape
    if not 1 <= t <= 4:
        raise ValueError(f"q: tokens per sequence expected 1..4, got {t}")
    if h != INDEX_HEADS or d != 128:
        raise ValueError(f"q: expected [B, T, {INDEX_HEADS}, 128], got {tuple(q.shape)}")
    _check_fp8("k_cache", k_cache, 3, {1: (PAGE, "tokens per page"), 2: (d, "q's head dim")})
    p = k_cache.shape[0]
    if p < 1:
        raise ValueError("k_cache: expected at least one page, got 0")
    _check_f32("k_scale_cache", k_scale_cache, (p, PAGE))
    check_tensor("block_table", block_table, (torch.int32,), 2)
    if block_table.shape[0] != b or not 1 <= block_table.shape[1] <= MAX_KEYS // PAGE:
        raise ValueError(f"block_table: expected [{b}, 1..{MAX_KEYS // PAGE}], got {tuple(block_table.shape)}")
    mp = block_table.shape[1]
    if b * mp * 256 > 2**31 - 1:
        raise ValueError(f"block_table: B * MP = {b * mp} too large for int32 logits offsets")
    _check_f32("seq_lens", seq_lens, (b,), torch.int32)
    _check_f32("w", w, (b, t, h))
    check_cuda(q=q, k_cache=k_cache, k_scale_cache=k_scale_cache, block_table=block_table, seq_lens=seq_lens, w=w)
    out = torch.empty((b, t, mp * PAGE), dtype=torch.float32, device=q.device)
    if b:
        indexer_paged_kernel(t, d)(q, k_cache, k_scale_cache, block_table, seq_lens, w, out)
    return out


def reference_logits(q, k, k_scale, w, visible):
    """fp64 torch reference: ``q [S, H, D]``, ``k [N, D]`` (e4m3, decoded exactly), ``visible
    [S, N]`` bool; returns (logits fp64 with -inf where not visible, the bound of each logit's
    magnitude: ``Σ_h |w| Σ_d |q k| · k_scale``, for the tolerance)."""
    qf, kf = q.double(), k.double()
    dots = torch.einsum("shd,nd->shn", qf, kf)
    wd = w.double()[:, :, None]
    logits = (dots.clamp_min(0) * wd).sum(1) * k_scale.double()[None, :]
    bound = (torch.einsum("shd,nd->shn", qf.abs(), kf.abs()) * wd.abs()).sum(1) * k_scale.double().abs()[None, :]
    return logits.masked_fill(~visible, float("-inf")), bound
