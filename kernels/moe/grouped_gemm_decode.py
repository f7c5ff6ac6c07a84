"""FP8 grouped GEMM for decode batches: the expert weights on the MMA's M side ("swap AB").

At a decode batch an expert holds a few routed rows (T = 8: about one) in a 128-row block of the
contiguous layout, so the GEMM is a stream of weight bytes. ``grouped_gemm_contiguous_kernel``
puts the rows on wgmma's M side (64 rows a warpgroup, nearly all padding) and reads each weight
row in 128-byte pieces, one K block a stage; at T = 8 the V4 GEMMs read their weights at 91-96% of
the copy rate that way (H100, 2026-12-07), where a plain read of the same bytes reaches 96-100%. Here the
roles swap: a CTA computes ``C^T = B A^T`` for ``block_n`` weight rows (wgmma's M side, one
consumer warpgroup) and the block's first ``tokens`` rows (its N side: m64n{tokens}k32), so no
tensor-core work goes to padding rows beyond ``tokens``, the accumulators take ``tokens`` registers
a thread (at 8 rows two CTAs share an SM), and a stage holds ``group`` consecutive K blocks, their
TMA loads issued together (each weight row read as ``128 * group`` contiguous bytes).

The same bits as ``grouped_gemm_contiguous_kernel`` and ``grouped_gemm.cu`` on every routed row:
per 128-wide K block the products are summed in fp32 by a wgmma chain over K in steps of 32 from
zero (each output element is the same 32-product dot-product step whichever operand is on M), and
the block result is added to the total with ``fma(block, sa[row, kb] * sb[n // 128, kb], total)``,
K blocks ascending; the total is rounded to bf16 once. Only rows whose ``rows`` entry is >= 0 are
stored. A block whose expert holds more than ``tokens`` rows is computed in further chunks of
``tokens`` rows, each streaming the CTA's weights again: correct for every routing, and as fast
as one chunk where ``tokens`` bounds most experts' rows. Until 2026-12-07 that bound was a
precondition for every call, and rows past it were silently left unwritten; now only a caller
that guarantees it (``bounded``: ``tokens`` bounds the batch's token count, and gating gives a
token distinct experts) takes the one-chunk form.
"""

import tilelang.language as T

import tlx
from kernels.moe.grouped_gemm import BLOCK_K, BLOCK_M, check_gemm_args, nblocks, nexp, nrows
from kernels.quant.common import cast_e4m3, group_scale

TOKENS = (8, 16, 32, 64)  # the N sides this kernel takes (the rows of an expert's block computed a pass)
# Up to this many tokens a call takes this kernel by default (``decode_width``) at the width that
# holds them all (one chunk). On an H100 (2026-12-07, ``bench/decode_gemm.py``, the same bits): at
# T = 8 the V4-Flash GEMMs read the weights at 98.5% / 97.3% of the copy rate against the persistent
# kernel's 93.1% / 91.1% (the layer as a CUDA graph 377.0 against 396.8 us, V4-Pro 1061.7 against 1098.4).
DEFAULT_MAX_TOKENS = 8
# Past it, up to CHUNKED_MAX_TOKENS tokens, the width CHUNKED_WIDTH with further chunks where an expert
# holds more rows (V4-Flash T = 512: 12 rows an expert on average, more than 32 in about one expert of two million).
# The V4-Flash layer as a CUDA graph against the persistent kernels, H100 2026-12-07 16:47, the same
# bits (``--layer-tokens 64,256,512 --layer-width W``): width 32 1643 / 2163 / 2202 against 1686 / 2212 /
# 2254 us at T = 64 / 256 / 512 (1.02-1.03x); width 16 1.035x / 1.032x but 0.959x at T = 512 (second chunks).
CHUNKED_MAX_TOKENS = 512
CHUNKED_WIDTH = 32


def width_for(tokens: int) -> int | None:
    """The smallest N side (``TOKENS``) that holds ``tokens`` rows, None past the largest."""
    return next((w for w in TOKENS if tokens <= w), None)


