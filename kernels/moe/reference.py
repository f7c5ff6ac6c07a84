"""Float64 torch references for the MoE building blocks (CPU or GPU).

These define what each kernel computes; the kernels are checked bitwise against their
CUDA baselines and against these references within a relative error. Conventions fixed
here and shared by every kernel:

* Gating: the per-expert bias only steers selection (scores + bias); the weights use the
  unbiased scores. Group-limited selection scores a group by its largest biased score.
  Ties (equal value) are broken by the lower expert (or group) id. Weights are
  optionally divided by their sum (in k order), then multiplied by ``routed_scaling``.
* Metadata: expert ``e``'s rows sit at ``offsets[e] .. offsets[e] + counts[e]``, ordered by
  the flat index ``t * topk + j``; each group is padded to ``align`` rows. Entries routed
  to experts of another rank get row -1; padding rows map to entry -1.
* Combine: ``out[t] = sum_j w[t, j] * y[row_of[t, j]]`` accumulated in fp32 in j order
  (rows of -1 skipped), so it is deterministic and independent of the batch.
"""

from __future__ import annotations

import torch

SCORE_FUNCS = ("softmax", "sigmoid", "sqrtsoftplus")


def scores_ref(logits: torch.Tensor, score_func: str) -> torch.Tensor:
    """The routing scores in float64."""
    x = logits.double()
    if score_func == "softmax":
        return torch.softmax(x, dim=-1)
    if score_func == "sigmoid":
        return torch.sigmoid(x)
    if score_func == "sqrtsoftplus":
        return torch.sqrt(torch.nn.functional.softplus(x))
    raise ValueError(f"score_func: expected one of {SCORE_FUNCS}, got {score_func!r}")


def _order(values: torch.Tensor, k: int) -> torch.Tensor:
    """Indices of the k largest values per row, ties to the lower index."""
    return torch.sort(values, dim=-1, descending=True, stable=True).indices[..., :k]


