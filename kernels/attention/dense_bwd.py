"""Dense attention backward (dQ, dK, dV) for training, deterministic, on sm_90a.

Takes the forward's inputs, its output ``o``, its log-sum-exp ``lse`` and the output gradient
``do`` (layouts and causal rule of ``dense_fwd.py``, fixed-length or varlen, MHA / GQA / MQA)
and returns the input gradients. Three kernels, none with atomics:

1. ``delta[h, t] = sum_d o * do`` in fp32 (d ascending, per thread, then TileLang's reduction);
2. dK, dV: one CTA per (key tile, kv head, sequence) loops over the query heads of its group
   in ascending order and, for each, over query blocks in ascending order (one flat loop),
   accumulating ``dV += P^T dO`` and ``dK += dS^T Q`` in registers (wgmma, m64nDk16, one
   consumer warpgroup per 64 keys). At d = 256 the two fp32 accumulators (256 registers a
   thread) do not fit one warpgroup, so dV and dK run as two kernels of the same loop, the
   second recomputing ``P`` (one more GEMM);
3. dQ: one CTA per (query tile, head, sequence), one consumer warpgroup per 64 queries, loops
   over key blocks in ascending order, recomputing ``P`` and ``dP`` and accumulating ``dQ += dS K``.

or, with ``FUSED_TILES`` (d 64 / 128; a candidate, timed on the H200 2026-12-05: +4% non-causal, -4%
causal at d 128, so not the default), 2 and 3 in one kernel
(``bwd_fused_kernel``: dQ's per-key-tile shares added to fp32 sums in a fixed order, one tile at a
time, by bulk reductions behind GPU-scope counters, so no recomputation and no atomics) and a
kernel that adds its two chains and scales (``bwd_dq_sum_kernel``);

with ``P = exp2(fma(q.k, scale * log2 e, -lse * log2 e))`` (0 where masked) and
``dS = P * (dP - delta)`` rounded to the input dtype. Every gradient element is summed by one
thread in a fixed order, so the same inputs give the same bits on every run (dQ recomputes
``P``: two more GEMMs than an atomic dQ, the price of determinism). Head dims 64, 128 and 256.

Tiles (``BwdTiles``): each gradient element is one chain of k16 wgmma steps over the queries
(dK, dV) or keys (dQ) in ascending order, whatever the block sizes, so the tiles change the
speed, not the order of any sum. One warpgroup of 64 rows per CTA (the first version, kept at
d = 256) leaves the SM with a single warpgroup whose GEMMs are each waited for before the
elementwise work (240 registers x 256 threads: one CTA per SM), so the tensor cores idle during
every exp2 / dS step; two warpgroups per CTA (128 keys, or 128 queries) let one warpgroup's
GEMMs run while the other does its elementwise work, at the same registers per thread. The
default at d 64 / 128 (``WIDE_DQ_TILES``) also steps dQ over 128 keys at a time.

``tlx check``: every access of the three kernels is proven in bounds (offsets clamped as in
``dense_fwd.py``; ``delta`` under the launcher-checked ``TQ <= 2147483584``), and determinism
is "deterministic" for all three. dQ's batch invariance is "unknown": its loop extent ``n_kb``
depends on ``TQ`` / ``TK`` only through the clamp of the offsets read from ``cu_q`` / ``cu_k``
into ``[0, TQ]`` / ``[0, TK]`` (a dependence on data, a no-op for the offsets that
``check_cu_seqlens`` accepts). dK / dV is reported not batch-invariant because its extent
``groups * n_qb`` also depends on ``HK`` (through ``groups = H / HK``): the analysis treats every
shape variable as one that may vary with the batch, and cannot know that ``HK``, the model's
KV head count, does not. So each gradient element's sum runs over its own sequence's blocks
whatever else is in the batch.
"""

import math
from typing import NamedTuple

import torch
import tilelang.language as T

import tlx

from kernels.attention import common as C
from kernels.attention.dense_fwd import _check, sequence_rows, uniform_offsets
from kernels.moe.mega import sysflags

SUPPORTED_DIMS = (64, 128, 256)
SPLIT_DIMS = (256,)  # head dims whose dK and dV run as two kernels (registers)
BLOCK_SIZES = (64, 128)  # rows of a tile: one consumer warpgroup per 64


class BwdTiles(NamedTuple):
    """Block sizes of the backward: ``dkdv_keys`` key rows per dK/dV CTA, ``dkdv_queries``
    queries per step of its loop, ``dq_queries`` query rows per dQ CTA, ``dq_keys`` keys per
    step of its loop (each 64 or 128; a CTA has one consumer warpgroup per 64 rows). ``split``:
    dK and dV in two kernels (each recomputes S; dK also dP) also where the head dim does not
    need it (``SPLIT_DIMS``): at d 128 the fused kernel with 128 keys needs more registers than a
    thread has, and ptxas serializes its wgmma (``reports["ptxas"]``), the split ones it does not
    (yet the fused one is faster: ``SPLIT_WIDE_DQ_TILES``)."""

    dkdv_keys: int
    dkdv_queries: int
    dq_queries: int
    dq_keys: int
    split: bool = False
    fused: bool = False  # dQ summed by the dK/dV kernel in a fixed order (``bwd_fused_kernel``)
    fast_exp2: bool = False  # with ``fused``: P's exp2 as one instruction (``C.exp2_ftz``)


