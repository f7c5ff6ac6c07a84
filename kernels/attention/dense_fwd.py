"""Dense attention forward (FlashAttention-style) for prefill and training, on sm_90a.

``o = softmax(scale * q k^T + mask) v`` per query head, with the log-sum-exp as a second
output. bf16 or fp16, head dim 64, 128 or 256, MHA / GQA / MQA (query head ``h`` reads kv head
``h // (heads / kv_heads)``), causal or not, fixed-length ``[b, s, h, d]`` or packed varlen
``[total, h, d]`` with ``cu_seqlens``. Causal masking is aligned to the bottom right: query ``i``
of a sequence with ``len_q`` queries and ``len_k`` keys sees keys ``j <= i + len_k - len_q``
(the usual convention for ``len_q != len_k``); a query that sees no key gets 0 and lse -inf.

Work split: one CTA per (query tile, query head, sequence); consumer warpgroups of 64 query
rows each (two: 128-query tiles) plus a TMA producer warpgroup, either by TileLang's warp
specialization of the pipelined key loop (``dense_fwd_kernel``) or scheduled by hand with the
softmax overlapping the tensor cores (``dense_fwd_overlap_kernel``: two or three consumers, the
warpgroups optionally taking turns to issue their GEMMs; or, as ``dense_fwd_persistent_kernel``,
one CTA a SM walking the tiles); all compute the same bits (a row's
arithmetic does not depend on the tile's other rows; a row given key blocks wholly right of its
diagonal by a taller tile adds exact zeros: its max, sum and output stay bit for bit). Every tile of a sequence starts at the sequence's first row, so a
sequence's bits do not depend on the other sequences of the batch (batch invariance).

Fixed orders (the contract with ``dense_fwd.cu``, which must give the same bits):

* keys in blocks of ``block_n`` (128 for d <= 128, 64 for d = 256; the overlap schedule's default
  at d 256 takes 80) in ascending order, from
  block 0 to the last block the tile's rows can see;
* ``S = Q K^T``: one fp32 wgmma chain per warpgroup, m64n{block_n}k16, K (= d) ascending in
  steps of 16, starting from zero; masked entries are then replaced by -inf;
* the online-softmax update of ``kernels/attention/common.py`` (row max; ``m_scaled = m * c``
  rounded, ``c = scale * log2(e)`` folded at compile time; ``alpha = exp2(m_scaled_old -
  m_scaled)``, 0 while the old max is -inf; ``p = exp2(fma(s, c, -m_scaled))``;
  ``l = fma(l, alpha, rowsum(p))``); ``rowsum`` starts from 0 and adds the thread's own entries
  of the row: first the even column of each 8-column group (columns ``8 t + 2 (lane % 4)``,
  ``t`` ascending), then the odd ones, then across the quad with shuffles (xor 2, then xor 1);
* ``O = O * alpha + P V``: P rounded to the input dtype (RNE), one wgmma chain
  m64n{d}k16 with P from registers, keys ascending in steps of 16, onto the rescaled O;
* ``o = O / l`` (IEEE division) rounded to the input dtype; ``lse = (m_scaled + log2(l)) * ln 2``;
* ``exp2`` is CUDA's ``exp2f``, or with ``fast_exp2`` (the default at every head dim) the one instruction
  ``ex2.approx.ftz.f32``: the same bits but for results below 2^-126, which it flushes to 0
  (the baseline takes the same choice: its ``fast_exp2`` argument).

Bounds: each sequence's offsets are clamped into ``[0, total]`` in the kernel (a no-op for the
offsets the wrapper accepts), stores are guarded by the clamped length and TMA zero-fills rows
past a tensor, so no offset values reach memory out of range. Because of those clamps ``tlx
check`` proves every access in bounds under the ``assume`` list alone, no derived precondition
(102 of 102, ``pipelined``, d 128 causal; 158 of 158, ``overlap``); ``2 <= NB`` in the assume
list keeps its precondition search from settling on an empty grid.

Determinism: ``tlx check`` reports "deterministic" (no atomics, no split reduction) and batch
invariance "unknown": the key-block count ``n_blocks`` depends on ``TQ``, the packed row count
of the whole batch, but only through the clamp of the offsets read from ``cu_q`` into
``[0, TQ]``, which the analysis reports as a dependence on data. That clamp never binds for
offsets that ``check_cu_seqlens`` accepts, so a tile's block count is a function of its own
sequence's lengths.
``tests/kernels/attention/test_dense_fwd_gpu.py::test_batch_invariance`` checks the property
on the GPU (one sequence alone and inside a 64-sequence varlen batch). The persistent grid's tile -> (row
block, head, sequence) map divides by ``H``, so there the analysis finds the key loop's extent
depending on ``H`` and reports batch invariance false; each tile still reads only its own
sequence's rows.
"""

import functools
import math

import torch
import tilelang.language as T

import tlx

from kernels.attention import common as C
from kernels.device import sm_count

SUPPORTED_DIMS = (64, 128, 256)
BLOCK_M = 128  # query rows of a CTA with two consumer warpgroups
CONSUMER_ROWS = 64  # query rows of one consumer warpgroup (its wgmma M)
# registers a thread (setmaxnreg) of the producer and of each consumer warpgroup, by consumer
# count: together within the SM's 64K (2 x 128 x 240 + 128 x 24, 3 x 128 x 160 + 128 x 24)
REGISTER_SPLIT = {2: (24, 240), 3: (24, 160)}
TURN_BARRIER = C.NAMED_BARRIER  # first named-barrier id of the warpgroups' turns

