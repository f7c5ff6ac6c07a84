"""Run every public quantization operation once at tail-heavy shapes; meant to run under
``compute-sanitizer --tool memcheck`` (see test_quant_gpu.py), which reports any bad access."""

import torch

from kernels.quant.block_cast import fp4_to_fp8_blocks, per_block_cast
from kernels.quant.channel_cast import per_channel_cast_transpose
from kernels.quant.dequant import dequant_e2m1, dequant_e4m3
from kernels.quant.group_cast import fp4_to_fp8, mxfp4_cast, per_token_group_cast, swiglu_cast


def main():
    torch.manual_seed(0)
    x = torch.randn(37, 640, device="cuda", dtype=torch.bfloat16)  # 37 rows: partial CTA; 5 groups: padded words
    ops = [
        lambda: per_token_group_cast(x, 128, "ue8m0_packed", col_major=True),
        lambda: per_token_group_cast(x.float(), 32, "fp32"),
        lambda: swiglu_cast(x, torch.rand(37, device="cuda"), group=64),
        lambda: fp4_to_fp8(*mxfp4_cast(x), group=128, scale_fmt="ue8m0"),
        lambda: fp4_to_fp8(*mxfp4_cast(x), group=32, scale_fmt="ue8m0_packed", col_major=True),
        # 96 rows: a partial 128-row CTA; K 384: 128-column CTAs; K 512: 256-column CTAs
        lambda: fp4_to_fp8_blocks(*mxfp4_cast(torch.randn(96, 384, device="cuda", dtype=torch.bfloat16)), 32),
        lambda: fp4_to_fp8_blocks(*mxfp4_cast(torch.randn(128, 512, device="cuda", dtype=torch.bfloat16)), 128),
        lambda: per_block_cast(torch.randn(96, 256, device="cuda"), 32),
        lambda: per_channel_cast_transpose(torch.randn(208, 128, device="cuda", dtype=torch.bfloat16)),
        lambda: dequant_e4m3(*per_token_group_cast(x, 64), (1, 64)),
        lambda: dequant_e2m1(*mxfp4_cast(x), torch.float32),
    ]
    for op in ops:
        op()
    torch.cuda.synchronize()
    print(f"ran {len(ops)} operations")


if __name__ == "__main__":
    main()