# one warpgroup per CTA: the only tiles d = 256's registers allow
SINGLE_WARPGROUP_TILES = BwdTiles(64, 64, 64, 64)
# two consumer warpgroups per dK/dV and dQ CTA (same registers per thread, see the docstring)
TWO_WARPGROUP_TILES = BwdTiles(128, 64, 128, 64)
# the fastest at d 64 and 128 in `bench/attention_prefill.py --sweep` (2026-12-02, H200): 1.6-1.8x
# the single-warpgroup tiles; two dK/dV warpgroups, and dQ over 128 keys a step
WIDE_DQ_TILES = BwdTiles(128, 64, 128, 128)
# the same with dK and dV in two kernels: not serialized by ptxas at d 128, but slower than the
# default at d 64 and 128 (0.70-0.84x, --sweep-backward 2026-12-04: the serialization costs less
# than recomputing S)
SPLIT_WIDE_DQ_TILES = BwdTiles(128, 64, 128, 128, split=True)
# (dQ summed inside the dK/dV kernel in ascending key-tile order behind per-query-block counters,
# no atomics, lost on an H200 in both forms tried, b8 h32 s4096 d128 non-causal / causal: 52 / 28
# TFLOP/s with every thread synchronising at system scope, 85 / 44 with one thread at GPU scope,
# against the default's 306 / 281; see bench/RESULTS.md, 2026-12-04. dQ stays the recomputing
# kernel below.)
# dK, dV and dQ in one kernel (``bwd_fused_kernel``: 128 keys a CTA, 64 queries a step, dQ's
# shares added in a fixed order, no recomputation): five GEMMs a step instead of seven. A sweep
# candidate at d 64 / 128, timed on the H200 on 2026-12-05 and not the default (the dq_* sizes
# are unused).
FUSED_TILES = BwdTiles(128, 64, 64, 128, fused=True)
# the same with P's exp2 as ex2.approx.ftz (other bits than exp2f's only below 2^-126)
FUSED_FAST_EXP2_TILES = FUSED_TILES._replace(fast_exp2=True)
DEFAULT_TILES = {64: WIDE_DQ_TILES, 128: WIDE_DQ_TILES, 256: SINGLE_WARPGROUP_TILES}


def check_block(name: str, rows: int) -> None:
    if rows not in BLOCK_SIZES:
        raise ValueError(f"{name}: expected a block size in {BLOCK_SIZES}, got {rows}")


# setmaxnreg of the dK/dV kernel with two consumer warpgroups. Its producer does the loop's lse /
# delta loads (thread copies), so TileLang gives it as many threads as the consumers (512 in all)
# and, for a producer with thread copies, reallocates no registers: ptxas then caps every thread
# at 65536 / 512 = 128 and the consumers' 128 accumulator + 64 score registers spill (2160 bytes
# at d 128). Explicit: 256 x 24 + 256 x 232 = 65536, the whole register file (d 128, ptxas 13.0:
# 20 bytes spilled at 24 / 232, 48 at 32 / 224, 52 at 24 / 224).
DKDV_PRODUCER_REGS, DKDV_CONSUMER_REGS = 24, 232

total_q = T.dynamic("TQ")
total_k = T.dynamic("TK")
n_offsets = T.dynamic("NB")
heads = T.dynamic("H")
kv_heads = T.dynamic("HK")
query_blocks = T.dynamic("QB")  # the fused kernel's counters per (head, sequence)


@tlx.jit(target=C.TARGET)
def bwd_delta_kernel(dim: int, dtype: str = "bfloat16"):
    """``Delta [H, TQ] = rowsum(O * dO)`` in fp32 (O, dO [TQ, H, D])."""
    C.check_head_dim("dim", dim, SUPPORTED_DIMS)
    rows = 64

    @T.prim_func
    def main(O: T.Tensor((total_q, heads, dim), dtype), dO: T.Tensor((total_q, heads, dim), dtype),
             Delta: T.Tensor((heads, total_q), "float32")):
        with T.Kernel(T.ceildiv(total_q, rows), heads, threads=128) as (bx, by):
            prod = T.alloc_fragment((rows, dim), "float32")
            delta = T.alloc_fragment((rows,), "float32")
            for i, j in T.Parallel(rows, dim):
                r = bx * rows + i
                prod[i, j] = T.if_then_else(r < total_q, T.Cast("float32", O[T.min(r, total_q - 1), by, j]) * T.Cast("float32", dO[T.min(r, total_q - 1), by, j]), T.float32(0))
            T.reduce_sum(prod, delta, dim=1)
            for i in T.Parallel(rows):
                if bx * rows + i < total_q:
                    Delta[by, bx * rows + i] = delta[i]

    return main


def _valid(causal, row, col, len_q, len_k):
    """Query ``row`` sees key ``col`` (bottom-right causal alignment)."""
    if causal:
        return T.And(T.And(row < len_q, col < len_k), col <= row + len_k - len_q)
    return T.And(row < len_q, col < len_k)


DKDV_ASSUMPTIONS = ["2 <= NB", "1 <= HK", "HK <= H", "H % HK == 0", "1 <= k_tiles", "k_tiles * 64 <= TK + 63",
                    "TQ <= 1073741568", "TK <= 1073741568", "H * TQ <= 33554431", "HK * TK <= 33554431"]


