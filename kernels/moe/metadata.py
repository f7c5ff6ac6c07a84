"""Routing metadata: expert-major row layout of one rank's experts, padded per expert.

Three launches, all with integer results and a fixed assignment order (rows of an expert
follow the flat index ``t * topk + j``), so they are deterministic and bitwise equal to
``metadata.cu`` (which computes the same maps serially per expert):

1. ``count``: per chunk of tokens, a shared-memory histogram (integer atomics: the counts do
   not depend on their order).
2. ``scan``: one block, a thread per expert: prefix over chunks, then a warp-shuffle scan of
   the padded counts gives the offsets; padding rows and the expert of every row block.
3. ``rows``: per chunk, one warp walks the chunk's entries 32 at a time in order; lanes with
   the same expert (``match_any``) take consecutive rows by their rank among those lanes, so
   an expert's rows follow the entry order.

Outputs (see ``reference.metadata_ref``): counts [El], offsets [El + 1], row_of [T, k],
entry_of_row [R], block_expert [R // align], with R = ``max_rows(T, k, El, align)``.
Rows past ``offsets[El]`` are left untouched except that their blocks get expert -1.
"""

from __future__ import annotations

import functools

import tilelang.language as T

import tlx

# Symbolic sizes (module level so the kernel sources see them): tokens, chunks, rows, row
# blocks, local experts (symbolic so one compiled kernel serves every expert count and rank
# split).
ntok = T.dynamic("T")
nchunk = T.dynamic("C")
nrows = T.dynamic("R")
nblocks = T.dynamic("B")
nlocal = T.dynamic("El")

CHUNK = 128  # tokens per chunk
THREADS = 256  # count / rows blocks
WARP = 32
MAX_LOCAL = 1024  # local experts per rank: the scan has a thread per expert
BATCH = 16  # chunk counts the scan loads at once


def max_rows(n_tokens: int, topk: int, n_local: int, align: int = 128) -> int:
    """An upper bound of the padded rows, a multiple of ``align`` (static given T)."""
    rows = n_tokens * topk + n_local * (align - 1)
    return (rows + align - 1) // align * align


