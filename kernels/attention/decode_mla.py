"""MLA decode over a paged latent KV cache, batch invariant.

Shapes (DeepSeek MLA, absorbed): q ``[B, T, H, 576]`` bf16 (T = 1..4 query tokens per sequence,
H query heads sharing one latent KV head), the cache ``[P, 64, 576]`` (pages of 64 tokens; the
first 512 dims are also V) in bf16 or e4m3 with fp32 scales ``[P, 64, 9]`` (one per 1 x 64
group, the project's quantization layout), a block table ``[B, MP]`` int32 and ``seq_lens [B]``
int32 (clamped to ``MP * 64``). Token t of sequence b sees keys ``j <= seq_lens[b] - T + t``.
Output ``o [B, T, H, 512]`` bf16 and ``lse [B, T, H]`` fp32 (natural log, -inf for no keys).

Batch invariance: a sequence is cut into splits of ``split_pages`` pages (default
``SPLIT_PAGES``, 4096 tokens), a count that depends on its own length and that constant only,
never on the batch or the SM count (each split size is its own bit-for-bit contract with the
baseline, which takes the same constant); each split is one CTA
per 64 query rows (token-major rows ``t * H + h``; 16 rows: one CTA of the key-major kernel,
the same bits) that writes its normalised partial output and log-sum-exp, and
a second kernel combines the splits in ascending order. No atomics, no
persistent scheduling: the bits of a sequence are the same alone, in any batch, on any grid.

FP8: each page is dequantized in shared memory before the matrix products, by the project's
rule (``float(q) * scale``, one fp32 multiply, rounded to bf16), so an FP8 cache gives the bits
of the bf16 cache holding the dequantized values. The page and its scales arrive by TMA into a
staging tile that is released as soon as its values sit in registers (the next page's copy
then overlaps this page's work); the conversion runs two values per cvt and stores 16 bytes a
thread, a quarter warp per 128-byte swizzled row (``DEQUANT_LAYOUT``). The key-major kernel with
one consumer (``mla_split_key_major_fp8_kernel``) instead has producer warpgroups dequantize the
pages off the consumer's path: by default (16 query rows) one producer, whose next page TMA
stages while it converts the last (optionally for two consumers, each its own split); or two
(one, with two CTAs a SM) loading pages into registers.

Guard (documented, no launcher check: the table is device data): a block-table entry outside
``[0, P)`` is never read; the rows of its sequence become NaN. Entries past the sequence's pages
are not read at all. Cache slots past the sequence in its last page may hold anything, NaN too:
their values enter the products as zeros.

Per split the online softmax is ``kernels/attention/common.py``'s (its docstring gives the
order); the combine is, per row, over the sequence's splits i ascending:
``m = max lse_i``; ``w_i = exp2((lse_i - m) * log2 e)``; ``s = Σ w_i``; ``o = Σ (w_i / s) o_i``
(fma, splits ascending) rounded to bf16; ``lse = m + log(s)``.
"""

import math

import torch
import tilelang.language as T

import tlx
from kernels.attention import common as C
from kernels.attention.indexer import clamped_page, table_entry
from kernels.device import sm_count

