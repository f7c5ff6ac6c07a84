"""The MegaMoE kernels (``@tlx.jit``); the protocol they implement is in ``kernels.moe.mega.layer``.

Peer buffers arrive as ``PEERS`` tensor arguments of one kind (slot p = rank p's buffer; slots at
or past ``n_ranks`` repeat the rank's own buffer and are never read): the kernel picks a peer with
a branch per rank (``for p in list(range(n_ranks))`` unrolls at trace time), so every access is a
plain buffer access that the bounds verifier sees. On one GPU the slots are the virtual ranks'
buffers; on several they are the tensors ``torch.distributed._symmetric_memory`` maps for the peers.

Only ``exchange_kernel``, ``step_kernel`` and ``gate_kernel`` wait, each in one warp of one CTA:
a rank has at most one waiting CTA at a time (they are on its compute stream), so n ranks hold at
most n small CTAs while waiting and every kernel they wait on can always be scheduled. Each waits
only for flags that kernels enqueued before it (on the host) set: see ``exchange_kernel``.

What ``tlx check`` decides here (table in ``kernels/moe/README.md``): every access of every kernel
is proven in bounds (``gather_ids`` under the launcher-checked ``Tr <= 268435455``). The race
analysis covers shared memory within one CTA only, where these kernels have nothing to race on
(race-free, 0 pairs); it does not model global memory, other CTAs, other kernels or other ranks,
so the flag protocol (system-scope release / acquire on READY, COUNT, DONE and the status words)
is outside it: why it is ordered and cannot deadlock is argued in ``kernels.moe.mega.layer`` and
checked by the CPU tests of the launch order and the GPU tests (timeouts, 100 runs). Determinism
is "deterministic, batch-invariant" for ``gather_ids`` and ``combine``, and "unknown" for
``announce``, ``exchange``, ``step``, ``gate`` and ``dispatch``: the flag operations are inline PTX
(``sysflags.py``) whose effects the analysis does not read. No output value of those kernels
depends on timing: they do no floating-point arithmetic, ``dispatch`` copies bytes to the rows
that ``entry_of_row`` names, and the flags only say when those bytes may be read.
"""


import tilelang.language as T

import tlx
from kernels.moe.mega.sysflags import PRELUDE, release_add, release_store, wait_at_least, wait_equal
from tlx.numerics import determinism

TARGET = {"kind": "cuda", "arch": "sm_90a"}
PEERS = 8  # ranks at most
WARP = 32
GROUP = 128  # activation scale group along H

# Flag words of one rank (int32, symmetric: peers read READY and DONE).
EPOCH = 0  # this rank's call counter, 1..EPOCH_WRAP (read only by the rank itself)
EPOCH_WRAP = 1 << 30
READY = 1  # = epoch once the rank's tokens, scales and ids of this call are in its send buffers
STATUS = 2  # STATUS..STATUS+3: code, rank, wave, peer of the rank's first failed wait (code 0: none)
COUNT = 8  # COUNT + w: dispatch CTAs done with wave w (reset to 0 by the step kernel that waited for it)
MAX_WAVES = 16
DONE = COUNT + MAX_WAVES  # DONE + w: = epoch once wave w's L2 rows are in the rank's y
FLAG_WORDS = DONE + MAX_WAVES

# Failure codes (STATUS): which wait gave up.
WAIT_TOKENS = 1  # a rank's exchange waited for a peer's READY
WAIT_DISPATCH = 2  # a rank's compute stream waited for its own dispatch of a wave
WAIT_RESULTS = 3  # a rank's combine waited for a peer's DONE of a wave
WAIT_L1 = 4  # an L2 tile of the fused wave kernel waited for its row block's L1 tiles (same rank)

# Symbolic sizes: send-buffer tokens per rank, all ranks' tokens, the rank's tokens, rows.
ntok = T.dynamic("Tr")
gtok = T.dynamic("GT")
mytok = T.dynamic("T")
nrows = T.dynamic("R")

RECORD_PRELUDE = r"""
#ifndef TLX_MEGA_RECORD_PRELUDE_
#define TLX_MEGA_RECORD_PRELUDE_
// The first failure of a rank wins the status words (code first, then rank, wave and peer).
__device__ __forceinline__ void tlx_mega_record_failure(int* status, int code, int rank, int wave, int peer) {
  if (atomicCAS(status, 0, code) == 0) {
    status[1] = rank;
    status[2] = wave;
    status[3] = peer;
    __threadfence_system();
  }
}
#endif
"""


determinism.declare_sync(tlx_mega_record_failure="failure_record")