def decode_width(tokens: int | None) -> int | None:
    """The N side the layer's GEMMs take for a batch of ``tokens`` tokens (a block's rows a chunk;
    ``bounded`` where it holds them all), or None where the persistent kernel serves it better
    (above ``CHUNKED_MAX_TOKENS``) or the count is unknown."""
    if tokens is None or tokens > CHUNKED_MAX_TOKENS:
        return None
    return width_for(tokens) if tokens <= DEFAULT_MAX_TOKENS else CHUNKED_WIDTH


def one_chunk(tokens: int, width: int) -> bool:
    """``bounded`` for a batch of ``tokens`` tokens at ``width``: gating gives a token distinct
    experts, so no expert holds more rows than the batch has tokens, and a width that holds the
    tokens holds every block's routed rows in its first chunk."""
    return tokens <= width


@tlx.jit(target={"kind": "cuda", "arch": "sm_90a"},
         pass_configs={"tl.disable_warp_specialized": True, "tl.disable_thread_storage_sync": True},
         assume=("NB <= 16777214", "R == NB * 128"))
def grouped_gemm_decode_kernel(n: int, k: int, tokens: int, block_n: int = 128, group: int = 2, num_stages: int = 3,
                               swiglu_clamp: float | None = None, pdl: bool = False, bounded: bool = False):
    """``(A [R, K], SA [R, K/128], B [E, N, K], SB [E, N/128, K/128], block_expert [R/128],
    rows [R], C [R, N])``: the contiguous layout's routed rows (entry >= 0) of C, ``tokens`` rows of
    a block a chunk (with ``bounded``, the first chunk only).

    Grid: (N / ``block_n``, row blocks); a CTA whose block has no expert (-1) leaves at once, and
    one whose block holds more than ``tokens`` routed rows runs its K loop once a chunk of them.
    Threads 0..127 are the consumer warpgroup (``block_n / 64`` m64n{tokens}k32 chains a K step,
    the promotion fma, the epilogue), thread 128 issues the TMA loads of a stage (``group`` K
    blocks of B's ``block_n`` rows and of A's first ``tokens`` rows) and threads 128.. below
    128 + ``tokens`` store the stage's ``sa * sb``. Epilogue: C^T transposed into ``C_s`` (bf16),
    then 16-byte stores of the routed rows.

    ``swiglu_clamp`` set (N = 2I, the MoE's L1: MegaMoE's fused L1 at decode sizes; its bitwise
    test is ``test_swiglu_bitwise_equal_to_gemm_then_swiglu_cast``):
    ``(..., rows [R], Q [R, I] e4m3, S [R, I/128] fp32)``,
    ``swiglu_cast(L1, clamp)`` of the routed rows in the same kernel, bit for bit: a CTA's 128
    output columns ``c0..`` take the gate rows ``c0..`` and the up rows ``I + c0..`` of B, loaded in
    one stage (``block_n`` 128 each), a chain for each into its own total with its own scale group;
    the epilogue rounds each total to bf16 as L1 stores it, then runs ``swiglu_cast``'s fp32
    operations in its order (as ``grouped_gemm_swiglu_kernel``), the row's amax over its 128
    columns (exact in any order), its scale and e4m3 bytes.

    ``pdl`` (MegaMoE's decode GEMMs): launched as a programmatic dependent
    of the kernel before it on the stream, which must not write B, SB, ``block_expert`` or
    ``rows`` (MegaMoE's dispatch and L1 write only the activations): the CTA loads its first
    ``num_stages`` stages of weights, then waits for that grid (``T.pdl_sync()``) before it reads
    A and SA, so the weight stream starts while the activations are still being written. Every
    CTA lets its own dependents launch as it starts (``T.pdl_trigger()``: they start once all of
    this grid's CTAs have); a CTA of an empty block waits for that grid before it leaves, so this
    grid ends after it even where every block is empty (a dependent of this one, waiting for it,
    then waits for both). Without it the kernel is the one measured above, unchanged.

    ``bounded``: the caller guarantees that no block holds more than ``tokens`` routed rows (the
    layers pass it where ``tokens`` bounds the batch's token count), so the kernel computes one
    chunk a block and reads no chunk flag (at T = 1 / 8 the chunked form cost the V4-Flash layer
    3-8 us, H100 2026-12-07); otherwise a block's further chunks are computed where they hold rows."""
    check_gemm_args(n, k)
    swiglu = swiglu_clamp is not None
    if tokens not in TOKENS:
        raise ValueError(f"tokens: expected one of {TOKENS}, got {tokens}")
    if block_n not in (64, 128):
        raise ValueError(f"block_n: expected 64 or 128, got {block_n}")
    if swiglu and (block_n != 128 or n % 256):
        raise ValueError(f"swiglu_clamp: expected block_n = 128 and N = 2I with I a multiple of 128, got block_n = {block_n}, "
                         f"N = {n}")
    if n % block_n:
        raise ValueError(f"n: expected a multiple of block_n = {block_n}, got {n}")
    kblocks = k // BLOCK_K
    if group < 1 or kblocks % group:
        raise ValueError(f"group: expected a divisor of the {kblocks} K blocks, got {group}")
    if num_stages < 1:
        raise ValueError(f"num_stages: expected >= 1, got {num_stages}")
    steps = kblocks // group
    # a row block's rows in chunks of ``tokens``: an expert's routed rows come first in its blocks,
    # so chunk c holds a routed row iff its first row does; ``bounded``: one chunk (the caller's bound)
    chunks = 1 if bounded else BLOCK_M // tokens
    S = num_stages
    early = min(S, steps) if pdl else 0  # steps whose weights load before T.pdl_sync()
    cols = n // 2 if swiglu else n  # output columns
    m = 2 * block_n if swiglu else block_n  # weight rows a CTA (gate and up with SwiGLU)
    halves = 2 if swiglu else 1  # scale groups of a CTA's weight rows
    elem = 1 if swiglu else 2  # bytes of an output value
    vpr = block_n * elem // 16  # 16-byte pieces an output row
    pieces = tokens * vpr
    out_dtype = "float8_e4m3" if swiglu else "bfloat16"

    def w_half(W_s, stage, u, h):
        """Stage ``stage``'s K block ``u`` of the CTA's weight rows: with SwiGLU half ``h`` (gate, up)."""
        return W_s[stage, u, h * block_n:(h + 1) * block_n, :] if swiglu else W_s[stage, u, :, :]

    @T.macro
    def load_weights(B, expert, n0, kq, u, W_s, full, slot):
        """K block ``u`` of step ``kq``'s weight rows (SwiGLU: gate, then up) into stage ``slot``."""
        kb = kq * group + u
        T.tma_copy(B[expert, n0:n0 + block_n, kb * BLOCK_K:(kb + 1) * BLOCK_K], w_half(W_s, slot, u, 0),
                   barrier=full[slot])
        if swiglu:  # the up rows, I further
            T.tma_copy(B[expert, cols + n0:cols + n0 + block_n, kb * BLOCK_K:(kb + 1) * BLOCK_K],
                       w_half(W_s, slot, u, 1), barrier=full[slot])

    @T.macro
    def produce_chunk(A, SA, B, SB, W_s, X_s, scale_s, full, empty, expert, r0, n0, c, tx):
        """The producer's loads of chunk ``c`` (rows ``r0 + c * tokens..``); with ``pdl`` chunk 0's
        first ``early`` steps of weights were loaded before the wait on the grid before this one."""
        for kq in T.serial(steps):
            it = c * steps + kq  # the stage's use count: its slot and phase
            T.mbarrier_wait_parity(empty[it % S], ((it // S) & 1) ^ 1)
            for u in T.unroll(group):
                kb = kq * group + u
                if not pdl or c > 0 or kq >= early:
                    load_weights(B, expert, n0, kq, u, W_s, full, it % S)
                T.tma_copy(A[r0 + c * tokens:r0 + c * tokens + tokens, kb * BLOCK_K:(kb + 1) * BLOCK_K],
                           X_s[it % S, u, :, :], barrier=full[it % S])
            if tx - 128 < tokens:
                for u in T.unroll(group):
                    scale_s[it % S, u, 0, tx - 128] = (SA[r0 + c * tokens + tx - 128, kq * group + u]
                                                       * SB[expert, n0 // 128, kq * group + u])
                    if swiglu:
                        scale_s[it % S, u, 1, tx - 128] = (SA[r0 + c * tokens + tx - 128, kq * group + u]
                                                           * SB[expert, (cols + n0) // 128, kq * group + u])
            T.mbarrier_arrive(full[it % S])

    @T.macro
    def consume_chunk(W_s, X_s, scale_s, part, total, total_up, value_s, value, amax, C_s, full, empty, rows, C, Sq,
                      r0, n0, c, tx):
        """The consumers' K loop over chunk ``c`` (rows ``r0..r0 + tokens``) and its epilogue."""
        T.clear(total)
        if swiglu:
            T.clear(total_up)
        for kq in T.serial(steps):
            it = c * steps + kq
            T.mbarrier_wait_parity(full[it % S], (it // S) & 1)
            for u in T.unroll(group):
                T.gemm(w_half(W_s, it % S, u, 0), X_s[it % S, u, :, :], part, transpose_B=True,
                       clear_accum=True, policy=T.GemmWarpPolicy.FullRow)
                for i, j in T.Parallel(block_n, tokens):
                    total[i, j] = T.ieee_fmaf(part[i, j], scale_s[it % S, u, 0, j], total[i, j])
                if swiglu:  # the up rows' chain into their own total, with their scale group
                    T.gemm(w_half(W_s, it % S, u, 1), X_s[it % S, u, :, :], part, transpose_B=True,
                           clear_accum=True, policy=T.GemmWarpPolicy.FullRow)
                    for i, j in T.Parallel(block_n, tokens):
                        total_up[i, j] = T.ieee_fmaf(part[i, j], scale_s[it % S, u, 1, j], total_up[i, j])
            if tx % 32 == 0:
                T.mbarrier_arrive(empty[it % S])
        if swiglu:
            for i, j in T.Parallel(block_n, tokens):
                g = T.min(T.Cast("float32", T.Cast("bfloat16", total[i, j])), T.float32(swiglu_clamp))
                up = T.max(T.min(T.Cast("float32", T.Cast("bfloat16", total_up[i, j])),
                                 T.float32(swiglu_clamp)), T.float32(-swiglu_clamp))
                value_s[j, i] = g / T.ieee_add(T.float32(1.0), T.exp(-g), "rn") * up  # no FMA into expf
            T.sync_threads(1, 128)
            T.copy(value_s[:, 0:block_n], value)
            T.reduce_absmax(value, amax, dim=1)
            for j, i in T.Parallel(tokens, block_n):
                C_s[j, i] = cast_e4m3(value[j, i] * (T.float32(1.0) / group_scale(amax[j], "e4m3", False)[0]))
            for j in T.Parallel(tokens):
                if rows[r0 + j] >= 0:
                    Sq[r0 + j, n0 // 128] = group_scale(amax[j], "e4m3", False)[0]
        else:
            for i, j in T.Parallel(block_n, tokens):
                C_s[j, i] = T.Cast("bfloat16", total[i, j])
        T.sync_threads(1, 128)  # the consumers only
        per = 16 // elem  # values a 16-byte piece
        for p in T.unroll(T.ceildiv(pieces, 128)):
            if p * 128 + tx < pieces:
                if rows[r0 + (p * 128 + tx) // vpr] >= 0:
                    for v in T.vectorized(per):
                        C[r0 + (p * 128 + tx) // vpr, n0 + (p * 128 + tx) % vpr * per + v] = \
                            C_s[(p * 128 + tx) // vpr, (p * 128 + tx) % vpr * per + v]
        if chunks > 1:
            T.sync_threads(1, 128)  # C_s read by every store before the next chunk writes it

    @T.macro
    def body(A, SA, B, SB, block_expert, rows, C, Sq):
        with T.Kernel(cols // block_n, nblocks, threads=256) as (bx, by):
            W_s = T.alloc_shared((S, group, m, BLOCK_K), "float8_e4m3")
            X_s = T.alloc_shared((S, group, tokens, BLOCK_K), "float8_e4m3")
            scale_s = T.alloc_shared((S, group, halves, tokens), "float32")
            # rows padded by 16 bytes: the transposed stores of a warp's 4 token columns fall in 4 distinct bank groups
            C_s = T.alloc_shared((tokens, block_n + 16 // elem), out_dtype)
            part = T.alloc_fragment((block_n, tokens), "float32")
            total = T.alloc_fragment((block_n, tokens), "float32")
            total_up = T.alloc_fragment((block_n, tokens), "float32") if swiglu else None
            # SwiGLU: the values, transposed through shared memory into rows (whose amax TileLang reduces)
            value_s = T.alloc_shared((tokens, block_n + 4), "float32") if swiglu else None  # padded as C_s
            value = T.alloc_fragment((tokens, block_n), "float32") if swiglu else None
            amax = T.alloc_fragment((tokens,), "float32") if swiglu else None
            full = T.alloc_barrier([128] * S)  # the producer warpgroup's 128 threads + the TMA bytes
            empty = T.alloc_barrier([4] * S)  # lane 0 of each consumer warp
            tx = T.get_thread_binding()
            expert = block_expert[by]
            r0 = by * BLOCK_M
            n0 = bx * block_n
            if pdl:
                T.pdl_trigger()
            # chunk 1's first row's entry: >= 0 where the block needs a second chunk
            more = T.alloc_var("int32", init=-1) if chunks > 1 else None
            if expert >= 0:
                if chunks > 1:
                    more = rows[r0 + tokens]  # read at once: its latency under the first chunk's K loop
                if tx >= 128:
                    if pdl:  # the first stages' weights before the grid before this one has finished
                        for kq in T.unroll(early):
                            for u in T.unroll(group):
                                load_weights(B, expert, n0, kq, u, W_s, full, kq % S)
                        T.pdl_sync()
                    produce_chunk(A, SA, B, SB, W_s, X_s, scale_s, full, empty, expert, r0, n0, 0, tx)
                    if chunks > 1:
                        if more >= 0:
                            for c1 in T.serial(chunks - 1):
                                if rows[r0 + (c1 + 1) * tokens] >= 0:
                                    produce_chunk(A, SA, B, SB, W_s, X_s, scale_s, full, empty, expert, r0, n0, c1 + 1, tx)
                else:
                    consume_chunk(W_s, X_s, scale_s, part, total, total_up, value_s, value, amax, C_s, full, empty, rows, C,
                                  Sq, r0, n0, 0, tx)
                    if chunks > 1:
                        if more >= 0:
                            for c1 in T.serial(chunks - 1):
                                if rows[r0 + (c1 + 1) * tokens] >= 0:
                                    consume_chunk(W_s, X_s, scale_s, part, total, total_up, value_s, value, amax, C_s, full,
                                                  empty, rows, C, Sq, r0 + (c1 + 1) * tokens, n0, c1 + 1, tx)
            elif pdl:  # an empty block's CTA waits too: the grid never ends before the one before it
                T.pdl_sync()


    a_t = T.Tensor((nrows, k), "float8_e4m3")
    sa_t = T.Tensor((nrows, k // BLOCK_K), "float32")
    b_t = T.Tensor((nexp, n, k), "float8_e4m3")
    sb_t = T.Tensor((nexp, n // 128, k // BLOCK_K), "float32")
    if swiglu:
        @T.prim_func
        def main(A: a_t, SA: sa_t, B: b_t, SB: sb_t, block_expert: T.Tensor((nblocks,), "int32"),
                 rows: T.Tensor((nrows,), "int32"), Q: T.Tensor((nrows, cols), "float8_e4m3"),
                 Sq: T.Tensor((nrows, cols // 128), "float32")):
            body(A, SA, B, SB, block_expert, rows, Q, Sq)
    else:
        @T.prim_func
        def main(A: a_t, SA: sa_t, B: b_t, SB: sb_t, block_expert: T.Tensor((nblocks,), "int32"),
                 rows: T.Tensor((nrows,), "int32"), C: T.Tensor((nrows, n), "bfloat16")):
            body(A, SA, B, SB, block_expert, rows, C, None)

    return main