D_QK = 576
D_V = 512
D_PE = D_QK - D_V
PAGE = 64
ROWS = 64  # query rows (token, head) per CTA
# pages per split by default: the split count is ceil(seq_len / 4096). On an H200 (2026-12-03,
# B 128, ctx 8192) 64-page splits ran 1.5x faster than 16-page ones at H 128 and 1.3x at H 16:
# each split CTA loads its 64 query rows and writes fp32 partials that the combine reads back,
# and shorter splits repeat that for fewer keys. Shorter splits suit small batches (more CTAs).
SPLIT_PAGES = 64
SPLIT_CHOICES = (16, 32, 64, 128)  # the split sizes the kernels take
GROUP = 64  # FP8 scale group (1 x 64 of a token's 576 values)
GROUPS = D_QK // GROUP
# a page's 64 x 9 fp32 scales as the split kernel copies them: 4 rows of 144 (576 bytes, a row
# length the TMA engine takes; 9 scales are 36 bytes, which it does not)
SCALE_TILE = (4, PAGE * GROUPS // 4)
KV_DTYPES = {torch.bfloat16: "bfloat16", torch.float8_e4m3fn: "float8_e4m3"}
MAX_PAGES = 1 << 16
LOG2E = C.LOG2E


def entry_outside(BT, b, slot, pages):
    """Whether block-table entry ``BT[b, slot]`` lies outside ``[0, P)``: its sequence's rows
    become NaN (the module docstring's guard)."""
    return T.Or(table_entry(BT, b, slot) < 0, table_entry(BT, b, slot) >= pages)


def nan():
    return T.reinterpret(T.uint32(0x7FC00000), T.float32)


def lse_weight(lse, mx):
    """``exp(lse - mx)`` as the combine computes it (``exp2`` of the difference times log2 e, each
    step IEEE): a split's (or the sink's) weight against the row's running max ``mx``."""
    return T.exp2(T.ieee_mul(T.ieee_sub(lse, mx), T.float32(LOG2E)))


def dequant_layout(threads: int):
    """The consumer thread and register of element (i, d) of an e4m3 page: 8 columns a thread,
    64 threads along one row, ``threads // 64`` rows at a time. A quarter warp then stores one
    128-byte row of a swizzled bf16 panel (16 bytes a thread: no bank conflicts), and reads 64
    contiguous e4m3 bytes of the staged page."""
    per_row = threads // 64
    return T.Fragment((PAGE, D_V), forward_fn=lambda i, d: ((i % per_row) * 64 + d // 8, (i // per_row) * 8 + d % 8))


DEQUANT_LAYOUT = dequant_layout(256)


def page_scale(scales, i, g, *page):
    """The scale of token slot i, group g of a page's scales in ``SCALE_TILE`` form (``page``: the
    page's index when ``scales`` holds every page's)."""
    return scales[(*page, (i * GROUPS + g) // SCALE_TILE[1], (i * GROUPS + g) % SCALE_TILE[1])]


def dequant(x, scale):
    """The project's e4m3 rule: ``bf16(float(x) * scale)``, one rounded fp32 multiply. A bare
    product (nothing to contract it into an fma; the kernels build without fast math), which
    TileLang's vectorizer turns into 4-wide code beside the paired e4m3 and bf16 conversions."""
    return T.Cast("bfloat16", T.Cast("float32", x) * scale)


@T.macro
def query_piece(Q, dst, b, query_of, i, d, col):
    """Eight values of row i's query from column ``col + d`` into ``dst[i, d:d + 8]``; ``query_of(i)``
    is the row's (token, head, valid), zeros where not valid."""
    for v in T.vectorized(8):
        dst[i, d + v] = T.if_then_else(query_of(i)[2], Q[b, query_of(i)[0], query_of(i)[1], col + d + v], T.Cast("bfloat16", 0))


@T.macro
def load_queries(Q, Q_s, QP_s, b, tx, threads: int, query_of):
    """A block's 64 query rows into ``Q_s`` / ``QP_s`` by the threads ``tx < threads`` (the caller's
    branch): 16-byte pieces with no branch, so a thread's pieces are all in flight at once (a
    CTA's 64 x 576 queries, loaded by TileLang's elementwise loop, took 54 guarded 2- and 4-byte
    steps a thread, each load issued after the previous store: 23% of the sparse split's stall
    samples, ncu, H200)."""
    for k in T.unroll(ROWS * D_V // 8 // threads):
        query_piece(Q, Q_s, b, query_of, k * (threads // 64) + tx // 64, tx % 64 * 8, 0)
    for k in T.unroll(ROWS * D_PE // 8 // threads):
        query_piece(Q, QP_s, b, query_of, k * (threads // 8) + tx // 8, tx % 8 * 8, D_V)


@T.macro
def dequant_page(KQ_s, KQP_s, KS_s, KQ_f, KV_s, KP_s, full, key_valid, layout):
    """A staged e4m3 page (values ``KQ_s`` / ``KQP_s``, scales ``KS_s``) into the bf16 tiles ``KV_s``
    / ``KP_s`` by the project's rule; zeros for a slot ``i`` past the sequence (``key_valid(i)``
    false; ``full()``: no such slot). Both are callables, not values: a value passed to a macro
    is let-bound, and TileLang then placed one more barrier in the page loop. The values go
    to registers first (16-byte loads), so the staging tile is released at once and the next
    page's copy overlaps this one's dequant and products (the scales came with the page: read
    per element from global memory behind the block-table entry, they made every element wait
    for two dependent loads). A page of keys only (all but a sequence's last) has no test per
    value: as a select, each four values were a branch (1.17-1.19x slower, H200, 2026-12-04)."""
    for i, d in T.Parallel(PAGE, D_V, loop_layout=layout):
        KQ_f[i, d] = KQ_s[i, d]
    if full():
        for i, d in T.Parallel(PAGE, D_V, loop_layout=layout):
            KV_s[i, d] = dequant(KQ_f[i, d], page_scale(KS_s, i, d // GROUP))
    else:
        for i, d in T.Parallel(PAGE, D_V, loop_layout=layout):
            KV_s[i, d] = T.if_then_else(key_valid(i), dequant(KQ_f[i, d], page_scale(KS_s, i, d // GROUP)),
                                        T.Cast("bfloat16", 0))
    for i, d in T.Parallel(PAGE, D_PE):
        KP_s[i, d] = dequant(KQP_s[i, d], page_scale(KS_s, i, D_V // GROUP))


@T.macro
def load_page(KV, KVS, KQ_s, KQP_s, KS_s, KQ_f, KV_s, KP_s, page, full, key_valid, fp8: bool, layout):
    """The cache page ``page()`` into the bf16 tiles ``KV_s`` / ``KP_s`` of a ``T.Pipelined`` page
    loop: copied, or staged in e4m3 and dequantized (``dequant_page``, which takes ``full`` and
    ``key_valid``). ``page`` is a callable for dequant_page's reason: a value would be let-bound."""
    if fp8:
        T.copy(KV[page(), :, 0:D_V], KQ_s)
        T.copy(KV[page(), :, D_V:D_QK], KQP_s)
        T.copy(KVS[page(), :, :], KS_s)
        dequant_page(KQ_s, KQP_s, KS_s, KQ_f, KV_s, KP_s, full, key_valid, layout)
    else:
        T.copy(KV[page(), :, 0:D_V], KV_s)
        T.copy(KV[page(), :, D_V:D_QK], KP_s)


@T.macro
def zero_past_sequence(KV_s, k0, seq):
    """Zeros in the bf16 page tile's slots past the sequence (first key ``k0()``, ``seq()`` keys;
    callables, as ``dequant_page``'s): the cache may hold anything there, NaN too, and P V would
    give 0 * NaN. Called after the score product, which waits for the page's copy (zeros written
    earlier could be overwritten by the copy in flight)."""
    if k0() + PAGE > seq():
        for i, d in T.Parallel(PAGE, D_V):
            if k0() + i >= seq():
                KV_s[i, d] = T.Cast("bfloat16", 0)


def splits_of(max_pages, split: int):
    return T.ceildiv(max_pages, split)


def check_split(split_pages: int) -> int:
    if split_pages not in SPLIT_CHOICES:
        raise ValueError(f"split_pages: expected one of {SPLIT_CHOICES}, got {split_pages!r}")
    return split_pages


def sequence_keys(SL, b, max_pages):
    """The keys of sequence b: ``seq_lens[b]`` clamped into ``[0, MP * 64]``."""
    return T.max(T.min(SL[b], max_pages * PAGE), 0)


def pages_in_split(SL, b, sp, max_pages, split: int):
    """The pages of split ``sp`` (of ``split`` pages) of sequence b that hold keys (<= 0: the split is empty)."""
    return T.min(T.ceildiv(sequence_keys(SL, b, max_pages), PAGE) - sp * split, split)


@tlx.jit(target=C.TARGET, assume=["1 <= P", "1 <= MP", f"MP <= {MAX_PAGES}", "B <= 65535"])
def mla_split_kernel(tokens: int, heads: int, kv_dtype: str, softmax_scale: float, num_stages: int = 1,
                     split_pages: int = SPLIT_PAGES):
    """Partial attention of each (64-row block, split, sequence): ``OP [B, NS, T*H, 512]`` fp32
    normalised, ``LP [B, NS, T*H]`` fp32 log-sum-exp (NS = ceil(MP / split_pages); splits past
    the sequence are not written)."""
    split = check_split(split_pages)
    rows = tokens * heads
    row_blocks = -(-rows // ROWS)
    fp8 = kv_dtype == "float8_e4m3"
    scale_log2 = softmax_scale * LOG2E
    batch, pages, max_pages = T.dynamic("B"), T.dynamic("P"), T.dynamic("MP")
    f32 = "float32"
    bf16 = "bfloat16"

    @T.prim_func
    def kernel(Q: T.Tensor((batch, tokens, heads, D_QK), bf16), KV: T.Tensor((pages, PAGE, D_QK), kv_dtype),
               KVS: T.Tensor((pages if fp8 else 1, *SCALE_TILE), f32), BT: T.Tensor((batch, max_pages), "int32"),
               SL: T.Tensor((batch,), "int32"), OP: T.Tensor((batch, splits_of(max_pages, split), rows, D_V), f32),
               LP: T.Tensor((batch, splits_of(max_pages, split), rows), f32)):
        with T.Kernel(row_blocks, splits_of(max_pages, split), batch, threads=256) as (rb, sp, b):
            # the TMA producer gives its registers to the two consumer warpgroups (TileLang
            # leaves the reallocation out by itself here: the producer assigns a variable)
            T.annotate_producer_reg_dealloc(24)
            T.annotate_consumer_reg_alloc(240)
            Q_s = T.alloc_shared((ROWS, D_V), bf16)
            QP_s = T.alloc_shared((ROWS, D_PE), bf16)
            KV_s = T.alloc_shared((PAGE, D_V), bf16)
            KP_s = T.alloc_shared((PAGE, D_PE), bf16)
            if fp8:
                KQ_s = T.alloc_shared((PAGE, D_V), kv_dtype)
                KQP_s = T.alloc_shared((PAGE, D_PE), kv_dtype)
                KS_s = T.alloc_shared(SCALE_TILE, f32)  # the page's 64 x 9 scales, row-major
                KQ_f = T.alloc_fragment((PAGE, D_V), kv_dtype)
            else:
                KQ_s = KQP_s = KS_s = KQ_f = None
            acc_s = T.alloc_fragment((ROWS, PAGE), f32)
            # P (the two warpgroups' key halves meet here): with an e4m3 cache in KP_s, the dequantized
            # rope keys, dead once S is computed (both warpgroups have passed the softmax's barriers
            # before P is written); that 8 KB lets two e4m3 pages be in flight
            P_s = KP_s if fp8 else T.alloc_shared((ROWS, PAGE), bf16)
            acc_o = T.alloc_fragment((ROWS, D_V), f32)
            m, m_prev, m_scaled, alpha, l, row_sum, lse_rows = C.row_state(ROWS)
            bad = T.alloc_var("int32")  # a table entry of this split lies outside [0, P)
            seq = T.alloc_var("int32")  # keys of the sequence (past the table's pages: none)
            count = T.alloc_var("int32")  # pages of this split that hold keys (<= 0: none)
            seq = sequence_keys(SL, b, max_pages)
            count = pages_in_split(SL, b, sp, max_pages, split)
            first = sp * split
            r0 = rb * ROWS
            # the guard is the expression, not the variable: TileLang's warp specialization
            # evaluates it before the statements above (which it copies into the producer
            # and consumer branches), so `count > 0` read the variable's initial 0 (H200,
            # 2026-12-02: every split was skipped, the combine read uninitialised partials)
            if pages_in_split(SL, b, sp, max_pages, split) > 0:
                if heads % ROWS == 0:
                    # a block's 64 rows are 64 heads of one token, contiguous: one bulk copy each
                    T.copy(Q[b, r0 // heads, r0 % heads:r0 % heads + ROWS, 0:D_V], Q_s)
                    T.copy(Q[b, r0 // heads, r0 % heads:r0 % heads + ROWS, D_V:D_QK], QP_s)
                else:
                    # rows past T * H are zeros: 16-byte pieces, 36 a thread, by the first warpgroup
                    # only. (The first 256 threads did not work: TileLang simplifies the guard
                    # `tx < 256` away against the 256 threads declared, and then adds the producer's
                    # 128, which ran the loads past the tiles: `tlx check` gave the counterexample.)
                    tx = T.get_thread_binding()
                    if tx < C.WARPGROUP:
                        load_queries(Q, Q_s, QP_s, b, tx, C.WARPGROUP, lambda i: (
                            T.min(r0 + i, rows - 1) // heads, T.min(r0 + i, rows - 1) % heads, r0 + i < rows))
                C.init_softmax(m, m_scaled, l, acc_o)
                bad = 0
                for t in T.Pipelined(count, num_stages=num_stages):
                    # the table entry is read where it is used (not kept in a variable): the
                    # copies run in TileLang's producer warps, which do not see the consumers' variables
                    # (checked here, in the page loop: a check hoisted before it, under a branch on the
                    # split's page count, cost the analysis its batch-invariance verdict and no measurable time)
                    if entry_outside(BT, b, first + t, pages):
                        bad = 1
                    load_page(KV, KVS, KQ_s, KQP_s, KS_s, KQ_f, KV_s, KP_s, lambda: clamped_page(BT, b, first + t, pages),
                              lambda: (first + t + 1) * PAGE <= seq, lambda i: (first + t) * PAGE + i < seq, fp8,
                              DEQUANT_LAYOUT)
                    k0 = (first + t) * PAGE
                    # the nope product is issued without waiting for it: the rope product's wait covers both
                    T.wgmma_gemm(Q_s, KV_s, acc_s, transpose_B=True, clear_accum=True, policy=T.GemmWarpPolicy.FullCol)
                    T.gemm(QP_s, KP_s, acc_s, transpose_B=True, policy=T.GemmWarpPolicy.FullCol)
                    if not fp8:  # an e4m3 page's dequant wrote the zeros
                        zero_past_sequence(KV_s, lambda: k0, lambda: seq)
                    if k0 + PAGE > seq - tokens + (r0 // heads):
                        for i, j in T.Parallel(ROWS, PAGE):
                            acc_s[i, j] = T.if_then_else(k0 + j <= seq - tokens + (r0 + i) // heads, acc_s[i, j], C.neg_inf())
                    C.softmax_step(acc_s, m, m_prev, m_scaled, alpha, l, row_sum, scale_log2, ROWS, PAGE)
                    T.copy(acc_s, P_s)
                    C.rescale_rows(acc_o, alpha, ROWS, D_V)
                    T.gemm(P_s, KV_s, acc_o, policy=T.GemmWarpPolicy.FullCol)
                C.finish_rows(acc_o, l, m_scaled, lse_rows, ROWS, D_V)
                for i, d in T.Parallel(ROWS, D_V):
                    if r0 + i < rows:
                        OP[b, sp, r0 + i, d] = T.if_then_else(bad == 0, acc_o[i, d], nan())
                for i in T.Parallel(ROWS):
                    if r0 + i < rows:
                        LP[b, sp, r0 + i] = T.if_then_else(bad == 0, lse_rows[i], nan())

    return kernel


PANELS = D_V // 64  # 64-column panels of a page's nope keys (one 128-byte swizzle atom a row)
OVERLAP_BARRIER = C.NAMED_BARRIER  # the overlap kernel's consumer-wide named barrier


@tlx.jit(target=C.TARGET, assume=["1 <= P", "1 <= MP", f"MP <= {MAX_PAGES}", "B <= 65535"])
def mla_split_overlap_kernel(tokens: int, heads: int, softmax_scale: float, split_pages: int = SPLIT_PAGES):
    """``mla_split_kernel`` (bf16 cache, 64 heads of one token a block) scheduled by hand so that
    the tensor cores and the softmax overlap: page t's scores ``S_t`` are issued, then the
    previous page's ``P V`` product, and page t's softmax runs while that product does. A
    producer warpgroup loads each page by TMA as eight 64-column panels and the rope keys, each
    on its own barrier, so that the score product's first steps start when the first panel
    lands (two page slots: the next page's panels arrive during this page's products). The
    same instructions per page as ``mla_split_kernel`` in the same order per value (the score
    chain is split at panel boundaries, not reordered): the same bits. Measured slower than the
    default (H100, 2026-12-05, B128 ctx 8192 H128: 0.90x at T1, 0.935x at T2), so not the
    default (ncu: SM 41%, memory 52% of peak; where its pages wait is not yet profiled)."""
    split = check_split(split_pages)
    if heads % ROWS:
        raise ValueError(f"heads: the overlap split kernel takes a multiple of {ROWS}, got {heads}")
    rows = tokens * heads
    scale_log2 = softmax_scale * LOG2E
    batch, pages, max_pages = T.dynamic("B"), T.dynamic("P"), T.dynamic("MP")
    f32, bf16 = "float32", "bfloat16"
    consumers = 2 * C.WARPGROUP

    @T.macro
    def issue_scores(Q_s, QP_s, KV_s, KP_s, acc_s, nope_full, rope_full, t):
        """``S_t = Q K_t^T`` issued panel by panel as each lands (asynchronous wgmma)."""
        for c in T.unroll(PANELS):
            T.mbarrier_wait_parity(nope_full[t % 2 * PANELS + c], (t // 2) & 1)
            T.wgmma_gemm(Q_s[:, c * 64:(c + 1) * 64], KV_s[t % 2, :, c * 64:(c + 1) * 64], acc_s, transpose_B=True,
                         clear_accum=c == 0, policy=T.GemmWarpPolicy.FullCol)
        T.mbarrier_wait_parity(rope_full[t % 2], (t // 2) & 1)
        T.wgmma_gemm(QP_s, KP_s[t % 2, :, :], acc_s, transpose_B=True, policy=T.GemmWarpPolicy.FullCol)

    @T.macro
    def page_softmax(acc_s, m, m_prev, m_scaled, alpha, l, row_sum, seq, first, r0, t):
        """Page t's scores (done) through the online softmax: the keys past each row's last
        masked, then ``mla_split_kernel``'s step."""
        if (first + t) * PAGE + PAGE > seq - tokens + (r0 // heads):
            for i, j in T.Parallel(ROWS, PAGE):
                acc_s[i, j] = T.if_then_else((first + t) * PAGE + j <= seq - tokens + (r0 + i) // heads, acc_s[i, j], C.neg_inf())
        C.softmax_step(acc_s, m, m_prev, m_scaled, alpha, l, row_sum, scale_log2, ROWS, PAGE)

    @T.macro
    def publish(acc_s, KV_s, KP_s, seq, first, t):
        """Page t's P into its slot's rope keys (read by its score product only, done: the
        softmax's reductions came after both warpgroups' wait for it) and, on the sequence's last page,
        zeros in its slots past the sequence (they may hold anything, NaN too, and P V would
        give 0 * NaN); then the consumers' barrier, before P V reads them."""
        if (first + t) * PAGE + PAGE > seq:
            for i, d in T.Parallel(PAGE, D_V):
                if (first + t) * PAGE + i >= seq:
                    KV_s[t % 2, i, d] = T.Cast(bf16, 0)
        T.copy(acc_s, KP_s[t % 2, :, :])
        T.fence_proxy_async()  # plain stores, read by wgmma
        T.sync_threads(OVERLAP_BARRIER, consumers)

    @T.prim_func
    def kernel(Q: T.Tensor((batch, tokens, heads, D_QK), bf16), KV: T.Tensor((pages, PAGE, D_QK), bf16),
               BT: T.Tensor((batch, max_pages), "int32"), SL: T.Tensor((batch,), "int32"),
               OP: T.Tensor((batch, splits_of(max_pages, split), rows, D_V), f32),
               LP: T.Tensor((batch, splits_of(max_pages, split), rows), f32)):
        with T.Kernel(rows // ROWS, splits_of(max_pages, split), batch, threads=consumers + C.WARPGROUP) as (rb, sp, b):
            Q_s = T.alloc_shared((ROWS, D_V), bf16)
            QP_s = T.alloc_shared((ROWS, D_PE), bf16)
            KV_s = T.alloc_shared((2, PAGE, D_V), bf16)
            KP_s = T.alloc_shared((2, PAGE, D_PE), bf16)
            acc_s = T.alloc_fragment((ROWS, PAGE), f32)
            acc_o = T.alloc_fragment((ROWS, D_V), f32)
            m, m_prev, m_scaled, alpha, l, row_sum, lse_rows = C.row_state(ROWS)
            q_full = T.alloc_barrier(C.WARPGROUP)
            nope_full = T.alloc_barrier([C.WARPGROUP] * (2 * PANELS))  # slot s, panel c: s * PANELS + c
            rope_full = T.alloc_barrier([C.WARPGROUP] * 2)
            empty = T.alloc_barrier([consumers] * 2)
            bad = T.alloc_var("int32")  # a table entry of this split lies outside [0, P)
            tx = T.get_thread_binding()
            seq = sequence_keys(SL, b, max_pages)
            count = pages_in_split(SL, b, sp, max_pages, split)
            first = sp * split
            r0 = rb * ROWS
            if count > 0:
                if tx >= consumers:
                    T.set_max_nreg(24, 0)
                    T.tma_copy(Q[b, r0 // heads, r0 % heads:r0 % heads + ROWS, 0:D_V], Q_s, barrier=q_full)
                    T.tma_copy(Q[b, r0 // heads, r0 % heads:r0 % heads + ROWS, D_V:D_QK], QP_s, barrier=q_full)
                    T.mbarrier_arrive(q_full)
                    for t in T.serial(count):
                        T.mbarrier_wait_parity(empty[t % 2], ((t // 2) & 1) ^ 1)
                        for c in T.unroll(PANELS):
                            T.tma_copy(KV[clamped_page(BT, b, first + t, pages), :, c * 64:(c + 1) * 64],
                                       KV_s[t % 2, :, c * 64:(c + 1) * 64], barrier=nope_full[t % 2 * PANELS + c])
                            T.mbarrier_arrive(nope_full[t % 2 * PANELS + c])
                        T.tma_copy(KV[clamped_page(BT, b, first + t, pages), :, D_V:D_QK], KP_s[t % 2, :, :],
                                   barrier=rope_full[t % 2])
                        T.mbarrier_arrive(rope_full[t % 2])
                else:
                    T.set_max_nreg(240, 1)
                    C.init_softmax(m, m_scaled, l, acc_o)
                    bad = 0
                    T.mbarrier_wait_parity(q_full, 0)
                    issue_scores(Q_s, QP_s, KV_s, KP_s, acc_s, nope_full, rope_full, 0)
                    T.wait_wgmma(0)
                    if entry_outside(BT, b, first, pages):
                        bad = 1
                    page_softmax(acc_s, m, m_prev, m_scaled, alpha, l, row_sum, seq, first, r0, 0)
                    publish(acc_s, KV_s, KP_s, seq, first, 0)
                    # S_t, then P_(t-1) V_(t-1) on the tensor cores; page t's softmax overlaps the
                    # latter (every wgmma issued outside a branch: ptxas serializes them otherwise)
                    for t in T.serial(1, T.max(count, 1)):
                        issue_scores(Q_s, QP_s, KV_s, KP_s, acc_s, nope_full, rope_full, t)
                        C.rescale_rows(acc_o, alpha, ROWS, D_V)
                        T.wgmma_gemm(KP_s[(t - 1) % 2, :, :], KV_s[(t - 1) % 2, :, :], acc_o, policy=T.GemmWarpPolicy.FullCol)
                        T.wait_wgmma(1)
                        if entry_outside(BT, b, first + t, pages):
                            bad = 1
                        page_softmax(acc_s, m, m_prev, m_scaled, alpha, l, row_sum, seq, first, r0, t)
                        T.wait_wgmma(0)
                        # both warpgroups' P_(t-1) V_(t-1) are done: page t-1's slot is free
                        T.sync_threads(OVERLAP_BARRIER, consumers)
                        T.mbarrier_arrive(empty[(t - 1) % 2])
                        publish(acc_s, KV_s, KP_s, seq, first, t)
                    C.rescale_rows(acc_o, alpha, ROWS, D_V)
                    T.gemm(KP_s[(count - 1) % 2, :, :], KV_s[(count - 1) % 2, :, :], acc_o, policy=T.GemmWarpPolicy.FullCol)
                    C.finish_rows(acc_o, l, m_scaled, lse_rows, ROWS, D_V)
                    for i, d in T.Parallel(ROWS, D_V):
                        OP[b, sp, r0 + i, d] = T.if_then_else(bad == 0, acc_o[i, d], nan())
                    for i in T.Parallel(ROWS):
                        LP[b, sp, r0 + i] = T.if_then_else(bad == 0, lse_rows[i], nan())

    return kernel


KEY_MAJOR_ROWS = (16, 32)  # query rows (tokens x heads) the key-major split kernel takes


def p_words(rows: int) -> int:
    """Words of the key-major kernels' staged p (``p_index``)."""
    return 2 * (32 * (rows + 2) + 16)


def p_index(key, j, rows: int):
    """Word of p (``key``, row ``j``) in the key-major kernels' staged p: each 32-key half as rows of
    ``rows + 2`` words, the second half 16 words past the first's end. A warp's reads of the ordered
    row sums (``ordered_chain``: 4 rows, 8 chains each) then hit 32 banks; a plain [64, rows] tile
    put 8 lanes on one bank (``tlx check``'s banks analysis, 8-way), 8 loads a thread a page."""
    return key // 32 * (32 * (rows + 2) + 16) + key % 32 * (rows + 2) + j


def ordered_chain(p_s, j, c, rows: int):
    """Chain ``c`` (0..7: 32-key half ``c // 4``, lane quad ``q = c % 4``) of column ``j``'s row sum
    over ``p_s`` (fp32 p of 64 keys, ``p_index``), in the order the row-major kernel adds it (TileLang's
    reduce over its two warpgroups' m64n32 score fragments, which ``mla_tile.cuh`` writes out):
    the keys 8 j' + 2 q + c' of the half in the order (j', c') = (0,0) (1,0) (2,0) (3,0) (0,1) ...
    (3,1). ``quad_sum`` then adds the chains as that kernel does."""
    half, q = c // 4, c % 4
    keys = [half * 32 + 8 * jj + 2 * q + cc for cc in range(2) for jj in range(4)]
    acc = p_s[p_index(keys[0], j, rows)]
    for k in keys[1:]:
        acc = T.ieee_add(acc, p_s[p_index(k, j, rows)])
    return acc


def quad_sum(part, j):
    """The row sum from its chains ``part[j, 0..7]``: the halves of each quad added, ``x_q = part[j,
    q] + part[j, 4 + q]``, then the quads' xor-2 and xor-1 shuffle sums, ``(x0 + x2) + (x1 + x3)``
    (each a single add of two values, the same whichever lane holds which)."""
    x = [T.ieee_add(part[j, q], part[j, 4 + q]) for q in range(4)]
    return T.ieee_add(T.ieee_add(x[0], x[2]), T.ieee_add(x[1], x[3]))


@T.macro
def key_major_queries(Q, Q_s, QP_s, b, heads: int, part: int = 0, parts: int = 1):
    """Sequence b's query rows (token-major, ``t * heads + h``) into ``Q_s`` / ``QP_s``: column
    block ``part`` of ``parts`` (warpgroups that load one tile together)."""
    for i, d in T.Parallel(Q_s.shape[0], D_V // parts):
        Q_s[i, part * (D_V // parts) + d] = Q[b, i // heads, i % heads, part * (D_V // parts) + d]
    for i, d in T.Parallel(QP_s.shape[0], D_PE // parts):
        QP_s[i, part * (D_PE // parts) + d] = Q[b, i // heads, i % heads, D_V + part * (D_PE // parts) + d]


@T.macro
def key_major_scores(KV_p, KP_p, Q_s, QP_s, acc_t):
    """``S^T = K Q^T`` of a page (``KV_p`` / ``KP_p``: its nope and rope keys, bf16) into ``acc_t``."""
    T.gemm(KV_p, Q_s, acc_t, transpose_B=True, clear_accum=True, policy=T.GemmWarpPolicy.FullCol)
    T.gemm(KP_p, QP_s, acc_t, transpose_B=True, policy=T.GemmWarpPolicy.FullCol)


@T.macro
def key_major_update(KV_p, P_s, p_s, part_s, acc_t, acc_o, m, m_prev, m_scaled, alpha, l, row_sum, k0, seq,
                     tokens: int, heads: int, scale_log2: float):
    """A page's online-softmax step on ``acc_t = S^T`` and ``O^T += V^T P^T`` (``C.softmax_step``
    with the rows as columns, the row sum in the row-major kernel's order): the page's first key
    is ``k0()``, the sequence's keys ``seq()`` (callables: see ``dequant_page``); ``KV_p``'s slots
    past the sequence must hold finite values (zeros)."""
    rows = tokens * heads
    if k0() + PAGE > seq() - tokens:
        for i, j in T.Parallel(PAGE, rows):
            acc_t[i, j] = T.if_then_else(k0() + i <= seq() - tokens + j // heads, acc_t[i, j], C.neg_inf())
    T.copy(m, m_prev)
    T.reduce_max(acc_t, m, dim=0, clear=False)
    C.rescale_state(m, m_prev, m_scaled, alpha, scale_log2, rows)
    for i, j in T.Parallel(PAGE, rows):
        acc_t[i, j] = T.exp2(T.ieee_fmaf(acc_t[i, j], T.float32(scale_log2), -m_scaled[j]))
    for i, j in T.Parallel(PAGE, rows):
        p_s[p_index(i, j, rows)] = acc_t[i, j]
    for j, c in T.Parallel(rows, 8):
        part_s[j, c] = ordered_chain(p_s, j, c, rows)
    for j in T.Parallel(rows):
        row_sum[j] = quad_sum(part_s, j)
        l[j] = T.ieee_fmaf(l[j], alpha[j], row_sum[j])
    for i, j in T.Parallel(PAGE, rows):
        P_s[j, i] = T.Cast("bfloat16", acc_t[i, j])
    for d, j in T.Parallel(D_V, rows):
        acc_o[d, j] = acc_o[d, j] * alpha[j]
    T.gemm(KV_p, P_s, acc_o, transpose_A=True, transpose_B=True, policy=T.GemmWarpPolicy.FullCol)


@T.macro
def key_major_finish(acc_o, l, m_scaled, lse_rows, OP, LP, b, sp, good):
    """The split's normalised ``O^T`` and log-sum-exp into ``OP`` / ``LP``, NaN unless ``good()``
    (no bad table entry; a callable: see ``dequant_page``)."""
    rows = lse_rows.shape[0]
    C.finish_rows(acc_o, l, m_scaled, lse_rows, rows, D_V, transposed=True)
    for d, j in T.Parallel(D_V, rows):
        OP[b, sp, j, d] = T.if_then_else(good(), acc_o[d, j], nan())
    for j in T.Parallel(rows):
        LP[b, sp, j] = T.if_then_else(good(), lse_rows[j], nan())

@tlx.jit(target=C.TARGET, assume=["1 <= P", "1 <= MP", f"MP <= {MAX_PAGES}", "B <= 65535"])
def mla_split_key_major_kernel(tokens: int, heads: int, kv_dtype: str, softmax_scale: float, num_stages: int = 1,
                               split_pages: int = SPLIT_PAGES, consumers: int = 1):
    """``mla_split_kernel`` for 16 or 32 query rows (``KEY_MAJOR_ROWS``: H 16 with 1 or 2 tokens,
    H 32 with 1), with the keys as the products' M side: ``S^T = K Q^T`` (wgmma m64nRk16, R the
    rows) and ``O^T += V^T P^T`` (V^T read transposed from the page tile, P K-major). The
    row-major kernel pads R rows to 64: three quarters (H 16) of its score product, of its output
    accumulator and of the products' shared-memory reads work on padding.

    The same bits as ``mla_split_kernel`` (and ``decode_mla.cu``) by construction: every score and
    output element is the same chain of k16 steps over the same operands, only with its operands'
    roles swapped (the row-major kernel's m64n32 and the baseline's m64n64 tiles already agree);
    the row max is exact; the row sum is added in the row-major kernel's order from a staged copy
    of p (``ordered_chain``, ``quad_sum``); the rest is elementwise, as in ``C.softmax_step``.

    ``consumers``: consumer warpgroups. 1: all rows in one; 2: each owns half of the rows in both
    products (m64n(R/2)k16; its softmax needs nothing of the other's) and does half of an e4m3
    page's dequant, and each reads the whole K and V^T tiles. (One consumer over an e4m3 cache:
    ``mla_split_key_major_fp8_kernel``.)"""
    split = check_split(split_pages)
    if consumers not in (1, 2):
        raise ValueError(f"consumers: expected 1 or 2, got {consumers!r}")
    if kv_dtype == "float8_e4m3" and consumers == 1:
        raise ValueError("consumers: one consumer warpgroup over an e4m3 cache is mla_split_key_major_fp8_kernel")
    rows = tokens * heads
    if rows not in KEY_MAJOR_ROWS:
        raise ValueError(f"tokens x heads: the key-major split kernel takes {KEY_MAJOR_ROWS} rows, got {tokens} x {heads}")
    fp8 = kv_dtype == "float8_e4m3"
    scale_log2 = softmax_scale * LOG2E
    batch, pages, max_pages = T.dynamic("B"), T.dynamic("P"), T.dynamic("MP")
    f32 = "float32"
    bf16 = "bfloat16"

    @T.prim_func
    def kernel(Q: T.Tensor((batch, tokens, heads, D_QK), bf16), KV: T.Tensor((pages, PAGE, D_QK), kv_dtype),
               KVS: T.Tensor((pages if fp8 else 1, *SCALE_TILE), f32), BT: T.Tensor((batch, max_pages), "int32"),
               SL: T.Tensor((batch,), "int32"), OP: T.Tensor((batch, splits_of(max_pages, split), rows, D_V), f32),
               LP: T.Tensor((batch, splits_of(max_pages, split), rows), f32)):
        with T.Kernel(splits_of(max_pages, split), batch, threads=C.WARPGROUP * consumers) as (sp, b):
            if consumers == 2:
                # 384 threads cap a thread at 168 registers (ptxas spilled 176 bytes at T2 H16); the
                # producer gives its registers to the consumers, as in mla_split_kernel
                T.annotate_producer_reg_dealloc(24)
                T.annotate_consumer_reg_alloc(240)
            Q_s = T.alloc_shared((rows, D_V), bf16)
            QP_s = T.alloc_shared((rows, D_PE), bf16)
            KV_s = T.alloc_shared((PAGE, D_V), bf16)
            KP_s = T.alloc_shared((PAGE, D_PE), bf16)
            if fp8:
                KQ_s = T.alloc_shared((PAGE, D_V), kv_dtype)
                KQP_s = T.alloc_shared((PAGE, D_PE), kv_dtype)
                KS_s = T.alloc_shared(SCALE_TILE, f32)
                KQ_f = T.alloc_fragment((PAGE, D_V), kv_dtype)
            else:
                KQ_s = KQP_s = KS_s = KQ_f = None
            P_s = T.alloc_shared((rows, PAGE), bf16)  # P rounded: the output product's B (K-major)
            p_s = T.alloc_shared((p_words(rows),), f32)  # p: the ordered row sum's operands (p_index)
            part_s = T.alloc_shared((rows, 8), f32)  # its eight chains a row
            acc_t = T.alloc_fragment((PAGE, rows), f32)  # S^T, then p
            acc_o = T.alloc_fragment((D_V, rows), f32)  # O^T
            m, m_prev, m_scaled, alpha, l, row_sum, lse_rows = C.row_state(rows)
            bad = T.alloc_var("int32")
            seq = T.alloc_var("int32")
            count = T.alloc_var("int32")
            seq = sequence_keys(SL, b, max_pages)
            count = pages_in_split(SL, b, sp, max_pages, split)
            first = sp * split
            if pages_in_split(SL, b, sp, max_pages, split) > 0:  # the expression: see mla_split_kernel
                key_major_queries(Q, Q_s, QP_s, b, heads)
                C.init_softmax(m, m_scaled, l, acc_o)
                bad = 0
                for t in T.Pipelined(count, num_stages=num_stages):
                    if entry_outside(BT, b, first + t, pages):
                        bad = 1
                    load_page(KV, KVS, KQ_s, KQP_s, KS_s, KQ_f, KV_s, KP_s, lambda: clamped_page(BT, b, first + t, pages),
                              lambda: (first + t + 1) * PAGE <= seq, lambda i: (first + t) * PAGE + i < seq, fp8,
                              dequant_layout(C.WARPGROUP * consumers))
                    k0 = (first + t) * PAGE
                    key_major_scores(KV_s, KP_s, Q_s, QP_s, acc_t)
                    if not fp8:
                        zero_past_sequence(KV_s, lambda: k0, lambda: seq)
                    key_major_update(KV_s, P_s, p_s, part_s, acc_t, acc_o, m, m_prev, m_scaled, alpha, l, row_sum,
                                     lambda: k0, lambda: seq, tokens, heads, scale_log2)
                key_major_finish(acc_o, l, m_scaled, lse_rows, OP, LP, b, sp, lambda: bad == 0)

    return kernel


# the e4m3 key-major kernel's producer warpgroups (one per bf16 page slot, alternate pages) ->
# (CTAs a SM, registers a thread of a producer and of the consumer). Two producers: one CTA a SM,
# 2 x 128 x 136 + 128 x 232 = 384 x 168, the CTA's registers at launch (an increase past them
# waits forever: 136 / 240 did, which tlx's progress check shows). One producer (16 query rows): 100 KB
# of shared memory, so two CTAs share a SM (__launch_bounds__(256, 2): 128 registers a thread at launch,
# 96 + 160 = 2 x 128; ptxas: no spills, the producer within 94 once its scales come by TMA), the
# other CTA's pages filling the gaps of this one's chain (its consumer waits while the one
# producer converts the next page): as fast as two producers (H100, 2026-12-06: 390.0 / 368.2 us).
FP8_SPLITS = {2: (1, (136, 232)), 1: (2, (96, 160))}
# the staged split by (consumers, producers), one CTA a SM: (1, 1) 256 threads, no register
# handover; (2, 1) two splits a CTA, 384 threads: 128 x 136 + 2 x 128 x 184 = 384 x 168 (ptxas: no
# spills; the producer spilled at 120 and fewer, holding a page's 36 pieces and their scales);
# (1, 2) two producers converting each page's halves: 128 x 232 + 2 x 128 x 136 = 384 x 168;
# (2, 2) 512 threads: 2 x 128 x 168 + 2 x 128 x 88 = 512 x 128 (18 pieces a producer thread; ptxas
# spilled a few bytes with 72 or 80 producer registers)
STAGED_SPLIT = {(1, 1): (1, (None, None)), (2, 1): (1, (136, 184)), (1, 2): (1, (136, 232)), (2, 2): (1, (88, 168))}
STAGED_BARRIER = C.NAMED_BARRIER  # the staged producers' named barrier (their threads have read the staging tile)
QUERY_BARRIER = C.NAMED_BARRIER + 1  # two consumers: both halves of the shared query tile are stored


def consumer_tiles(rows: int):
    """A key-major consumer warpgroup's own tiles, allocated where this is called inside a kernel:
    P (bf16, the output product's B), p (fp32, ``p_index``), the row sums' chains, S^T, O^T, the
    row state (``C.row_state``) and its bad-entry flag (the names ``consume`` unpacks)."""
    return (T.alloc_shared((rows, PAGE), "bfloat16"), T.alloc_shared((p_words(rows),), "float32"),
            T.alloc_shared((rows, 8), "float32"), T.alloc_fragment((PAGE, rows), "float32"),
            T.alloc_fragment((D_V, rows), "float32"), C.row_state(rows), T.alloc_local((1,), "int32"))


def pair_slot(n, count, count1):
    """The consumer (and bf16 slot) of the staged producer's step n with two consumers of ``count``
    and ``count1`` pages: alternately while both have pages left, then the one with more."""
    return T.if_then_else(n < 2 * T.min(count, count1), n % 2, T.if_then_else(count1 > count, 1, 0))


def pair_use(n, count, count1):
    """The page of its split (the slot's use) that step n converts (``pair_slot``)."""
    return T.if_then_else(n < 2 * T.min(count, count1), n // 2, n - T.min(count, count1))


def piece_scale(scale, KS_s, k, row, group, n):
    """The scale of a producer's piece ``k`` (key ``row``, scale ``group``) of its page step ``n``:
    from its registers ``scale``, or (``scale`` None) from the step's shared-memory slot."""
    return scale[k] if scale is not None else page_scale(KS_s, row, group, n % 2)


@tlx.jit(target=C.TARGET, assume=["1 <= P", "1 <= MP", f"MP <= {MAX_PAGES}", "B <= 65535"])
def mla_split_key_major_fp8_kernel(tokens: int, heads: int, softmax_scale: float, split_pages: int = SPLIT_PAGES,
                                   producers: int = 2, staged: bool = False, consumers: int = 1):
    """``mla_split_key_major_kernel`` for an e4m3 cache with the dequant off the consumer's path:
    two producer warpgroups, each owning one bf16 page slot in shared memory and the alternate
    pages of the split (producer w: pages t = w, w + 2, ...), load a page's e4m3 values and
    scales straight into registers (issued before waiting for their slot: the next page's loads
    are in flight while the consumer works on the last one), dequantize by the project's rule
    and store the bf16 keys (zeros for slots past the sequence); the one consumer warpgroup
    runs the key-major page step (``key_major_scores``, ``key_major_update``) on each slot in
    page order. The same bits as the other split kernels: the consumer's instructions per page
    are ``mla_split_key_major_kernel``'s, on the same bf16 values.

    A producer thread converts 36 pieces of 8 values a page (18 where two staged producers share
    a page): a warp reads 256 contiguous bytes of one key row (a rope piece: 64 of each of 4 rows)
    and stores whole 128-byte rows of the swizzled bf16 panels (no bank conflicts).

    ``producers`` 2 (pages in flight, one slot each; ``mla_decode``'s choice at 32 query rows) or 1
    (one slot, two CTAs a SM; ``FP8_SPLITS``): the same bits, each CTA's pages in the same order
    through the same code.

    ``staged`` (``mla_decode``'s choice at 16 query rows): one producer
    warpgroup (``producers=2``: two, converting the halves of each page), one CTA a SM, two bf16 slots (page t into slot t % 2) and a staging tile that TMA
    fills with the next page's e4m3 values and scales while the producer converts the last one
    (``produce_staged``): in the forms above a producer's next load waits for its conversion, so
    each holds at most one page in flight (H100, 2026-12-06: 322.0 against 368.2 us).

    ``consumers`` 2 (with ``staged``): two consumer warpgroups, each its own split of the sequence
    (CTA c takes splits 2 c and 2 c + 1), bf16 slot w consumer w's; the producers convert their
    pages alternately (then the longer split's rest) and the consumers share the query tile. The
    same bits: each split's pages through the same consumer code, its partials written as its own.
    Measured (H100, 2026-12-06 18:36, B128 ctx 8192 H16, ``.pdlcopy``-style A/B, bits equal): one
    producer with two consumers 322.6 us against one consumer's 320.7, so the SM's pages a
    microsecond did not move with a second consumer chain. ``producers=2`` with ``staged``, two
    producer warpgroups converting the halves of each page (18 pieces a thread), measured at 20:46
    (the same A/B, 322.3 us the single form): with one consumer 327.4, with two 307.0 (69.2% of the
    copy's rate; ``mla_decode``'s paired choice where B x splits exceeds the SM count). Neither a
    second producer nor a second consumer alone moves an SM's pages a microsecond, both together
    5%: what bounds the split is shared by both (about 2.5 us a page and SM)."""
    split = check_split(split_pages)
    if producers not in FP8_SPLITS:
        raise ValueError(f"producers: expected one of {tuple(FP8_SPLITS)}, got {producers!r}")
    if consumers not in (1, 2) or (consumers == 2 and not staged):
        raise ValueError(f"consumers: expected 1, or 2 with staged=True, got {consumers!r} (staged={staged!r})")
    if staged and tokens * heads != KEY_MAJOR_ROWS[0]:
        raise ValueError(f"staged: takes {KEY_MAJOR_ROWS[0]} query rows (32 need 235 KB of shared memory), "
                         f"got {tokens} x {heads}")
    ctas_per_sm, (producer_regs, consumer_regs) = STAGED_SPLIT[consumers, producers] if staged else FP8_SPLITS[producers]
    # a page's converting threads: a staged page's are all producer warpgroups', else one's
    page_threads = C.WARPGROUP * (producers if staged else 1)
    v_pieces, pe_pieces = PAGE * D_V // 8 // page_threads, PAGE * D_PE // 8 // page_threads  # 8-value pieces a thread
    v_rows, pe_rows = page_threads // 64, page_threads // 8  # key rows of one piece step (nope, rope)
    # bf16 page slots: one consumer's page t in slot t % slots; two consumers: slot w consumer w's
    slots = 2 if staged else producers
    if producers == 1 and not staged and tokens * heads != KEY_MAJOR_ROWS[0]:
        raise ValueError(f"producers: one producer (two CTAs a SM) takes {KEY_MAJOR_ROWS[0]} query rows (32 need 130 KB "
                         f"of shared memory a CTA), got {tokens} x {heads}")
    rows = tokens * heads
    if rows not in KEY_MAJOR_ROWS:
        raise ValueError(f"tokens x heads: the key-major split kernel takes {KEY_MAJOR_ROWS} rows, got {tokens} x {heads}")
    scale_log2 = softmax_scale * LOG2E
    batch, pages, max_pages = T.dynamic("B"), T.dynamic("P"), T.dynamic("MP")
    f32, bf16, e4m3 = "float32", "bfloat16", "float8_e4m3"

    @T.macro
    def store_page(raw, scale, KS_s, KV_s, KP_s, slot, k0, seq, g, n):
        """Producer thread g's pieces ``raw`` of page step n (first key ``k0``) dequantized into bf16
        slot ``slot``: zeros for the keys past the sequence (the cache may hold anything there, NaN
        too; one branch a piece, on the sequence's last page only); the scales from ``scale`` or
        ``KS_s`` (``piece_scale``)."""
        if k0 + PAGE <= seq:
            for k in T.unroll(v_pieces):
                for v in T.vectorized(8):
                    KV_s[slot, v_rows * k + g // 64, g % 64 * 8 + v] = dequant(
                        raw[k, v], piece_scale(scale, KS_s, k, v_rows * k + g // 64, g % 64 // 8, n))
        else:
            for k in T.unroll(v_pieces):
                if k0 + v_rows * k + g // 64 < seq:
                    for v in T.vectorized(8):
                        KV_s[slot, v_rows * k + g // 64, g % 64 * 8 + v] = dequant(
                            raw[k, v], piece_scale(scale, KS_s, k, v_rows * k + g // 64, g % 64 // 8, n))
                else:
                    for v in T.vectorized(8):
                        KV_s[slot, v_rows * k + g // 64, g % 64 * 8 + v] = T.Cast(bf16, 0)
        for k in T.unroll(pe_pieces):
            for v in T.vectorized(8):
                KP_s[slot, pe_rows * k + g // 8, g % 8 * 8 + v] = dequant(
                    raw[v_pieces + k, v], piece_scale(scale, KS_s, v_pieces + k, pe_rows * k + g // 8, D_V // GROUP, n))
        T.fence_proxy_async()  # generic-proxy stores, read by the consumer's wgmma

    @T.macro
    def produce(KV, KVS, BT, KV_s, KP_s, KS_s, full, empty, scales_full, b, first, seq, count, g, w: int):
        """Producer warpgroup w (thread g of it): the split's pages w, w + producers, ... into slot w.
        Nope piece k: row ``2 k + g // 64``, columns ``g % 64 * 8 + 0..7``; rope piece k: row
        ``16 k + g // 8``, columns ``512 + g % 8 * 8 + 0..7``. The scales come with the values into
        registers, or (``KS_s``, one producer) by TMA into one of two shared-memory slots (page n
        into slot n % 2: page n - 2's conversions, its last reader, finished before the consumer
        released page n - 2's bf16 slot, which this producer waited for in step n - 1): 36 registers
        a thread fewer, which one producer's 128 (two CTAs a SM) need."""
        raw = T.alloc_local((v_pieces + pe_pieces, 8), e4m3)
        scale = T.alloc_local((v_pieces + pe_pieces,), "float32") if KS_s is None else None
        for n in T.serial(T.ceildiv(count - w, producers)):
            page = clamped_page(BT, b, first + producers * n + w, pages)
            if KS_s is not None:
                T.tma_copy(KVS[page, :, :], KS_s[n % 2, :, :], barrier=scales_full[n % 2])
                T.mbarrier_arrive(scales_full[n % 2])
            for k in T.unroll(v_pieces):
                for v in T.vectorized(8):
                    raw[k, v] = KV[page, v_rows * k + g // 64, g % 64 * 8 + v]
                if KS_s is None:
                    scale[k] = page_scale(KVS, v_rows * k + g // 64, g % 64 // 8, page)
            for k in T.unroll(pe_pieces):
                for v in T.vectorized(8):
                    raw[v_pieces + k, v] = KV[page, pe_rows * k + g // 8, D_V + g % 8 * 8 + v]
                if KS_s is None:
                    scale[v_pieces + k] = page_scale(KVS, pe_rows * k + g // 8, D_V // GROUP, page)
            T.mbarrier_wait_parity(empty[w], (n & 1) ^ 1)
            if KS_s is not None:
                T.mbarrier_wait_parity(scales_full[n % 2], (n // 2) & 1)
            store_page(raw, scale, KS_s, KV_s, KP_s, w, (first + producers * n + w) * PAGE, seq, g, n)
            T.mbarrier_arrive(full[w])

    @T.macro
    def stage_page(KV, KVS, BT, KQ_s, KQP_s, KS_s, staged_full, b, page_index):
        """The e4m3 values and scales of the sequence's page ``page_index`` into the staging tiles, by TMA."""
        page = clamped_page(BT, b, page_index, pages)
        T.tma_copy(KV[page, :, 0:D_V], KQ_s, barrier=staged_full)
        T.tma_copy(KV[page, :, D_V:D_QK], KQP_s, barrier=staged_full)
        T.tma_copy(KVS[page, :, :], KS_s[0, :, :], barrier=staged_full)
        T.mbarrier_arrive(staged_full)

    @T.macro
    def produce_staged(KV, KVS, BT, KQ_s, KQP_s, KS_s, KV_s, KP_s, staged_full, full, empty, b, seq, steps, page_of,
                       slot_of, use_of, g):
        """The staged producer (thread g), step n of ``steps``: the sequence's page ``page_of(n)`` into
        bf16 slot ``slot_of(n)``, that slot's use ``use_of(n)``. Step n's page arrives by TMA in the
        one staging tile while the producer still converts step n - 1's (its copy is issued as soon
        as every producer thread holds step n - 1's pieces in registers), so no page waits for its
        own load; then the pieces and their scales into registers (``produce``'s mapping, 8-byte
        shared-memory reads), the next step's copy, the wait for the slot and the conversion into
        it (from registers only: scales read from shared memory there made TileLang's storage sync
        put a barrier into every piece's conversion)."""
        raw = T.alloc_local((v_pieces + pe_pieces, 8), e4m3)
        scale = T.alloc_local((v_pieces + pe_pieces,), "float32")
        stage_page(KV, KVS, BT, KQ_s, KQP_s, KS_s, staged_full, b, page_of(0))
        for n in T.serial(steps):
            T.mbarrier_wait_parity(staged_full, n & 1)
            for k in T.unroll(v_pieces):
                for v in T.vectorized(8):
                    raw[k, v] = KQ_s[v_rows * k + g // 64, g % 64 * 8 + v]
                scale[k] = page_scale(KS_s, v_rows * k + g // 64, g % 64 // 8, 0)
            for k in T.unroll(pe_pieces):
                for v in T.vectorized(8):
                    raw[v_pieces + k, v] = KQP_s[pe_rows * k + g // 8, g % 8 * 8 + v]
                scale[v_pieces + k] = page_scale(KS_s, pe_rows * k + g // 8, D_V // GROUP, 0)
            T.sync_threads(STAGED_BARRIER, page_threads)  # every piece read: the tiles may be refilled
            if n + 1 < steps:
                stage_page(KV, KVS, BT, KQ_s, KQP_s, KS_s, staged_full, b, page_of(n + 1))
            T.mbarrier_wait_parity(empty[slot_of(n)], (use_of(n) & 1) ^ 1)
            store_page(raw, scale, None, KV_s, KP_s, slot_of(n), page_of(n) * PAGE, seq, g, n)
            T.mbarrier_arrive(full[slot_of(n)])

    @T.macro
    def consume(BT, OP, LP, KV_s, KP_s, Q_s, QP_s, tiles, full, empty, b, sp, seq, count, slot_of, use_of):
        """A consumer warpgroup (its ``consumer_tiles``): split ``sp``'s ``count`` pages, page t from
        bf16 slot ``slot_of(t)`` (that slot's use ``use_of(t)``), then the split's partial output."""
        P_s, p_s, part_s, acc_t, acc_o, state, bad = tiles
        m, m_prev, m_scaled, alpha, l, row_sum, lse_rows = state
        C.init_softmax(m, m_scaled, l, acc_o)
        bad[0] = 0
        for t in T.serial(count):
            if entry_outside(BT, b, sp * split + t, pages):
                bad[0] = 1
            T.mbarrier_wait_parity(full[slot_of(t)], use_of(t) & 1)
            key_major_scores(KV_s[slot_of(t), :, :], KP_s[slot_of(t), :, :], Q_s, QP_s, acc_t)
            key_major_update(KV_s[slot_of(t), :, :], P_s, p_s, part_s, acc_t, acc_o, m, m_prev, m_scaled,
                             alpha, l, row_sum, lambda: (sp * split + t) * PAGE, lambda: seq, tokens, heads, scale_log2)
            T.mbarrier_arrive(empty[slot_of(t)])
        key_major_finish(acc_o, l, m_scaled, lse_rows, OP, LP, b, sp, lambda: bad[0] == 0)

    @T.prim_func
    def kernel(Q: T.Tensor((batch, tokens, heads, D_QK), bf16), KV: T.Tensor((pages, PAGE, D_QK), e4m3),
               KVS: T.Tensor((pages, *SCALE_TILE), f32), BT: T.Tensor((batch, max_pages), "int32"),
               SL: T.Tensor((batch,), "int32"), OP: T.Tensor((batch, splits_of(max_pages, split), rows, D_V), f32),
               LP: T.Tensor((batch, splits_of(max_pages, split), rows), f32)):
        with T.Kernel(T.ceildiv(splits_of(max_pages, split), consumers), batch,
                      threads=C.WARPGROUP * (consumers + producers)) as (cta, b):
            if ctas_per_sm > 1:
                T.annotate_min_blocks_per_sm(ctas_per_sm)
            Q_s = T.alloc_shared((rows, D_V), bf16)
            QP_s = T.alloc_shared((rows, D_PE), bf16)
            KV_s = T.alloc_shared((slots, PAGE, D_V), bf16)
            KP_s = T.alloc_shared((slots, PAGE, D_PE), bf16)
            # full[w]: the page's producer threads stored slot w's page; empty[w]: the consumer's 128 read it
            full = T.alloc_barrier([page_threads] * slots)
            empty = T.alloc_barrier([C.WARPGROUP] * slots)
            # one producer: its pages' scales by TMA, two slots (see produce)
            KS_s = T.alloc_shared((1 if staged else 2, *SCALE_TILE), f32) if producers == 1 or staged else None
            scales_full = T.alloc_barrier([C.WARPGROUP] * 2) if producers == 1 and not staged else None
            # staged: the next page's e4m3 values (the scales go to KS_s) and their barrier
            KQ_s = T.alloc_shared((PAGE, D_V), e4m3) if staged else None
            KQP_s = T.alloc_shared((PAGE, D_PE), e4m3) if staged else None
            staged_full = T.alloc_barrier([page_threads]) if staged else None
            tiles = consumer_tiles(rows)
            tiles1 = consumer_tiles(rows) if consumers == 2 else None
            tx = T.get_thread_binding()
            # bound values, not variables: tlx's progress check simulates the protocol at each
            # page count (a variable's value it does not follow)
            sp = cta * consumers
            seq = sequence_keys(SL, b, max_pages)
            count = pages_in_split(SL, b, sp, max_pages, split)
            count1 = T.max(pages_in_split(SL, b, sp + 1, max_pages, split), 0) if consumers == 2 else 0
            first = sp * split
            if count > 0:
                if tx < consumers * C.WARPGROUP:
                    if consumer_regs is not None:
                        T.set_max_nreg(consumer_regs, 1)
                    if consumers == 1:
                        key_major_queries(Q, Q_s, QP_s, b, heads)
                        consume(BT, OP, LP, KV_s, KP_s, Q_s, QP_s, tiles, full, empty, b, sp, seq, count,
                                lambda t: t % slots, lambda t: t // slots)
                    elif tx < C.WARPGROUP:
                        key_major_queries(Q, Q_s, QP_s, b, heads, 0, 2)
                        T.sync_threads(QUERY_BARRIER, 2 * C.WARPGROUP)
                        consume(BT, OP, LP, KV_s, KP_s, Q_s, QP_s, tiles, full, empty, b, sp, seq, count,
                                lambda t: 0, lambda t: t)
                    else:
                        key_major_queries(Q, Q_s, QP_s, b, heads, 1, 2)
                        T.sync_threads(QUERY_BARRIER, 2 * C.WARPGROUP)
                        if count1 > 0:
                            consume(BT, OP, LP, KV_s, KP_s, Q_s, QP_s, tiles1, full, empty, b, sp + 1, seq, count1,
                                    lambda t: 1, lambda t: t)
                elif staged and consumers == 2:
                    # the consumers' pages alternately while both have some, then the longer split's
                    # rest (the first's: a second split with pages leaves the first full, but the
                    # protocol holds for any two counts)
                    T.set_max_nreg(producer_regs, 0)
                    produce_staged(KV, KVS, BT, KQ_s, KQP_s, KS_s, KV_s, KP_s, staged_full, full, empty, b, seq,
                                   count + count1, lambda n: first + pair_slot(n, count, count1) * split + pair_use(n, count, count1),
                                   lambda n: pair_slot(n, count, count1), lambda n: pair_use(n, count, count1),
                                   tx - 2 * C.WARPGROUP)
                elif staged:
                    if producer_regs is not None:
                        T.set_max_nreg(producer_regs, 0)
                    produce_staged(KV, KVS, BT, KQ_s, KQP_s, KS_s, KV_s, KP_s, staged_full, full, empty, b, seq, count,
                                   lambda n: first + n, lambda n: n % 2, lambda n: n // 2, tx - C.WARPGROUP)
                elif tx < 2 * C.WARPGROUP or producers == 1:
                    T.set_max_nreg(producer_regs, 0)
                    produce(KV, KVS, BT, KV_s, KP_s, KS_s, full, empty, scales_full, b, first, seq, count, tx - C.WARPGROUP, 0)
                else:
                    T.set_max_nreg(producer_regs, 0)
                    produce(KV, KVS, BT, KV_s, KP_s, KS_s, full, empty, scales_full, b, first, seq, count, tx - 2 * C.WARPGROUP, 1)

    return kernel


@tlx.jit(target=C.TARGET, assume=["1 <= MP", f"MP <= {MAX_PAGES}", "B <= 65535"])
def mla_combine_kernel(tokens: int, heads: int, fixed_splits: int = 0, with_sink: bool = False,
                       split_pages: int = SPLIT_PAGES):
    """``O [B, T, H, 512]`` bf16 and ``LSE [B, T, H]`` from the splits of each sequence (the
    module docstring's order). One CTA per (sequence, token): 128 threads x 4 output columns.

    ``fixed_splits`` > 0: every row has that many splits (sparse decode) instead of the count
    from its sequence's length. ``with_sink``: ``SINK [H]`` (natural-log units) joins each
    row's softmax as one more logit without a value: ``m`` starts at the sink and ``s`` at
    ``exp2((sink - m) * log2 e)``; otherwise SINK is not read. ``split_pages``: the split
    kernel's (unused with ``fixed_splits``)."""
    split = check_split(split_pages)
    rows = tokens * heads
    batch, max_pages = T.dynamic("B"), T.dynamic("MP")
    f32 = "float32"
    ns = fixed_splits if fixed_splits else splits_of(max_pages, split)

    @T.prim_func
    def kernel(BT: T.Tensor((batch, max_pages), "int32"), SL: T.Tensor((batch,), "int32"),
               OP: T.Tensor((batch, ns, rows, D_V), f32), LP: T.Tensor((batch, ns, rows), f32),
               SINK: T.Tensor((heads,), f32),
               O: T.Tensor((batch, tokens, heads, D_V), "bfloat16"), LSE: T.Tensor((batch, tokens, heads), f32)):
        with T.Kernel(rows, batch, threads=128) as (r, b):
            tx = T.get_thread_binding()
            mx = T.alloc_var(f32)
            s = T.alloc_var(f32)
            acc = T.alloc_local((4,), f32)
            n = T.alloc_var("int32")  # the sequence's splits
            n = T.ceildiv(T.ceildiv(sequence_keys(SL, b, max_pages), PAGE), split)
            if fixed_splits:
                n = fixed_splits
            bad = T.alloc_var("int32")  # a split of a bad table entry: the row is NaN
            mx = SINK[r % heads] if with_sink else C.neg_inf()
            bad = 0
            for i in T.serial(n):
                mx = T.if_then_else(LP[b, i, r] > mx, LP[b, i, r], mx)
                # T.isnan, not `x != x`: TVM's simplifier folds `x != x` to false
                bad = T.if_then_else(T.isnan(LP[b, i, r]), 1, bad)
            s = lse_weight(SINK[r % heads], mx) if with_sink else T.float32(0)
            for i in T.serial(n):
                s = T.ieee_add(s, lse_weight(LP[b, i, r], mx))
            for c in T.unroll(4):
                acc[c] = T.float32(0)
            for i in T.serial(n):
                wgt = T.ieee_fdiv(lse_weight(LP[b, i, r], mx), s)
                for c in T.unroll(4):
                    acc[c] = T.ieee_fmaf(wgt, OP[b, i, r, tx * 4 + c], acc[c])
            for c in T.vectorized(4):
                O[b, r // heads, r % heads, tx * 4 + c] = T.Cast("bfloat16", T.if_then_else(
                    bad == 1, nan(), T.if_then_else(mx == C.neg_inf(), T.float32(0), acc[c])))
            if tx == 0:
                LSE[b, r // heads, r % heads] = T.if_then_else(
                    bad == 1, nan(), T.if_then_else(mx == C.neg_inf(), C.neg_inf(), T.ieee_add(mx, T.log(s))))

    return kernel


def _check(q, kv_cache, kv_scales, block_table, seq_lens, out=None, **more):
    """The shared argument checks of dense and sparse decode (``out``: the caller's (o, lse) or
    None; ``more``: further named tensors that must sit on q's device); returns whether the
    cache is e4m3."""
    C.check_tensor("q", q, (torch.bfloat16,), 4)
    b, t, h, d = q.shape
    if d != D_QK or not 1 <= t <= 4 or h not in (16, 32, 64, 128):
        raise ValueError(f"q: expected [B, 1..4, 16|32|64|128, {D_QK}], got {tuple(q.shape)}")
    C.check_tensor("kv_cache", kv_cache, tuple(KV_DTYPES), 3)
    if tuple(kv_cache.shape[1:]) != (PAGE, D_QK) or kv_cache.shape[0] < 1:
        raise ValueError(f"kv_cache: expected [P >= 1, {PAGE}, {D_QK}], got {tuple(kv_cache.shape)}")
    fp8 = kv_cache.dtype == torch.float8_e4m3fn
    if fp8:
        if kv_scales is None:
            raise ValueError("kv_scales: an e4m3 kv_cache needs its fp32 scales [P, 64, 9]")
        C.check_tensor("kv_scales", kv_scales, (torch.float32,), 3)
        if tuple(kv_scales.shape) != (kv_cache.shape[0], PAGE, D_QK // GROUP):
            raise ValueError(f"kv_scales: expected shape {(kv_cache.shape[0], PAGE, D_QK // GROUP)}, got {tuple(kv_scales.shape)}")
    elif kv_scales is not None:
        raise ValueError("kv_scales: expected None for a bf16 kv_cache")
    C.check_tensor("block_table", block_table, (torch.int32,), 2)
    if block_table.shape[0] != b or not 1 <= block_table.shape[1] <= MAX_PAGES:
        raise ValueError(f"block_table: expected [{b}, 1..{MAX_PAGES}], got {tuple(block_table.shape)}")
    C.check_tensor("seq_lens", seq_lens, (torch.int32,), 1)
    if seq_lens.shape[0] != b:
        raise ValueError(f"seq_lens: expected shape ({b},), got {tuple(seq_lens.shape)}")
    if b > 65535:
        raise ValueError(f"q: batch expected <= 65535, got {b}")
    tensors = dict(q=q, kv_cache=kv_cache, block_table=block_table, seq_lens=seq_lens, **more)
    if fp8:
        tensors["kv_scales"] = kv_scales
    if out is not None:
        if not isinstance(out, (tuple, list)) or len(out) != 2:
            raise TypeError(f"out: expected a pair (o, lse), got {type(out).__name__}")
        for name, given, dtype, shape in (("out[0]", out[0], torch.bfloat16, (b, t, h, D_V)),
                                          ("out[1]", out[1], torch.float32, (b, t, h))):
            C.check_tensor(name, given, (dtype,), len(shape))
            if tuple(given.shape) != shape:
                raise ValueError(f"{name}: expected shape {shape}, got {tuple(given.shape)}")
            tensors[name] = given
    C.check_cuda(**tensors)
    return fp8


def _outputs(q, out):
    """(o, lse): the caller's pair (checked by ``_check``) or new tensors."""
    if out is not None:
        return out
    b, t, h, _ = q.shape
    return (torch.empty((b, t, h, D_V), dtype=torch.bfloat16, device=q.device),
            torch.empty((b, t, h), dtype=torch.float32, device=q.device))


_ZEROS = {}


def _zeros(device, shape):
    """A cached fp32 zero tensor for an input a kernel variant does not read (bf16 cache scales,
    the sink of a decode without one)."""
    if (device, shape) not in _ZEROS:
        _ZEROS[device, shape] = torch.zeros(shape, dtype=torch.float32, device=device)
    return _ZEROS[device, shape]


def key_major_default(rows: int) -> int:
    """The split kernel ``mla_decode`` picks: key-major with one consumer warpgroup for 16 query
    rows (T x H). H16 T1, B128 ctx 8192, H200, 2026-12-05, interleaved: a bf16 cache read at 89.7%
    of the copy's rate against the row-major kernel's 81.0%; an e4m3 cache (the producers
    dequantize) 1.13x the row-major kernel (415 against 470 us). Row-major otherwise: at 32 rows
    (H16 T2) the key-major kernel ran 0.70x (bf16) and 0.84x (e4m3)."""
    return 1 if rows == KEY_MAJOR_ROWS[0] else 0


def split_kernel(tokens: int, heads: int, kv_dtype: str, softmax_scale: float, num_stages: int | None,
                 split_pages: int = SPLIT_PAGES, key_major: int | None = None, overlap: bool = False,
                 paired: bool = False):
    """The split kernel ``mla_decode`` launches: key-major with ``key_major`` consumer warpgroups
    (one over an e4m3 cache: ``mla_split_key_major_fp8_kernel``, with ``num_stages`` producers,
    one page in flight each; None: its staged form at 16 query rows, two producers at 32),
    row-major for 0, ``key_major_default`` for None. ``num_stages``
    None: 2 pages in flight, 1 for the e4m3 kernels whose consumers dequantize (``mla_decode``).
    ``overlap``: ``mla_split_overlap_kernel`` (row-major, bf16, two pages in flight). ``paired``
    (the staged form only): two splits a CTA, two producer warpgroups converting each page's
    halves (the same bits; ``mla_decode`` pairs where one split a CTA would take more than one
    wave of the SMs)."""
    if overlap:
        if kv_dtype != "bfloat16" or key_major or num_stages not in (None, 2):
            raise ValueError(f"overlap: takes a bf16 cache, the row-major kernel and 2 pages in flight, got {kv_dtype}, "
                             f"key_major={key_major!r}, num_stages={num_stages!r}")
        return mla_split_overlap_kernel(tokens, heads, softmax_scale, split_pages)
    if key_major is None:
        key_major = key_major_default(tokens * heads)
    fp8 = kv_dtype == "float8_e4m3"
    if key_major == 1 and fp8 and num_stages is None and tokens * heads == KEY_MAJOR_ROWS[0]:
        # H100, 2026-12-06, B128 ctx 8192 H16: 322.0 us against two producers' 368.2 (the same bits);
        # paired 307.0 against 322.3 (one producer with two consumers 322.6: the producer bounds it;
        # two producers with one consumer 327.4), at B64 (half the CTAs) the unpaired form 165.3
        pair = 2 if paired else 1
        return mla_split_key_major_fp8_kernel(tokens, heads, softmax_scale, split_pages, pair, True, pair)
    if num_stages is None:
        num_stages = 1 if fp8 and key_major != 1 else 2
    if key_major == 1 and fp8:
        if num_stages == 1 and tokens * heads != KEY_MAJOR_ROWS[0]:
            raise ValueError(f"num_stages: 1 with key_major=1 over an e4m3 cache (one producer warpgroup, two CTAs a SM) "
                             f"takes {KEY_MAJOR_ROWS[0]} query rows, got {tokens} x {heads}; use 2")
        return mla_split_key_major_fp8_kernel(tokens, heads, softmax_scale, split_pages, num_stages)
    if key_major:
        return mla_split_key_major_kernel(tokens, heads, kv_dtype, softmax_scale, num_stages, split_pages, key_major)
    return mla_split_kernel(tokens, heads, kv_dtype, softmax_scale, num_stages, split_pages)


def mla_decode(q: torch.Tensor, kv_cache: torch.Tensor, block_table: torch.Tensor, seq_lens: torch.Tensor,
               softmax_scale: float | None = None, kv_scales: torch.Tensor | None = None, out=None,
               num_stages: int | None = None, split_pages: int = SPLIT_PAGES, key_major: int | None = None,
               overlap: bool = False):
    """(o ``[B, T, H, 512]`` bf16, lse ``[B, T, H]`` fp32) of MLA decode over the paged cache
    (module docstring); ``softmax_scale`` defaults to ``576 ** -0.5``; ``out``: an (o, lse)
    pair to write (e.g. poisoned by a test), else new tensors. ``num_stages``: pages in flight
    per CTA (2: the next page's TMA load overlaps this page's products; the same bits either
    way). None: 2 for a bf16 cache (1.28-1.32x faster at B128 ctx 8192, H200, 2026-12-03), 1 for
    e4m3 (two fit since P shares the rope keys' buffer, but ran no faster: its dequant, not the
    copy, is the wait); for the e4m3 key-major kernel with one consumer, whose producers
    dequantize, the count of producer warpgroups (1: two CTAs a SM), and None its staged form
    (16 query rows: one producer, the next page staged by TMA; two splits a CTA with two producers
    where ``B x splits`` exceeds the SM count) or 2 producers (32 rows). ``split_pages``:
    pages per split (``SPLIT_CHOICES``); each size gives its own bits, the baseline's with the
    same size. ``key_major`` 1 or 2: the split kernel with the keys as the products' M side
    (``mla_split_key_major_kernel``, T x H in ``KEY_MAJOR_ROWS``) with that many consumer
    warpgroups (1 over an e4m3 cache: ``mla_split_key_major_fp8_kernel``), 0: the row-major
    kernel; the same bits either way. None:
    ``key_major_default`` (1 for 16 rows, else 0). ``overlap``: the row-major kernel scheduled so
    that each page's softmax overlaps the tensor cores (``mla_split_overlap_kernel``: bf16, H a
    multiple of 64; the same bits; 0.90-0.935x the default's speed at H128, H100 2026-12-05)."""
    check_split(split_pages)
    if not isinstance(overlap, bool):
        raise TypeError(f"overlap: expected a bool, got {type(overlap).__name__}")
    if overlap and (not isinstance(q, torch.Tensor) or q.dim() != 4 or q.shape[2] % ROWS):
        shape = tuple(q.shape) if isinstance(q, torch.Tensor) else type(q).__name__
        raise ValueError(f"overlap: needs heads a multiple of {ROWS}, got q of shape {shape}")
    if key_major is not None and (key_major not in (0, 1, 2) or isinstance(key_major, bool)):
        raise ValueError(f"key_major: expected 0, 1 or 2 (consumer warpgroups of the key-major kernel), got {key_major!r}")
    if key_major and (not isinstance(q, torch.Tensor) or q.dim() != 4 or q.shape[1] * q.shape[2] not in KEY_MAJOR_ROWS):
        shape = tuple(q.shape) if isinstance(q, torch.Tensor) else type(q).__name__
        raise ValueError(f"key_major: needs tokens x heads in {KEY_MAJOR_ROWS}, got q of shape {shape}")
    if num_stages is not None and num_stages not in (1, 2):
        raise ValueError(f"num_stages: expected 1 or 2, got {num_stages!r}")
    fp8 = _check(q, kv_cache, kv_scales, block_table, seq_lens, out)
    b, t, h, _ = q.shape
    mp = block_table.shape[1]
    scale = float(D_QK ** -0.5 if softmax_scale is None else softmax_scale)
    if not (math.isfinite(scale) and scale > 0):
        raise ValueError(f"softmax_scale: expected a positive finite number, got {softmax_scale}")
    rows, splits = t * h, -(-mp // split_pages)
    dev = q.device
    o, lse = _outputs(q, out)
    if b == 0:
        return o, lse
    kv_scales = kv_scales.view(-1, *SCALE_TILE) if fp8 else _zeros(dev, (1, *SCALE_TILE))
    part_o = torch.empty((b, splits, rows, D_V), dtype=torch.float32, device=dev)
    part_lse = torch.empty((b, splits, rows), dtype=torch.float32, device=dev)
    # two splits a CTA where one a CTA would take more than one wave of the SMs (the same bits)
    paired = b * splits > sm_count(dev.index)
    kernel = split_kernel(t, h, KV_DTYPES[kv_cache.dtype], scale, num_stages, split_pages, key_major, overlap, paired)
    if overlap:  # no scales: bf16 only
        kernel(q, kv_cache, block_table, seq_lens, part_o, part_lse)
    else:
        kernel(q, kv_cache, kv_scales, block_table, seq_lens, part_o, part_lse)
    mla_combine_kernel(t, h, split_pages=split_pages)(block_table, seq_lens, part_o, part_lse, _zeros(dev, (h,)), o, lse)
    return o, lse


def dequant_cache(kv_cache: torch.Tensor, kv_scales: torch.Tensor) -> torch.Tensor:
    """The bf16 cache an e4m3 cache stands for: ``float(q) * scale`` (one fp32 multiply) -> bf16."""
    p = kv_cache.shape[0]
    x = kv_cache.float().view(p, PAGE, D_QK // GROUP, GROUP) * kv_scales[..., None]
    return x.view(p, PAGE, D_QK).to(torch.bfloat16)


def reference_mla_decode(q, kv_cache, block_table, seq_lens, softmax_scale=None, kv_scales=None):
    """fp32 torch reference (o fp32 [B, T, H, 512], lse [B, T, H]); an e4m3 cache is dequantized
    first by the project's rule; no keys: o = 0, lse = -inf."""
    cache = dequant_cache(kv_cache, kv_scales) if kv_cache.dtype == torch.float8_e4m3fn else kv_cache
    b, t, h, _ = q.shape
    mp = block_table.shape[1]
    scale = D_QK ** -0.5 if softmax_scale is None else softmax_scale
    o = torch.zeros((b, t, h, D_V), dtype=torch.float32, device=q.device)
    lse = torch.full((b, t, h), float("-inf"), dtype=torch.float32, device=q.device)
    for i in range(b):
        seq = max(min(int(seq_lens[i]), mp * PAGE), 0)
        if seq == 0:
            continue
        pages = block_table[i, :-(-seq // PAGE)].long()
        keys = cache[pages].reshape(-1, D_QK)[:seq].float()
        s = torch.einsum("thd,nd->thn", q[i].float(), keys) * scale
        limit = torch.arange(t, device=q.device) + seq - t
        visible = torch.arange(seq, device=q.device)[None, :] <= limit[:, None]
        s = s.masked_fill(~visible[:, None, :], float("-inf"))
        row_lse = torch.logsumexp(s, dim=-1)
        p = torch.exp(s - row_lse[..., None]).nan_to_num(0.0)
        o[i] = torch.einsum("thn,nd->thd", p, keys[:, :D_V])
        lse[i] = row_lse
    return o, lse
