"""The unfused expert-parallel MoE layer on one GPU, built from the kernels of this package.

gating -> per-token FP8 cast of x -> routing metadata -> permute (e4m3 + scales) ->
L1 grouped GEMM (N = 2I, K = H) -> SwiGLU + FP8 cast -> L2 grouped GEMM (N = H, K = I)
-> combine. Every step computes each token's (or row's) result from that token's data
alone, in a fixed order, so the output bits of a token do not depend on the batch or the
run. This is the baseline a fused MoE kernel is validated (bitwise) and timed against.

``n_ranks > 1`` simulates expert parallelism on one device: rank r owns experts
``[r * E / R, (r + 1) * E / R)``, builds its own metadata, permutes, runs both GEMMs on
its experts only, and the combine pulls every token's k results from the ranks' outputs
(one buffer, rank-major) in k order, so the result equals the single-rank one bit for bit.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kernels.moe.gating import gating
from kernels.moe.grouped_gemm import grouped_gemm_contiguous
from kernels.moe.metadata import routing_metadata
from kernels.moe.permute import combine, permute


@dataclass(frozen=True)
class MoEConfig:
    """Routing and activation settings of one MoE layer."""

    n_experts: int
    topk: int
    score_func: str = "sqrtsoftplus"
    n_groups: int = 1
    topk_groups: int = 1
    renormalize: bool = True
    routed_scaling: float = 1.0
    clamp: float = 10.0


V4_FLASH = dict(n_experts=256, hidden=4096, inter=2048, cfg=MoEConfig(256, 6, "sqrtsoftplus", routed_scaling=1.5))
V4_PRO = dict(n_experts=384, hidden=7168, inter=3072, cfg=MoEConfig(384, 6, "sqrtsoftplus", routed_scaling=2.5))


def _default_act_quant(x):
    from kernels.quant.group_cast import per_token_group_cast

    return per_token_group_cast(x, group=128)


def _default_swiglu_quant(h, clamp, rows):
    from kernels.quant.group_cast import swiglu_cast

    return swiglu_cast(h, clamp=clamp, group=128, rows=rows)


def _check_layer_args(x, logits, w1, w2, cfg: MoEConfig, n_ranks: int, ranks_name: str = "n_ranks") -> None:
    e, two_i, h = w1.shape
    if x.dtype != torch.bfloat16 or x.dim() != 2 or x.shape[1] != h:
        raise ValueError(f"x: expected bf16 [T, {h}], got {x.dtype} of shape {tuple(x.shape)}")
    if tuple(logits.shape) != (x.shape[0], e) or e != cfg.n_experts:
        raise ValueError(f"logits: expected [{x.shape[0]}, {cfg.n_experts}] for w1 of {e} experts, got {tuple(logits.shape)}")
    if tuple(w2.shape) != (e, h, two_i // 2):
        raise ValueError(f"w2: expected shape {(e, h, two_i // 2)}, got {tuple(w2.shape)}")
    if n_ranks < 1 or e % n_ranks:
        raise ValueError(f"{ranks_name}: expected a divisor of {e} experts, got {n_ranks}")


def _expert_rows(xq, xs, ids, meta, w1, s1, w2, s2, clamp: float, swiglu_quant):
    """One rank's experts (``w1 .. s2`` its slices) on the entries of ``ids`` that ``meta`` (its
    ``routing_metadata``) routes to it: permute, L1, SwiGLU cast, L2. Returns y [R, H] bf16, in
    the metadata's expert-contiguous row order (padding rows unspecified)."""
    # no step reads a padding row: permute leaves them unwritten, the GEMMs and the SwiGLU cast
    # store routed rows only where that saves time (``grouped_gemm_contiguous``, ``swiglu_cast``)
    xp, sp = permute(xq, meta, ids.shape[1], xs, zero_padding=False)
    rows = meta["entry_of_row"]
    hid = grouped_gemm_contiguous(xp, sp, w1, s1, meta["block_expert"], rows=rows, tokens=ids.shape[0])
    hq, hs = swiglu_quant(hid, clamp, rows)
    return grouped_gemm_contiguous(hq, hs, w2, s2, meta["block_expert"], rows=rows, tokens=ids.shape[0])


def moe_layer(x, logits, w1, s1, w2, s2, cfg: MoEConfig, bias=None, *, n_ranks: int = 1, act_quant=None,
              swiglu_quant=None, return_routing: bool = False):
    """Routed experts of one layer: x [T, H] bf16, logits [T, E] fp32, w1 [E, 2I, H] / w2 [E, H, I]
    e4m3 with 128 x 128 fp32 scales s1 [E, 2I/128, H/128] / s2 [E, H/128, I/128] -> [T, H] bf16.

    ``act_quant(x) -> (e4m3, scales)`` and ``swiglu_quant(h, clamp, rows) -> (e4m3, scales)`` default
    to ``kernels.quant.group_cast``'s per-token 1 x 128 cast and fused SwiGLU cast. ``rows`` is the
    metadata's ``entry_of_row``: the padding rows (-1) of ``h`` are unspecified, and a
    ``swiglu_quant`` must neither depend on them nor make a routed row depend on them.
    """
    act_quant = act_quant or _default_act_quant
    swiglu_quant = swiglu_quant or _default_swiglu_quant
    _check_layer_args(x, logits, w1, w2, cfg, n_ranks)
    e = w1.shape[0]
    ids, weights = gating(logits, bias, cfg.topk, cfg.score_func, cfg.n_groups, cfg.topk_groups, cfg.renormalize,
                          cfg.routed_scaling)
    xq, xs = act_quant(x)
    el = e // n_ranks
    outputs, row_maps = [], []
    base = 0
    for r in range(n_ranks):
        mine = slice(r * el, (r + 1) * el)
        meta = routing_metadata(ids, e, r, n_ranks)
        outputs.append(_expert_rows(xq, xs, ids, meta, w1[mine], s1[mine], w2[mine], s2[mine], cfg.clamp, swiglu_quant))
        row_maps.append(torch.where(meta["row_of"] >= 0, meta["row_of"] + base, -1) if base else meta["row_of"])
        base += outputs[-1].shape[0]
    if n_ranks == 1:
        y, row_of = outputs[0], row_maps[0]
    else:
        # Each entry is owned by exactly one rank: the others hold -1 there.
        y = torch.cat(outputs)
        row_of = torch.stack(row_maps).amax(dim=0)
    out = combine(y, row_of, weights)
    return (out, ids, weights) if return_routing else out