@tlx.jit(target=C.TARGET, assume=DKDV_ASSUMPTIONS)
def bwd_dkdv_kernel(dim: int, causal: bool, scale_log2: float, softmax_scale: float, dtype: str = "bfloat16",
                    grads: str = "dkdv", block_keys: int = 64, block_queries: int = 64):
    """dK, dV [TK, HK, D] (grid: k_tiles x HK x (NB - 1), k_tiles >= ceil(max len_k / block_keys));
    ``block_keys`` rows per CTA (one consumer warpgroup per 64), ``block_queries`` per loop step;
    ``H * TQ, HK * TK <= 33554431`` hold as q and k have at most 2^31 - 1 elements (``check_tensor``)
    and d >= 64: the steps of the flat loop (heads x query blocks) stay within int32 and the
    int64 offsets of every row provably in range.
    ``grads`` names what it writes: "dkdv" both, "dv" or "dk" one of them (the d = 256 split;
    the other output is not touched)."""
    C.check_head_dim("dim", dim, SUPPORTED_DIMS)
    if grads not in ("dkdv", "dk", "dv"):
        raise ValueError(f"grads: expected 'dkdv', 'dk' or 'dv', got {grads!r}")
    check_block("block_keys", block_keys)
    check_block("block_queries", block_queries)
    with_dk, with_dv = grads != "dv", grads != "dk"
    bm, bn = block_queries, block_keys
    f32 = "float32"

    @T.prim_func
    def main(Q: T.Tensor((total_q, heads, dim), dtype), K: T.Tensor((total_k, kv_heads, dim), dtype),
             V: T.Tensor((total_k, kv_heads, dim), dtype), dO: T.Tensor((total_q, heads, dim), dtype),
             LSE: T.Tensor((heads, total_q), f32), Delta: T.Tensor((heads, total_q), f32),
             cu_q: T.Tensor((n_offsets,), "int32"), cu_k: T.Tensor((n_offsets,), "int32"),
             dK: T.Tensor((total_k, kv_heads, dim), dtype), dV: T.Tensor((total_k, kv_heads, dim), dtype),
             k_tiles: T.int32):
        with T.Kernel(k_tiles, kv_heads, n_offsets - 1, threads=2 * bn) as (bx, by, bz):
            K_s = T.alloc_shared((bn, dim), dtype)
            V_s = T.alloc_shared((bn, dim), dtype)
            Q_s = T.alloc_shared((bm, dim), dtype)
            dO_s = T.alloc_shared((bm, dim), dtype)
            lse_s = T.alloc_shared((bm,), f32)
            delta_s = T.alloc_shared((bm,), f32)
            out_s = T.alloc_shared((bn, dim), dtype)
            s_t = T.alloc_fragment((bn, bm), f32)
            dp_t = T.alloc_fragment((bn, bm), f32)
            p_t = T.alloc_fragment((bn, bm), dtype)
            ds_t = T.alloc_fragment((bn, bm), dtype)
            dv = T.alloc_fragment((bn, dim), f32)
            dk = T.alloc_fragment((bn, dim), f32)
            if bn > 64:
                T.annotate_producer_reg_dealloc(DKDV_PRODUCER_REGS)
                T.annotate_consumer_reg_alloc(DKDV_CONSUMER_REGS)

            q0, len_q = sequence_rows(cu_q, bz, total_q)
            k0, len_k = sequence_rows(cu_k, bz, total_k)
            col0 = bx * bn
            groups = heads // kv_heads
            # causal: the first query block with a row that sees this tile's first key
            first = T.max(col0 - (len_k - len_q), 0) // bm if causal else 0
            n_qb = T.if_then_else(col0 < len_k, T.max(T.ceildiv(len_q, bm) - first, 0), 0)  # query blocks per head

            # loaded only when waited for (TileLang waits inside the loop): a TMA load still in flight
            # at the epilogue would land on out_s, which shares K_s's memory
            if n_qb > 0:
                T.copy(K[k0 + col0:k0 + col0 + bn, by, :], K_s)
                if with_dk:
                    T.copy(V[k0 + col0:k0 + col0 + bn, by, :], V_s)
            if with_dv:
                T.fill(dv, 0)
            if with_dk:
                T.fill(dk, 0)
            # one flat loop over (head of the group, query block): TileLang's warp specialization
            # re-runs the consumer's code ahead of an inner pipelined loop (the zero fill of dK, dV)
            # on every iteration of an outer loop, which kept only the group's last head
            for step in T.Pipelined(groups * n_qb, num_stages=2):
                hq = by * groups + step // T.max(n_qb, 1)
                qb = first + step % T.max(n_qb, 1)
                # TileLang's producer writes lse_s and delta_s (plain loads, not TMA) once the first
                # TMA copy's stage is released, and the consumer releases that stage after its last
                # use of that copy's buffer, whatever it still reads from lse_s: the first copy must
                # feed the last GEMM (Q_s for dK, dO_s for dV alone), or the producer overwrites
                # lse_s two steps ahead while P is still computed from it (d 256 dV: wrong, racy)
                if with_dk:
                    T.copy(Q[q0 + qb * bm:q0 + (qb + 1) * bm, hq, :], Q_s)
                T.copy(dO[q0 + qb * bm:q0 + (qb + 1) * bm, hq, :], dO_s)
                if not with_dk:
                    T.copy(Q[q0 + qb * bm:q0 + (qb + 1) * bm, hq, :], Q_s)
                for j in T.Parallel(bm):
                    r = T.min(q0 + qb * bm + j, total_q - 1)
                    lse_s[j] = T.ieee_mul(LSE[hq, r], T.float32(C.LOG2E))
                    if with_dk:
                        delta_s[j] = Delta[hq, r]
                T.gemm(K_s, Q_s, s_t, transpose_B=True, clear_accum=True, policy=T.GemmWarpPolicy.FullRow)
                if with_dk:
                    T.gemm(V_s, dO_s, dp_t, transpose_B=True, clear_accum=True, policy=T.GemmWarpPolicy.FullRow)
                for i, j in T.Parallel(bn, bm):
                    s_t[i, j] = T.if_then_else(_valid(causal, qb * bm + j, col0 + i, len_q, len_k),
                                               T.exp2(T.ieee_fmaf(s_t[i, j], T.float32(scale_log2), -lse_s[j])), T.float32(0))
                if with_dv:
                    T.copy(s_t, p_t)
                    T.gemm(p_t, dO_s, dv, policy=T.GemmWarpPolicy.FullRow)
                if with_dk:
                    for i, j in T.Parallel(bn, bm):
                        ds_t[i, j] = s_t[i, j] * (dp_t[i, j] - delta_s[j])
                    T.gemm(ds_t, Q_s, dk, policy=T.GemmWarpPolicy.FullRow)
            if with_dk:
                for i, j in T.Parallel(bn, dim):
                    dk[i, j] = dk[i, j] * T.float32(softmax_scale)
                T.copy(dk, out_s)
                for i, j in T.Parallel(bn, dim):
                    if col0 + i < len_k:
                        dK[k0 + col0 + i, by, j] = out_s[i, j]
            if with_dv:
                T.copy(dv, out_s)
                for i, j in T.Parallel(bn, dim):
                    if col0 + i < len_k:
                        dV[k0 + col0 + i, by, j] = out_s[i, j]

    return main


@tlx.jit(target=C.TARGET, assume=["2 <= NB", "1 <= HK", "HK <= H", "H % HK == 0", "1 <= q_tiles", "q_tiles * 64 <= TQ + 63",
                                   "TQ <= 1073741568", "TK <= 1073741568", "H * TQ <= 33554431", "HK * TK <= 33554431"])