total_q = T.dynamic("TQ")
total_k = T.dynamic("TK")
n_offsets = T.dynamic("NB")  # batch + 1
heads = T.dynamic("H")
kv_heads = T.dynamic("HK")  # divides H (checked by the wrapper)


def block_n_for(dim: int) -> int:
    """Keys per block: 128, or 64 at d = 256 (the shared-memory budget of two K/V stages)."""
    return 64 if dim == 256 else 128


def sequence_rows(cu, b, total):
    """(first row, row count) of sequence ``b`` from its offsets, clamped into ``[0, total]``: a
    no-op for the offsets the wrapper accepts (``check_cu_seqlens``), and what lets every access
    be proven in bounds without reading the offsets (data) at compile time."""
    start = T.min(T.max(cu[b], 0), total)
    return start, T.min(T.max(cu[b + 1], start), total) - start


def diagonal(len_q, len_k):
    """``len_k - len_q`` in int64: query ``i`` sees keys ``j <= i + diagonal`` (causal)."""
    return T.Cast("int64", len_k) - T.Cast("int64", len_q)


def keys_seen(row0, rows: int, len_q, len_k, causal: bool):
    """Keys the rows ``row0 .. row0 + rows - 1`` of a sequence can see, in ``[0, len_k]``; the
    diagonal arithmetic runs in int64, so no int32 sum of offsets can overflow (what the bounds
    proofs need, whatever the offsets hold)."""
    if not causal:
        return len_k
    return T.Cast("int32", T.max(T.min(T.Cast("int64", len_k), T.Cast("int64", row0 + rows) + diagonal(len_q, len_k)), T.int64(0)))


@T.macro
def mask_block(acc_s, kb, row0, len_q, len_k, causal: bool, block_m: int, block_n: int):
    """-inf for the scores of key block ``kb`` past the sequence or right of the diagonal; only
    blocks that cross the end or the diagonal are touched (diagonal offsets in int64, see
    ``keys_seen``)."""
    last_col = (kb + 1) * block_n - 1
    if last_col >= len_k or (causal and T.Cast("int64", last_col) > T.Cast("int64", row0) + diagonal(len_q, len_k)):
        for i, j in T.Parallel(block_m, block_n):
            col = kb * block_n + j
            if causal:
                acc_s[i, j] = T.if_then_else(col < len_k and T.Cast("int64", col) <= T.Cast("int64", row0 + i) + diagonal(len_q, len_k),
                                             acc_s[i, j], C.neg_inf())
            else:
                acc_s[i, j] = T.if_then_else(col < len_k, acc_s[i, j], C.neg_inf())


@T.macro
def store_rows(O, LSE, O_s, lse_rows, q0, row0, len_q, by, block_m: int, dim: int):
    """A tile's output rows (staged in ``O_s``) and their log-sum-exp, the rows past the sequence left alone."""
    for i, j in T.Parallel(block_m, dim):
        if row0 + i < len_q:
            O[q0 + row0 + i, by, j] = O_s[i, j]
    for i in T.Parallel(block_m):
        if row0 + i < len_q:
            LSE[by, q0 + row0 + i] = lse_rows[i]


# Host-checked preconditions (the wrapper meets them): at least one sequence, heads grouped evenly, a grid that covers
# the longest sequence without running past the packed rows, row sums (TQ + TK) within int32, rows x heads of q and k
# within 2^25 (check_tensor's element limit at d >= 64: the int64 offsets of every row are then provably in range).
FWD_ASSUME = ["2 <= NB", "1 <= HK", "HK <= H", "H % HK == 0", "1 <= q_tiles", "q_tiles * 128 <= TQ + 127",
              "TQ <= 1073741568", "TK <= 1073741568", "H * TQ <= 33554431", "HK * TK <= 33554431"]


