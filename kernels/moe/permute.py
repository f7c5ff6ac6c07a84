"""Permute (tokens into the expert-major layout) and combine (weighted top-k sum).

Permute copies whole rows, so any order gives the same bits; padding rows are written as
zero (scales too) unless ``zero_padding`` is off, rows past ``offsets[-1]`` are not touched.
Combine accumulates ``fma(w[t, j], y[row_of[t, j]], acc)`` in fp32 for j = 0..k-1 starting from 0, skipping
rows of -1, then rounds to bf16 once: a token's result does not depend on the batch.
``permute.cu`` repeats both.
"""

import functools

import tilelang.language as T

import tlx

# Symbolic sizes (module level so the kernel sources see them): tokens, rows, local experts + 1.
ntok = T.dynamic("T")
nrows = T.dynamic("R")
nl1 = T.dynamic("El1")

GROUP = 128  # activation scale group along H
WARP = 32
_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4, "float8_e4m3": 1}


def _scatter_rows(hidden: int, topk: int, dtype: str, scale_groups: int, threads: int, zero_padding: bool = True,
                  trigger: bool = False):
    """Warp ``i`` copies token ``i``'s row to its k rows (read once, ``hidden / 32`` elements a
    lane as 16-byte words, all loads before any store) and, with ``zero_padding``, zeroes row
    ``i`` if that is a padding row (entry -1); there are at least as many rows as tokens (``R >=
    T * k``). Without it the grid covers the tokens only: at T = 8 (V4-Flash) the padding is
    6096 of 6144 rows, 25 MB of zeros. The scale row (``scale_groups`` floats, 0 for none) goes
    lane by lane. ``trigger``: each CTA lets a programmatic dependent launch as it starts
    (``T.pdl_trigger()``), so a decode GEMM after it loads its first weights while the rows move."""
    per_word = 16 // _BYTES[dtype]
    if hidden % per_word:
        raise ValueError(f"hidden: expected a multiple of {per_word} ({dtype} rows move in 16-byte words), got {hidden}")
    if threads % WARP:
        raise ValueError(f"threads: expected a multiple of {WARP}, got {threads}")
    words = hidden // per_word
    per_lane = (words + WARP - 1) // WARP
    ragged = words % WARP != 0  # the last word slots of some lanes are past the row
    warps = threads // WARP
    ng = scale_groups
    spl = (ng + WARP - 1) // WARP  # scales per lane

    @T.macro
    def move(x, sx, row_of, entry_of_row, offsets, xp, sxp, b, lane):
        buf = T.alloc_local((per_lane * per_word,), dtype)
        sbuf = T.alloc_local((max(spl, 1),), "float32")
        rows = T.alloc_local((topk,), "int32")
        row = T.alloc_var("int32")
        i = b * warps + T.get_thread_binding() // WARP  # token i and row i
        if i < ntok:
            for j in T.unroll(topk):
                rows[j] = row_of[i, j]
            for c in T.unroll(per_lane):
                if not ragged or c * WARP + lane < words:
                    for v in T.vectorized(per_word):
                        buf[c * per_word + v] = x[i, (c * WARP + lane) * per_word + v]
            for g in T.unroll(spl):
                if g * WARP + lane < ng:
                    sbuf[g] = sx[i, g * WARP + lane]
            for j in T.unroll(topk):
                row = rows[j]
                if row >= 0:
                    for c in T.unroll(per_lane):
                        if not ragged or c * WARP + lane < words:
                            for v in T.vectorized(per_word):
                                xp[row, (c * WARP + lane) * per_word + v] = buf[c * per_word + v]
                    for g in T.unroll(spl):
                        if g * WARP + lane < ng:
                            sxp[row, g * WARP + lane] = sbuf[g]
        if zero_padding and i < nrows and i < offsets[nl1 - 1]:
            if entry_of_row[i] < 0:
                for c in T.unroll(per_lane):
                    if not ragged or c * WARP + lane < words:
                        for v in T.vectorized(per_word):
                            xp[i, (c * WARP + lane) * per_word + v] = T.cast(0, dtype)
                for g in T.unroll(spl):
                    if g * WARP + lane < ng:
                        sxp[i, g * WARP + lane] = T.float32(0)

    if ng == 0:

        @T.prim_func
        def main(
            x: T.Tensor((ntok, hidden), dtype),
            row_of: T.Tensor((ntok, topk), "int32"),
            entry_of_row: T.Tensor((nrows,), "int32"),
            offsets: T.Tensor((nl1,), "int32"),
            xp: T.Tensor((nrows, hidden), dtype),
        ):
            with T.Kernel(T.ceildiv(nrows if zero_padding else ntok, warps), threads=threads) as b:
                move(x, x, row_of, entry_of_row, offsets, xp, xp, b, T.get_thread_binding() % WARP)

        return main

    @T.prim_func
    def main_scaled(
        x: T.Tensor((ntok, hidden), dtype),
        sx: T.Tensor((ntok, ng), "float32"),
        row_of: T.Tensor((ntok, topk), "int32"),
        entry_of_row: T.Tensor((nrows,), "int32"),
        offsets: T.Tensor((nl1,), "int32"),
        xp: T.Tensor((nrows, hidden), dtype),
        sxp: T.Tensor((nrows, ng), "float32"),
    ):
        with T.Kernel(T.ceildiv(nrows if zero_padding else ntok, warps), threads=threads) as b:
            if trigger:
                T.pdl_trigger()
            move(x, sx, row_of, entry_of_row, offsets, xp, sxp, b, T.get_thread_binding() % WARP)

    return main_scaled


