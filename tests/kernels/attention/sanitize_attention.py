"""Run the prefill attention kernels once at tail shapes; meant to run under
``compute-sanitizer --tool memcheck`` (see test_dense_fwd_gpu.py), which reports any bad access.

    python sanitize_attention.py forward|backward|sparse

One part per process, so that the parts' kernels (compiled at first use) build in parallel
test workers rather than one after another under the sanitizer."""

import sys

import torch

from kernels.attention.dense_bwd import FUSED_TILES, dense_attention_backward
from kernels.attention.dense_fwd import dense_attention
from kernels.attention.sparse_fwd import DIM, sparse_attention

BF16 = dict(device="cuda", dtype=torch.bfloat16)
LENS_Q, LENS_K = [0, 5, 129, 1], [3, 5, 200, 64]  # empty, partial tiles, s_q != s_k


def _varlen(d: int):
    cu_q = torch.tensor([0, 0, 5, 134, 135], dtype=torch.int32, device="cuda")
    cu_k = torch.tensor([0, 3, 8, 208, 272], dtype=torch.int32, device="cuda")
    assert cu_q[-1] == sum(LENS_Q) and cu_k[-1] == sum(LENS_K)
    q, k, v = torch.randn(135, 4, d, **BF16), torch.randn(272, 2, d, **BF16), torch.randn(272, 2, d, **BF16)
    return q, k, v, dict(cu_seqlens_q=cu_q, cu_seqlens_k=cu_k)


def forward_ops():
    q, k, v, cu = _varlen(128)
    return [
        lambda: dense_attention(q, k, v, causal=True, **cu),
        lambda: dense_attention(q, k, v, causal=False, **cu),
        lambda: dense_attention(torch.randn(1, 127, 4, 64, **BF16), torch.randn(1, 127, 4, 64, **BF16), torch.randn(1, 127, 4, 64, **BF16)),
        lambda: dense_attention(torch.randn(1, 127, 2, 256, **BF16), torch.randn(1, 61, 1, 256, **BF16), torch.randn(1, 61, 1, 256, **BF16), causal=True),
    ]


def backward_ops():
    """The default tiles of d 64 (two warpgroups a CTA) and d 256 (one, dV and dK split), and the
    fused candidate (its dQ warp's bulk reductions) at d 64 causal and d 128 not causal."""
    ops = []
    for d, causal, tiles in ((64, True, None), (256, False, None), (64, True, FUSED_TILES), (128, False, FUSED_TILES)):
        q, k, v, cu = _varlen(d)
        o, lse = dense_attention(q, k, v, causal=causal, **cu)
        do = torch.randn_like(q)
        ops.append(lambda q=q, k=k, v=v, o=o, lse=lse, do=do, c=causal, cu=cu, t=tiles:
                   dense_attention_backward(do, q, k, v, o, lse, causal=c, tiles=t, **cu))
    return ops


def sparse_ops():
    """Two sequences (each token's rows through views from its sequence's base), n not a multiple
    of the 64-key block, masked and out-of-range slots, an all-masked token, and the window branch
    over a window_kv shorter than the window."""
    g = torch.Generator(device="cuda").manual_seed(0)
    q, kv = torch.randn(2, 3, 64, DIM, generator=g, **BF16), torch.randn(2, 100, DIM, generator=g, **BF16)
    idx = torch.randint(-1, 101, (2, 3, 512), generator=g, device="cuda", dtype=torch.int32)
    idx[1, 1] = -1
    sink = torch.randn(64, generator=g, device="cuda")
    wkv = torch.randn(2, 40, DIM, generator=g, **BF16)
    widx = torch.where(torch.arange(128, device="cuda") < 40, torch.arange(128, device="cuda"), -1).to(torch.int32)
    widx = widx.expand(2, 3, 128).contiguous()
    return [lambda: sparse_attention(q, kv, idx, sink), lambda: sparse_attention(q, kv, idx, sink, window_kv=wkv, window_indices=widx)]


PARTS = {"forward": forward_ops, "backward": backward_ops, "sparse": sparse_ops}


def main(part: str):
    torch.manual_seed(0)
    ops = PARTS[part]()
    for op in ops:
        op()
    torch.cuda.synchronize()
    print(f"ran {len(ops)} operations")


if __name__ == "__main__":
    main(sys.argv[1])
