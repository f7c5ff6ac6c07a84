"""The torch references' rounding rules against hand-computed vectors (CPU, runs in CI).

Expected values are worked out by hand in the comments; the kernels and CUDA baselines are
held to these references bit for bit by the GPU tests.
"""

import math

import pytest
import torch

from kernels.quant import reference as R

E4M3_NAN, E4M3_MAX_BITS, NEG_ZERO = 0x7F, 0x7E, 0x80


def bits(t):
    return t.view(torch.uint8).tolist()


def row(values, width=128):
    """One group of ``width``: ``values`` then zeros."""
    x = torch.zeros(width, dtype=torch.float32)
    x[: len(values)] = torch.tensor(values, dtype=torch.float32)
    return x


def fp32(v):
    return torch.tensor(v, dtype=torch.float32)


def test_scale_one_keeps_exact_values_and_rounds_denormals_to_even():
    # amax 448 -> scale 448/448 = 1 exactly, inv 1: q is the e4m3 rounding of x itself.
    # 2^-9 is the smallest e4m3 denormal (0x01); 2^-10 ties 0/0x01 -> 0x00 (even);
    # 1.5*2^-9 ties 0x01/0x02 -> 0x02; -2^-11 rounds to -0 (0x80); -0 keeps its sign; 1e-40
    # (an fp32 denormal) is not flushed but rounds to +0; 17 ties 16/18 -> 16 (0x58: exponent 1011, mantissa 000, even).
    x = row([448.0, -448.0, 2**-9, 2**-10, 1.5 * 2**-9, -(2**-11), -0.0, 1e-40, 17.0, 3.0])
    q, s = R.per_token_group_cast(x[None], 128)
    assert s.item() == 1.0
    assert bits(q[0, :10]) == [0x7E, 0xFE, 0x01, 0x00, 0x02, NEG_ZERO, NEG_ZERO, 0x00, 0x58, 0x44]


def test_fp32_scale_is_ieee_division_and_reciprocal():
    # amax 4: scale = RN(4 / 448) = RN(1/112); q = RN(x * RN(1/scale)).
    x = row([4.0, -2.0, 1.0])
    q, s = R.per_token_group_cast(x[None], 128)
    scale = fp32(4.0) / fp32(448.0)
    assert s.item() == scale.item()
    inv = (fp32(1.0) / scale).item()
    assert inv == pytest.approx(112.0, rel=1e-6)
    # 4 * 112 = 448 (0x7E); 2 * 112 = 224 = 1.75 * 2^7 (0xF6 with sign); 112 = 1.75 * 2^6 (0x6E).
    assert bits(q[0, :3]) == [0x7E, 0xF6, 0x6E]


@pytest.mark.parametrize(
    "amax, scale",
    [
        (4.0, 2.0**-6),  # 4/448 = 1/112 lies in (2^-7, 2^-6]: rounded up to 2^-6
        (56.0, 2.0**-3),  # 56/448 = 2^-3 exactly: a power of two stays
        (448.0, 1.0),
        (1e-5, 2.0**-22),  # below the clamp: 1e-4/448 = 2.23e-7 in (2^-23, 2^-22]
        (0.0, 2.0**-22),  # all-zero group: the clamp
        (3e38, 2.0**120),  # 3e38/448 = 6.70e35 in (2^119 = 6.65e35, 2^120]
    ],
)
def test_power_of_two_scales_round_up(amax, scale):
    q, s = R.per_token_group_cast(row([amax])[None], 128, "ue8m0")
    assert s.item() == scale
    assert R.pow2_code(s).item() == int(math.log2(scale)) + 127


def test_amax_exactly_power_of_two_pow2_maps_to_448():
    # amax 56 = 448 * 2^-3: scale 2^-3, q = x * 8 exactly, so 56 -> 448 and 7 -> 56 (1.75 * 2^5: 0x66).
    q, s = R.per_token_group_cast(row([56.0, 7.0, -56.0])[None], 128, "ue8m0")
    assert s.item() == 0.125
    assert bits(q[0, :3]) == [0x7E, 0x66, 0xFE]


def test_below_clamp_group():
    # amax 1e-5 < 1e-4: scale = RN(1e-4 / 448); q = 1e-5 * 4.48e6 = 44.8 -> 44 (e4m3 step 4 in [32, 64); 1.375 * 2^5: 0x63).
    q, s = R.per_token_group_cast(row([1e-5])[None], 128)
    assert s.item() == (fp32(1e-4) / fp32(448.0)).item()
    assert bits(q[0, :2]) == [0x63, 0x00]


def test_all_zero_group_keeps_signs():
    x = row([-0.0, 0.0, -0.0])
    q, s = R.per_token_group_cast(x[None], 128)
    assert s.item() == (fp32(1e-4) / fp32(448.0)).item()
    assert bits(q[0, :3]) == [NEG_ZERO, 0x00, NEG_ZERO]


