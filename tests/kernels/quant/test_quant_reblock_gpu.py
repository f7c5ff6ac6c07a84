"""GPU parity of the FP4 -> FP8 re-blocking kernel on UE8M0 codes that real MXFP4 weights never
hold: 0 (scale 0), 253 and 254 (products that overflow fp32, so the kernel takes its fp32
fallback) and 255 (scale inf), mixed into ordinary codes, every e2m1 code at every position.
The kernel's fp16 fast path must agree bit for bit with the CUDA baseline and the torch reference.
"""

from pathlib import Path

import pytest
import torch

from kernels.quant import reference as R
from kernels.quant.block_cast import block_cast_kernel
from tlx.numerics.parity import assert_bitwise, build_baseline

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("block", [128, 32])
@pytest.mark.parametrize("wild", [0.02, 1.0])
def test_fp4_to_fp8_blocks_edge_codes(block, wild):
    n, k = 1024, 7168
    g = torch.Generator(device="cuda").manual_seed(block + int(wild * 100))
    packed = torch.randint(0, 256, (n, k // 2), device="cuda", generator=g, dtype=torch.uint8)
    codes = torch.randint(100, 150, (n, k // 32), device="cuda", generator=g, dtype=torch.uint8)
    edge = torch.tensor([0, 1, 2, 126, 252, 253, 254, 255], dtype=torch.uint8, device="cuda")
    pick = edge[torch.randint(0, len(edge), codes.shape, device="cuda", generator=g)]
    codes = torch.where(torch.rand(codes.shape, device="cuda", generator=g) < wild, pick, codes)
    base = build_baseline(Path(R.__file__).with_name("block_cast.cu"))
    outs = []
    for run in (lambda q, s: block_cast_kernel(k, block, "e2m1", True)(packed, codes, q, s),
                lambda q, s: base.block_cast_e2m1(packed, codes, q, s, block, 1)):
        q = torch.full((n, k), 0x55, dtype=torch.uint8, device="cuda").view(torch.float8_e4m3fn)
        s = torch.full((n // block, k // block), float("nan"), device="cuda")
        run(q, s)
        outs.append((q, s))
    (q, s), (bq, bs) = outs
    assert_bitwise(q, bq, name="q vs baseline")
    assert_bitwise(s, bs, name="scales vs baseline")
    eq, es = R.fp4_to_fp8(packed, codes, (block, block))
    assert_bitwise(q, eq, name="q vs torch reference")
    assert_bitwise(s, es, name="scales vs torch reference")