def bwd_dq_kernel(dim: int, causal: bool, scale_log2: float, softmax_scale: float, dtype: str = "bfloat16",
                  block_queries: int = 64, block_keys: int = 64):
    """dQ [TQ, H, D] (grid: q_tiles x H x (NB - 1), q_tiles >= ceil(max len_q / block_queries));
    ``block_queries`` rows per CTA (one consumer warpgroup per 64), ``block_keys`` per loop step."""
    C.check_head_dim("dim", dim, SUPPORTED_DIMS)
    check_block("block_queries", block_queries)
    check_block("block_keys", block_keys)
    bm, bn = block_queries, block_keys
    f32 = "float32"

    @T.prim_func
    def main(Q: T.Tensor((total_q, heads, dim), dtype), K: T.Tensor((total_k, kv_heads, dim), dtype),
             V: T.Tensor((total_k, kv_heads, dim), dtype), dO: T.Tensor((total_q, heads, dim), dtype),
             LSE: T.Tensor((heads, total_q), f32), Delta: T.Tensor((heads, total_q), f32),
             cu_q: T.Tensor((n_offsets,), "int32"), cu_k: T.Tensor((n_offsets,), "int32"),
             dQ: T.Tensor((total_q, heads, dim), dtype), q_tiles: T.int32):
        with T.Kernel(q_tiles, heads, n_offsets - 1, threads=2 * bm) as (bx, by, bz):
            Q_s = T.alloc_shared((bm, dim), dtype)
            dO_s = T.alloc_shared((bm, dim), dtype)
            K_s = T.alloc_shared((bn, dim), dtype)
            V_s = T.alloc_shared((bn, dim), dtype)
            out_s = T.alloc_shared((bm, dim), dtype)
            s = T.alloc_fragment((bm, bn), f32)
            dp = T.alloc_fragment((bm, bn), f32)
            ds = T.alloc_fragment((bm, bn), dtype)
            dq = T.alloc_fragment((bm, dim), f32)
            lse_r = T.alloc_fragment((bm,), f32)
            delta_r = T.alloc_fragment((bm,), f32)

            q0, len_q = sequence_rows(cu_q, bz, total_q)
            k0, len_k = sequence_rows(cu_k, bz, total_k)
            row0 = bx * bm
            kvh = by // (heads // kv_heads)
            seen = T.min(len_k, row0 + bm + len_k - len_q) if causal else len_k
            n_kb = T.if_then_else(row0 < len_q, T.ceildiv(T.max(seen, 0), bn), 0)

            T.copy(Q[q0 + row0:q0 + row0 + bm, by, :], Q_s)
            T.copy(dO[q0 + row0:q0 + row0 + bm, by, :], dO_s)
            for i in T.Parallel(bm):
                r = T.min(q0 + row0 + i, total_q - 1)
                lse_r[i] = T.ieee_mul(LSE[by, r], T.float32(C.LOG2E))
                delta_r[i] = Delta[by, r]
            T.fill(dq, 0)
            for kb in T.Pipelined(n_kb, num_stages=2):
                T.copy(K[k0 + kb * bn:k0 + (kb + 1) * bn, kvh, :], K_s)
                T.copy(V[k0 + kb * bn:k0 + (kb + 1) * bn, kvh, :], V_s)
                T.gemm(Q_s, K_s, s, transpose_B=True, clear_accum=True, policy=T.GemmWarpPolicy.FullRow)
                T.gemm(dO_s, V_s, dp, transpose_B=True, clear_accum=True, policy=T.GemmWarpPolicy.FullRow)
                for i, j in T.Parallel(bm, bn):
                    p = T.if_then_else(_valid(causal, row0 + i, kb * bn + j, len_q, len_k),
                                       T.exp2(T.ieee_fmaf(s[i, j], T.float32(scale_log2), -lse_r[i])), T.float32(0))
                    ds[i, j] = p * (dp[i, j] - delta_r[i])
                T.gemm(ds, K_s, dq, policy=T.GemmWarpPolicy.FullRow)
            for i, j in T.Parallel(bm, dim):
                dq[i, j] = dq[i, j] * T.float32(softmax_scale)
            T.copy(dq, out_s)
            for i, j in T.Parallel(bm, dim):
                if row0 + i < len_q:
                    dQ[q0 + row0 + i, by, j] = out_s[i, j]

    return main


# The fused kernel's dQ hand-off (``bwd_fused_kernel``), GPU scope: one warp waits until the query
# block's counter has reached the tile's rank (acquire), adds the block's rows from shared memory
# by bulk asynchronous reductions (``cp.reduce.async.bulk .add.f32``: the TMA unit adds at L2), frees
# the shared slot once they have read it, then waits for them to complete and releases the counter
# (``tlx_dq_release``). Only one tile adds to a block at a time, in the order of the ranks, so each
# fp32 sum has one order. A wait that has not arrived after
# ``ORDERED_DQ_TIMEOUT_NS`` traps (a launch error, never a hang); see ``bwd_fused_kernel`` for why
# it cannot happen.
ORDERED_DQ_TIMEOUT_NS = 10_000_000_000
ORDERED_DQ_PRELUDE = sysflags.PRELUDE + r"""
#ifndef TLX_ORDERED_DQ_PRELUDE_
#define TLX_ORDERED_DQ_PRELUDE_
// dst[dst_offset + r * dst_stride + c] += src[src_offset + r * src_stride + c] for r < rows,
// c < row_floats, once counts[index] >= rank; returns once src has been read (the slot is free).
// All 32 lanes of a warp; tlx_dq_release then publishes the sums.
__device__ __forceinline__ void tlx_dq_add_in_order(float* dst, long long dst_offset, long long dst_stride,
                                                    const float* src, int src_offset, int src_stride, int rows,
                                                    int row_floats, int* counts, long long index, int rank,
                                                    long long timeout_ns) {
  int lane = threadIdx.x & 31;
  if (lane == 0) {
    unsigned long long start = tlx_globaltimer_ns();
    while (true) {
      int value;
      asm volatile("ld.acquire.gpu.global.b32 %0, [%1];" : "=r"(value) : "l"(counts + index) : "memory");
      if (value >= rank) break;
      if ((long long)(tlx_globaltimer_ns() - start) > timeout_ns) asm volatile("trap;");
      __nanosleep(32);  // leave the issue slots of its SM sub-partition to the consumers' warps
    }
  }
  __syncwarp();
  asm volatile("fence.proxy.async.global;" ::: "memory");
  unsigned base = (unsigned)__cvta_generic_to_shared(src + src_offset);
  for (int r = lane; r < rows; r += 32) {
    asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;"
                 :: "l"(dst + dst_offset + r * dst_stride), "r"(base + 4u * (unsigned)(r * src_stride)),
                    "r"(4 * row_floats) : "memory");
  }
  asm volatile("cp.async.bulk.commit_group;" ::: "memory");
  asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");
  __syncwarp();
}
// counts[index] += 1 once this warp's reductions have completed (release, GPU scope).
__device__ __forceinline__ void tlx_dq_release(int* counts, long long index) {
  asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
  asm volatile("fence.proxy.async.global;" ::: "memory");
  __syncwarp();
  if ((threadIdx.x & 31) == 0) asm volatile("red.release.gpu.global.add.s32 [%0], 1;" :: "l"(counts + index) : "memory");
}
#endif
"""
FUSED_DIMS = (64, 128)  # d 256's dK and dV accumulators alone fill a thread's registers
FUSED_STAGES = 2  # query blocks in flight (Q, dO, lse, delta)
# setmaxnreg of the load / dQ warpgroup and of each consumer: 128 x 24 + 256 x 240 = 384 x 168,
# the registers at launch
FUSED_REGS = (24, 240)
DQ_PAD = 8  # floats after each row of dq_s: rows 8 banks apart, so a warp's stores take 2 wavefronts
DS_FREE, DS_FULL = C.NAMED_BARRIER, C.NAMED_BARRIER + 1  # the consumers' barriers around ds_s