def test_inf_and_nan_documented_behaviour():
    # fp32 scales: amax inf -> scale inf, inv 0: inf*0 = NaN -> 0x7F, 1*0 -> 0, -1*0 -> -0.
    x = row([math.inf, 1.0, -1.0])
    q, s = R.per_token_group_cast(x[None], 128)
    assert math.isinf(s.item())
    assert bits(q[0, :3]) == [E4M3_NAN, 0x00, NEG_ZERO]
    # UE8M0: the scale saturates at 2^127: inf -> 448, +-1 * 2^-127 -> +-0.
    q, s = R.per_token_group_cast(x[None], 128, "ue8m0")
    assert s.item() == 2.0**127
    assert bits(q[0, :3]) == [E4M3_MAX_BITS, 0x00, NEG_ZERO]
    # NaN is ignored by amax (2 -> scale 2/448) and itself becomes 0x7F; 2 -> 448.
    q, s = R.per_token_group_cast(row([math.nan, 2.0, -math.nan])[None], 128)
    assert s.item() == (fp32(2.0) / fp32(448.0)).item()
    assert bits(q[0, :3]) == [E4M3_NAN, 0x7E, E4M3_NAN]


def test_cast_e4m3_saturates():
    v = fp32([464.0, 1000.0, -1e30, math.inf, -math.inf, 449.0])
    assert bits(R.cast_e4m3(v)) == [0x7E, 0x7E, 0xFE, 0x7E, 0xFE, 0x7E]


def test_e2m1_ties_go_to_even_codes():
    # amax 6 -> scale 6/6 = 1 (a power of two already): codes of x itself.
    vals = [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0, -0.25, -0.1, -0.0, 0.0, 0.5, 1.0, 3.0, 4.0]
    x = row(vals, 32)
    packed, codes = R.mxfp4_cast(x[None])
    assert codes.tolist() == [[127]]
    unpacked = R.unpack_e2m1(packed)[0].tolist()
    assert unpacked[:16] == [0, 2, 2, 4, 4, 6, 6, 7, 8, 8, 8, 0, 1, 2, 5, 6]
    # Two codes per byte, element 2i in the low nibble: (0.25, 0.75) -> 0x20.
    assert packed[0, 0].item() == 0x20


def test_e2m1_scaled_ties_and_saturation():
    # amax 12 -> 12/6 = 2 -> scale 2 (code 128): x/2 = 0.375 -> 0.5 (code 1), 2.5 (5/2) -> code 4,
    # 7 -> 3.5 -> code 6 (tie to 4), 12 -> 6 (code 7).
    x = row([0.75, 5.0, 7.0, 12.0], 32)
    packed, codes = R.mxfp4_cast(x[None])
    assert codes.item() == 128
    assert R.unpack_e2m1(packed)[0, :4].tolist() == [1, 4, 6, 7]
    # amax 7 -> 7/6 rounds up to 2: 7/2 = 3.5 ties 3/4 -> 4 (code 6).
    packed, codes = R.mxfp4_cast(row([7.0], 32)[None])
    assert codes.item() == 128 and R.unpack_e2m1(packed)[0, 0].item() == 6


def test_e2m1_clamp_nan_and_cast():
    # A group of fp32 denormals: amax below 6*2^-126 -> scale 2^-126 (code 1); 2^-127 * 2^126 = 0.5 -> code 1.
    packed, codes = R.mxfp4_cast(row([2.0**-127], 32)[None])
    assert codes.item() == 1 and R.unpack_e2m1(packed)[0, 0].item() == 1
    assert R.e2m1_code(fp32([math.nan, -math.nan, math.inf, -math.inf, 100.0])).tolist() == [7, 7, 7, 15, 7]


def test_ue8m0_packing_and_column_major_layout():
    # Five groups of 32 with amax 448 * 2^k for k = 0..4 -> codes 127..131, packed little-endian
    # four per int32, the fifth word padded with zero bytes.
    x = torch.zeros(3, 160)
    for g in range(5):
        x[:, 32 * g] = 448.0 * 2**g
    q, s = R.per_token_group_cast(x, 32, "ue8m0_packed")
    assert s.dtype == torch.int32 and s.shape == (3, 2)
    assert s[0, 0].item() & 0xFFFFFFFF == 127 | 128 << 8 | 129 << 16 | 130 << 24  # int32 reads negative
    assert s[0, 1].item() == 131
    q2, s2 = R.per_token_group_cast(x, 32, "ue8m0_packed", col_major=True)
    assert s2.shape == (3, 2) and s2.stride() == (1, 4)  # 3 rows padded to 4 (16 bytes)
    assert torch.equal(s2, s) and torch.equal(q2.view(torch.uint8), q.view(torch.uint8))
    _, s3 = R.per_token_group_cast(torch.ones(5, 128), 128, "fp32", col_major=True)
    assert s3.stride() == (1, 8)


