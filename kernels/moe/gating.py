"""Gating: fp32 logits [T, E] (+ per-expert bias) -> top-k expert ids and weights.

One warp per token; lane ``l`` holds experts ``l, l + 32, l + 64, ...``. Order rules that the
CUDA baseline ``gating.cu`` repeats so results match bitwise (the scores themselves are
per-expert expressions, maxima are order-free):

* softmax denominator: lane ``l`` sums ``exp(x_e - max)`` over its experts in ascending ``e``,
  then the 32 partial sums are combined by a butterfly (``p += shfl_xor(p, d)`` for
  ``d = 16, 8, 4, 2, 1``), which leaves the same sum in every lane;
* selection: the j-th pick is the best entry strictly after pick j-1 in the order (value
  descending, id ascending), found as each lane's best then a butterfly arg-max; no per-expert
  mask is needed and ties go to the lower expert id;
* renormalisation sums the k weights in pick order.

See ``reference.py`` for the conventions (bias steers selection only, group score is the
group's largest biased score).
"""

from __future__ import annotations

import functools

import tilelang.language as T

import tlx

ntok = T.dynamic("T")  # symbolic token count; module level so the kernel source sees it
from kernels.moe.reference import SCORE_FUNCS
from kernels.outputs import check_out

SCORE_CODES = {name: i for i, name in enumerate(SCORE_FUNCS)}
SOFTPLUS_LINEAR_FROM = 20.0  # softplus(x) is taken as x above this, like torch
WARP = 32


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