def fused_schedule(causal: bool, tile, len_q, len_k, bm: int, bn: int):
    """(query blocks a head, first block, key tiles) of key tile ``tile`` of a sequence.

    Causal: blocks ``first .. nq - 1`` in ascending order (``first``: the block of the first query
    row that sees the tile's first key). Not causal: all ``nq`` blocks, ascending from ``first =
    tile * nq // nk`` and wrapping to 0, so that the ``nk`` tiles start spread over the blocks
    and no two of them need one block at once (see ``fused_rank``)."""
    nq, nk = T.ceildiv(len_q, bm), T.ceildiv(len_k, bn)
    if causal:
        first = T.max(tile * bn - (len_k - len_q), 0) // bm
        count = T.max(nq - first, 0)
        first = T.Cast("int64", first)
    else:
        first = T.Cast("int64", tile) * T.Cast("int64", nq) // T.Cast("int64", T.max(nk, 1))
        count = nq
    return T.if_then_else(tile * bn < len_k, count, 0), first, nk


def fused_step(causal: bool, t, per_head, first, len_q, by, groups, bm: int):
    """(query head, query block, chain) of step ``t`` of a tile's walk (``fused_schedule``): the
    heads of the kv head's group one after another, each over its blocks; chain 1 for a block a
    not-causal walk reaches after wrapping, else 0."""
    hq = T.min(by * groups + t // T.max(per_head, 1), by * groups + groups - 1)
    nq = T.ceildiv(len_q, bm)
    # the clamp into [0, nq) is a no-op for the steps of a walk; it lets the bounds proofs avoid
    # the walk's division and modulo
    u = first + T.Cast("int64", t % T.max(per_head, 1))
    wraps = u >= T.Cast("int64", nq)
    qb = u if causal else T.if_then_else(wraps, u - T.Cast("int64", nq), u)
    qb = T.Cast("int32", T.min(T.max(qb, T.int64(0)), T.Cast("int64", T.max(nq - 1, 0))))
    return hq, qb, (0 if causal else T.if_then_else(wraps, 1, 0))


def fused_rank(causal: bool, tile, qb, chain, len_q, len_k, nk, bm: int, bn: int):
    """The rank of tile ``tile`` among the tiles that add to query block ``qb`` in one order (its
    ``chain``, from ``fused_step``).

    A chain's tiles add in descending tile order: in chain 0 they are the tiles ``0 .. a`` whose
    walk starts at or before ``qb`` (``a``: the last of them), ranked ``a - tile``; in chain 1 the
    tiles ``a + 1 .. nk - 1``, ranked ``nk - 1 - tile``. Tile ``j + 1`` reaches ``qb`` no later in
    its walk than tile ``j`` (its walk starts no earlier), so the tile before in the order has
    usually added by the time a tile gets there."""
    if causal:
        last = (T.Cast("int64", qb + 1) * bm + T.Cast("int64", len_k) - T.Cast("int64", len_q) - 1) // bn
    else:
        nq = T.ceildiv(len_q, bm)
        last = (T.Cast("int64", qb + 1) * T.Cast("int64", nk) - 1) // T.Cast("int64", T.max(nq, 1))
    a = T.Cast("int32", T.min(last, T.Cast("int64", nk - 1)))
    return a - tile if causal else T.if_then_else(chain == 1, nk - 1 - tile, a - tile)


def fused_counter(chain, hq, bz, qb):
    """The element of ``Counts [chains, H, NB - 1, QB]`` that orders query block ``qb`` of head
    ``hq`` of sequence ``bz`` in ``chain`` (int64; ``qb < QB`` for the QB the wrapper passes, the
    clamp lets ``tlx check`` prove it)."""
    return ((T.Cast("int64", chain) * heads + hq) * (n_offsets - 1) + bz) * query_blocks + T.min(qb, query_blocks - 1)


@tlx.jit(target=C.TARGET, assume=DKDV_ASSUMPTIONS,
         pass_configs={"tl.disable_warp_specialized": True, "tl.disable_thread_storage_sync": True})
def bwd_fused_kernel(dim: int, causal: bool, scale_log2: float, softmax_scale: float, dtype: str = "bfloat16",
                     fast_exp2: bool = False):
    """dK, dV [TK, HK, D] and the fp32 sums of dQ, ``DQacc [chains, TQ, H, D]`` (unscaled; zeros
    before the launch; chains = 1 causal, 2 not), from one pass: grid ``k_tiles x HK x (NB - 1)``,
    128 keys a CTA (two consumer warpgroups of 64), 64 queries a step, ``k_tiles >= ceil(max len_k
    / 128)``; ``Counts [chains, H, NB - 1, QB]`` int32 zeros, ``QB >= ceil(max len_q / 64)``.

    A step (one query block of one head of the group) computes ``S``, ``dP`` (wgmma, keys on M),
    ``P``, ``dS`` as ``bwd_dkdv_kernel`` does, ``dV += P dO`` and ``dK += dS Q`` from registers,
    and ``dQ_tile = dS^T K`` (m64n{d/2}k16 per warpgroup, keys ascending, from ``dS`` through shared
    memory): five GEMMs where the two-kernel backward has seven. A TMA warp loads K, V once and
    Q, dO, lse, delta per step (two stages); the consumers put ``dQ_tile`` in shared memory
    (two slots) and a dQ warp adds it to ``DQacc[chain]`` in the order of ``fused_rank``
    (``ORDERED_DQ_PRELUDE``), so every dQ element is the sum of its tiles' shares in a fixed
    order: deterministic, and a function of the sequence's own lengths (batch-invariant).
    The wrapper then adds the chains and scales (``bwd_dq_sum_kernel``). The schedule
    (``fused_schedule``) differs from ``bwd_dkdv_kernel``'s for a not-causal tile (its blocks
    start at ``first``, not 0), so dK / dV are other sums there; causal, they are its bits.

    Progress: tile ``j`` waits only on tile ``j + 1`` of its (kv head, sequence), which has the
    lower block index (``tile = k_tiles - 1 - bx``) and so starts no later, and which reaches
    every block no later in its walk than ``j``; tile ``nk - 1`` waits on nobody. No wait edge
    goes to a later block of a later step, so the waits cannot form a cycle, and no CTA waits on
    one that has not started. (Not causal, one chain per block, ordered across the wrap, would
    make tile ``nk - 1`` wait on tile 0, which may not have started when the sequence has more
    tiles than fit on the GPU at once: hence two chains.)

    ``fast_exp2``: P's exp2 as one instruction (``C.exp2_ftz``; other bits only where P < 2^-126)."""
    C.check_head_dim("dim", dim, FUSED_DIMS)
    bm, bn, S = 64, 128, FUSED_STAGES
    chains = 1 if causal else 2
    consumers = 2 * C.WARPGROUP
    producer_regs, consumer_regs = FUSED_REGS
    f32 = "float32"
    exp2 = C.exp2_ftz if fast_exp2 else T.exp2

    @T.prim_func
    def main(Q: T.Tensor((total_q, heads, dim), dtype), K: T.Tensor((total_k, kv_heads, dim), dtype),
             V: T.Tensor((total_k, kv_heads, dim), dtype), dO: T.Tensor((total_q, heads, dim), dtype),
             LSE: T.Tensor((heads, total_q), f32), Delta: T.Tensor((heads, total_q), f32),
             cu_q: T.Tensor((n_offsets,), "int32"), cu_k: T.Tensor((n_offsets,), "int32"),
             dK: T.Tensor((total_k, kv_heads, dim), dtype), dV: T.Tensor((total_k, kv_heads, dim), dtype),
             DQacc: T.Tensor((chains, total_q, heads, dim), f32),
             Counts: T.Tensor((chains, heads, n_offsets - 1, query_blocks), "int32"), k_tiles: T.int32):
        with T.Kernel(k_tiles, kv_heads, n_offsets - 1, threads=consumers + C.WARPGROUP,
                      prelude=ORDERED_DQ_PRELUDE + (C.EXP2_FTZ_PRELUDE if fast_exp2 else "")) as (bx, by, bz):
            K_s = T.alloc_shared((bn, dim), dtype)
            V_s = T.alloc_shared((bn, dim), dtype)
            Q_s = T.alloc_shared((S, bm, dim), dtype)
            dO_s = T.alloc_shared((S, bm, dim), dtype)
            lse_s = T.alloc_shared((S, bm), f32)
            delta_s = T.alloc_shared((S, bm), f32)
            ds_s = T.alloc_shared((bn, bm), dtype)
            dq_s = T.alloc_shared((2, bm, dim + DQ_PAD), f32)
            s_t = T.alloc_fragment((bn, bm), f32)
            dp_t = T.alloc_fragment((bn, bm), f32)
            p_t = T.alloc_fragment((bn, bm), dtype)
            ds_t = T.alloc_fragment((bn, bm), dtype)
            dv = T.alloc_fragment((bn, dim), f32)
            dk = T.alloc_fragment((bn, dim), f32)
            dq = T.alloc_fragment((bm, dim), f32)
            kv_full = T.alloc_barrier(32)
            full = T.alloc_barrier([32] * S)
            empty = T.alloc_barrier([consumers] * S)
            dq_full = T.alloc_barrier([consumers] * 2)
            dq_empty = T.alloc_barrier([32] * 2)

            q0, len_q = sequence_rows(cu_q, bz, total_q)
            k0, len_k = sequence_rows(cu_k, bz, total_k)
            tile = k_tiles - 1 - bx
            col0 = tile * bn
            groups = heads // kv_heads
            per_head, first_block, nk = fused_schedule(causal, tile, len_q, len_k, bm, bn)
            # a variable: the bounds proofs take it as any int64 value and rest on fused_step's
            # clamp, instead of carrying the walk's start (a product and a quotient) into every index
            first = T.alloc_var("int64")
            first = first_block
            steps = groups * per_head
            tx = T.get_thread_binding()

            if tx >= consumers:
                T.set_max_nreg(producer_regs, 0)
                lane = tx % 32
                if tx < consumers + 32:
                    if steps > 0:
                        T.tma_copy(K[k0 + col0:k0 + col0 + bn, by, :], K_s, barrier=kv_full)
                        T.tma_copy(V[k0 + col0:k0 + col0 + bn, by, :], V_s, barrier=kv_full)
                    T.mbarrier_arrive(kv_full)
                    for t in T.serial(steps):
                        hq, qb, _ = fused_step(causal, t, per_head, first, len_q, by, groups, bm)
                        T.mbarrier_wait_parity(empty[t % S], ((t // S) & 1) ^ 1)
                        T.tma_copy(Q[q0 + qb * bm:q0 + (qb + 1) * bm, hq, :], Q_s[t % S, :, :], barrier=full[t % S])
                        T.tma_copy(dO[q0 + qb * bm:q0 + (qb + 1) * bm, hq, :], dO_s[t % S, :, :], barrier=full[t % S])
                        for v in T.unroll(bm // 32):
                            # clamped in int64: the row's range then needs no proof about the walk
                            r = T.Cast("int32", T.max(T.min(T.Cast("int64", q0) + T.Cast("int64", qb) * bm + v * 32 + lane,
                                                            T.Cast("int64", total_q - 1)), T.int64(0)))
                            lse_s[t % S, v * 32 + lane] = T.ieee_mul(LSE[hq, r], T.float32(C.LOG2E))
                            delta_s[t % S, v * 32 + lane] = Delta[hq, r]
                        T.mbarrier_arrive(full[t % S])
                elif tx < consumers + 64:
                    for t in T.serial(steps):
                        hq, qb, chain = fused_step(causal, t, per_head, first, len_q, by, groups, bm)
                        T.mbarrier_wait_parity(dq_full[t % 2], (t // 2) & 1)
                        T.call_extern("handle", "tlx_dq_add_in_order", DQacc.access_ptr("rw"),
                                      ((T.Cast("int64", chain) * total_q + q0 + qb * bm) * heads + hq) * dim,
                                      T.Cast("int64", heads * dim), dq_s.access_ptr("r"), (t % 2) * bm * (dim + DQ_PAD),
                                      dim + DQ_PAD, T.min(len_q - qb * bm, bm), dim, Counts.access_ptr("rw"),
                                      fused_counter(chain, hq, bz, qb),
                                      fused_rank(causal, tile, qb, chain, len_q, len_k, nk, bm, bn),
                                      T.int64(ORDERED_DQ_TIMEOUT_NS))
                        T.mbarrier_arrive(dq_empty[t % 2])  # read: the consumers may refill the slot
                        T.call_extern("handle", "tlx_dq_release", Counts.access_ptr("rw"),
                                      fused_counter(chain, hq, bz, qb))
            else:
                T.set_max_nreg(consumer_regs, 1)
                T.fill(dv, 0)
                T.fill(dk, 0)
                T.mbarrier_wait_parity(kv_full, 0)
                for t in T.serial(steps):
                    _, qb, _ = fused_step(causal, t, per_head, first, len_q, by, groups, bm)
                    T.mbarrier_wait_parity(full[t % S], (t // S) & 1)
                    T.wgmma_gemm(K_s, Q_s[t % S, :, :], s_t, transpose_B=True, clear_accum=True, policy=T.GemmWarpPolicy.FullRow)
                    T.wgmma_gemm(V_s, dO_s[t % S, :, :], dp_t, transpose_B=True, clear_accum=True, policy=T.GemmWarpPolicy.FullRow)
                    T.wait_wgmma(0)
                    for i, j in T.Parallel(bn, bm):
                        s_t[i, j] = T.if_then_else(_valid(causal, qb * bm + j, col0 + i, len_q, len_k),
                                                   exp2(T.ieee_fmaf(s_t[i, j], T.float32(scale_log2), -lse_s[t % S, j])),
                                                   T.float32(0))
                    T.copy(s_t, p_t)
                    for i, j in T.Parallel(bn, bm):
                        ds_t[i, j] = s_t[i, j] * (dp_t[i, j] - delta_s[t % S, j])
                    T.wgmma_gemm(p_t, dO_s[t % S, :, :], dv, policy=T.GemmWarpPolicy.FullRow)
                    T.wgmma_gemm(ds_t, Q_s[t % S, :, :], dk, policy=T.GemmWarpPolicy.FullRow)
                    T.sync_threads(DS_FREE, consumers)  # both warpgroups' dQ products of the last step are done
                    T.copy(ds_t, ds_s)
                    T.fence_proxy_async()  # generic-proxy stores, read by wgmma
                    T.sync_threads(DS_FULL, consumers)
                    T.wgmma_gemm(ds_s, K_s, dq, transpose_A=True, clear_accum=True, policy=T.GemmWarpPolicy.FullCol)
                    T.wait_wgmma(0)
                    T.mbarrier_arrive(empty[t % S])
                    T.mbarrier_wait_parity(dq_empty[t % 2], ((t // 2) & 1) ^ 1)
                    T.copy(dq, dq_s[t % 2, :, 0:dim])
                    T.fence_proxy_async()  # read by the dQ warp's bulk reductions
                    T.mbarrier_arrive(dq_full[t % 2])
                for i, j in T.Parallel(bn, dim):
                    if col0 + i < len_k:
                        dK[k0 + col0 + i, by, j] = T.Cast(dtype, dk[i, j] * T.float32(softmax_scale))
                for i, j in T.Parallel(bn, dim):
                    if col0 + i < len_k:
                        dV[k0 + col0 + i, by, j] = T.Cast(dtype, dv[i, j])

    return main


@tlx.jit(target=C.TARGET)
def bwd_dq_sum_kernel(dim: int, chains: int, softmax_scale: float, dtype: str = "bfloat16"):
    """``dQ = (DQacc[0] (+ DQacc[1])) * softmax_scale`` rounded to ``dtype``: the fused kernel's
    chains added in chain order, then scaled as the dQ kernel scales."""
    C.check_head_dim("dim", dim, FUSED_DIMS)
    if chains not in (1, 2):
        raise ValueError(f"chains: expected 1 or 2, got {chains}")
    rows = 64

    @T.prim_func
    def main(DQacc: T.Tensor((chains, total_q, heads, dim), "float32"), dQ: T.Tensor((total_q, heads, dim), dtype)):
        with T.Kernel(T.ceildiv(total_q, rows), heads, threads=128) as (bx, by):
            for i, j in T.Parallel(rows, dim):
                r = bx * rows + i
                if r < total_q:
                    total = DQacc[0, r, by, j] if chains == 1 else T.ieee_add(DQacc[0, r, by, j], DQacc[1, r, by, j])
                    dQ[r, by, j] = T.Cast(dtype, T.ieee_mul(total, T.float32(softmax_scale)))

    return main


def backward_tiles(dim: int, tiles: BwdTiles | None) -> BwdTiles:
    """``tiles``, or the head dim's default (``DEFAULT_TILES``)."""
    if tiles is None:
        return DEFAULT_TILES[dim]
    if not isinstance(tiles, BwdTiles):
        raise TypeError(f"tiles: expected a BwdTiles or None, got {type(tiles).__name__}")
    if tiles.fast_exp2 and not tiles.fused:
        raise ValueError("tiles: fast_exp2 is an option of the fused backward (fused=True)")
    if tiles.fused and (dim not in FUSED_DIMS or tiles[:2] != FUSED_TILES[:2]):
        raise ValueError(f"tiles: the fused backward takes head dims {FUSED_DIMS} and {FUSED_TILES[:2]} "
                         f"(keys, queries), got d {dim} and {tiles[:2]}")
    return tiles


def backward_builds(dim: int, causal: bool, softmax_scale: float, dtype: str = "bfloat16",
                    tiles: BwdTiles | None = None) -> dict:
    """name -> a call that builds that kernel of ``dense_attention_backward``, in launch order:
    "delta", "dkdv" (at the head dims of ``SPLIT_DIMS``, or with ``tiles.split``: "dv" and "dk"), "dq"; with
    ``tiles.fused``: "delta", "fused", "dq_sum". One kernel a call,
    so that a tool can take any one of them (scripts/verdict-share)."""
    t = backward_tiles(dim, tiles)
    scale_log2 = softmax_scale * C.LOG2E
    builds = {"delta": lambda: bwd_delta_kernel(dim, dtype)}
    if t.fused:
        builds["fused"] = lambda: bwd_fused_kernel(dim, bool(causal), scale_log2, softmax_scale, dtype, t.fast_exp2)
        builds["dq_sum"] = lambda: bwd_dq_sum_kernel(dim, 1 if causal else 2, softmax_scale, dtype)
        return builds
    for grads in ("dv", "dk") if t.split or dim in SPLIT_DIMS else ("dkdv",):
        builds[grads] = lambda g=grads: bwd_dkdv_kernel(dim, bool(causal), scale_log2, softmax_scale, dtype, g,
                                                        t.dkdv_keys, t.dkdv_queries)
    builds["dq"] = lambda: bwd_dq_kernel(dim, bool(causal), scale_log2, softmax_scale, dtype, t.dq_queries, t.dq_keys)
    return builds


def backward_kernels(dim: int, causal: bool, softmax_scale: float, dtype: str = "bfloat16", tiles: BwdTiles | None = None) -> list:
    """The kernels ``dense_attention_backward`` launches, in launch order (``backward_builds``;
    also what a precompile step builds)."""
    return [build() for build in backward_builds(dim, causal, softmax_scale, dtype, tiles).values()]


def dense_attention_backward(do, q, k, v, o, lse, *, causal: bool = False, softmax_scale: float | None = None,
                             cu_seqlens_q=None, cu_seqlens_k=None, out=None, tiles: BwdTiles | None = None):
    """``(dq, dk, dv)`` of ``dense_fwd.dense_attention`` (same argument forms; ``lse`` as that
    returns it: [b, h, s_q] or [h, total_q]). Deterministic: the same inputs give the same bits.
    ``out=(dq, dk, dv)`` writes into given buffers (contiguous, of the shapes and dtype of q, k, v)
    and returns them. ``tiles`` picks the block sizes (default: ``DEFAULT_TILES`` of the head dim)."""
    varlen = cu_seqlens_q is not None or cu_seqlens_k is not None
    if varlen and (cu_seqlens_q is None or cu_seqlens_k is None):
        raise ValueError("cu_seqlens_q, cu_seqlens_k: expected both or neither")
    _check(q, k, v, varlen)
    C.check_head_dim("q", q.shape[-1], SUPPORTED_DIMS)
    for name, t in (("do", do), ("o", o)):
        C.check_tensor(name, t, (q.dtype,), q.dim())
        if tuple(t.shape) != tuple(q.shape):
            raise ValueError(f"{name}: expected the shape of q {tuple(q.shape)}, got {tuple(t.shape)}")
    d, h = q.shape[-1], q.shape[-2]
    tile = backward_tiles(d, tiles)
    scale = 1.0 / math.sqrt(d) if softmax_scale is None else float(softmax_scale)
    if varlen:
        host_q = C.check_cu_seqlens("cu_seqlens_q", cu_seqlens_q, q.shape[0])
        host_k = C.check_cu_seqlens("cu_seqlens_k", cu_seqlens_k, k.shape[0])
        max_q, max_k = int((host_q[1:] - host_q[:-1]).max()), int((host_k[1:] - host_k[:-1]).max())
        cu_q, cu_k = cu_seqlens_q, cu_seqlens_k
    else:
        b, max_q, max_k = q.shape[0], q.shape[1], k.shape[1]
        cu_q, cu_k = uniform_offsets(b, max_q, q.device), uniform_offsets(b, max_k, q.device)
    total_q = q.numel() // (h * d)
    shapes = [(h, total_q)] if varlen else [(b, h, max_q), (h, total_q)]
    if not isinstance(lse, torch.Tensor) or lse.dtype != torch.float32 or tuple(lse.shape) not in shapes:
        raise ValueError(f"lse: expected fp32 of shape {' or '.join(map(str, shapes))}, got "
                         f"{getattr(lse, 'dtype', type(lse).__name__)} {tuple(getattr(lse, 'shape', ()))}")
    lse_p = (lse.permute(1, 0, 2).reshape(h, total_q) if lse.dim() == 3 else lse).contiguous()
    if out is not None:
        if not isinstance(out, (tuple, list)) or len(out) != 3:
            raise ValueError(f"out: expected a tuple (dq, dk, dv), got {type(out).__name__}")
        for i, (given, like) in enumerate(zip(out, (q, k, v))):
            C.check_tensor(f"out[{i}]", given, (q.dtype,), q.dim())
            if tuple(given.shape) != tuple(like.shape):
                raise ValueError(f"out[{i}]: expected shape {tuple(like.shape)}, got {tuple(given.shape)}")
    C.check_cuda(q=q, k=k, v=v, o=o, do=do, lse=lse, **{f"out[{i}]": given for i, given in enumerate(out or ())})
    hk = k.shape[-2]
    qp, kp, vp = q.reshape(-1, h, d), k.reshape(-1, hk, d), v.reshape(-1, hk, d)
    op, dop = o.reshape(-1, h, d), do.reshape(-1, h, d)
    dt = C.TORCH_DTYPES[q.dtype]
    if out is None:
        dq, dk, dv = torch.empty_like(qp), torch.empty_like(kp), torch.empty_like(vp)
    else:
        dq, dk, dv = (given.view(p.shape) for given, p in zip(out, (qp, kp, vp)))
    if qp.shape[0] and kp.shape[0]:
        delta_kernel, *kernels = backward_kernels(d, causal, scale, dt, tile)
        delta = torch.empty((h, qp.shape[0]), dtype=torch.float32, device=q.device)
        delta_kernel(op, dop, delta)
        args = (qp, kp, vp, dop, lse_p, delta, cu_q, cu_k)
        k_tiles = max(1, -(-max_k // tile.dkdv_keys))
        if tile.fused:
            # the fp32 sums start at zero, the counters at rank 0 (bwd_fused_kernel)
            fused_kernel, sum_kernel = kernels
            chains = 1 if causal else 2
            sums = torch.zeros((chains, qp.shape[0], h, d), dtype=torch.float32, device=q.device)
            counts = torch.zeros((chains, h, cu_q.numel() - 1, max(1, -(-max_q // 64))), dtype=torch.int32, device=q.device)
            fused_kernel(*args, dk, dv, sums, counts, k_tiles)
            sum_kernel(sums, dq)
        else:
            *dkdv_kernels, dq_kernel = kernels
            for kernel in dkdv_kernels:
                kernel(*args, dk, dv, k_tiles)
            dq_kernel(*args, dq, max(1, -(-max_q // tile.dq_queries)))
    else:
        dq.zero_(), dk.zero_(), dv.zero_()
    return dq.view(q.shape), dk.view(k.shape), dv.view(v.shape)