def test_per_block_cast_scales_each_tile():
    w = torch.zeros(64, 64)
    w[0, 0] = 448.0  # tile (0, 0): scale 1
    w[40, 63] = -896.0  # tile (1, 1): scale 2, -896 -> -448
    w[33, 1] = 1.0  # tile (1, 0): scale 1/448, 1 * 448 -> 448
    q, s = R.per_block_cast(w, 32)
    assert s[0, 0].item() == 1.0 and s[1, 1].item() == 2.0
    assert s[1, 0].item() == (fp32(1.0) / fp32(448.0)).item()
    assert s[0, 1].item() == (fp32(1e-4) / fp32(448.0)).item()
    assert bits(q[[0, 40, 33], [0, 63, 1]]) == [0x7E, 0xFE, 0x7E]


def test_dequant_values():
    q = torch.tensor([[0x7E, 0xFE, 0x01, 0x80]], dtype=torch.uint8).view(torch.float8_e4m3fn).repeat(1, 32)
    y = R.dequant_e4m3(q, torch.tensor([[2.0]]), (1, 128), torch.float32)
    assert y[0, :4].tolist() == [896.0, -896.0, 2.0**-8, -0.0] and math.copysign(1, y[0, 3].item()) == -1
    packed = R.pack_e2m1(torch.tensor([[1, 7, 15, 8] + [0] * 28], dtype=torch.uint8))
    y = R.dequant_e2m1(packed, torch.tensor([[129]], dtype=torch.uint8), torch.bfloat16)  # scale 4
    assert y[0, :4].float().tolist() == [2.0, 24.0, -24.0, -0.0]


def test_fp4_to_fp8_is_lossless_within_14_binades():
    g = torch.Generator().manual_seed(0)
    codes = torch.randint(0, 16, (128, 256), generator=g, dtype=torch.uint8)
    # Scale codes spread over 14 binades; the smallest value 0.5 * 2^-7 stays above the 1e-4 clamp.
    scales = torch.randint(120, 135, (128, 8), generator=g, dtype=torch.uint8)
    packed = R.pack_e2m1(codes)
    exact = R.dequant_e2m1(packed, scales, torch.float32)
    for block in ((1, 128), (128, 128)):
        q, s = R.fp4_to_fp8(packed, scales, block)
        back = R.dequant_e4m3(q, s, block, torch.float32)
        assert torch.equal(back, exact)


def test_swiglu_clamps_and_weights():
    x = torch.zeros(2, 256, dtype=torch.bfloat16)
    x[0, 0], x[0, 128] = 20.0, 1.0  # gate clamped to 10, up 1
    x[0, 1], x[0, 129] = 1.0, -50.0  # up clamped to -10
    x[0, 2], x[0, 130] = float("nan"), 1.0  # fmin(NaN, 10) = 10
    x[1, 0], x[1, 128] = 0.0, 5.0  # silu(0) = 0
    w = torch.tensor([1.0, 0.5])
    y = R.swiglu(x, 10.0, w)
    silu10 = fp32(10.0) / (1.0 + torch.exp(fp32(-10.0)))
    silu1 = fp32(1.0) / (1.0 + torch.exp(fp32(-1.0)))
    assert y[0, 0].item() == silu10.item() and y[0, 2].item() == silu10.item()
    assert y[0, 1].item() == (silu1 * -10.0).item()
    assert y[1, 0].item() == 0.0
    q, s = R.swiglu_cast(x, 10.0, w)
    assert q.shape == (2, 128) and s.shape == (2, 1)


def test_per_channel_transpose_partial_block():
    x = torch.zeros(200, 64)
    x[130, 5] = 448.0  # channel 5, token block 1 (tokens 128..199): scale 1
    x[3, 5] = -224.0  # channel 5, block 0: scale 0.5, -224 -> -448
    q, s = R.per_channel_cast_transpose(x)
    assert q.shape == (64, 200) and s.shape == (64, 2)
    assert s[5].tolist() == [0.5, 1.0]
    assert bits(q[5, [3, 130]]) == [0xFE, 0x7E]


def test_batch_invariance_of_reference():
    x = torch.randn(37, 256)
    q, s = R.per_token_group_cast(x, 128, "ue8m0_packed", col_major=True)
    q1, s1 = R.per_token_group_cast(x[5:6], 128, "ue8m0_packed", col_major=True)
    assert torch.equal(q[5:6].view(torch.uint8), q1.view(torch.uint8)) and torch.equal(s[5:6], s1)
