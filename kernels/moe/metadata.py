"""Routing metadata: expert-major row layout of one rank's experts, padded per expert.

One cooperative launch, a block per chunk of tokens (128 tokens, doubled until at most one
block per SM is needed, so that every block is resident; up to ``MAX_CHUNK`` tokens per SM; one
chunk, a plain launch without the grid barrier),
integer results and a fixed assignment order (rows of an expert follow the flat index
``t * topk + j``): the results are deterministic and bitwise equal to ``metadata.cu``.

* The block's warps take consecutive 32-entry steps of its chunk; ``match_any`` groups a step's
  lanes by expert, so a per-warp running count gives each entry's rank among the warp's earlier
  entries of its expert. Summed over the warps, those counts are the chunk's histogram, which
  the block writes before a grid barrier.
* Every block then sums the histograms itself (each expert's total and its count in earlier
  chunks: at most one row per SM from L2) and scans the padded totals into the offsets; a
  prefix over the warps' counts places each warp's entries.
* The blocks share out the padding rows (entry -1) and the row-block experts (a binary search
  in the offsets); block 0 writes counts and offsets.

Outputs (see ``reference.metadata_ref``): counts [El], offsets [El + 1], row_of [T, k],
entry_of_row [R], block_expert [R // align], with R = ``max_rows(T, k, El, align)``.
Rows past ``offsets[El]`` get entry -1 (as padding rows do) and their blocks expert -1.

Bounds (``tlx check``, topk 6, E 256, chunk 128): 252 of 255 accesses proven under the derived
precondition ``C <= 2796203`` (194 of 197 in the one-chunk form). Unknown, not unsafe: the scatters
of ``entry_of_row`` (the routed rows and the padding rows) and the expert search's ``s_off`` read,
whose indices come from the histogram and offsets the kernel itself computed in shared memory
(data the verifier does not track), and the int32 overflow checks of those running sums (each at
most T * k). TileLang guards each of those stores by the buffer's size, and every output is
compared with ``metadata.cu`` and the reference on the GPU (``test_metadata_bitwise_and_reference``).
"""

from __future__ import annotations

import functools

import tilelang.language as T

import tlx
from kernels.device import sm_count

# Symbolic sizes (module level so the kernel sources see them): tokens, chunks, rows, row
# blocks. The local expert count is static: the histogram sums then index with constant strides.
ntok = T.dynamic("T")
nchunk = T.dynamic("C")
nrows = T.dynamic("R")
nblocks = T.dynamic("B")

CHUNK = 128  # tokens per chunk at least (a multiple of 32: a chunk's entries fill whole 32-entry steps)
MAX_CHUNK = 4096  # tokens per chunk at most (per-warp entries live in registers)
WARP = 32
MAX_LOCAL = 1024  # local experts per rank (shared arrays are sized for it)


def max_rows(n_tokens: int, topk: int, n_local: int, align: int = 128) -> int:
    """An upper bound of the padded rows, a multiple of ``align`` (static given T): every entry,
    plus at most ``align - 1`` padding rows per expert that holds an entry (at most T * k of them,
    so a few tokens do not pay for every expert's padding)."""
    rows = n_tokens * topk + min(n_local, n_tokens * topk) * (align - 1)
    return (rows + align - 1) // align * align