@tlx.jit(target=C.TARGET, assume=FWD_ASSUME)
def dense_fwd_kernel(dim: int, causal: bool, scale_log2: float, dtype: str = "bfloat16", num_stages: int = 2,
                     fast_exp2: bool = False):
    """The kernel for one configuration: parameters ``Q [TQ, H, D], K, V [TK, HK, D],
    cu_q, cu_k [NB] int32, O [TQ, H, D], LSE [H, TQ] fp32, q_tiles`` (grid: q_tiles x H x (NB-1);
    q_tiles >= ceil(max len_q / 128)). ``fast_exp2``: as ``dense_fwd_overlap_kernel``'s."""
    C.check_head_dim("dim", dim, SUPPORTED_DIMS)
    if dtype not in ("bfloat16", "float16"):
        raise ValueError(f"dtype: expected 'bfloat16' or 'float16', got {dtype!r}")
    block_m, block_n = BLOCK_M, block_n_for(dim)
    f32 = "float32"
    exp2 = C.exp2_ftz if fast_exp2 else T.exp2

    @T.prim_func
    def main(Q: T.Tensor((total_q, heads, dim), dtype), K: T.Tensor((total_k, kv_heads, dim), dtype),
             V: T.Tensor((total_k, kv_heads, dim), dtype), cu_q: T.Tensor((n_offsets,), "int32"),
             cu_k: T.Tensor((n_offsets,), "int32"), O: T.Tensor((total_q, heads, dim), dtype),
             LSE: T.Tensor((heads, total_q), f32), q_tiles: T.int32):
        with T.Kernel(q_tiles, heads, n_offsets - 1, threads=256,
                      prelude=C.EXP2_FTZ_PRELUDE if fast_exp2 else None) as (bx, by, bz):
            Q_s = T.alloc_shared((block_m, dim), dtype)
            K_s = T.alloc_shared((block_n, dim), dtype)
            V_s = T.alloc_shared((block_n, dim), dtype)
            O_s = T.alloc_shared((block_m, dim), dtype)
            acc_s = T.alloc_fragment((block_m, block_n), f32)
            p = T.alloc_fragment((block_m, block_n), dtype)
            acc_o = T.alloc_fragment((block_m, dim), f32)
            m, m_prev, m_scaled, alpha, l, row_sum, lse_rows = C.row_state(block_m)

            q0, len_q = sequence_rows(cu_q, bz, total_q)
            k0, len_k = sequence_rows(cu_k, bz, total_k)
            row0 = bx * block_m
            # keys the tile's last row can see (bottom-right causal alignment)
            n_blocks = T.if_then_else(row0 < len_q, T.ceildiv(keys_seen(row0, block_m, len_q, len_k, causal), block_n), 0)

            # loaded only when waited for (TileLang waits inside the key loop): a TMA load still in
            # flight when the CTA exits could land in the next CTA's shared memory
            if n_blocks > 0:
                T.copy(Q[q0 + row0:q0 + row0 + block_m, by, :], Q_s)
            C.init_softmax(m, m_scaled, l, acc_o)
            for kb in T.Pipelined(n_blocks, num_stages=num_stages):
                T.copy(K[k0 + kb * block_n:k0 + (kb + 1) * block_n, by // (heads // kv_heads), :], K_s)
                T.gemm(Q_s, K_s, acc_s, transpose_B=True, clear_accum=True, policy=T.GemmWarpPolicy.FullRow)
                mask_block(acc_s, kb, row0, len_q, len_k, causal, block_m, block_n)
                C.softmax_step(acc_s, m, m_prev, m_scaled, alpha, l, row_sum, scale_log2, block_m, block_n, exp2)
                T.copy(acc_s, p)
                C.rescale_rows(acc_o, alpha, block_m, dim)
                T.copy(V[k0 + kb * block_n:k0 + (kb + 1) * block_n, by // (heads // kv_heads), :], V_s)
                T.gemm(p, V_s, acc_o, policy=T.GemmWarpPolicy.FullRow)
            C.finish_rows(acc_o, l, m_scaled, lse_rows, block_m, dim)
            T.copy(acc_o, O_s)
            store_rows(O, LSE, O_s, lse_rows, q0, row0, len_q, by, block_m, dim)

    return main


@functools.lru_cache(maxsize=64)
def uniform_offsets(batch: int, seqlen: int, device) -> torch.Tensor:
    """``cu_seqlens`` of ``batch`` sequences of ``seqlen`` rows (cached: no allocation per call)."""
    return torch.arange(0, batch + 1, dtype=torch.int32, device=device) * seqlen


OVERLAP_CONFIGS = {"tl.disable_warp_specialized": True, "tl.disable_thread_storage_sync": True}
# a persistent grid's own preconditions: ctas CTAs, at most one a tile, fewer than 2^30 tiles (so the
# tile count plus ctas stays in int32)
PERSISTENT_ASSUME = [*FWD_ASSUME, "1 <= ctas", "ctas <= q_tiles * H * (NB - 1)", "q_tiles * H * (NB - 1) <= 1073741823"]


@tlx.jit(target=C.TARGET, assume=FWD_ASSUME, pass_configs=OVERLAP_CONFIGS)
def dense_fwd_overlap_kernel(dim: int, causal: bool, scale_log2: float, dtype: str = "bfloat16", num_stages: int = 2,
                             consumers: int = 2, pingpong: bool = False, fast_exp2: bool = False, block_n: int = 0,
                             heavy_first: bool = False, lazy_rescale: bool = False, pinned_softmax: bool = False):
    """The hand-scheduled forward, one CTA a tile (see ``overlap_program``)."""
    return overlap_program(dim, causal, scale_log2, dtype, num_stages, consumers, pingpong, fast_exp2, block_n, heavy_first,
                           False, lazy_rescale, pinned_softmax)


@tlx.jit(target=C.TARGET, assume=PERSISTENT_ASSUME, pass_configs=OVERLAP_CONFIGS)
def dense_fwd_persistent_kernel(dim: int, causal: bool, scale_log2: float, dtype: str = "bfloat16", num_stages: int = 2,
                                consumers: int = 2, fast_exp2: bool = False, block_n: int = 0, heavy_first: bool = False,
                                lazy_rescale: bool = False, pinned_softmax: bool = False):
    """The hand-scheduled forward on a persistent grid of ``ctas`` CTAs (see ``overlap_program``)."""
    return overlap_program(dim, causal, scale_log2, dtype, num_stages, consumers, False, fast_exp2, block_n, heavy_first, True,
                           lazy_rescale, pinned_softmax)


def overlap_kernel(*args, persistent: bool = False, **options):
    """``dense_fwd_overlap_kernel``, or with ``persistent`` ``dense_fwd_persistent_kernel``."""
    if persistent and options.get("pingpong"):
        raise ValueError("pingpong: the turns start once per CTA, so a persistent grid takes pingpong=False")
    return (dense_fwd_persistent_kernel if persistent else dense_fwd_overlap_kernel)(*args, **options)


def overlap_program(dim: int, causal: bool, scale_log2: float, dtype: str, num_stages: int, consumers: int, pingpong: bool,
                    fast_exp2: bool, block_n: int, heavy_first: bool, persistent: bool, lazy_rescale: bool,
                    pinned_softmax: bool):
    """``dense_fwd_kernel``'s computation (same parameters, same bits) scheduled by hand:
    a TMA producer warpgroup and ``consumers`` warpgroups (64 query rows each: the grid's
    q_tiles cover ceil(len_q / (64 consumers))) that overlap block ``kb``'s softmax with block
    ``kb - 1``'s ``P V`` on the tensor cores (issue ``S_kb = Q K_kb^T`` and
    ``O += P_(kb-1) V_(kb-1)`` asynchronously, wait for ``S_kb`` only, run the softmax, then
    wait for ``P V``). ``pingpong``: the consumers issue those two GEMMs in turn (warpgroup 0,
    1, ..., one named barrier each), so that one warpgroup's softmax runs while the next one's
    GEMMs hold the tensor cores instead of all of them contending at once. The arithmetic and
    its order are those of the module docstring. ``fast_exp2``: exp2 as one instruction
    (``C.exp2_ftz``: p and alpha below 2^-126 become 0, other bits than exp2f's only there; the
    d 128 default, and ``dense_fwd.cu`` takes the same choice). ``block_n``: keys a block (0:
    ``block_n_for``; a multiple of 16 up to 256, e.g. 176 at d 128, FlashAttention-3's choice,
    which spreads each block's row-state update over more keys; other blocks, other bits: a
    sweep candidate).
    ``heavy_first`` (causal only; a sweep candidate, same bits): CTA ``bx`` takes query tile
    ``q_tiles - 1 - bx``, so a head's tiles with the most keys start first and the grid's last
    CTAs are short ones (a shorter tail of the last wave), as FlashAttention-3 orders causal tiles.
    ``lazy_rescale`` (a sweep candidate, same bits): ``C.rescale_rows``'s.
    ``pinned_softmax`` (same bits): block ``kb``'s softmax is pinned above the wait for
    ``P_(kb-1) V_(kb-1)`` by an order point on its row sums (``C.order_point``), where ptxas
    otherwise issues most of its exp2s and sums after that wait.
    ``persistent`` (a sweep candidate, same bits; slower than the default at every head dim on
    an H100, 0.73-0.79x non-causal, 0.42-0.71x causal): a grid of ``ctas`` CTAs (one more scalar
    parameter, at most the tile count, ``PERSISTENT_ASSUME``; the wrapper passes the SM count) that walk the tiles
    ``bid, bid + ctas, ...`` (tile ``t``: query tile ``t % q_tiles``, head ``t // q_tiles % H``,
    sequence ``t // (q_tiles H)``), the K/V ring and its barrier phases running on across tiles,
    so the producer loads the next tile's Q and first blocks while the consumers finish this one
    (FlashAttention-3's persistent scheduler). Where the shared memory allows (``O_s`` beside
    ``Q_s``), the consumers release Q after the tile's last ``Q K^T``, else after its output."""
    C.check_head_dim("dim", dim, SUPPORTED_DIMS)
    if block_n and (block_n % 16 or not 16 <= block_n <= 256):
        raise ValueError(f"block_n: expected 0 or a multiple of 16 from 16 to 256, got {block_n}")
    if dtype not in ("bfloat16", "float16"):
        raise ValueError(f"dtype: expected 'bfloat16' or 'float16', got {dtype!r}")
    if consumers not in REGISTER_SPLIT:
        raise ValueError(f"consumers: expected one of {tuple(REGISTER_SPLIT)}, got {consumers}")
    if num_stages < 1:
        raise ValueError(f"num_stages: expected >= 1, got {num_stages}")
    block_m, block_n = CONSUMER_ROWS * consumers, block_n or block_n_for(dim)
    consumer_threads = C.WARPGROUP * consumers
    producer_regs, consumer_regs = REGISTER_SPLIT[consumers]
    f32 = "float32"
    S = num_stages
    exp2 = C.exp2_ftz if fast_exp2 else T.exp2
    elem = 2  # bytes of a bf16 / fp16 value
    # the output's own staging tile, when it fits beside Q and the K/V ring (227 KB a CTA)
    own_o = persistent and (2 * block_m * dim + 2 * S * block_n * dim) * elem <= 227 * 1024
    prelude = "".join(p for p, on in ((C.EXP2_FTZ_PRELUDE, fast_exp2), (C.ORDER_POINT_PRELUDE, pinned_softmax)) if on) or None

    def ring(base, kb):
        """Block ``kb`` of a tile as a position in the K/V ring (``base``: the blocks of the
        CTA's earlier tiles mod 2 S; None without a persistent grid)."""
        return kb if base is None else T.floormod(base, 2 * S) + kb  # (floormod: in range whatever base holds)

    def slot(base, kb):
        return ring(base, kb) % S

    def phase(base, kb):
        """The barrier parity of block ``kb``'s pass through its slot."""
        return (ring(base, kb) // S) & 1

    def tile(cu_q, cu_k, q_tiles, t):
        """A persistent grid's tile ``t``: its head, its sequence's rows (``sequence_rows``), its first
        row and its key blocks."""
        by, bz = t // q_tiles % heads, t // (q_tiles * heads)
        q0, len_q = sequence_rows(cu_q, bz, total_q)
        k0, len_k = sequence_rows(cu_k, bz, total_k)
        row0 = (q_tiles - 1 - t % q_tiles if causal and heavy_first else t % q_tiles) * block_m
        n_blocks = T.if_then_else(row0 < len_q, T.ceildiv(keys_seen(row0, block_m, len_q, len_k, causal), block_n), 0)
        return by, q0, len_q, k0, len_k, row0, n_blocks

    def shared_state():
        """The CTA's tiles, fragments and barriers, allocated where this is called inside the
        kernel, in this order: ``(Q_s, K_s, V_s, O_s, acc_s, p, acc_o, row state (7), q_full,
        q_empty, k_full, v_full, k_empty, v_empty)``. ``O_s`` is ``Q_s`` unless ``own_o``. Without a
        persistent grid the tuple has no ``O_s`` (the output goes through ``Q_s``: a buffer bound
        to two names in the program takes the second) and no ``q_empty``."""
        Q_s = T.alloc_shared((block_m, dim), dtype)
        K_s = T.alloc_shared((S, block_n, dim), dtype)
        V_s = T.alloc_shared((S, block_n, dim), dtype)
        O_s = T.alloc_shared((block_m, dim), dtype) if own_o else Q_s
        acc_s = T.alloc_fragment((block_m, block_n), f32)
        p = T.alloc_fragment((block_m, block_n), dtype)
        acc_o = T.alloc_fragment((block_m, dim), f32)
        rows = C.row_state(block_m)
        q_full = T.alloc_barrier(128)
        q_empty = T.alloc_barrier(consumer_threads) if persistent else None
        k_full = T.alloc_barrier([128] * S)
        v_full = T.alloc_barrier([128] * S)
        k_empty = T.alloc_barrier([consumer_threads] * S)
        v_empty = T.alloc_barrier([consumer_threads] * S)
        if not persistent:
            return (Q_s, K_s, V_s, acc_s, p, acc_o, *rows, q_full, k_full, v_full, k_empty, v_empty)
        return (Q_s, K_s, V_s, O_s, acc_s, p, acc_o, *rows, q_full, q_empty, k_full, v_full, k_empty, v_empty)

    @T.macro
    def produce(Q, K, V, Q_s, K_s, V_s, q_full, k_full, v_full, k_empty, v_empty, q0, k0, row0, by, kvh, n_blocks, base):
        T.tma_copy(Q[q0 + row0:q0 + row0 + block_m, by, :], Q_s, barrier=q_full)
        T.mbarrier_arrive(q_full)
        for kb in T.serial(n_blocks):
            T.mbarrier_wait_parity(k_empty[slot(base, kb)], phase(base, kb) ^ 1)
            T.tma_copy(K[k0 + kb * block_n:k0 + (kb + 1) * block_n, kvh, :], K_s[slot(base, kb), :, :], barrier=k_full[slot(base, kb)])
            T.mbarrier_arrive(k_full[slot(base, kb)])
            T.mbarrier_wait_parity(v_empty[slot(base, kb)], phase(base, kb) ^ 1)
            T.tma_copy(V[k0 + kb * block_n:k0 + (kb + 1) * block_n, kvh, :], V_s[slot(base, kb), :, :], barrier=v_full[slot(base, kb)])
            T.mbarrier_arrive(v_full[slot(base, kb)])

    @T.macro
    def consume(O, LSE, Q_s, K_s, V_s, O_s, acc_s, p, acc_o, m, m_prev, m_scaled, alpha, l, row_sum, lse_rows,
                q_full, q_phase, k_full, v_full, k_empty, v_empty, q_empty, q0, len_q, len_k, row0, by, n_blocks, warpgroup,
                base):
        C.init_softmax(m, m_scaled, l, acc_o)
        T.mbarrier_wait_parity(q_full, q_phase)
        if n_blocks > 0:
            T.mbarrier_wait_parity(k_full[slot(base, 0)], phase(base, 0))
            T.gemm(Q_s, K_s[slot(base, 0), :, :], acc_s, transpose_B=True, clear_accum=True, policy=T.GemmWarpPolicy.FullRow)
            T.mbarrier_arrive(k_empty[slot(base, 0)])
            mask_block(acc_s, 0, row0, len_q, len_k, causal, block_m, block_n)
            C.softmax_step(acc_s, m, m_prev, m_scaled, alpha, l, row_sum, scale_log2, block_m, block_n, exp2)
            T.copy(acc_s, p)
        # S_kb and then P_(kb-1) V_(kb-1) on the tensor cores; block kb's softmax overlaps the latter
        for kb in T.serial(1, T.max(n_blocks, 1)):
            T.mbarrier_wait_parity(k_full[slot(base, kb)], phase(base, kb))
            if pingpong:  # this warpgroup's turn: the one before it has issued its GEMMs
                T.sync_threads(TURN_BARRIER + warpgroup, 2 * C.WARPGROUP)
            T.wgmma_gemm(Q_s, K_s[slot(base, kb), :, :], acc_s, transpose_B=True, clear_accum=True, policy=T.GemmWarpPolicy.FullRow)
            T.mbarrier_wait_parity(v_full[slot(base, kb - 1)], phase(base, kb - 1))
            C.rescale_rows(acc_o, alpha, block_m, dim, lazy_rescale)
            T.wgmma_gemm(p, V_s[slot(base, kb - 1), :, :], acc_o, policy=T.GemmWarpPolicy.FullRow)
            if pingpong:  # the next warpgroup's turn
                T.named_barrier_arrive(TURN_BARRIER + (warpgroup + 1) % consumers, 2 * C.WARPGROUP)
            T.wait_wgmma(1)
            T.mbarrier_arrive(k_empty[slot(base, kb)])
            mask_block(acc_s, kb, row0, len_q, len_k, causal, block_m, block_n)
            C.softmax_step(acc_s, m, m_prev, m_scaled, alpha, l, row_sum, scale_log2, block_m, block_n, exp2)
            if pinned_softmax:
                C.order_point(l, block_m)
            T.wait_wgmma(0)
            T.mbarrier_arrive(v_empty[slot(base, kb - 1)])
            T.copy(acc_s, p)
        if own_o:  # the tile's last Q K^T is done: the producer may load the next tile's Q
            T.mbarrier_arrive(q_empty)
        if n_blocks > 0:
            T.mbarrier_wait_parity(v_full[slot(base, n_blocks - 1)], phase(base, n_blocks - 1))
            C.rescale_rows(acc_o, alpha, block_m, dim, lazy_rescale)
            T.gemm(p, V_s[slot(base, n_blocks - 1), :, :], acc_o, policy=T.GemmWarpPolicy.FullRow)
            T.mbarrier_arrive(v_empty[slot(base, n_blocks - 1)])
        C.finish_rows(acc_o, l, m_scaled, lse_rows, block_m, dim)
        if persistent:  # every consumer has read the previous tile's output from O_s
            T.sync_threads(1, consumer_threads)
        T.copy(acc_o, O_s)  # without own_o, O_s is Q_s: each warpgroup overwrites only its own rows, read by its own gemms
        T.sync_threads(1, consumer_threads)
        store_rows(O, LSE, O_s, lse_rows, q0, row0, len_q, by, block_m, dim)
        if persistent and not own_o:  # Q_s held the output: free once every consumer has stored it
            T.sync_threads(1, consumer_threads)
            T.mbarrier_arrive(q_empty)

    if not persistent:
        @T.prim_func
        def main(Q: T.Tensor((total_q, heads, dim), dtype), K: T.Tensor((total_k, kv_heads, dim), dtype),
                 V: T.Tensor((total_k, kv_heads, dim), dtype), cu_q: T.Tensor((n_offsets,), "int32"),
                 cu_k: T.Tensor((n_offsets,), "int32"), O: T.Tensor((total_q, heads, dim), dtype),
                 LSE: T.Tensor((heads, total_q), f32), q_tiles: T.int32):
            with T.Kernel(q_tiles, heads, n_offsets - 1, threads=consumer_threads + C.WARPGROUP,
                          prelude=prelude) as (bx, by, bz):
                (Q_s, K_s, V_s, acc_s, p, acc_o, m, m_prev, m_scaled, alpha, l, row_sum, lse_rows,
                 q_full, k_full, v_full, k_empty, v_empty) = shared_state()

                q0, len_q = sequence_rows(cu_q, bz, total_q)
                k0, len_k = sequence_rows(cu_k, bz, total_k)
                row0 = (q_tiles - 1 - bx if causal and heavy_first else bx) * block_m
                n_blocks = T.if_then_else(row0 < len_q, T.ceildiv(keys_seen(row0, block_m, len_q, len_k, causal), block_n), 0)
                kvh = by // (heads // kv_heads)
                tx = T.get_thread_binding()
                warpgroup = tx // C.WARPGROUP

                if tx >= consumer_threads:
                    T.set_max_nreg(producer_regs, 0)
                    produce(Q, K, V, Q_s, K_s, V_s, q_full, k_full, v_full, k_empty, v_empty, q0, k0, row0, by, kvh, n_blocks, None)
                else:
                    T.set_max_nreg(consumer_regs, 1)
                    if pingpong and warpgroup == consumers - 1:
                        T.named_barrier_arrive(TURN_BARRIER, 2 * C.WARPGROUP)  # warpgroup 0 goes first
                    consume(O, LSE, Q_s, K_s, V_s, Q_s, acc_s, p, acc_o, m, m_prev, m_scaled, alpha, l, row_sum, lse_rows,
                            q_full, 0, k_full, v_full, k_empty, v_empty, None, q0, len_q, len_k, row0, by, n_blocks, warpgroup, None)

        return main

    @T.prim_func
    def main_persistent(Q: T.Tensor((total_q, heads, dim), dtype), K: T.Tensor((total_k, kv_heads, dim), dtype),
                        V: T.Tensor((total_k, kv_heads, dim), dtype), cu_q: T.Tensor((n_offsets,), "int32"),
                        cu_k: T.Tensor((n_offsets,), "int32"), O: T.Tensor((total_q, heads, dim), dtype),
                        LSE: T.Tensor((heads, total_q), f32), q_tiles: T.int32, ctas: T.int32):
        with T.Kernel(ctas, threads=consumer_threads + C.WARPGROUP,
                      prelude=prelude) as bid:
            (Q_s, K_s, V_s, O_s, acc_s, p, acc_o, m, m_prev, m_scaled, alpha, l, row_sum, lse_rows,
             q_full, q_empty, k_full, v_full, k_empty, v_empty) = shared_state()
            tx = T.get_thread_binding()
            warpgroup = tx // C.WARPGROUP
            tiles = T.ceildiv(q_tiles * heads * (n_offsets - 1) - bid, ctas)  # this CTA's: bid, bid + ctas, ...
            if tx >= consumer_threads:
                T.set_max_nreg(producer_regs, 0)
                base = T.alloc_var("int32")  # the K/V blocks of this CTA's earlier tiles, mod 2 S
                base = 0
                for i in T.serial(tiles):
                    by, q0, len_q, k0, len_k, row0, n_blocks = tile(cu_q, cu_k, q_tiles, bid + i * ctas)
                    T.mbarrier_wait_parity(q_empty, (i & 1) ^ 1)
                    produce(Q, K, V, Q_s, K_s, V_s, q_full, k_full, v_full, k_empty, v_empty, q0, k0, row0, by,
                            by // (heads // kv_heads), n_blocks, base)
                    base = T.floormod(ring(base, n_blocks), 2 * S)  # slots and phases repeat every 2 S blocks
            else:
                T.set_max_nreg(consumer_regs, 1)
                base = T.alloc_var("int32")
                base = 0
                for i in T.serial(tiles):
                    by, q0, len_q, k0, len_k, row0, n_blocks = tile(cu_q, cu_k, q_tiles, bid + i * ctas)
                    consume(O, LSE, Q_s, K_s, V_s, O_s, acc_s, p, acc_o, m, m_prev, m_scaled, alpha, l, row_sum, lse_rows,
                            q_full, i & 1, k_full, v_full, k_empty, v_empty, q_empty, q0, len_q, len_k, row0, by, n_blocks,
                            warpgroup, base)
                    base = T.floormod(ring(base, n_blocks), 2 * S)  # slots and phases repeat every 2 S blocks

    return main_persistent


SCHEDULES = {"pipelined": dense_fwd_kernel, "overlap": overlap_kernel}
# "overlap"'s fastest options per head dim in `bench/attention_prefill.py --sweep` (H200): three
# consumers are 13-15% faster at d 64 (2026-12-02); at d 128 exp2 as one instruction is 6-7% faster
# with three stages (538 / 463 TFLOP/s against 505 / 436, b8 h32 s4096, 2026-12-05); ping-pong
# moves d 128 / 256 by <= 1%. The one-instruction exp2 also at d 64 (414 / 330 against 378 / 300,
# b8 h32) and d 256 (522 / 469 against 513 / 456, b4 h16; H100, `--sweep-forward`, 2026-12-05),
# each the same bits as exp2f on those random inputs. At d 256, 80 keys a block (FlashAttention-3's
# tile; 224 KB of shared memory) with the one-instruction exp2: 1.11x / 1.05x the 64-key block
# (592 / 505 against 535 / 481 TFLOP/s, b4 h16 s4096; H100, 2026-12-05 18:57, `--sweep-forward
# --dim 256`), bit for bit `dense_fwd.cu` with the same block (H100, 2026-12-05 18:54). The lazy
# rescale (same bits) at d 256: 636 / 514 against 622 / 500 (1.02x / 1.03x); at d 64 419 / 349 against
# 414 / 350, at d 128 526 / 480 against 526 / 479: within noise, not taken (H100, 2026-12-07 09:48,
# `--sweep-forward --only "=...|=..., lazy rescale"`); in the MLA decode kernel 0.96-0.97x, not taken
DEFAULT_OPTIONS = {64: {"consumers": 3, "fast_exp2": True}, 128: {"num_stages": 3, "fast_exp2": True},
                   256: {"block_n": 80, "fast_exp2": True, "lazy_rescale": True}}


def kernel_options(schedule: str, dim: int, options: dict | None) -> dict:
    """The options ``dense_attention`` builds ``schedule``'s kernel with: ``options``, or for
    None the "overlap" schedule's ``DEFAULT_OPTIONS`` at ``dim`` (none for "pipelined")."""
    return dict(DEFAULT_OPTIONS[dim] if options is None and schedule == "overlap" else options or {})


def tile_rows(schedule: str, options: dict) -> int:
    """Query rows of one CTA of ``schedule`` built with ``options`` (the grid's tile)."""
    return CONSUMER_ROWS * options.get("consumers", 2) if schedule == "overlap" else BLOCK_M


def _check(q, k, v, varlen: bool):
    nd = 3 if varlen else 4
    C.check_tensor("q", q, C.TORCH_DTYPES, nd)
    C.check_tensor("k", k, C.TORCH_DTYPES, nd)
    C.check_tensor("v", v, C.TORCH_DTYPES, nd)
    C.check_same_dtype(q=q, k=k, v=v)
    d = q.shape[-1]
    C.check_head_dim("q", d, SUPPORTED_DIMS)
    C.check_dim("k", k, -1, d, "the head dim of q")
    C.check_dim("v", v, -1, d, "the head dim of q")
    if tuple(v.shape) != tuple(k.shape):
        raise ValueError(f"v: expected the shape of k {tuple(k.shape)}, got {tuple(v.shape)}")
    C.check_heads(q.shape[-2], k.shape[-2])
    if not varlen:
        C.check_dim("k", k, 0, q.shape[0], "the batch of q")


def dense_attention(q, k, v, *, causal: bool = False, softmax_scale: float | None = None,
                    cu_seqlens_q=None, cu_seqlens_k=None, out=None, schedule: str = "overlap",
                    options: dict | None = None):
    """Attention forward: returns ``(o, lse)``.

    Fixed length: ``q [b, s_q, h, d]``, ``k, v [b, s_k, hk, d]`` -> ``o [b, s_q, h, d]``,
    ``lse [b, h, s_q]`` (fp32, natural log; a strided view). Varlen: ``q [total_q, h, d]``,
    ``k, v [total_k, hk, d]`` and int32 ``cu_seqlens_q``, ``cu_seqlens_k`` [batch + 1] ->
    ``o [total_q, h, d]``, ``lse [h, total_q]``. ``softmax_scale`` defaults to ``1 / sqrt(d)``.
    ``out=(o, lse)`` writes into given buffers: ``o`` of q's shape and dtype, ``lse`` fp32
    ``[h, total_q]`` (both forms); the returned tensors are then views of them. ``schedule``
    picks the kernel: "overlap" (hand-scheduled softmax / tensor-core overlap, 1.2-1.6x faster) or
    "pipelined" (TileLang's warp specialization); both give the same bits for the same
    ``fast_exp2``. ``options``: keyword arguments of that kernel beyond the problem's
    (``num_stages``, ``fast_exp2``; "overlap" also ``consumers``, ``pingpong``, ``block_n``), the
    candidates ``bench/attention_prefill.py --sweep`` times; same bits for every choice but
    ``fast_exp2`` and ``block_n`` (default: ``kernel_options``).
    """
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule: expected one of {sorted(SCHEDULES)}, got {schedule!r}")
    varlen = cu_seqlens_q is not None or cu_seqlens_k is not None
    if varlen and (cu_seqlens_q is None or cu_seqlens_k is None):
        raise ValueError("cu_seqlens_q, cu_seqlens_k: expected both or neither")
    _check(q, k, v, varlen)
    d = q.shape[-1]
    options = kernel_options(schedule, d, options)
    scale = 1.0 / math.sqrt(d) if softmax_scale is None else float(softmax_scale)
    if not math.isfinite(scale) or scale <= 0:
        raise ValueError(f"softmax_scale: expected a positive finite number, got {softmax_scale}")
    if varlen:
        host_q = C.check_cu_seqlens("cu_seqlens_q", cu_seqlens_q, q.shape[0])
        host_k = C.check_cu_seqlens("cu_seqlens_k", cu_seqlens_k, k.shape[0])
        if host_q.numel() != host_k.numel():
            raise ValueError(f"cu_seqlens_k: expected {host_q.numel()} offsets (as cu_seqlens_q), got {host_k.numel()}")
        max_q = int((host_q[1:] - host_q[:-1]).max())
        qp, kp, vp, cu_q, cu_k = q, k, v, cu_seqlens_q, cu_seqlens_k
    else:
        b, s_q, h, _ = q.shape
        s_k = k.shape[1]
        max_q = s_q
        qp, kp, vp = q.view(b * s_q, h, d), k.view(b * s_k, k.shape[2], d), v.view(b * s_k, k.shape[2], d)
        cu_q, cu_k = uniform_offsets(b, s_q, q.device), uniform_offsets(b, s_k, q.device)
    C.check_cuda(q=q, k=k, v=v, cu_q=cu_q, cu_k=cu_k)
    h = qp.shape[1]
    kernel = SCHEDULES[schedule](d, bool(causal), scale * C.LOG2E, C.TORCH_DTYPES[q.dtype], **options)
    if out is None:
        o, lse = torch.empty_like(qp), torch.empty((h, qp.shape[0]), dtype=torch.float32, device=q.device)
    else:
        o, lse = out
        C.check_tensor("out[0]", o, (q.dtype,), q.dim())
        if tuple(o.shape) != tuple(q.shape):
            raise ValueError(f"out[0]: expected shape {tuple(q.shape)}, got {tuple(o.shape)}")
        C.check_tensor("out[1]", lse, (torch.float32,), 2)
        if tuple(lse.shape) != (h, qp.shape[0]):
            raise ValueError(f"out[1]: expected shape {(h, qp.shape[0])}, got {tuple(lse.shape)}")
        o = o.view(qp.shape)
    if qp.shape[0] and cu_q.numel() > 1:
        q_tiles = max(1, -(-max_q // tile_rows(schedule, options)))
        if options.get("persistent"):
            tiles = q_tiles * h * (cu_q.numel() - 1)
            kernel(qp, kp, vp, cu_q, cu_k, o, lse, q_tiles, min(tiles, sm_count(q.device.index)))
        else:
            kernel(qp, kp, vp, cu_q, cu_k, o, lse, q_tiles)
    if varlen:
        return o, lse
    return o.view(q.shape), lse.view(h, q.shape[0], q.shape[1]).permute(1, 0, 2)