def _better(v, i, best_v, best_i):
    """Whether candidate (v, i) beats (best_v, best_i): a real id first, then value desc, id asc."""
    return T.And(i >= 0, T.Or(best_i < 0, T.Or(v > best_v, T.And(v == best_v, i < best_i))))


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
    per_lane = (E + WARP - 1) // WARP
    ragged = E % WARP != 0  # the last lane slots hold no expert
    code = SCORE_CODES[score_func]
    scaling = float(routed_scaling)
    warps = threads // WARP

    @T.prim_func
    def main(
        logits: T.Tensor((ntok, E), "float32"),
        bias: T.Tensor((E,), "float32"),
        ids: T.Tensor((ntok, topk), "int32"),
        weights: T.Tensor((ntok, topk), "float32"),
    ):
        with T.Kernel(T.ceildiv(ntok, warps), threads=threads) as bx:
            tx = T.get_thread_binding()
            lane = tx % WARP
            t = bx * warps + tx // WARP
            x = T.alloc_local((per_lane,), "float32")
            sc = T.alloc_local((per_lane,), "float32")  # scores
            ch = T.alloc_local((per_lane,), "float32")  # scores + bias, for selection
            gs = T.alloc_local((G,), "float32")  # group scores
            pick = T.alloc_local((topk,), "int32")
            wt = T.alloc_local((topk,), "float32")
            row_max = T.alloc_var("float32")
            denom = T.alloc_var("float32")
            kept = T.alloc_var("int32")
            prev_v = T.alloc_var("float32")
            prev_i = T.alloc_var("int32")
            best_v = T.alloc_var("float32")
            best_i = T.alloc_var("int32")
            best_s = T.alloc_var("float32")
            o_v = T.alloc_var("float32")
            o_i = T.alloc_var("int32")
            o_s = T.alloc_var("float32")
            total = T.alloc_var("float32")

            if t < ntok:  # the same for the whole warp, so the shuffles below see every lane
                for i in T.unroll(per_lane):
                    if ragged:
                        x[i] = T.if_then_else(i * WARP + lane < E, logits[t, T.min(i * WARP + lane, E - 1)], -T.infinity("float32"))
                    else:
                        x[i] = logits[t, i * WARP + lane]
                row_max = T.float32(0.0)
                denom = T.float32(0.0)
                if code == 0:
                    row_max = x[0]
                    for i in T.unroll(1, per_lane):
                        row_max = T.max(row_max, x[i])
                    for d in T.unroll(5):
                        row_max = T.max(row_max, T.shfl_xor(row_max, 16 >> d))
                    for i in T.unroll(per_lane):
                        if not ragged or i * WARP + lane < E:
                            denom = denom + T.exp(x[i] - row_max)
                    for d in T.unroll(5):
                        denom = denom + T.shfl_xor(denom, 16 >> d)
                for i in T.unroll(per_lane):
                    sc[i] = _score(code, x[i], row_max, denom)
                    if ragged:
                        ch[i] = T.if_then_else(i * WARP + lane < E, sc[i] + bias[T.min(i * WARP + lane, E - 1)], -T.infinity("float32"))
                    else:
                        ch[i] = sc[i] + bias[i * WARP + lane]
                kept = T.int32(-1)
                if G > 1:
                    for g in T.unroll(G):
                        gs[g] = -T.infinity("float32")
                        for i in T.unroll(per_lane):
                            if (i * WARP + lane) // per_group == g:
                                gs[g] = T.max(gs[g], ch[i])
                        for d in T.unroll(5):
                            gs[g] = T.max(gs[g], T.shfl_xor(gs[g], 16 >> d))
                    kept = T.int32(0)
                    prev_v = T.infinity("float32")
                    prev_i = T.int32(-1)
                    for _ in T.unroll(topk_groups):
                        best_i = T.int32(-1)
                        best_v = -T.infinity("float32")
                        for g in T.unroll(G):
                            if _after(gs[g], g, prev_v, prev_i) and (best_i < 0 or gs[g] > best_v):
                                best_v = gs[g]
                                best_i = g
                        kept = kept | (T.int32(1) << best_i)
                        prev_v = best_v
                        prev_i = best_i
                prev_v = T.infinity("float32")
                prev_i = T.int32(-1)
                for j in T.unroll(topk):
                    # The lane's best candidate (its experts ascend with i), then a butterfly
                    # arg-max over the lanes; every lane ends with the same pick.
                    best_i = T.int32(-1)
                    best_v = -T.infinity("float32")
                    best_s = T.float32(0.0)
                    for i in T.unroll(per_lane):
                        if ((kept >> ((i * WARP + lane) // per_group)) & 1) == 1 and (not ragged or i * WARP + lane < E) and _after(ch[i], i * WARP + lane, prev_v, prev_i) and (best_i < 0 or ch[i] > best_v):
                            best_v = ch[i]
                            best_i = i * WARP + lane
                            best_s = sc[i]
                    for d in T.unroll(5):
                        o_v = T.shfl_xor(best_v, 16 >> d)
                        o_i = T.shfl_xor(best_i, 16 >> d)
                        o_s = T.shfl_xor(best_s, 16 >> d)
                        if _better(o_v, o_i, best_v, best_i):
                            best_v = o_v
                            best_i = o_i
                            best_s = o_s
                    pick[j] = best_i
                    wt[j] = best_s
                    prev_v = best_v
                    prev_i = best_i
                total = T.float32(0.0)
                for j in T.unroll(topk):
                    total = total + wt[j]
                for j in T.unroll(topk):
                    if lane == j:
                        ids[t, j] = pick[j]
                        if renormalize:
                            weights[t, j] = wt[j] / total * T.float32(scaling)
                        else:
                            weights[t, j] = wt[j] * T.float32(scaling)

    return main


@functools.lru_cache(maxsize=None)
def _kernel(*params):
    """``gating_kernel(*params)`` behind a plain dict lookup: the jit's own lookup binds and
    normalises every parameter, tens of µs on each call."""
    return gating_kernel(*params)


@functools.lru_cache(maxsize=16)
def _zero_bias(n_experts, device):
    """A zero bias kept per (E, device): no allocation and memset on every unbiased call."""
    import torch

    return torch.zeros(n_experts, dtype=torch.float32, device=device)


def gating(logits, bias, topk, score_func="softmax", n_groups=1, topk_groups=1, renormalize=True, routed_scaling=1.0,
           out=None):
    """Route ``logits`` [T, E] (fp32, CUDA); ``bias`` [E] or None. Returns (ids int32, weights f32);
    ``out``: an (ids, weights) pair of [T, topk] tensors to write instead (e.g. a send buffer's rows)."""
    import torch

    if logits.dtype != torch.float32 or logits.dim() != 2:
        raise ValueError(f"logits: expected a 2-D float32 tensor, got {logits.dtype} of shape {tuple(logits.shape)}")
    e = logits.shape[1]
    if bias is None:
        bias = _zero_bias(e, logits.device)
    if logits.shape[0] == 0:  # a launch of zero blocks is an error
        t = logits.new_empty(0, topk)
        return t.int(), t
    kernel = _kernel(e, topk, score_func, n_groups, topk_groups, bool(renormalize), float(routed_scaling))
    shape = (logits.shape[0], topk)
    if out is None:
        ids = torch.empty(shape, dtype=torch.int32, device=logits.device)
        weights = torch.empty(shape, dtype=torch.float32, device=logits.device)
    else:
        ids, weights = check_out(out, "an (ids, weights) pair", [(torch.int32, shape), (torch.float32, shape)], logits.device)
    kernel.launch(logits.contiguous(), bias.float().contiguous(), ids, weights)
    return ids, weights
