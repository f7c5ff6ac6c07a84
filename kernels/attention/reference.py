"""Torch fp32 references of the attention kernels (the semantics the tests compare against).

Inputs are widened to fp32 exactly; the math is plain softmax attention in fp32 (float64 where
asked), without the kernels' blocking, so a reference is an independent statement of the rules:
bottom-right causal alignment, a query that sees no key gives output 0 and lse -inf, lse in
natural-log units.
"""

import math

import torch


def attention_one(q, k, v, causal: bool, scale: float, dtype=torch.float32):
    """One sequence: q [s_q, h, d], k, v [s_k, hk, d] -> (o [s_q, h, d], lse [h, s_q])."""
    s_q, h, d = q.shape
    s_k, hk = k.shape[0], k.shape[1]
    g = h // hk
    qf = q.to(dtype).permute(1, 0, 2)  # h, s_q, d
    kf = k.to(dtype).repeat_interleave(g, dim=1).permute(1, 0, 2)
    vf = v.to(dtype).repeat_interleave(g, dim=1).permute(1, 0, 2)
    s = torch.matmul(qf, kf.transpose(1, 2)) * scale
    if causal:
        i = torch.arange(s_q, device=q.device)[:, None]
        j = torch.arange(s_k, device=q.device)[None, :]
        s = s.masked_fill(j > i + (s_k - s_q), float("-inf"))
    lse = torch.logsumexp(s, dim=-1)  # -inf for rows without keys
    p = torch.exp(s - torch.where(torch.isfinite(lse), lse, torch.zeros_like(lse))[..., None])
    o = torch.matmul(p, vf).permute(1, 0, 2)
    return o, lse


def dense_attention_ref(q, k, v, causal=False, softmax_scale=None, cu_seqlens_q=None, cu_seqlens_k=None,
                        dtype=torch.float32):
    """Reference of ``dense_fwd.dense_attention`` (same argument forms), outputs in ``dtype``."""
    d = q.shape[-1]
    scale = 1.0 / math.sqrt(d) if softmax_scale is None else softmax_scale
    if cu_seqlens_q is None:
        outs = [attention_one(q[b], k[b], v[b], causal, scale, dtype) for b in range(q.shape[0])]
        return torch.stack([o for o, _ in outs]), torch.stack([l for _, l in outs])
    cq, ck = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
    o = torch.zeros(q.shape, dtype=dtype, device=q.device)
    lse = torch.full((q.shape[1], q.shape[0]), float("-inf"), dtype=dtype, device=q.device)
    for b in range(len(cq) - 1):
        if cq[b + 1] == cq[b]:
            continue
        ob, lb = attention_one(q[cq[b]:cq[b + 1]], k[ck[b]:ck[b + 1]], v[ck[b]:ck[b + 1]], causal, scale, dtype)
        o[cq[b]:cq[b + 1]] = ob
        lse[:, cq[b]:cq[b + 1]] = lb
    return o, lse


def sparse_attention_ref(q, kv, indices, sink, softmax_scale=None, window_kv=None, window_indices=None):
    """Reference of ``sparse_fwd.sparse_attention`` in fp32: gather the selected rows (masked
    slots: index outside ``[0, n)``), softmax over [scores, sink], sum over the selected rows."""
    b, s, h, d = q.shape
    scale = 1.0 / math.sqrt(d) if softmax_scale is None else softmax_scale
    branches = [(kv, indices)] + ([(window_kv, window_indices)] if window_kv is not None else [])
    keys, masks = [], []
    for src, idx in branches:
        ok = (idx >= 0) & (idx < src.shape[1])
        rows = torch.gather(src.float(), 1, idx.clamp(0, src.shape[1] - 1).long().reshape(b, -1, 1).expand(-1, -1, d))
        keys.append(rows.reshape(b, s, idx.shape[2], d))
        masks.append(ok)
    keys, ok = torch.cat(keys, dim=2), torch.cat(masks, dim=2)  # [b, s, t, d], [b, s, t]
    scores = torch.einsum("bshd,bstd->bsht", q.float(), keys) * scale
    scores = scores.masked_fill(~ok[:, :, None, :], float("-inf"))
    logits = torch.cat([scores, sink.float()[None, None, :, None].expand(b, s, h, 1)], dim=-1)
    lse = torch.logsumexp(logits, dim=-1)
    p = torch.exp(logits - lse[..., None])[..., :-1]
    return torch.einsum("bsht,bstd->bshd", p, keys), lse
