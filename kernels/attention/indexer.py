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

1. ``dot = k[n] · q[s, h]``: one chain of wgmma ``k32.f32.e4m3.e4m3`` steps over D, ascending,
   from zero (the tensor cores' fp32 accumulation), keys as the M operand;
2. ``p_h = max(dot, 0) · w[s, h]`` (``fmaxf``, one rounded multiply);
3. four partial sums from +0, ``part_l = ((0 + p_{2l}) + p_{2l+8}) + ...`` over the heads
   ``8g + 2l`` (g ascending), then on over ``8g + 2l + 1``: the heads one thread of a wgmma
   accumulator quad holds, in its register order;
4. ``sum = (part_0 + part_2) + (part_1 + part_3)`` (the quad's butterfly, lane distance 2 then 1);
5. ``logit = sum · k_scale[n]`` (one rounded multiply).

Kernels: the key tile (64 keys, one page in decode) is the wgmma's M side and the query rows
(token, head) its N side, so each thread's accumulator holds whole head runs of its two keys and
the head sum stays in registers (steps 3-4: no shared-memory round trip). The prefill kernel is
warp-specialized: a producer warpgroup streams key tiles by TMA through a ring of stages (and
fills the keys past every query's last visible one with -inf), and consumer warpgroups own 128
query rows each: at d 128 two of them alternate two accumulators, so one tile's products run on
the tensor cores while the previous tile's head sums run on the ALUs; at d 64, where the head
sums dominate, three with one accumulator each (``PREFILL_OPTIONS``; the same bits). Every logit is computed by one thread quad
from its own inputs only: the result does not depend on the batch, the grid or the other queries.
"""

import torch
import tilelang.language as T

import tlx
from kernels.attention.common import WARPGROUP, check_cuda, check_tensor, neg_inf

TARGET = {"kind": "cuda", "arch": "sm_90a"}
BLOCK_N = 64  # keys of one tile: the wgmma's M
COLS = 128  # query rows (tokens x heads) of one prefill consumer warpgroup: its wgmma N
CONSUMERS = 2  # prefill consumer warpgroups
# indexer_logits' prefill kernel options by head dim (H200, 2026-12-04, S 4096 N 8192): at d 64 the
# head sums outweigh the products, and three consumer warpgroups with one accumulator each beat
# two alternating two (0.310 against 0.358 ms); at d 128 the alternation wins (0.638 against 0.654)
PREFILL_OPTIONS = {64: {"consumers": 3, "overlap": False}, 128: {"consumers": 2, "overlap": True}}
# setmaxnreg of the prefill producer and consumers by consumer count (within the SM's 64K registers)
REGISTERS = {2: (24, 240), 3: (24, 160)}
PAGE = 64  # tokens per KV page
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
def head_sums(acc3, prods3, W_f, sums, keys: int, tokens: int, heads: int):
    """Steps 2-4 of the module docstring: ``acc3 [keys, tokens, heads]`` (a view of the wgmma
    accumulator) holds the raw dots, ``W_f [tokens, heads]`` the weights; ``sums [keys, tokens]``
    gets the head sums (TileLang's reduction: register order, then the quad's butterfly). The
    products go to ``prods3``, not back into the accumulator: ptxas serializes every wgmma of a
    kernel whose other instructions write an accumulator while another wgmma is in flight."""
    for i, q, h in T.Parallel(keys, tokens, heads):
        prods3[i, q, h] = T.ieee_mul(T.max(acc3[i, q, h], T.float32(0)), W_f[q, h])
    T.reduce_sum(prods3, sums, dim=-1, clear=True)


@tlx.jit(target=TARGET, assume=["1 <= S", "1 <= N", f"N <= {MAX_KEYS}", "S * N <= 2147483647"],
         pass_configs={"tl.disable_thread_storage_sync": True})  # every barrier is placed by hand
def indexer_kernel(heads: int, dim: int, num_stages: int = 4, consumers: int = CONSUMERS, overlap: bool = True):
    """Prefill form: ``Logits [S, N]`` from ``Q [S, heads, dim]``, ``K [N, dim]``, ``KS [N]``,
    ``W [S, heads]``, ``Pos [S]``. A CTA owns ``consumers * 128 / heads`` consecutive queries
    (the grid's first CTAs the last queries: in a causal prefill they see the most keys).
    ``overlap``: two accumulators per consumer, one tile's products beside the other's head
    sums; else one, and the consumers' own interleaving hides the products (the same bits)."""
    if consumers not in REGISTERS:
        raise ValueError(f"consumers: expected one of {tuple(REGISTERS)}, got {consumers}")
    tq = COLS // heads  # queries of one consumer warpgroup
    bq = tq * consumers
    stores = tq * BLOCK_N // WARPGROUP  # logits one consumer thread stores a tile
    rows = COLS * consumers
    stages = num_stages
    seqs = T.dynamic("S")
    keys = T.dynamic("N")
    f32 = "float32"

    @T.macro
    def score_tile(acc3, prods3, sums, W_f, S_s, buf, Pos_s, t, tiles, s0, KS, KS_l, Logits, tx):
        """Logits of key tile ``t`` (nothing for a tile past the last one) from its dots: the
        head sums go through shared memory ``S_s[buf] [bq, 64]`` so that the logits leave as
        whole rows of 64 keys instead of one float per thread quad. Each consumer stages and
        stores only its own ``tq`` queries behind its own named barrier, so the consumers never
        wait for one another and one's products overlap another's head sums; ``buf`` alternates
        between tiles, so the barrier of tile t + 1 orders tile t's reads before tile t + 2's
        writes of the same buffer."""
        for j in T.serial(stores):  # the key scales this thread applies, loaded under the head sums
            KS_l[j] = KS[T.min(t * BLOCK_N + (j * WARPGROUP + tx % WARPGROUP) % BLOCK_N, keys - 1)]
        head_sums(acc3, prods3, W_f, sums, BLOCK_N, bq, heads)
        for i, q in T.Parallel(BLOCK_N, bq):
            S_s[buf, q, i] = sums[i, q]
        T.sync_threads(2 + tx // WARPGROUP, WARPGROUP)
        for j in T.serial(stores):
            q = tx // WARPGROUP * tq + (j * WARPGROUP + tx % WARPGROUP) // BLOCK_N
            n = t * BLOCK_N + (j * WARPGROUP + tx % WARPGROUP) % BLOCK_N
            if t < tiles and s0 + q < seqs and n < keys:
                Logits[s0 + q, n] = T.if_then_else(n <= Pos_s[q], T.ieee_mul(S_s[buf, q, n - t * BLOCK_N], KS_l[j]),
                                                   neg_inf())

    @T.macro
    def issue(K_s, Q_s, acc, k_full, t, tiles):
        """Wait for key tile ``t`` (unless it is past the last one) and start its products into
        ``acc`` (asynchronous wgmma)."""
        if t < tiles:
            T.mbarrier_wait_parity(k_full[t % stages], (t // stages) & 1)
        T.wgmma_gemm(K_s[t % stages, :, :], Q_s, acc, transpose_B=True, clear_accum=True,
                     policy=T.GemmWarpPolicy.FullCol)

    @T.prim_func
    def kernel(Q: T.Tensor((seqs, heads, dim), "float8_e4m3"), K: T.Tensor((keys, dim), "float8_e4m3"),
               KS: T.Tensor((keys,), f32), W: T.Tensor((seqs, heads), f32),
               Pos: T.Tensor((seqs,), "int32"), Logits: T.Tensor((seqs, keys), f32)):
        with T.Kernel(T.ceildiv(seqs, bq), threads=WARPGROUP * (consumers + 1)) as bx:
            tx = T.get_thread_binding()
            Q_s = T.alloc_shared((rows, dim), "float8_e4m3")
            K_s = T.alloc_shared((stages, BLOCK_N, dim), "float8_e4m3")
            acc_a = T.alloc_fragment((BLOCK_N, rows), f32)
            acc3_a = T.reshape(acc_a, (BLOCK_N, bq, heads))
            if overlap:
                acc_b = T.alloc_fragment((BLOCK_N, rows), f32)
                acc3_b = T.reshape(acc_b, (BLOCK_N, bq, heads))
                prods = T.alloc_fragment((BLOCK_N, rows), f32)
                prods3 = T.reshape(prods, (BLOCK_N, bq, heads))
            W_f = T.alloc_fragment((bq, heads), f32)
            sums = T.alloc_fragment((BLOCK_N, bq), f32)
            S_s = T.alloc_shared((2, bq, BLOCK_N), f32)
            Pos_s = T.alloc_shared((bq,), "int32")
            KS_l = T.alloc_local((stores,), f32)
            k_full = T.alloc_barrier([WARPGROUP] * stages)
            k_empty = T.alloc_barrier([WARPGROUP * consumers] * stages)
            last = T.alloc_var("int32")  # the last key any of the CTA's queries sees, -1 for none
            s0 = (T.ceildiv(seqs, bq) - 1 - bx) * bq
            last = -1
            for q in T.serial(bq):
                if s0 + q < seqs:
                    last = T.max(last, T.min(Pos[s0 + q], keys - 1))
            # clamped again although the loop above keeps last in [-1, keys - 1]: the bounds
            # verifier does not follow values through variables, and proves the tiles from this
            tiles = T.ceildiv(T.min(T.max(last, -1), keys - 1) + 1, BLOCK_N)
            if tx >= WARPGROUP * consumers:
                T.set_max_nreg(REGISTERS[consumers][0], 0)
                for t in T.serial(tiles):
                    T.mbarrier_wait_parity(k_empty[t % stages], ((t // stages) & 1) ^ 1)
                    T.tma_copy(K[t * BLOCK_N:(t + 1) * BLOCK_N, :], K_s[t % stages, :, :], barrier=k_full[t % stages])
                    T.mbarrier_arrive(k_full[t % stages])
                # keys past every query's last visible key: -inf without computing them
                for c in T.serial(T.ceildiv(keys - tiles * BLOCK_N, WARPGROUP)):
                    n = tiles * BLOCK_N + c * WARPGROUP + (tx - WARPGROUP * consumers)
                    if n < keys:
                        for q in T.serial(bq):
                            if s0 + q < seqs:
                                Logits[s0 + q, n] = neg_inf()
            else:
                T.set_max_nreg(REGISTERS[consumers][1], 1)
                for i, d in T.Parallel(rows, dim):
                    Q_s[i, d] = T.if_then_else(s0 + i // heads < seqs, Q[T.min(s0 + i // heads, seqs - 1), i % heads, d],
                                               T.Cast("float8_e4m3", 0))
                for q, h in T.Parallel(bq, heads):
                    W_f[q, h] = T.if_then_else(s0 + q < seqs, W[T.min(s0 + q, seqs - 1), h], T.float32(0))
                for q in T.Parallel(bq):
                    Pos_s[q] = Pos[T.min(s0 + q, seqs - 1)]
                T.fence_proxy_async()  # Q_s, written by plain stores, is read by wgmma
                T.sync_threads(1, WARPGROUP * consumers)
                if not overlap:
                    for t in T.serial(tiles):
                        T.mbarrier_wait_parity(k_full[t % stages], (t // stages) & 1)
                        T.gemm(K_s[t % stages, :, :], Q_s, acc_a, transpose_B=True, clear_accum=True,
                               policy=T.GemmWarpPolicy.FullCol)
                        T.mbarrier_arrive(k_empty[t % stages])
                        score_tile(acc3_a, acc3_a, sums, W_f, S_s, t % 2, Pos_s, t, tiles, s0, KS, KS_l, Logits, tx)
                else:
                    # tiles in pairs: while one accumulator's products run, the other's head sums
                    # do. ptxas serializes every wgmma of the kernel unless each one is issued
                    # outside any branch, and no wgmma is issued between another's issue and
                    # retirement (wait 0) after a read of its accumulator: so each issue follows
                    # a full wait, and a tile past the last one is computed anyway (on a stage no
                    # copy writes any more; its results unused), also when there is no tile: a
                    # branch on the tile count would make the logits' bits depend on N as far as
                    # the batch-invariance check can tell.
                    issue(K_s, Q_s, acc_a, k_full, 0, tiles)
                    for j in T.serial(T.ceildiv(tiles, 2)):
                        T.wait_wgmma(0)
                        T.mbarrier_arrive(k_empty[(2 * j) % stages])
                        issue(K_s, Q_s, acc_b, k_full, 2 * j + 1, tiles)
                        score_tile(acc3_a, prods3, sums, W_f, S_s, 0, Pos_s, 2 * j, tiles, s0, KS, KS_l, Logits, tx)
                        T.wait_wgmma(0)
                        if 2 * j + 1 < tiles:
                            T.mbarrier_arrive(k_empty[(2 * j + 1) % stages])
                        issue(K_s, Q_s, acc_a, k_full, 2 * j + 2, tiles)
                        score_tile(acc3_b, prods3, sums, W_f, S_s, 1, Pos_s, 2 * j + 1, tiles, s0, KS, KS_l, Logits, tx)
                    T.wait_wgmma(0)

    return kernel


@tlx.jit(target=TARGET, assume=["1 <= P", "1 <= MP", f"MP <= {MAX_KEYS // PAGE}", "B * MP * 256 <= 2147483647"])
def indexer_paged_kernel(tokens: int, dim: int, num_stages: int = 2):
    """Decode form: ``Logits [B, tokens, MP * 64]`` from ``Q [B, tokens, 64, dim]``, the paged
    ``KC [P, 64, dim]`` / ``KSC [P, 64]``, ``BT [B, MP]``, ``SL [B]`` and ``W [B, tokens, 64]``.
    CTA (c, b) scores pages ``16c .. 16c + 15`` of sequence b, one warpgroup (TileLang's pipeline
    adds the producer)."""
    heads = INDEX_HEADS
    cols = tokens * heads
    batch = T.dynamic("B")
    pages = T.dynamic("P")
    max_pages = T.dynamic("MP")

    @T.prim_func
    def kernel(Q: T.Tensor((batch, tokens, heads, dim), "float8_e4m3"),
               KC: T.Tensor((pages, PAGE, dim), "float8_e4m3"), KSC: T.Tensor((pages, PAGE), "float32"),
               BT: T.Tensor((batch, max_pages), "int32"), SL: T.Tensor((batch,), "int32"),
               W: T.Tensor((batch, tokens, heads), "float32"),
               Logits: T.Tensor((batch, tokens, max_pages * PAGE), "float32")):
        with T.Kernel(T.ceildiv(max_pages, PAGES_PER_CTA), batch, threads=WARPGROUP) as (cx, b):
            tx = T.get_thread_binding()
            Q_s = T.alloc_shared((cols, dim), "float8_e4m3")
            K_s = T.alloc_shared((PAGE, dim), "float8_e4m3")
            acc = T.alloc_fragment((PAGE, cols), "float32")
            acc3 = T.reshape(acc, (PAGE, tokens, heads))
            W_f = T.alloc_fragment((tokens, heads), "float32")
            sums = T.alloc_fragment((PAGE, tokens), "float32")
            scored = T.alloc_var("int32")  # pages of this CTA that hold keys of the sequence
            p0 = cx * PAGES_PER_CTA
            seq = T.min(SL[b], max_pages * PAGE)  # keys past the block table's pages do not exist
            for i, d in T.Parallel(cols, dim):
                Q_s[i, d] = Q[b, i // heads, i % heads, d]
            for q, h in T.Parallel(tokens, heads):
                W_f[q, h] = W[b, q, h]
            scored = T.max(T.min(seq // PAGE + T.if_then_else(seq % PAGE > 0, 1, 0) - p0, PAGES_PER_CTA), 0)
            for t in T.Pipelined(scored, num_stages=num_stages):
                # the table entry is read where it is used (not kept in a variable): the copy
                # runs in TileLang's producer warps, which do not see the consumers' variables
                T.copy(KC[clamped_page(BT, b, p0 + t, pages), :, :], K_s)
                T.gemm(K_s, Q_s, acc, transpose_B=True, clear_accum=True, policy=T.GemmWarpPolicy.FullCol)
                head_sums(acc3, acc3, W_f, sums, PAGE, tokens, heads)  # in place: its wgmma is synchronous
                for j, q in T.Parallel(PAGE, tokens):
                    Logits[b, q, (p0 + t) * PAGE + j] = T.if_then_else(
                        0 <= table_entry(BT, b, p0 + t) and table_entry(BT, b, p0 + t) < pages,
                        T.if_then_else((p0 + t) * PAGE + j <= seq - tokens + q,
                                       T.ieee_mul(sums[j, q], KSC[clamped_page(BT, b, p0 + t, pages), j]),
                                       neg_inf()),
                        T.reinterpret(T.uint32(0x7FC00000), T.float32))
            # the CTA's pages past the sequence: -inf without reading them
            for c in T.serial(T.ceildiv((PAGES_PER_CTA - scored) * PAGE, WARPGROUP)):
                key = (p0 + scored) * PAGE + c * WARPGROUP + tx
                if key < T.min(p0 + PAGES_PER_CTA, max_pages) * PAGE:
                    for q in T.serial(tokens):
                        Logits[b, q, key] = neg_inf()

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
        indexer_kernel(h, d, **PREFILL_OPTIONS[d])(q, k, k_scale, w, pos, out)
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