def gating_ref(
    logits: torch.Tensor,
    bias: torch.Tensor | None,
    topk: int,
    score_func: str = "softmax",
    n_groups: int = 1,
    topk_groups: int = 1,
    renormalize: bool = True,
    routed_scaling: float = 1.0,
):
    """Top-k routing: returns (ids int32 [T, k], weights float64 [T, k])."""
    t, e = logits.shape
    if e % n_groups:
        raise ValueError(f"n_groups: expected a divisor of {e} experts, got {n_groups}")
    if not 1 <= topk_groups <= n_groups:
        raise ValueError(f"topk_groups: expected 1..{n_groups}, got {topk_groups}")
    scores = scores_ref(logits, score_func)
    choice = scores + (bias.double() if bias is not None else 0.0)
    if n_groups > 1:
        group_score = choice.view(t, n_groups, e // n_groups).amax(dim=-1)
        keep = torch.zeros(t, n_groups, dtype=torch.bool, device=logits.device)
        keep.scatter_(1, _order(group_score, topk_groups), True)
        keep = keep.repeat_interleave(e // n_groups, dim=1)
        choice = torch.where(keep, choice, torch.full_like(choice, -torch.inf))
    ids = _order(choice, topk)
    w = torch.gather(scores, 1, ids)
    if renormalize:
        w = w / w.sum(dim=-1, keepdim=True)
    return ids.to(torch.int32), w * routed_scaling


def metadata_ref(ids: torch.Tensor, n_experts: int, rank: int = 0, n_ranks: int = 1, align: int = 128):
    """Routing metadata for one rank's experts (``n_experts // n_ranks`` of them).

    Returns a dict: ``counts`` [El], ``offsets`` [El + 1] (padded), ``row_of`` [T, k]
    (-1 for other ranks' experts), ``entry_of_row`` [offsets[-1]] (flat t*k+j, -1 for
    padding) and ``block_expert`` [offsets[-1] // align] (local expert of each row block).
    """
    if n_experts % n_ranks:
        raise ValueError(f"n_ranks: expected a divisor of {n_experts} experts, got {n_ranks}")
    el = n_experts // n_ranks
    flat = ids.reshape(-1).long().cpu()
    local = flat - rank * el
    counts = torch.zeros(el, dtype=torch.int64)
    row_of = torch.full_like(flat, -1)
    padded = [0]
    for e in range(el):
        idx = torch.nonzero(local == e).reshape(-1)
        counts[e] = idx.numel()
        row_of[idx] = padded[-1] + torch.arange(idx.numel())
        padded.append(padded[-1] + (idx.numel() + align - 1) // align * align)
    offsets = torch.tensor(padded, dtype=torch.int64)
    entry_of_row = torch.full((padded[-1],), -1, dtype=torch.int64)
    hit = row_of >= 0
    entry_of_row[row_of[hit]] = torch.nonzero(hit).reshape(-1)
    block_expert = torch.repeat_interleave(torch.arange(el), (offsets[1:] - offsets[:-1]) // align)
    return {
        "counts": counts.int(),
        "offsets": offsets.int(),
        "row_of": row_of.view(ids.shape).int(),
        "entry_of_row": entry_of_row.int(),
        "block_expert": block_expert.int(),
    }


def permute_ref(x: torch.Tensor, entry_of_row: torch.Tensor, topk: int) -> torch.Tensor:
    """Gather token rows into the expert-major layout; padding rows are zero."""
    e = entry_of_row.long().to(x.device)
    out = torch.zeros((e.numel(), *x.shape[1:]), dtype=x.dtype, device=x.device)
    hit = e >= 0
    out[hit] = x[torch.div(e[hit], topk, rounding_mode="floor")]
    return out


def combine_ref(y: torch.Tensor, row_of: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """The weighted top-k sum back to token order, in float64."""
    t, k = row_of.shape
    out = torch.zeros(t, y.shape[1], dtype=torch.float64, device=y.device)
    for j in range(k):
        r = row_of[:, j].long().to(y.device)
        hit = r >= 0
        out[hit] += weights[hit, j].double().unsqueeze(1) * y[r[hit]].double()
    return out


def dequant_rows_ref(q: torch.Tensor, scales: torch.Tensor, group: int = 128) -> torch.Tensor:
    """e4m3 rows with 1 x group scales back to float64."""
    return q.double() * scales.double().repeat_interleave(group, dim=-1)[..., : q.shape[-1]]


def dequant_blocks_ref(q: torch.Tensor, scales: torch.Tensor, block: int = 128) -> torch.Tensor:
    """e4m3 weights [..., N, K] with block x block scales back to float64."""
    s = scales.double().repeat_interleave(block, dim=-2).repeat_interleave(block, dim=-1)
    return q.double() * s[..., : q.shape[-2], : q.shape[-1]]


def grouped_gemm_contiguous_ref(a, sa, b, sb, block_expert, block_m: int = 128) -> torch.Tensor:
    """C[rows of block i] = A x B[block_expert[i]]^T, float64; rows of blocks with expert -1 are 0."""
    ad = dequant_rows_ref(a, sa)
    out = torch.zeros(a.shape[0], b.shape[1], dtype=torch.float64, device=a.device)
    experts = block_expert.tolist()
    for e in sorted(set(experts) - {-1}):
        bd = dequant_blocks_ref(b[e], sb[e]).T
        for i in (i for i, x in enumerate(experts) if x == e):
            rows = slice(i * block_m, (i + 1) * block_m)
            out[rows] = ad[rows] @ bd
    return out


def grouped_gemm_masked_ref(a, sa, b, sb, counts) -> torch.Tensor:
    """C[e, :counts[e]] = A[e, :counts[e]] x B[e]^T, float64; rows past the count are 0."""
    out = torch.zeros(a.shape[0], a.shape[1], b.shape[1], dtype=torch.float64, device=a.device)
    for e, c in enumerate(counts.tolist()):
        if c > 0:
            out[e, :c] = dequant_rows_ref(a[e, :c], sa[e, :c]) @ dequant_blocks_ref(b[e], sb[e]).T
    return out


def swiglu_ref(h: torch.Tensor, clamp: float | None = None) -> torch.Tensor:
    """SiLU(gate) * up on [rows, 2I] (gate first), optionally clamped like DeepSeek-V4."""
    g, u = h.double().chunk(2, dim=-1)
    if clamp is not None:
        g = g.clamp(max=clamp)
        u = u.clamp(-clamp, clamp)
    return torch.nn.functional.silu(g) * u


def moe_ref(x, logits, bias, w1, s1, w2, s2, *, topk, score_func, n_groups=1, topk_groups=1, renormalize=True,
            routed_scaling=1.0, clamp=None):
    """The routed-expert layer in float64 from e4m3 block-scaled weights w1 [E, 2I, H], w2 [E, H, I]
    (dequantized one expert at a time); activations are not quantized."""
    ids, w = gating_ref(logits, bias, topk, score_func, n_groups, topk_groups, renormalize, routed_scaling)
    out = torch.zeros(x.shape, dtype=torch.float64, device=x.device)
    xd = x.double()
    for e in ids.unique().tolist():
        tok, j = torch.nonzero(ids == e, as_tuple=True)
        h = swiglu_ref(xd[tok] @ dequant_blocks_ref(w1[e], s1[e]).T, clamp)
        out.index_add_(0, tok, w[tok, j].unsqueeze(1) * (h @ dequant_blocks_ref(w2[e], s2[e]).T))
    return out


def rel_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """||a - e|| / ||e|| in float64 (0 when both are zero)."""
    a, e = actual.double(), expected.double()
    den = e.norm().item()
    num = (a - e).norm().item()
    return num / den if den else num


def random_layer(model: dict, seed: int = 0, device: str = "cuda"):
    """Random e4m3 expert weights ``(w1, s1, w2, s2)`` for ``model`` (keys ``n_experts``, ``hidden``,
    ``inter``), with 128 x 128 block scales sized so activations stay O(1) through the layer. The one
    generator every MoE test and benchmark draws its weights from, so their layers are the same."""
    g = torch.Generator(device=device).manual_seed(seed)
    e, h, i = model["n_experts"], model["hidden"], model["inter"]

    def weight(n, k):
        w = torch.empty(e, n, k, device=device, dtype=torch.float8_e4m3fn)
        for j in range(e):  # one expert at a time keeps the bf16 temporaries small
            w[j] = (torch.randn(n, k, device=device, generator=g, dtype=torch.bfloat16) * 2).clamp(-8, 8).to(w.dtype)
        s = (torch.rand(e, n // 128, k // 128, device=device, generator=g) + 0.5) / (2 * k**0.5)
        return w, s

    return (*weight(2 * i, h), *weight(h, i))