def record_failure(status_ref, code, rank, wave, peer):
    return T.call_extern("handle", "tlx_mega_record_failure", T.address_of(status_ref), code, rank, wave, peer)


def _check_ranks(n_ranks: int):
    if not 1 <= n_ranks <= PEERS:
        raise ValueError(f"n_ranks: expected 1 to {PEERS}, got {n_ranks}")


@tlx.jit(target=TARGET)
def announce_kernel():
    """``(mine [F])``: one thread. Advances the rank's epoch, clears its status and publishes
    READY = epoch (the stream order puts the rank's send buffers before it). It waits for nothing:
    see ``exchange_kernel`` for why publishing and waiting are two launches."""

    @T.prim_func
    def main(mine: T.Tensor((FLAG_WORDS,), "int32")):
        with T.Kernel(1, threads=WARP, prelude=PRELUDE):
            epoch = T.alloc_var("int32")
            if T.get_thread_binding() == 0:
                epoch = mine[EPOCH] % EPOCH_WRAP + 1
                mine[EPOCH] = epoch
                for i in T.unroll(4):
                    mine[STATUS + i] = 0
                release_store(mine[READY], epoch)

    return main


@tlx.jit(target=TARGET)
def exchange_kernel(n_ranks: int):
    """``(fl0..fl7 [F], mine [F], rank, timeout_ns)``: one warp. Acquires every rank's READY of
    this epoch (the rank's own ``announce_kernel`` has advanced it); a peer that does not arrive
    within ``timeout_ns`` is recorded (WAIT_TOKENS, wave 0, the peer) instead of waited for.

    Publishing and waiting are separate launches, and every rank's announce is enqueued before any
    rank's exchange: streams share the GPU's few hardware queues (CUDA_DEVICE_MAX_CONNECTIONS,
    8 by default), in which a kernel can wait behind any kernel enqueued earlier on another stream.
    With both in one kernel, rank 0's waiting exchange held up rank 1's announce behind it in a
    shared queue: 5 s timeouts in every 8-rank test on the H200 (16 streams)."""
    _check_ranks(n_ranks)

    @T.prim_func
    def main(fl0: T.Tensor((FLAG_WORDS,), "int32"), fl1: T.Tensor((FLAG_WORDS,), "int32"),
             fl2: T.Tensor((FLAG_WORDS,), "int32"), fl3: T.Tensor((FLAG_WORDS,), "int32"),
             fl4: T.Tensor((FLAG_WORDS,), "int32"), fl5: T.Tensor((FLAG_WORDS,), "int32"),
             fl6: T.Tensor((FLAG_WORDS,), "int32"), fl7: T.Tensor((FLAG_WORDS,), "int32"),
             mine: T.Tensor((FLAG_WORDS,), "int32"), rank: T.int32, timeout_ns: T.int64):
        with T.Kernel(1, threads=WARP, prelude=PRELUDE + RECORD_PRELUDE):
            flags = [fl0, fl1, fl2, fl3, fl4, fl5, fl6, fl7]
            if T.get_thread_binding() == 0:
                for p in list(range(n_ranks)):
                    if wait_equal(flags[p][READY], mine[EPOCH], mine[STATUS], timeout_ns) == 0:
                        record_failure(mine[STATUS], WAIT_TOKENS, rank, 0, p)

    return main


@tlx.jit(target=TARGET)
def step_kernel():
    """``(mine [F], signal_wave, wait_wave, ctas, rank, timeout_ns)``: one warp on the rank's compute
    stream between waves. ``signal_wave >= 0``: its L2 rows are written (stream order), release
    DONE + signal_wave = epoch. ``wait_wave >= 0``: acquire the dispatch's COUNT + wait_wave >=
    ctas (every dispatch CTA has written the wave's rows), or record WAIT_DISPATCH; then reset it."""

    @T.prim_func
    def main(mine: T.Tensor((FLAG_WORDS,), "int32"), signal_wave: T.int32, wait_wave: T.int32, ctas: T.int32,
             rank: T.int32, timeout_ns: T.int64):
        with T.Kernel(1, threads=WARP, prelude=PRELUDE + RECORD_PRELUDE):
            if T.get_thread_binding() == 0:
                if 0 <= signal_wave and signal_wave < MAX_WAVES:
                    release_store(mine[DONE + signal_wave], mine[EPOCH])
                if 0 <= wait_wave and wait_wave < MAX_WAVES:
                    if wait_at_least(mine[COUNT + wait_wave], ctas, mine[STATUS], timeout_ns) == 0:
                        record_failure(mine[STATUS], WAIT_DISPATCH, rank, wait_wave, rank)
                    # the next call's dispatch starts after this call's combine (stream order)
                    mine[COUNT + wait_wave] = 0

    return main


