"""Run the prefill attention kernels once at tail shapes; meant to run under
``compute-sanitizer --tool memcheck`` (see test_dense_fwd_gpu.py), which reports any bad access."""

import torch

from kernels.attention.dense_fwd import dense_attention


def main():
    torch.manual_seed(0)
    bf = dict(device="cuda", dtype=torch.bfloat16)
    lens_q, lens_k = [0, 5, 129, 1], [3, 5, 200, 64]  # empty, partial tiles, s_q != s_k
    cu_q = torch.tensor([0, 0, 5, 134, 135], dtype=torch.int32, device="cuda")
    cu_k = torch.tensor([0, 3, 8, 208, 272], dtype=torch.int32, device="cuda")
    assert cu_q[-1] == sum(lens_q) and cu_k[-1] == sum(lens_k)
    q, k, v = torch.randn(135, 4, 128, **bf), torch.randn(272, 2, 128, **bf), torch.randn(272, 2, 128, **bf)
    ops = [
        lambda: dense_attention(q, k, v, causal=True, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k),
        lambda: dense_attention(q, k, v, causal=False, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k),
        lambda: dense_attention(torch.randn(1, 127, 4, 64, **bf), torch.randn(1, 127, 4, 64, **bf), torch.randn(1, 127, 4, 64, **bf)),
        lambda: dense_attention(torch.randn(1, 127, 2, 256, **bf), torch.randn(1, 61, 1, 256, **bf), torch.randn(1, 61, 1, 256, **bf), causal=True),
    ]
    for op in ops:
        op()
    torch.cuda.synchronize()
    print(f"ran {len(ops)} operations")


if __name__ == "__main__":
    main()
