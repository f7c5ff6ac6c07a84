"""The sweep generators and comparisons, run on CPU tensors (the GPU sweeps use them on cuda)."""

import pytest
import torch

from tlx.numerics import sweep as S


def test_fp32_chunks_cover_every_pattern_once():
    offsets = S.chunk_offsets(1 << 28)
    assert [o & 0xFFFFFFFF for o in offsets] == list(range(0, 1 << 32, 1 << 28))
    assert all(-(1 << 31) <= o and o + (1 << 28) - 1 < (1 << 31) for o in offsets)  # no int32 wrap inside a chunk
    with pytest.raises(ValueError, match="chunk: expected a positive divisor of 2\\^32, got 3"):
        S.chunk_offsets(3)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_specials_and_random_operands(dtype):
    sp = S.specials(dtype, device="cpu").view(dtype)
    assert {float("inf"), float("-inf"), 0.0, 1.0, 2.0} <= set(sp.tolist())
    assert torch.isnan(sp).sum() == 6 and (torch.signbit(sp) & (sp == 0)).sum() == 1
    assert torch.finfo(dtype).max in sp.tolist() and torch.finfo(dtype).smallest_normal in sp.tolist()
    x, y = S.random_operands(1 << 16, dtype, torch.Generator().manual_seed(1), 2, device="cpu")
    assert x.dtype == dtype and torch.isnan(x).any() and torch.isinf(y).any() and (x == 0).any()


def test_random_operands_make_add_ties():
    x, y = S.random_operands(1 << 18, torch.float32, torch.Generator().manual_seed(7), 2, device="cpu")
    ax = x.abs()
    ulp = (torch.nextafter(ax, torch.full_like(ax, float("inf"))) - ax).double()
    ties = torch.isfinite(x) & (y.double().abs() * 2 == ulp)
    assert int(ties.sum()) > 15_000  # ~7% of pairs
    exact = x.double()[ties] + y.double()[ties]
    between = exact != (x[ties] + y[ties]).double()  # falls between two floats (not at a binade edge)
    assert between.float().mean() > 0.9


def test_assert_same_bits_reports_inputs_and_accepts_bit_views():
    a, b = torch.tensor([1.0, 2.0, 3.0]), torch.tensor([1.0, 2.5, 3.0])
    with pytest.raises(AssertionError, match=r"t at flat index 1 \(input0=0x40000000\).*actual 2.0 .* expected 2.5"):
        S.assert_same_bits(a, b.view(torch.int32), "t", (a,))
    S.assert_same_bits(a.bfloat16(), a.bfloat16().view(torch.int16), "bits view")
    nan_a, nan_b = torch.tensor([float("nan")]), torch.tensor([float("nan")]).neg()
    with pytest.raises(AssertionError):
        S.assert_same_bits(nan_a, nan_b, "NaN sign")
    assert S.poisoned((2,), torch.float32, device="cpu").view(torch.int32).tolist() == [-1515870811] * 2