@tlx.jit(target=TARGET)
def gate_kernel(n_ranks: int, n_waves: int):
    """``(fl0..fl7 [F], mine [F], rank, timeout_ns)``: one warp ahead of the combine; acquires
    every rank's DONE of every wave for this epoch (so the combine, a plain kernel after it in
    stream order, reads finished rows), or records WAIT_RESULTS naming the peer and the wave."""
    _check_ranks(n_ranks)
    if not 1 <= n_waves <= MAX_WAVES:
        raise ValueError(f"n_waves: expected 1 to {MAX_WAVES}, got {n_waves}")

    @T.prim_func
    def main(fl0: T.Tensor((FLAG_WORDS,), "int32"), fl1: T.Tensor((FLAG_WORDS,), "int32"),
             fl2: T.Tensor((FLAG_WORDS,), "int32"), fl3: T.Tensor((FLAG_WORDS,), "int32"),
             fl4: T.Tensor((FLAG_WORDS,), "int32"), fl5: T.Tensor((FLAG_WORDS,), "int32"),
             fl6: T.Tensor((FLAG_WORDS,), "int32"), fl7: T.Tensor((FLAG_WORDS,), "int32"),
             mine: T.Tensor((FLAG_WORDS,), "int32"), rank: T.int32, timeout_ns: T.int64):
        with T.Kernel(1, threads=WARP, prelude=PRELUDE + RECORD_PRELUDE):
            flags = [fl0, fl1, fl2, fl3, fl4, fl5, fl6, fl7]
            if T.get_thread_binding() == 0:
                for p in list(range(n_ranks)):
                    for w in T.serial(n_waves):
                        if wait_equal(flags[p][DONE + w], mine[EPOCH], mine[STATUS], timeout_ns) == 0:
                            record_failure(mine[STATUS], WAIT_RESULTS, rank, w, p)

    return main


@tlx.jit(target=TARGET, assume=("Tr <= 268435456",))
def gather_ids_kernel(n_ranks: int, topk: int, threads: int = 256):
    """``(ids0..ids7 [Tr, k], gids [n * Tr, k])``: every rank's routing, rank-major (plain copy; the
    exchange before it in stream order has acquired the peers' READY)."""
    _check_ranks(n_ranks)

    @T.prim_func
    def main(ids0: T.Tensor((ntok, topk), "int32"), ids1: T.Tensor((ntok, topk), "int32"),
             ids2: T.Tensor((ntok, topk), "int32"), ids3: T.Tensor((ntok, topk), "int32"),
             ids4: T.Tensor((ntok, topk), "int32"), ids5: T.Tensor((ntok, topk), "int32"),
             ids6: T.Tensor((ntok, topk), "int32"), ids7: T.Tensor((ntok, topk), "int32"),
             gids: T.Tensor((n_ranks * ntok, topk), "int32")):
        with T.Kernel(T.ceildiv(ntok, threads), n_ranks, threads=threads) as (b, s):
            ids = [ids0, ids1, ids2, ids3, ids4, ids5, ids6, ids7]
            t = b * threads + T.get_thread_binding()
            if t < ntok:
                for p in list(range(n_ranks)):
                    if s == p:
                        for j in T.unroll(topk):
                            gids[p * ntok + t, j] = ids[p][t, j]

    return main