@tlx.jit(target={"kind": "cuda", "arch": "sm_90a"})
def count_kernel(topk: int):

    @T.prim_func
    def main(
        ids: T.Tensor((ntok, topk), "int32"),
        first_expert: T.int32,
        chunk_counts: T.Tensor((nchunk, nlocal), "int32"),
    ):
        with T.Kernel(nchunk, threads=THREADS) as c:
            tx = T.get_thread_binding()
            s_hist = T.alloc_shared((MAX_LOCAL,), "int32")
            n = T.alloc_var("int32")
            e = T.alloc_var("int64")  # the local expert, wide so that no id can overflow it
            for b in T.serial(T.ceildiv(nlocal, THREADS)):
                if b * THREADS + tx < nlocal:
                    s_hist[b * THREADS + tx] = 0
            T.sync_threads()
            n = T.min(ntok - c * CHUNK, CHUNK) * topk
            for i in T.serial(T.ceildiv(CHUNK * topk, THREADS)):
                if i * THREADS + tx < n:
                    e = T.cast(ids[c * CHUNK + (i * THREADS + tx) // topk, (i * THREADS + tx) % topk], "int64") - first_expert
                    if e >= 0 and e < nlocal:
                        T.atomic_add(s_hist[e], 1)
            T.sync_threads()
            for b in T.serial(T.ceildiv(nlocal, THREADS)):
                if b * THREADS + tx < nlocal:
                    chunk_counts[c, b * THREADS + tx] = s_hist[b * THREADS + tx]

    return main


@tlx.jit(target={"kind": "cuda", "arch": "sm_90a"})
def scan_kernel(align: int = 128):

    @T.prim_func
    def main(
        chunk_counts: T.Tensor((nchunk, nlocal), "int32"),
        chunk_base: T.Tensor((nchunk, nlocal), "int32"),
        counts: T.Tensor((nlocal,), "int32"),
        offsets: T.Tensor((nlocal + 1,), "int32"),
        entry_of_row: T.Tensor((nrows,), "int32"),
        block_expert: T.Tensor((nblocks,), "int32"),
    ):
        with T.Kernel(1, threads=MAX_LOCAL):
            tx = T.get_thread_binding()  # the expert
            lane = tx % WARP
            s_warp = T.alloc_shared((MAX_LOCAL // WARP,), "int32")
            part = T.alloc_local((BATCH,), "int32")
            run = T.alloc_var("int32")
            pad = T.alloc_var("int32")
            incl = T.alloc_var("int32")
            up = T.alloc_var("int32")
            wsum = T.alloc_var("int32")
            run = 0
            if tx < nlocal:
                for cb in T.serial(T.ceildiv(nchunk, BATCH)):  # BATCH loads in flight, then the prefix
                    for u in T.unroll(BATCH):
                        part[u] = T.if_then_else(cb * BATCH + u < nchunk, chunk_counts[T.min(cb * BATCH + u, nchunk - 1), tx], 0)
                    for u in T.unroll(BATCH):
                        if cb * BATCH + u < nchunk:
                            chunk_base[cb * BATCH + u, tx] = run
                            run = run + part[u]
                counts[tx] = run
            pad = T.ceildiv(run, align) * align
            # Inclusive scan of the padded counts: within each warp, then over the warp sums.
            incl = pad
            for d in T.unroll(5):
                up = T.shfl_up(incl, 1 << d)
                if lane >= (1 << d):
                    incl = incl + up
            if lane == WARP - 1:
                s_warp[tx // WARP] = incl
            T.sync_threads()
            if tx < WARP:
                wsum = s_warp[tx]
                for d in T.unroll(5):
                    up = T.shfl_up(wsum, 1 << d)
                    if lane >= (1 << d):
                        wsum = wsum + up
                s_warp[tx] = wsum
            T.sync_threads()
            if tx >= WARP:
                incl = incl + s_warp[tx // WARP - 1]
            if tx == 0:
                offsets[0] = 0
            if tx < nlocal:
                offsets[tx + 1] = incl
                for r in T.serial(pad - run):
                    entry_of_row[incl - pad + run + r] = -1
                for q in T.serial(pad // align):
                    block_expert[(incl - pad) // align + q] = tx
            for q in T.serial(T.ceildiv(nblocks, MAX_LOCAL)):
                if q * MAX_LOCAL + tx < nblocks and (q * MAX_LOCAL + tx) * align >= s_warp[MAX_LOCAL // WARP - 1]:
                    block_expert[q * MAX_LOCAL + tx] = -1

    return main


@tlx.jit(target={"kind": "cuda", "arch": "sm_90a"})
def rows_kernel(topk: int):

    @T.prim_func
    def main(
        ids: T.Tensor((ntok, topk), "int32"),
        first_expert: T.int32,
        chunk_base: T.Tensor((nchunk, nlocal), "int32"),
        offsets: T.Tensor((nlocal + 1,), "int32"),
        row_of: T.Tensor((ntok, topk), "int32"),
        entry_of_row: T.Tensor((nrows,), "int32"),
    ):
        with T.Kernel(nchunk, threads=THREADS) as c:
            tx = T.get_thread_binding()
            s_ids = T.alloc_shared((CHUNK * topk,), "int32")
            s_next = T.alloc_shared((MAX_LOCAL,), "int32")  # next free row of each expert
            n = T.alloc_var("int32")
            i = T.alloc_var("int32")
            e = T.alloc_var("int32")
            peers = T.alloc_var("uint32")
            rank = T.alloc_var("int32")
            base = T.alloc_var("int32")
            n = T.min(ntok - c * CHUNK, CHUNK) * topk
            for b in T.serial(T.ceildiv(CHUNK * topk, THREADS)):
                if b * THREADS + tx < n:
                    s_ids[b * THREADS + tx] = ids[c * CHUNK + (b * THREADS + tx) // topk, (b * THREADS + tx) % topk] - first_expert
            for b in T.serial(T.ceildiv(nlocal, THREADS)):
                if b * THREADS + tx < nlocal:
                    s_next[b * THREADS + tx] = offsets[b * THREADS + tx] + chunk_base[c, b * THREADS + tx]
            T.sync_threads()
            if tx < WARP:
                for s in T.serial(T.ceildiv(n, WARP)):
                    i = s * WARP + tx
                    e = -1  # past the chunk or another rank's expert
                    if i < n:
                        if s_ids[i] >= 0 and s_ids[i] < nlocal:
                            e = s_ids[i]
                    peers = T.match_any_sync(e)
                    rank = T.cast(T.min(T.popcount(peers & ((T.uint32(1) << T.cast(tx, "uint32")) - T.uint32(1))), T.uint32(WARP)), "int32")
                    base = 0
                    if e >= 0:
                        base = s_next[e]
                    T.sync_warp()
                    if e >= 0:
                        row_of[c * CHUNK + i // topk, i % topk] = base + rank
                        entry_of_row[base + rank] = c * CHUNK * topk + i
                        if rank == 0:
                            s_next[e] = base + T.cast(T.min(T.popcount(peers), T.uint32(WARP)), "int32")
                    elif i < n:
                        row_of[c * CHUNK + i // topk, i % topk] = -1
                    T.sync_warp()

    return main


def routing_metadata(ids, n_experts: int, rank: int = 0, n_ranks: int = 1, align: int = 128):
    """Metadata of rank ``rank``'s experts for ``ids`` [T, k] int32 (CUDA). Returns a dict like
    ``reference.metadata_ref`` but with ``entry_of_row`` / ``block_expert`` at their static size."""
    import torch

    if ids.dtype != torch.int32 or ids.dim() != 2:
        raise ValueError(f"ids: expected a 2-D int32 tensor, got {ids.dtype} of shape {tuple(ids.shape)}")
    if n_experts % n_ranks or not 0 <= rank < n_ranks:
        raise ValueError(f"rank/n_ranks: expected 0 <= rank < n_ranks dividing {n_experts}, got {rank}/{n_ranks}")
    el = n_experts // n_ranks
    if el > MAX_LOCAL:
        raise ValueError(f"n_experts // n_ranks: expected at most {MAX_LOCAL} local experts, got {el}")
    t, k = ids.shape
    dev = ids.device
    nchunk = max(1, (t + CHUNK - 1) // CHUNK)
    rows = max_rows(t, k, el, align)
    chunk_counts = torch.empty(nchunk, el, dtype=torch.int32, device=dev)
    chunk_base = torch.empty_like(chunk_counts)
    out = {
        "counts": torch.empty(el, dtype=torch.int32, device=dev),
        "offsets": torch.empty(el + 1, dtype=torch.int32, device=dev),
        "row_of": torch.empty(t, k, dtype=torch.int32, device=dev),
        "entry_of_row": torch.empty(rows, dtype=torch.int32, device=dev),
        "block_expert": torch.empty(rows // align, dtype=torch.int32, device=dev),
    }
    ids = ids.contiguous()
    count, scan, rows_ = _kernels(k, align)
    if t:
        count.launch(ids, rank * el, chunk_counts)
    else:
        chunk_counts.zero_()
    scan.launch(chunk_counts, chunk_base, out["counts"], out["offsets"], out["entry_of_row"], out["block_expert"])
    if t:
        rows_.launch(ids, rank * el, chunk_base, out["offsets"], out["row_of"], out["entry_of_row"])
    return out


@functools.lru_cache(maxsize=None)
def _kernels(topk: int, align: int):
    """The three kernels behind a plain dict lookup (the jit's own lookup costs µs per call)."""
    return count_kernel(topk), scan_kernel(align), rows_kernel(topk)