def ep_plan(ids: torch.Tensor, experts_per_rank: int, n_ranks: int):
    """The order in which a rank sends its (token, slot) entries, flattened ``t * k + slot``, and
    how many go to each rank: grouped by the rank that owns the entry's expert, token-major and
    in slot order within a group (a stable order: the receiver's rows, and so every bit, follow
    from the routing alone)."""
    t, k = ids.shape
    dest = (ids.long() // experts_per_rank).flatten()
    order = torch.argsort(dest * (t * k) + torch.arange(t * k, device=ids.device))
    return order, torch.bincount(dest, minlength=n_ranks)


def ep_expert_rows(xq, xs, ids, group, experts_per_rank: int, compute):
    """Every (token, slot) entry's expert output, computed on the rank that owns the expert: the
    entries' rows (e4m3 values, fp32 scales and the global expert id, packed as bytes) go out in
    ``ep_plan``'s order with one all-to-all (``torch.distributed.all_to_all_single``, NCCL on
    GPUs), ``compute(xq_rows, xs_rows, expert_ids) -> [N, H]`` runs on the rows that arrive
    (source-rank-major), and a second all-to-all brings the results back. Returns ``y`` [T*k, H]
    and ``row_of`` [T, k] int32 (entry -> its row of ``y``), what ``combine`` takes."""
    import torch.distributed as dist

    t, k = ids.shape
    h, hs = xq.shape[1], xs.shape[1] * 4
    order, send = ep_plan(ids, experts_per_rank, group.size())
    recv = torch.empty_like(send)
    dist.all_to_all_single(recv, send, group=group)
    sends, recvs = send.tolist(), recv.tolist()  # the split sizes (a host sync)
    tok = order // k
    packed = torch.cat([xq[tok].view(torch.uint8), xs[tok].contiguous().view(torch.uint8),
                        ids.flatten()[order].to(torch.int32).view(torch.uint8).view(-1, 4)], dim=1)
    arrived = packed.new_empty(sum(recvs), packed.shape[1])
    dist.all_to_all_single(arrived, packed, recvs, sends, group=group)
    rows = compute(arrived[:, :h].contiguous().view(torch.float8_e4m3fn), arrived[:, h:h + hs].contiguous().view(torch.float32),
                   arrived[:, h + hs:].contiguous().view(torch.int32).flatten())
    y = rows.new_empty(t * k, rows.shape[1])
    dist.all_to_all_single(y, rows.contiguous(), sends, recvs, group=group)
    row_of = torch.empty(t * k, dtype=torch.int32, device=ids.device)
    row_of[order] = torch.arange(t * k, dtype=torch.int32, device=ids.device)
    return y, row_of.view(t, k)


def moe_layer_ep(x, logits, w1, s1, w2, s2, cfg: MoEConfig, group, bias=None, *, act_quant=None, swiglu_quant=None):
    """The unfused expert-parallel layer over a process group (one GPU a rank): this rank's
    tokens x [T, H] and logits [T, E], ``moe_layer``'s full weights (the rank computes with its
    slice, experts ``[r E/n, (r+1) E/n)``). Gating and the FP8 cast run on the token's rank; its
    entries travel to their experts' ranks and back with NCCL all-to-all (``ep_expert_rows``);
    the combine runs in k order on the token's rank. Every step computes a row from that row
    alone, so the output equals ``moe_layer`` of the gathered tokens bit for bit."""
    act_quant = act_quant or _default_act_quant
    swiglu_quant = swiglu_quant or _default_swiglu_quant
    n, r = group.size(), group.rank()
    _check_layer_args(x, logits, w1, w2, cfg, n, "group")
    e = w1.shape[0]
    el = e // n
    mine = slice(r * el, (r + 1) * el)
    ids, weights = gating(logits, bias, cfg.topk, cfg.score_func, cfg.n_groups, cfg.topk_groups, cfg.renormalize,
                          cfg.routed_scaling)
    xq, xs = act_quant(x)

    def local_experts(xq_rows, xs_rows, expert_ids):
        meta = routing_metadata(expert_ids[:, None].contiguous(), e, r, n)  # one entry a received row
        y = _expert_rows(xq_rows, xs_rows, expert_ids[:, None], meta, w1[mine], s1[mine], w2[mine], s2[mine], cfg.clamp,
                         swiglu_quant)
        return y[meta["row_of"][:, 0].long()]

    y, row_of = ep_expert_rows(xq, xs, ids, group, el, local_experts)
    return combine(y, row_of, weights)