@tlx.jit(target=TARGET, assume=("R <= 1073741824", "Tr >= 1"))
def dispatch_kernel(n_ranks: int, hidden: int, topk: int, n_waves: int, wave_experts: int, n_local: int,
                    ctas: int, threads: int = 256):
    """``(xq0..xq7 [Tr, H] e4m3, xs0..xs7 [Tr, H/128] f32, mine [F], entry_of_row [R], offsets [El+1],
    xp [R, H], sp [R, H/128])``: pulls the rank's rows from their source ranks, wave by wave.

    ``ctas`` persistent CTAs, a warp per 32 rows: row ``i`` of wave w (rows ``offsets[w * W]`` to
    ``offsets[min((w + 1) * W, El)]``) holds entry ``g * k + j`` of global token ``g`` = source rank
    ``g // Tr``, its token ``g % Tr``; the warp loads its rows' entries at once and copies each
    routed row's e4m3 bytes (16-byte words) and scales from the source rank's send buffer. A
    padding row (entry -1) is not written, as ``moe_layer``'s ``permute(zero_padding=False)``: every
    later step computes a row from that row alone and the combine reads routed rows only (zeroing
    them was most of the dispatch's bytes: T = 512 pads 3072 routed rows to 32768). After each
    wave every CTA adds 1 to COUNT + w with release semantics; the compute stream's ``step_kernel``
    waits for ``ctas``. Nothing here waits. Each CTA lets a programmatic
    dependent launch as it starts (``T.pdl_trigger()``; on one rank the L1 follows on the same
    stream and loads its first weights while the rows arrive)."""
    _check_ranks(n_ranks)
    if hidden % (16 * WARP) or hidden % GROUP:
        raise ValueError(f"hidden: expected a multiple of {16 * WARP}, got {hidden}")
    if not 1 <= n_waves <= MAX_WAVES:
        raise ValueError(f"n_waves: expected 1 to {MAX_WAVES}, got {n_waves}")
    words = hidden // 16  # 16-byte words of an e4m3 row
    per_lane = words // WARP
    ng = hidden // GROUP
    spl = (ng + WARP - 1) // WARP
    warps = threads // WARP

    @T.prim_func
    def main(xq0: T.Tensor((ntok, hidden), "float8_e4m3"), xq1: T.Tensor((ntok, hidden), "float8_e4m3"),
             xq2: T.Tensor((ntok, hidden), "float8_e4m3"), xq3: T.Tensor((ntok, hidden), "float8_e4m3"),
             xq4: T.Tensor((ntok, hidden), "float8_e4m3"), xq5: T.Tensor((ntok, hidden), "float8_e4m3"),
             xq6: T.Tensor((ntok, hidden), "float8_e4m3"), xq7: T.Tensor((ntok, hidden), "float8_e4m3"),
             xs0: T.Tensor((ntok, ng), "float32"), xs1: T.Tensor((ntok, ng), "float32"),
             xs2: T.Tensor((ntok, ng), "float32"), xs3: T.Tensor((ntok, ng), "float32"),
             xs4: T.Tensor((ntok, ng), "float32"), xs5: T.Tensor((ntok, ng), "float32"),
             xs6: T.Tensor((ntok, ng), "float32"), xs7: T.Tensor((ntok, ng), "float32"),
             mine: T.Tensor((FLAG_WORDS,), "int32"), entry_of_row: T.Tensor((nrows,), "int32"),
             offsets: T.Tensor((n_local + 1,), "int32"), xp: T.Tensor((nrows, hidden), "float8_e4m3"),
             sp: T.Tensor((nrows, ng), "float32")):
        with T.Kernel(ctas, threads=threads, prelude=PRELUDE) as c:
            xq = [xq0, xq1, xq2, xq3, xq4, xq5, xq6, xq7]
            xs = [xs0, xs1, xs2, xs3, xs4, xs5, xs6, xs7]
            tx = T.get_thread_binding()
            lane = tx % WARP
            T.pdl_trigger()
            buf = T.alloc_local((per_lane * 16,), "float8_e4m3")
            sbuf = T.alloc_local((spl,), "float32")
            lo = T.alloc_var("int32")
            hi = T.alloc_var("int32")
            base = T.alloc_var("int32")
            row = T.alloc_var("int32")
            lane_entry = T.alloc_var("int32")
            entry = T.alloc_var("int32")
            src = T.alloc_var("int32")
            tok = T.alloc_var("int32")
            for w in T.serial(n_waves):
                lo = T.max(T.min(offsets[T.min(w * wave_experts, n_local)], nrows), 0)
                hi = T.max(T.min(offsets[T.min((w + 1) * wave_experts, n_local)], nrows), lo)
                for it in T.serial(T.ceildiv(T.ceildiv(hi - lo, WARP), ctas * warps)):
                    # a warp's 32 rows: one coalesced load of their entries, then row by row
                    base = lo + ((it * ctas + c) * warps + tx // WARP) * WARP
                    lane_entry = -1
                    if base + lane < hi:
                        lane_entry = entry_of_row[base + lane]
                    for j in T.serial(WARP):
                        entry = T.shfl_sync(lane_entry, j)
                        row = base + j
                        if row < hi:
                            if entry >= 0:  # a padding row (entry -1) is left as it was
                                src = entry // topk // ntok
                                tok = entry // topk % ntok
                                for p in list(range(n_ranks)):
                                    if src == p:
                                        for q in T.unroll(per_lane):
                                            for v in T.vectorized(16):
                                                buf[q * 16 + v] = xq[p][tok, (q * WARP + lane) * 16 + v]
                                        for g in T.unroll(spl):
                                            if g * WARP + lane < ng:
                                                sbuf[g] = xs[p][tok, g * WARP + lane]
                                for q in T.unroll(per_lane):
                                    for v in T.vectorized(16):
                                        xp[row, (q * WARP + lane) * 16 + v] = buf[q * 16 + v]
                                for g in T.unroll(spl):
                                    if g * WARP + lane < ng:
                                        sp[row, g * WARP + lane] = sbuf[g]
                T.sync_threads()
                if tx == 0:
                    release_add(mine[COUNT + w], 1)

    return main


@tlx.jit(target=TARGET)
def combine_kernel(n_ranks: int, hidden: int, topk: int, n_local: int, threads: int = 128):
    """``(y0..y7 [R, H] bf16, rowof0..rowof7 [n * Tr, k], ids [T, k], weights [T, k], out [T, H],
    first_token)``: a block per token of this rank (global index ``first_token + t``); pulls its k
    rows from their owners' ``y`` (owner = expert // El, row from the owner's ``row_of``) and
    accumulates ``fma(w, y, acc)`` in fp32 for j = 0..k-1 from 0, then one bf16 rounding: the
    arithmetic of ``permute.combine``, so the bits equal the unfused layer's."""
    _check_ranks(n_ranks)
    if hidden % (threads * 8):
        raise ValueError(f"hidden: expected a multiple of {threads * 8}, got {hidden}")
    runs = hidden // (threads * 8)

    @T.prim_func
    def main(y0: T.Tensor((nrows, hidden), "bfloat16"), y1: T.Tensor((nrows, hidden), "bfloat16"),
             y2: T.Tensor((nrows, hidden), "bfloat16"), y3: T.Tensor((nrows, hidden), "bfloat16"),
             y4: T.Tensor((nrows, hidden), "bfloat16"), y5: T.Tensor((nrows, hidden), "bfloat16"),
             y6: T.Tensor((nrows, hidden), "bfloat16"), y7: T.Tensor((nrows, hidden), "bfloat16"),
             r0: T.Tensor((gtok, topk), "int32"), r1: T.Tensor((gtok, topk), "int32"),
             r2: T.Tensor((gtok, topk), "int32"), r3: T.Tensor((gtok, topk), "int32"),
             r4: T.Tensor((gtok, topk), "int32"), r5: T.Tensor((gtok, topk), "int32"),
             r6: T.Tensor((gtok, topk), "int32"), r7: T.Tensor((gtok, topk), "int32"),
             ids: T.Tensor((mytok, topk), "int32"), weights: T.Tensor((mytok, topk), "float32"),
             out: T.Tensor((mytok, hidden), "bfloat16"), first_token: T.int32):
        with T.Kernel(mytok, threads=threads) as t:
            ys = [y0, y1, y2, y3, y4, y5, y6, y7]
            rows_of = [r0, r1, r2, r3, r4, r5, r6, r7]
            tx = T.get_thread_binding()
            acc = T.alloc_local((runs * 8,), "float32")
            yv = T.alloc_local((topk * runs * 8,), "bfloat16")
            rows = T.alloc_local((topk,), "int32")
            owner = T.alloc_local((topk,), "int32")
            ws = T.alloc_local((topk,), "float32")
            g = T.alloc_var("int32")
            # in int64: first_token + t must not wrap (the verifier would bound T instead)
            g = T.cast(T.min(T.max(T.cast(first_token, "int64") + t, 0), T.cast(gtok, "int64") - 1), "int32")
            for j in T.unroll(topk):
                owner[j] = ids[t, j] // n_local
                ws[j] = weights[t, j]
                rows[j] = -1
                for p in list(range(n_ranks)):
                    if owner[j] == p:
                        rows[j] = rows_of[p][g, j]
            for c in T.unroll(runs * 8):
                acc[c] = T.float32(0)
            for j in T.unroll(topk):
                for p in list(range(n_ranks)):
                    if owner[j] == p and rows[j] >= 0:
                        for c in T.unroll(runs):
                            for v in T.vectorized(8):
                                yv[(j * runs + c) * 8 + v] = ys[p][T.min(rows[j], nrows - 1), (c * threads + tx) * 8 + v]
            for j in T.unroll(topk):
                for c in T.unroll(runs):
                    for v in T.unroll(8):
                        acc[c * 8 + v] = T.if_then_else(
                            rows[j] >= 0,
                            T.ieee_fmaf(ws[j], T.cast(yv[(j * runs + c) * 8 + v], "float32"), acc[c * 8 + v]),
                            acc[c * 8 + v])
            for c in T.unroll(runs):
                for v in T.vectorized(8):
                    out[t, (c * threads + tx) * 8 + v] = T.cast(acc[c * 8 + v], "bfloat16")

    return main
