"""Permute (gather tokens into the expert-major layout) and combine (weighted top-k sum).

Permute copies whole rows, so any order gives the same bits; padding rows are written as
zero (scales too), rows past ``offsets[-1]`` are not touched. Combine accumulates
``fma(w[t, j], y[row_of[t, j]], acc)`` in fp32 for j = 0..k-1 starting from 0, skipping
rows of -1, then rounds to bf16 once: a token's result does not depend on the batch.
``permute.cu`` repeats both.
"""


import tilelang.language as T

import tlx

# Symbolic sizes (module level so the kernel sources see them): tokens, rows, local experts + 1.
ntok = T.dynamic("T")
nrows = T.dynamic("R")
nl1 = T.dynamic("El1")

GROUP = 128  # activation scale group along H


@tlx.jit(target={"kind": "cuda", "arch": "sm_90a"})
def permute_kernel(hidden: int, topk: int, dtype: str = "bfloat16", threads: int = 256):
    """``(x [T, H], entry_of_row [R], offsets [El+1]) -> xp [R, H]`` for a bf16 ``x``."""

    @T.prim_func
    def main(
        x: T.Tensor((ntok, hidden), dtype),
        entry_of_row: T.Tensor((nrows,), "int32"),
        offsets: T.Tensor((nl1,), "int32"),
        xp: T.Tensor((nrows, hidden), dtype),
    ):
        with T.Kernel(nrows, threads=threads) as r:
            entry = T.alloc_var("int32")
            if r < offsets[nl1 - 1]:
                entry = entry_of_row[r]
                if entry >= 0:
                    for h in T.Parallel(hidden):
                        xp[r, h] = x[entry // topk, h]
                else:
                    for h in T.Parallel(hidden):
                        xp[r, h] = T.cast(0, dtype)

    return main


@tlx.jit(target={"kind": "cuda", "arch": "sm_90a"})
def permute_fp8_kernel(hidden: int, topk: int, threads: int = 256):
    """``(x [T, H] e4m3, sx [T, H/128] f32, entry_of_row, offsets) -> (xp [R, H], sxp [R, H/128])``."""
    ng = hidden // GROUP

    @T.prim_func
    def main(
        x: T.Tensor((ntok, hidden), "float8_e4m3"),
        sx: T.Tensor((ntok, ng), "float32"),
        entry_of_row: T.Tensor((nrows,), "int32"),
        offsets: T.Tensor((nl1,), "int32"),
        xp: T.Tensor((nrows, hidden), "float8_e4m3"),
        sxp: T.Tensor((nrows, ng), "float32"),
    ):
        with T.Kernel(nrows, threads=threads) as r:
            entry = T.alloc_var("int32")
            if r < offsets[nl1 - 1]:
                entry = entry_of_row[r]
                if entry >= 0:
                    for h in T.Parallel(hidden):
                        xp[r, h] = x[entry // topk, h]
                    for g in T.Parallel(ng):
                        sxp[r, g] = sx[entry // topk, g]
                else:
                    for h in T.Parallel(hidden):
                        xp[r, h] = T.cast(0, "float8_e4m3")
                    for g in T.Parallel(ng):
                        sxp[r, g] = T.float32(0)

    return main


@tlx.jit(target={"kind": "cuda", "arch": "sm_90a"})
def combine_kernel(hidden: int, topk: int, threads: int = 128):
    """``(y [R, H] bf16, row_of [T, k], weights [T, k] f32) -> out [T, H] bf16``; each thread owns
    runs of 8 adjacent columns so rows move in 16-byte loads and stores."""
    if hidden % (threads * 8):
        raise ValueError(f"hidden: expected a multiple of {threads * 8}, got {hidden}")
    runs = hidden // (threads * 8)

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
            row = T.alloc_var("int32")
            w = T.alloc_var("float32")
            for c in T.unroll(runs * 8):  # unrolled: acc stays in registers
                acc[c] = T.float32(0)
            for j in T.serial(topk):
                row = row_of[t, j]
                w = weights[t, j]
                if row >= 0:
                    for c in T.unroll(runs):
                        for v in T.vectorized(8):
                            acc[c * 8 + v] = T.ieee_fmaf(w, T.cast(y[row, (c * threads + tx) * 8 + v], "float32"), acc[c * 8 + v])
            for c in T.unroll(runs):
                for v in T.vectorized(8):
                    out[t, (c * threads + tx) * 8 + v] = T.cast(acc[c * 8 + v], "bfloat16")

    return main


def _check(name, t, dtype, ndim):
    if t.dtype != dtype or t.dim() != ndim:
        raise ValueError(f"{name}: expected a {ndim}-D {dtype} tensor, got {t.dtype} of shape {tuple(t.shape)}")


def permute(x, meta, topk: int, x_scales=None):
    """Gather ``x`` [T, H] (bf16, or e4m3 with ``x_scales`` [T, H/128]) into expert-major rows."""
    import torch

    rows = meta["entry_of_row"].shape[0]
    h = x.shape[1]
    if x_scales is None:
        _check("x", x, torch.bfloat16, 2)
        xp = torch.empty(rows, h, dtype=x.dtype, device=x.device)
        permute_kernel(h, topk)(x.contiguous(), meta["entry_of_row"], meta["offsets"], xp)
        return xp
    _check("x", x, torch.float8_e4m3fn, 2)
    _check("x_scales", x_scales, torch.float32, 2)
    if h % GROUP or x_scales.shape != (x.shape[0], h // GROUP):
        raise ValueError(f"x_scales: expected shape {(x.shape[0], h // GROUP)}, got {tuple(x_scales.shape)}")
    xp = torch.empty(rows, h, dtype=x.dtype, device=x.device)
    sxp = torch.empty(rows, h // GROUP, dtype=torch.float32, device=x.device)
    permute_fp8_kernel(h, topk)(x.contiguous(), x_scales.contiguous(), meta["entry_of_row"], meta["offsets"], xp, sxp)
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
    return_buf = torch.empty(t, y.shape[1], dtype=torch.bfloat16, device=y.device)
    combine_kernel(y.shape[1], k)(y.contiguous(), row_of.contiguous(), weights.contiguous(), return_buf)
    return return_buf
