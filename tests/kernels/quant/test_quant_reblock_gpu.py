"""GPU parity of the FP4 -> FP8 re-blocking kernels (128x128 / 32x32 blocks, 1x128 / 1x32 groups)
and the MXFP4 dequant on UE8M0 codes that real MXFP4 weights never hold: 0 (scale 0), 1 and 2
(denormal products), 253 and 254 (products that overflow fp32) and 255 (scale inf), mixed into
ordinary codes, every e2m1 code at every position, zeros of both signs. The kernels' integer
fast paths must agree bit for bit with the CUDA baselines and the torch reference.
"""

from pathlib import Path

import pytest
import torch

from kernels.quant import reference as R
from kernels.quant.block_cast import block_cast_kernel
from kernels.quant.dequant import dequant_kernel
from kernels.quant.group_cast import group_cast_kernel
from tlx.numerics.parity import assert_bitwise, build_baseline

pytestmark = pytest.mark.gpu
DT = {torch.bfloat16: "bfloat16", torch.float32: "float32"}


@pytest.mark.parametrize("block", [128, 32])
@pytest.mark.parametrize("wild, k", [(0.02, 7168), (1.0, 7168), (0.5, 6016)])  # 6016: 128-column CTAs
def test_fp4_to_fp8_blocks_edge_codes(block, wild, k):
    n = 1024
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


def _wild_mxfp4(t, k, seed, wild):
    """Random MXFP4 words (a third of the codes zero, either sign) and UE8M0 codes 100..149 with a
    share ``wild`` replaced by the edge codes."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    packed = torch.randint(0, 256, (t, k // 2), device="cuda", generator=g, dtype=torch.uint8)
    zero = torch.rand(packed.shape, device="cuda", generator=g) < 0.3
    packed = torch.where(zero, packed & 0x88, packed)
    codes = torch.randint(100, 150, (t, k // 32), device="cuda", generator=g, dtype=torch.uint8)
    edge = torch.tensor([0, 1, 2, 126, 252, 253, 254, 255], dtype=torch.uint8, device="cuda")
    pick = edge[torch.randint(0, len(edge), codes.shape, device="cuda", generator=g)]
    return packed, torch.where(torch.rand(codes.shape, device="cuda", generator=g) < wild, pick, codes)


@pytest.mark.parametrize("group", [128, 32])
@pytest.mark.parametrize("wild", [0.02, 1.0])
def test_fp4_to_fp8_groups_edge_codes(group, wild):
    t, k = 1024, 7168
    packed, codes = _wild_mxfp4(t, k, group + int(wild * 100), wild)
    base = build_baseline(Path(R.__file__).with_name("group_cast.cu"))
    outs = []
    for run in (lambda q, s: group_cast_kernel(k, group, "e2m1", "uint8", "e4m3", "ue8m0")(packed, codes, q, s),
                lambda q, s: base.group_cast(packed, codes, q, s, 2, group, 0, 1, 0, 0.0)):
        q = torch.full((t, k), 0x55, dtype=torch.uint8, device="cuda").view(torch.float8_e4m3fn)
        s = torch.full((t, k // group), float("nan"), device="cuda")
        run(q, s)
        outs.append((q, s))
    (q, s), (bq, bs) = outs
    assert_bitwise(q, bq, name="q vs baseline")
    assert_bitwise(s, bs, name="scales vs baseline")
    eq, es = R.fp4_to_fp8(packed, codes, (1, group))
    assert_bitwise(q, eq, name="q vs torch reference")
    assert_bitwise(s, es, name="scales vs torch reference")


@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float32])
def test_dequant_e2m1_edge_codes(out_dtype):
    """Scale 0, denormal and overflowing products, scale inf (0 * inf: CUDA's canonical NaN, no sign)."""
    m, n = 1024, 7168
    packed, codes = _wild_mxfp4(m, n, 11, 0.5)
    base = build_baseline(Path(R.__file__).with_name("dequant.cu"))
    outs = []
    for run in (lambda y: dequant_kernel(n, "e2m1", 1, 32, DT[out_dtype])(packed, codes, y),
                lambda y: base.dequant(packed, codes, y, 1, 1, 32)):
        y = torch.full((m, n), 0x55, dtype=torch.uint8, device="cuda").repeat(1, out_dtype.itemsize).view(out_dtype)
        run(y)
        outs.append(y)
    assert_bitwise(outs[0], outs[1], name="y vs baseline")
    ref = R.dequant_e2m1(packed, codes, out_dtype)
    nan = torch.isnan(ref)
    assert torch.equal(torch.isnan(outs[0]), nan)
    assert_bitwise(torch.where(nan, 0.0, outs[0].float()), torch.where(nan, 0.0, ref.float()), name="y vs torch reference (NaN as NaN)")