@tlx.jit(target={"kind": "cuda", "arch": "sm_90a"})
def metadata_kernel(topk: int, n_local: int, align: int = 128, chunk: int = CHUNK, threads: int = 512, batch: int = 32,
                    single: bool = False):
    """``(ids [T, k], first_expert, chunk_counts [C, El] (scratch), counts, offsets, row_of, entry_of_row,
    block_expert)`` for El = ``n_local`` experts, a block per ``chunk`` tokens; C blocks must be
    resident at once (cooperative launch). ``single``: the launch has one chunk (T <= ``chunk``,
    a decode batch): its histogram is the totals, with no grid barrier and no round trip through
    ``chunk_counts`` (not written then)."""
    if not 1 <= n_local <= MAX_LOCAL:
        raise ValueError(f"n_local: expected 1 to {MAX_LOCAL} local experts, got {n_local}")
    if threads % WARP or not WARP <= threads <= MAX_LOCAL or MAX_LOCAL % threads:
        raise ValueError(f"threads: expected a multiple of {WARP} dividing {MAX_LOCAL}, got {threads}")
    if chunk % CHUNK or not CHUNK <= chunk <= MAX_CHUNK:
        raise ValueError(f"chunk: expected a multiple of {CHUNK} up to {MAX_CHUNK}, got {chunk}")
    warps = threads // WARP
    steps = chunk * topk // WARP  # 32-entry steps of a chunk
    per_warp = (steps + warps - 1) // warps  # consecutive steps of one warp
    busy = (steps + per_warp - 1) // per_warp  # warps that hold entries
    ept = MAX_LOCAL // threads  # consecutive experts of a thread in the offsets scan
    probes = n_local.bit_length()  # binary-search steps over El + 1 offsets
    per = max(threads // n_local, 1)  # chunk rows summed at once per expert

    @T.macro
    def warp_ranks(ex, rk, s_seg, w, lane):
        """Per warp and expert, a running count over the warp's steps: an entry's rank among the
        warp's earlier entries of its expert (lanes of one expert in a step: ``match_any``)."""
        peers = T.alloc_var("uint32")
        below = T.alloc_var("int32")
        cur = T.alloc_var("int32")
        if w < busy:
            for s in T.unroll(per_warp):
                peers = T.match_any_sync(ex[s])
                below = T.cast(T.min(T.popcount(peers & ((T.uint32(1) << T.cast(lane, "uint32")) - T.uint32(1))), T.uint32(WARP)), "int32")
                cur = 0
                if ex[s] >= 0:
                    cur = s_seg[w * MAX_LOCAL + ex[s]]
                T.sync_warp()
                if ex[s] >= 0 and below == 0:
                    s_seg[w * MAX_LOCAL + ex[s]] = cur + T.cast(T.min(T.popcount(peers), T.uint32(WARP)), "int32")
                T.sync_warp()
                rk[s] = cur + below

    @T.prim_func
    def main(
        ids: T.Tensor((ntok, topk), "int32"),
        first_expert: T.int32,
        chunk_counts: T.Tensor((nchunk, n_local), "int32"),
        counts: T.Tensor((n_local,), "int32"),
        offsets: T.Tensor((n_local + 1,), "int32"),
        row_of: T.Tensor((ntok, topk), "int32"),
        entry_of_row: T.Tensor((nrows,), "int32"),
        block_expert: T.Tensor((nblocks,), "int32"),
    ):
        with T.Kernel(nchunk, threads=threads) as c:
            tx = T.get_thread_binding()
            lane = tx % WARP
            w = tx // WARP
            s_tot = T.alloc_shared((MAX_LOCAL,), "int32")  # tokens of each expert
            s_bef = T.alloc_shared((MAX_LOCAL,), "int32")  # ... in the chunks before this one
            s_off = T.alloc_shared((MAX_LOCAL + 1,), "int32")
            s_part = None if single else T.alloc_shared((2, MAX_LOCAL), "int32")  # per-slot partial tot / bef
            s_warp = T.alloc_shared((WARP,), "int32")
            s_seg = T.alloc_shared((busy * MAX_LOCAL,), "int32")  # per warp: its count, then its first row
            ex = T.alloc_local((per_warp,), "int32")  # local expert of each entry (-1: none)
            rk = T.alloc_local((per_warp,), "int32")  # its rank among the warp's entries of that expert
            part = None if single else T.alloc_local((batch,), "int32")
            pad = T.alloc_local((ept,), "int32")
            n = T.alloc_var("int32")
            i = T.alloc_var("int32")
            g = T.alloc_var("int64")  # the local expert, wide so that no id can overflow it
            slot = T.alloc_var("int32")
            r0 = T.alloc_var("int32")
            e = T.alloc_var("int32")
            tot = T.alloc_var("int32")
            bef = T.alloc_var("int32")
            cur = T.alloc_var("int32")
            run = T.alloc_var("int32")
            incl = T.alloc_var("int32")
            up = T.alloc_var("int32")
            wsum = T.alloc_var("int32")
            row = T.alloc_var("int64")
            lo = T.alloc_var("int32")
            hi = T.alloc_var("int32")
            mid = T.alloc_var("int32")
            n = T.min(ntok - c * chunk, chunk) * topk
            # The chunk's entries, warp w holding steps w * per_warp ...: loads first.
            for s in T.unroll(per_warp):
                i = (w * per_warp + s) * WARP + lane
                ex[s] = -1
                if w < busy and i < n:
                    g = T.cast(ids[c * chunk + i // topk, i % topk], "int64") - first_expert
                    if g >= 0 and g < n_local:
                        ex[s] = T.cast(g, "int32")
            if w < busy:
                for b in T.serial(T.ceildiv(n_local, WARP)):
                    if b * WARP + lane < n_local:
                        s_seg[w * MAX_LOCAL + b * WARP + lane] = 0
            T.sync_threads()
            warp_ranks(ex, rk, s_seg, w, lane)
            T.sync_threads()
            for j in T.serial(T.ceildiv(n_local, threads)):  # the chunk's histogram
                e = j * threads + tx
                if e < n_local:
                    tot = 0
                    for b in T.unroll(busy):
                        tot = tot + s_seg[b * MAX_LOCAL + e]
                    if single:  # the only chunk: its histogram is the totals
                        s_tot[e] = tot
                        s_bef[e] = 0
                    else:
                        chunk_counts[c, e] = tot
            if not single:
                T.sync_grid()
                # Every expert's total and its count before chunk c: slot = (row phase, expert), batch
                # loads in flight per thread.
                for j in T.serial(T.ceildiv(per * n_local, threads)):
                    slot = j * threads + tx
                    if slot < per * n_local:
                        r0 = slot // n_local
                        e = slot % n_local
                        tot = 0
                        bef = 0
                        for q in T.serial(T.ceildiv(nchunk, per * batch)):
                            for u in T.unroll(batch):
                                part[u] = 0
                                if (q * batch + u) * per + r0 < nchunk:
                                    part[u] = chunk_counts[(q * batch + u) * per + r0, e]
                            for u in T.unroll(batch):
                                tot = tot + part[u]
                                if (q * batch + u) * per + r0 < c:
                                    bef = bef + part[u]
                        s_part[0, slot] = tot
                        s_part[1, slot] = bef
                T.sync_threads()
                for j in T.serial(T.ceildiv(n_local, threads)):
                    e = j * threads + tx
                    if e < n_local:
                        tot = 0
                        bef = 0
                        for p in T.serial(per):
                            tot = tot + s_part[0, p * n_local + e]
                            bef = bef + s_part[1, p * n_local + e]
                        s_tot[e] = tot
                        s_bef[e] = bef
            # Offsets: exclusive scan of the padded counts, ept experts a thread, then warps.
            run = 0
            for u in T.unroll(ept):
                pad[u] = T.if_then_else(tx * ept + u < n_local, T.ceildiv(s_tot[tx * ept + u], align) * align, 0)
                run = run + pad[u]
            incl = run
            for d in T.unroll(5):
                up = T.shfl_up(incl, 1 << d)
                if lane >= (1 << d):
                    incl = incl + up
            if lane == WARP - 1:
                s_warp[w] = incl
            T.sync_threads()
            if tx < WARP:
                wsum = T.if_then_else(tx < warps, s_warp[tx], 0)
                for d in T.unroll(5):
                    up = T.shfl_up(wsum, 1 << d)
                    if lane >= (1 << d):
                        wsum = wsum + up
                s_warp[tx] = wsum
            T.sync_threads()
            run = incl - run
            if w > 0:
                run = run + s_warp[w - 1]
            for u in T.unroll(ept):
                s_off[tx * ept + u] = run
                run = run + pad[u]
            if tx == threads - 1:
                s_off[MAX_LOCAL] = run
            T.sync_threads()
            if c == 0:
                for j in T.serial(T.ceildiv(n_local + 1, threads)):
                    if j * threads + tx < n_local:
                        counts[j * threads + tx] = s_tot[j * threads + tx]
                    if j * threads + tx <= n_local:
                        offsets[j * threads + tx] = s_off[j * threads + tx]
            # Padding rows (entry -1), spread over all blocks: a warp an expert (whose test is the
            # same for its lanes), its lanes the rows of the expert's last block past its entries.
            # (A thread a (expert, row) slot walked 256 x 128 slots in 64 steps a thread at one chunk.)
            for j in T.serial(T.ceildiv(n_local, nchunk * warps)):
                e = (j * nchunk + c) * warps + w
                if e < n_local:
                    if s_tot[e] % align != 0:
                        for q in T.unroll((align + WARP - 1) // WARP):
                            if q * WARP + lane < align and s_tot[e] + q * WARP + lane < T.ceildiv(s_tot[e], align) * align:
                                entry_of_row[s_off[e] + s_tot[e] + q * WARP + lane] = -1
            # The expert of each row block: the last expert starting at or before it.
            for j in T.serial(T.ceildiv(nblocks, nchunk * threads)):
                slot = (j * nchunk + c) * threads + tx
                if slot < nblocks:
                    row = T.cast(slot, "int64") * align
                    lo = -1
                    if row < s_off[n_local]:
                        lo = 0
                        hi = n_local
                        for it in T.unroll(probes):
                            if hi - lo > 1:
                                mid = (lo + hi) // 2
                                if s_off[mid] <= row:
                                    lo = mid
                                else:
                                    hi = mid
                    block_expert[slot] = lo
            # Rows past the last expert's: entry -1 too, so that a kernel masking rows by their entry
            # (the SwiGLU cast) skips them with no offsets (left as they were, they held whatever the
            # buffer held: V4-Flash T = 4001, 23808 of 56576 rows, which the cast then read and wrote)
            for j in T.serial(T.ceildiv(nrows, nchunk * threads)):
                row = (j * nchunk + c) * threads + tx
                if row < nrows:
                    if row >= s_off[n_local]:
                        entry_of_row[row] = -1
            # First row of each warp's entries of each expert: offset + earlier chunks + earlier warps.
            for j in T.serial(T.ceildiv(n_local, threads)):
                e = j * threads + tx
                if e < n_local:
                    run = s_off[e] + s_bef[e]
                    for b in T.unroll(busy):
                        cur = s_seg[b * MAX_LOCAL + e]
                        s_seg[b * MAX_LOCAL + e] = run
                        run = run + cur
            T.sync_threads()
            if w < busy:
                for s in T.unroll(per_warp):
                    i = (w * per_warp + s) * WARP + lane
                    if ex[s] >= 0:
                        row_of[c * chunk + i // topk, i % topk] = s_seg[w * MAX_LOCAL + ex[s]] + rk[s]
                        entry_of_row[s_seg[w * MAX_LOCAL + ex[s]] + rk[s]] = c * chunk * topk + i
                    elif i < n:
                        row_of[c * chunk + i // topk, i % topk] = -1

    return main


def metadata_buffers(ids, n_experts: int, n_ranks: int = 1, align: int = 128) -> dict:
    """Buffers for ``routing_metadata(ids, n_experts, ..., out=)``: its five outputs and the
    kernel's scratch (``chunk_counts``, per-chunk histograms), views of one allocation. Reusing
    them (a serving loop, a CUDA graph) takes the allocations off the call."""
    _check_ids(ids)
    el, _, rows, nchunk = _plan(*ids.shape, n_experts, n_ranks, align, ids.get_device())
    return _buffers(ids, el, rows, nchunk, align)


def routing_metadata(ids, n_experts: int, rank: int = 0, n_ranks: int = 1, align: int = 128, out: dict | None = None):
    """Metadata of rank ``rank``'s experts for ``ids`` [T, k] int32 (CUDA). Returns a dict like
    ``reference.metadata_ref`` but with ``entry_of_row`` / ``block_expert`` at their static size,
    plus the scratch ``chunk_counts``. ``out``: buffers from ``metadata_buffers`` for the same
    ``ids`` shape, ``n_experts``, ``n_ranks`` and ``align``, written in place and returned."""
    _check_ids(ids)
    if not 0 <= rank < n_ranks:
        raise ValueError(f"rank: expected 0 <= rank < n_ranks = {n_ranks}, got {rank}")
    t, k = ids.shape
    el, chunk, rows, nchunk = _plan(t, k, n_experts, n_ranks, align, ids.get_device())
    if not ids.is_contiguous():
        ids = ids.contiguous()
    if out is None:
        out = _buffers(ids, el, rows, nchunk, align)
    elif (out["entry_of_row"].shape[0], out["chunk_counts"].shape[0]) != (rows, nchunk):
        # the sizes that the launcher cannot check (free symbols): the rows and the grid
        raise ValueError(f"out: expected buffers of {rows} rows and {nchunk} chunks (metadata_buffers for these ids), "
                         f"got {out['entry_of_row'].shape[0]} rows and {out['chunk_counts'].shape[0]} chunks")
    if not t:  # no entries: no rows, every block past the end
        out["counts"].zero_()
        out["offsets"].zero_()
        out["block_expert"].fill_(-1)
        return out
    _kernel(k, el, align, chunk, nchunk == 1).launch(ids, rank * el, out["chunk_counts"], out["counts"], out["offsets"],
                                                     out["row_of"], out["entry_of_row"], out["block_expert"])
    return out


def _check_ids(ids) -> None:
    import torch

    if ids.dtype != torch.int32 or ids.dim() != 2:
        raise ValueError(f"ids: expected a 2-D int32 tensor, got {ids.dtype} of shape {tuple(ids.shape)}")


def _buffers(ids, el: int, rows: int, nchunk: int, align: int) -> dict:
    """The six tensors as views of one allocation (each view costs less host time than an
    allocation; every kernel that reads them needs 4-byte alignment only)."""
    t, k = ids.shape
    sizes = (el, el + 1, t * k, rows, rows // align, nchunk * el)
    parts = ids.new_empty(sum(sizes)).split_with_sizes(sizes)
    counts, offsets, row_of, entry_of_row, block_expert, chunk_counts = parts
    return {"counts": counts, "offsets": offsets, "row_of": row_of.view(t, k), "entry_of_row": entry_of_row,
            "block_expert": block_expert, "chunk_counts": chunk_counts.view(nchunk, el)}


@functools.lru_cache(maxsize=4096)
def _plan(t: int, k: int, n_experts: int, n_ranks: int, align: int, device: int) -> tuple[int, int, int, int]:
    """(local experts, tokens per chunk, padded rows, chunks) for T tokens on ``device``: a chunk is
    the least (from ``CHUNK``, doubling) that needs at most one block per SM."""
    if n_ranks < 1 or n_experts % n_ranks:
        raise ValueError(f"n_ranks: expected a divisor of n_experts = {n_experts}, got {n_ranks}")
    el = n_experts // n_ranks
    if not 1 <= el <= MAX_LOCAL:
        raise ValueError(f"n_experts // n_ranks: expected 1 to {MAX_LOCAL} local experts, got {el}")
    if device < 0:
        raise ValueError("ids: expected a CUDA tensor, got one on the CPU")
    sms = sm_count(device)
    chunk = CHUNK
    while chunk * sms < t and chunk < MAX_CHUNK:
        chunk *= 2
    if chunk * sms < t:
        raise ValueError(f"ids: expected at most {MAX_CHUNK * sms} tokens ({MAX_CHUNK} per SM), got {t}")
    return el, chunk, max_rows(t, k, el, align), -(-t // chunk)


@functools.lru_cache(maxsize=None)
def _kernel(topk: int, n_local: int, align: int, chunk: int, single: bool):
    """The kernel behind a plain dict lookup (the jit's own lookup costs µs per call)."""
    return metadata_kernel(topk, n_local, align, chunk, single=single)

