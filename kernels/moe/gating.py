"""Gating: fp32 logits [T, E] (+ per-expert bias) -> top-k expert ids and weights.

One thread per token walks its row serially, so every reduction has one fixed order
(ascending expert id) that the CUDA baseline ``gating.cu`` repeats exactly. Selection
needs no per-expert mask: the j-th pick is the best entry strictly after pick j-1 in the
order (value descending, id ascending), which also breaks ties by the lower expert id.
See ``reference.py`` for the conventions (bias steers selection only, group score is the
group's largest biased score).
"""

from __future__ import annotations

import tilelang.language as T

import tlx

ntok = T.dynamic("T")  # symbolic token count; module level so the kernel source sees it
from kernels.moe.reference import SCORE_FUNCS

SCORE_CODES = {name: i for i, name in enumerate(SCORE_FUNCS)}
SOFTPLUS_LINEAR_FROM = 20.0  # softplus(x) is taken as x above this, like torch


def check_gating_args(n_experts, topk, score_func, n_groups, topk_groups):
    if score_func not in SCORE_FUNCS:
        raise ValueError(f"score_func: expected one of {SCORE_FUNCS}, got {score_func!r}")
    if not 1 <= topk <= n_experts:
        raise ValueError(f"topk: expected 1..{n_experts}, got {topk}")
    if not 1 <= n_groups <= 32 or n_experts % n_groups:
        raise ValueError(f"n_groups: expected a divisor of {n_experts} experts in 1..32, got {n_groups}")
    if not 1 <= topk_groups <= n_groups:
        raise ValueError(f"topk_groups: expected 1..{n_groups}, got {topk_groups}")
    if topk > topk_groups * (n_experts // n_groups):
        raise ValueError(f"topk: {topk} exceeds the {topk_groups * (n_experts // n_groups)} experts of the kept groups")


def _score(code, x, row_max, denom):
    """The score of logit ``x``; the softmax needs the row's max and denominator."""
    if code == 0:
        return T.exp(x - row_max) / denom
    if code == 1:
        return T.float32(1.0) / (T.float32(1.0) + T.exp(-x))
    return T.sqrt(T.if_then_else(x > T.float32(SOFTPLUS_LINEAR_FROM), x, T.log1p(T.exp(x))))


def _after(v, i, prev_v, prev_i):
    """Whether (v, i) comes strictly after the previous pick in (value desc, id asc) order."""
    return T.Or(v < prev_v, T.And(v == prev_v, i > prev_i))


@tlx.jit(out_idx=[2, 3], target={"kind": "cuda", "arch": "sm_90a"})
def gating_kernel(
    n_experts: int,
    topk: int,
    score_func: str = "softmax",
    n_groups: int = 1,
    topk_groups: int = 1,
    renormalize: bool = True,
    routed_scaling: float = 1.0,
    threads: int = 128,
):
    """Kernel ``(logits [T, E] f32, bias [E] f32) -> (ids [T, k] i32, weights [T, k] f32)``."""
    check_gating_args(n_experts, topk, score_func, n_groups, topk_groups)
    E = n_experts
    G = n_groups
    per_group = E // G
    code = SCORE_CODES[score_func]
    scaling = float(routed_scaling)

    @T.prim_func
    def main(
        logits: T.Tensor((ntok, E), "float32"),
        bias: T.Tensor((E,), "float32"),
        ids: T.Tensor((ntok, topk), "int32"),
        weights: T.Tensor((ntok, topk), "float32"),
    ):
        with T.Kernel(T.ceildiv(ntok, threads), threads=threads) as bx:
            tx = T.get_thread_binding()
            t = bx * threads + tx
            row_max = T.alloc_var("float32")
            denom = T.alloc_var("float32")
            kept = T.alloc_var("int32")
            prev_v = T.alloc_var("float32")
            prev_i = T.alloc_var("int32")
            best_v = T.alloc_var("float32")
            best_i = T.alloc_var("int32")
            gv = T.alloc_var("float32")
            total = T.alloc_var("float32")
            pick = T.alloc_local((topk,), "int32")
            wt = T.alloc_local((topk,), "float32")

            if t < ntok:
                if code == 0:
                    row_max = logits[t, 0]
                    for e in T.serial(1, E):
                        row_max = T.max(row_max, logits[t, e])
                    denom = T.float32(0.0)
                    for e in T.serial(E):
                        denom = denom + T.exp(logits[t, e] - row_max)
                kept = T.int32(-1)
                if G > 1:
                    kept = T.int32(0)
                    prev_v = T.infinity("float32")
                    prev_i = T.int32(-1)
                    for _ in T.serial(topk_groups):
                        best_i = T.int32(-1)
                        best_v = -T.infinity("float32")
                        for g in T.serial(G):
                            gv = _score(code, logits[t, g * per_group], row_max, denom) + bias[g * per_group]
                            for c in T.serial(1, per_group):
                                gv = T.max(gv, _score(code, logits[t, g * per_group + c], row_max, denom) + bias[g * per_group + c])
                            if _after(gv, g, prev_v, prev_i) and (best_i < 0 or gv > best_v):
                                best_v = gv
                                best_i = g
                        kept = kept | (T.int32(1) << best_i)
                        prev_v = best_v
                        prev_i = best_i
                prev_v = T.infinity("float32")
                prev_i = T.int32(-1)
                for j in T.serial(topk):
                    best_i = T.int32(-1)
                    best_v = -T.infinity("float32")
                    for e in T.serial(E):
                        gv = _score(code, logits[t, e], row_max, denom) + bias[e]
                        if ((kept >> (e // per_group)) & 1) == 1 and _after(gv, e, prev_v, prev_i) and (best_i < 0 or gv > best_v):
                            best_v = gv
                            best_i = e
                    pick[j] = best_i
                    prev_v = best_v
                    prev_i = best_i
                total = T.float32(0.0)
                for j in T.serial(topk):
                    wt[j] = _score(code, logits[t, pick[j]], row_max, denom)
                    total = total + wt[j]
                for j in T.serial(topk):
                    ids[t, j] = pick[j]
                    if renormalize:
                        weights[t, j] = wt[j] / total * T.float32(scaling)
                    else:
                        weights[t, j] = wt[j] * T.float32(scaling)

    return main


def gating(logits, bias, topk, score_func="softmax", n_groups=1, topk_groups=1, renormalize=True, routed_scaling=1.0):
    """Route ``logits`` [T, E] (fp32, CUDA); ``bias`` [E] or None. Returns (ids int32, weights f32)."""
    import torch

    if logits.dtype != torch.float32 or logits.dim() != 2:
        raise ValueError(f"logits: expected a 2-D float32 tensor, got {logits.dtype} of shape {tuple(logits.shape)}")
    e = logits.shape[1]
    if bias is None:
        bias = torch.zeros(e, dtype=torch.float32, device=logits.device)
    if logits.shape[0] == 0:  # a launch of zero blocks is an error
        t = logits.new_empty(0, topk)
        return t.int(), t
    kernel = gating_kernel(e, topk, score_func, n_groups, topk_groups, bool(renormalize), float(routed_scaling))
    return kernel(logits.contiguous(), bias.float().contiguous())