@tlx.jit(target={"kind": "cuda", "arch": "sm_90a"})
def permute_kernel(hidden: int, topk: int, dtype: str = "bfloat16", threads: int = 256):
    """``(x [T, H], row_of [T, k], entry_of_row [R], offsets [El+1]) -> xp [R, H]`` for a bf16 ``x``."""
    return _scatter_rows(hidden, topk, dtype, 0, threads)


@tlx.jit(target={"kind": "cuda", "arch": "sm_90a"})
def permute_fp8_kernel(hidden: int, topk: int, threads: int = 256, zero_padding: bool = True, trigger: bool = False):
    """``(x [T, H] e4m3, sx [T, H/128] f32, row_of, entry_of_row, offsets) -> (xp [R, H], sxp [R, H/128])``."""
    if hidden % GROUP:
        raise ValueError(f"hidden: expected a multiple of {GROUP}, got {hidden}")
    return _scatter_rows(hidden, topk, "float8_e4m3", hidden // GROUP, threads, zero_padding, trigger)


@tlx.jit(target={"kind": "cuda", "arch": "sm_90a"})
def combine_kernel(hidden: int, topk: int, threads: int = 128, ahead: int = 3):
    """``(y [R, H] bf16, row_of [T, k], weights [T, k] f32) -> out [T, H] bf16``; a block per token,
    each thread owns runs of 8 adjacent columns (16-byte loads and stores). The k rows and
    weights are read first; then the y words of ``ahead`` rows (0: all k) are loaded before
    they are accumulated, from row 0 for skipped entries so the loads need no branch."""
    if hidden % (threads * 8):
        raise ValueError(f"hidden: expected a multiple of {threads * 8}, got {hidden}")
    runs = hidden // (threads * 8)
    step = ahead if 0 < ahead < topk else topk
    stages = (topk + step - 1) // step

    @T.prim_func
    def main(
        y: T.Tensor((nrows, hidden), "bfloat16"),
        row_of: T.Tensor((ntok, topk), "int32"),
        weights: T.Tensor((ntok, topk), "float32"),
        out: T.Tensor((ntok, hidden), "bfloat16"),
    ):
        with T.Kernel(ntok, threads=threads) as t:
            tx = T.get_thread_binding()
            acc = T.alloc_local((runs * 8,), "float32")
            rows = T.alloc_local((topk,), "int32")
            ws = T.alloc_local((topk,), "float32")
            yv = T.alloc_local((step * runs * 8,), "bfloat16")
            row = T.alloc_var("int32")
            for j in T.unroll(topk):
                rows[j] = row_of[t, j]
                ws[j] = weights[t, j]
            for c in T.unroll(runs * 8):  # unrolled: acc stays in registers
                acc[c] = T.float32(0)
            for s in T.unroll(stages):
                for q in T.unroll(step):
                    if s * step + q < topk:
                        row = T.max(rows[s * step + q], 0)
                        for c in T.unroll(runs):
                            for v in T.vectorized(8):
                                yv[(q * runs + c) * 8 + v] = y[row, (c * threads + tx) * 8 + v]
                for q in T.unroll(step):
                    if s * step + q < topk:
                        for c in T.unroll(runs):
                            for v in T.unroll(8):
                                acc[c * 8 + v] = T.if_then_else(
                                    rows[s * step + q] >= 0,
                                    T.ieee_fmaf(ws[s * step + q], T.cast(yv[(q * runs + c) * 8 + v], "float32"), acc[c * 8 + v]),
                                    acc[c * 8 + v],
                                )
            for c in T.unroll(runs):
                for v in T.vectorized(8):
                    out[t, (c * threads + tx) * 8 + v] = T.cast(acc[c * 8 + v], "bfloat16")

    return main


def _check(name, t, dtype, ndim):
    if t.dtype != dtype or t.dim() != ndim:
        raise ValueError(f"{name}: expected a {ndim}-D {dtype} tensor, got {t.dtype} of shape {tuple(t.shape)}")


def permute(x, meta, topk: int, x_scales=None, zero_padding: bool = True):
    """Gather ``x`` [T, H] (bf16, or e4m3 with ``x_scales`` [T, H/128]) into expert-major rows;
    ``zero_padding`` off (e4m3 only): the padding rows are left unwritten, for a consumer that
    reads none of them (``moe_layer``: its GEMMs' padding rows are never read)."""
    import torch

    _check("x", x, torch.bfloat16 if x_scales is None else torch.float8_e4m3fn, 2)
    rows = meta["entry_of_row"].shape[0]
    t, h = x.shape
    if tuple(meta["row_of"].shape) != (t, topk):
        raise ValueError(f"meta['row_of']: expected shape {(t, topk)}, got {tuple(meta['row_of'].shape)}")
    if rows < t:  # a warp per row index covers the tokens too
        raise ValueError(f"meta['entry_of_row']: expected at least {t} rows (one per token at least), got {rows}")
    xp = torch.empty(rows, h, dtype=x.dtype, device=x.device)
    if x_scales is None:
        if not zero_padding:
            raise ValueError("zero_padding: only the e4m3 permute (with x_scales) leaves padding rows unwritten")
        _kernel(permute_kernel, h, topk).launch(x.contiguous(), meta["row_of"], meta["entry_of_row"], meta["offsets"], xp)
        return xp
    _check("x_scales", x_scales, torch.float32, 2)
    if h % GROUP or x_scales.shape != (t, h // GROUP):
        raise ValueError(f"x_scales: expected shape {(t, h // GROUP)}, got {tuple(x_scales.shape)}")
    sxp = torch.empty(rows, h // GROUP, dtype=torch.float32, device=x.device)
    _kernel(permute_fp8_kernel, h, topk, zero_padding=zero_padding).launch(x.contiguous(), x_scales.contiguous(), meta["row_of"],
                                                              meta["entry_of_row"], meta["offsets"], xp, sxp)
    return xp, sxp


def combine(y, row_of, weights):
    """``out[t] = sum_j weights[t, j] * y[row_of[t, j]]`` (bf16 out, fp32 accumulation in j order)."""
    import torch

    _check("y", y, torch.bfloat16, 2)
    _check("row_of", row_of, torch.int32, 2)
    _check("weights", weights, torch.float32, 2)
    t, k = row_of.shape
    if t == 0:
        return torch.empty(0, y.shape[1], dtype=torch.bfloat16, device=y.device)
    out = torch.empty(t, y.shape[1], dtype=torch.bfloat16, device=y.device)
    _kernel(combine_kernel, y.shape[1], k).launch(y.contiguous(), row_of.contiguous(), weights.contiguous(), out)
    return out


@functools.lru_cache(maxsize=None)
def _kernel(factory, *params, **options):
    """``factory(*params, **options)`` behind a plain dict lookup (the jit's own lookup costs µs per call)."""
    return factory(*params, **options)
