"""Routing metadata: expert-major row layout of one rank's experts, padded per expert.

Three launches, all with integer results and a fixed assignment order (rows of an expert
follow the flat index ``t * topk + j``), so they are deterministic and bitwise equal to
``metadata.cu``:

1. ``count``: per chunk of tokens, each thread counts its experts' entries in the chunk.
2. ``scan``: one block; per expert a prefix over chunks, the padded offsets, the expert of
   every row block, padding rows marked -1.
3. ``rows``: per chunk, each thread walks the chunk's entries in order and hands its
   experts' entries consecutive rows.

Outputs (see ``reference.metadata_ref``): counts [El], offsets [El + 1], row_of [T, k],
entry_of_row [R], block_expert [R // align], with R = ``max_rows(T, k, El, align)``.
Rows past ``offsets[El]`` are left untouched except that their blocks get expert -1.
"""

from __future__ import annotations

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
THREADS = 128
MAX_LOCAL = 1024  # local experts per rank (the scan keeps counts and offsets in shared memory)


def max_rows(n_tokens: int, topk: int, n_local: int, align: int = 128) -> int:
    """An upper bound of the padded rows, a multiple of ``align`` (static given T)."""
    rows = n_tokens * topk + n_local * (align - 1)
    return (rows + align - 1) // align * align


@tlx.jit(target={"kind": "cuda", "arch": "sm_90a"})
def count_kernel(topk: int):

    @T.prim_func
    def main(
        ids: T.Tensor((ntok, topk), "int32"),
        first_expert: T.Tensor((1,), "int32"),
        chunk_counts: T.Tensor((nchunk, nlocal), "int32"),
    ):
        with T.Kernel(nchunk, threads=THREADS) as c:
            tx = T.get_thread_binding()
            s_ids = T.alloc_shared((CHUNK * topk,), "int32")
            n = T.alloc_var("int32")
            cnt = T.alloc_var("int32")
            n = T.min(ntok - c * CHUNK, CHUNK) * topk
            for i in T.serial(T.ceildiv(CHUNK * topk, THREADS)):
                if i * THREADS + tx < n:
                    s_ids[i * THREADS + tx] = ids[c * CHUNK + (i * THREADS + tx) // topk, (i * THREADS + tx) % topk] - first_expert[0]
            T.sync_threads()
            for b in T.serial(T.ceildiv(nlocal, THREADS)):
                if b * THREADS + tx < nlocal:
                    cnt = 0
                    for i in T.serial(n):
                        if s_ids[i] == b * THREADS + tx:
                            cnt = cnt + 1
                    chunk_counts[c, b * THREADS + tx] = cnt

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
        with T.Kernel(1, threads=THREADS):
            tx = T.get_thread_binding()
            s_counts = T.alloc_shared((MAX_LOCAL,), "int32")
            s_off = T.alloc_shared((MAX_LOCAL + 1,), "int32")
            run = T.alloc_var("int32")
            lo = T.alloc_var("int32")
            hi = T.alloc_var("int32")
            for b in T.serial(T.ceildiv(nlocal, THREADS)):
                if b * THREADS + tx < nlocal:
                    run = 0
                    for c in T.serial(nchunk):
                        chunk_base[c, b * THREADS + tx] = run
                        run = run + chunk_counts[c, b * THREADS + tx]
                    s_counts[b * THREADS + tx] = run
                    counts[b * THREADS + tx] = run
            T.sync_threads()
            if tx == 0:
                s_off[0] = 0
                for e in T.serial(nlocal):
                    s_off[e + 1] = s_off[e] + T.ceildiv(s_counts[e], align) * align
            T.sync_threads()
            for b in T.serial(T.ceildiv(nlocal + 1, THREADS)):
                if b * THREADS + tx <= nlocal:
                    offsets[b * THREADS + tx] = s_off[b * THREADS + tx]
            for b in T.serial(T.ceildiv(nlocal, THREADS)):
                if b * THREADS + tx < nlocal:
                    lo = s_off[b * THREADS + tx]
                    hi = s_off[b * THREADS + tx + 1]
                    run = s_counts[b * THREADS + tx]
                    for r in T.serial(hi - lo - run):
                        entry_of_row[lo + run + r] = -1
                    for q in T.serial((hi - lo) // align):
                        block_expert[lo // align + q] = b * THREADS + tx
            lo = s_off[nlocal]
            for q in T.serial(T.ceildiv(nblocks, THREADS)):
                if q * THREADS + tx < nblocks and (q * THREADS + tx) * align >= lo:
                    block_expert[q * THREADS + tx] = -1

    return main


@tlx.jit(target={"kind": "cuda", "arch": "sm_90a"})
def rows_kernel(topk: int):

    @T.prim_func
    def main(
        ids: T.Tensor((ntok, topk), "int32"),
        first_expert: T.Tensor((1,), "int32"),
        chunk_base: T.Tensor((nchunk, nlocal), "int32"),
        offsets: T.Tensor((nlocal + 1,), "int32"),
        row_of: T.Tensor((ntok, topk), "int32"),
        entry_of_row: T.Tensor((nrows,), "int32"),
    ):
        with T.Kernel(nchunk, threads=THREADS) as c:
            tx = T.get_thread_binding()
            s_ids = T.alloc_shared((CHUNK * topk,), "int32")
            n = T.alloc_var("int32")
            row = T.alloc_var("int32")
            n = T.min(ntok - c * CHUNK, CHUNK) * topk
            for i in T.serial(T.ceildiv(CHUNK * topk, THREADS)):
                if i * THREADS + tx < n:
                    s_ids[i * THREADS + tx] = ids[c * CHUNK + (i * THREADS + tx) // topk, (i * THREADS + tx) % topk] - first_expert[0]
            T.sync_threads()
            for i in T.serial(T.ceildiv(CHUNK * topk, THREADS)):
                if i * THREADS + tx < n:
                    if s_ids[i * THREADS + tx] < 0 or s_ids[i * THREADS + tx] >= nlocal:
                        row_of[c * CHUNK + (i * THREADS + tx) // topk, (i * THREADS + tx) % topk] = -1
            for b in T.serial(T.ceildiv(nlocal, THREADS)):
                if b * THREADS + tx < nlocal:
                    row = offsets[b * THREADS + tx] + chunk_base[c, b * THREADS + tx]
                    for i in T.serial(n):
                        if s_ids[i] == b * THREADS + tx:
                            row_of[c * CHUNK + i // topk, i % topk] = row
                            entry_of_row[row] = c * CHUNK * topk + i
                            row = row + 1

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
    first = torch.tensor([rank * el], dtype=torch.int32, device=dev)
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
    if t:
        count_kernel(k)(ids, first, chunk_counts)
    else:
        chunk_counts.zero_()
    scan_kernel(align)(chunk_counts, chunk_base, out["counts"], out["offsets"], out["entry_of_row"], out["block_expert"])
    if t:
        rows_kernel(k)(ids, first, chunk_base, out["offsets"], out["row_of"], out["entry_of_row"])
    return out
