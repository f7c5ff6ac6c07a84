"""The parity harness's pieces that need no GPU: assert_bitwise's reports and baseline flags."""

import pytest
import torch

from tlx.numerics.modes import nvcc_flags
from tlx.numerics.parity import assert_bitwise, baseline_flags


def test_identical_bits_pass_including_nan_payloads():
    x = torch.tensor([1.0, float("nan"), -0.0, float("inf")])
    assert_bitwise(x, x.clone())


def test_first_difference_is_reported_with_values_bits_and_ulps():
    a = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    b = a.clone()
    b[1, 0] = torch.nextafter(torch.tensor(3.0), torch.tensor(4.0))  # one ulp up
    b[1, 1] = 5.0
    with pytest.raises(AssertionError) as e:
        assert_bitwise(a, b, name="out")
    msg = str(e.value)
    assert "out: 2 of 4 elements differ; first at index (1, 0)" in msg
    assert "actual 3.0 (0x40400000)" in msg and "(0x40400001)" in msg and "1 ULP apart" in msg


def test_sign_of_zero_and_nan_payload_count_as_differences():
    with pytest.raises(AssertionError, match="0x00000000.*0x80000000"):
        assert_bitwise(torch.tensor([0.0]), torch.tensor([-0.0]))
    qnan = torch.tensor([0x7FC00000], dtype=torch.int32).view(torch.float32)
    other = torch.tensor([0x7FC00001], dtype=torch.int32).view(torch.float32)
    with pytest.raises(AssertionError, match="1 of 1 elements differ"):
        assert_bitwise(qnan, other)


def test_ulps_across_zero_and_for_half_types():
    tiny = torch.tensor([1], dtype=torch.int32).view(torch.float32)
    with pytest.raises(AssertionError, match="2 ULP apart"):
        assert_bitwise(tiny, -tiny)
    with pytest.raises(AssertionError, match="1 ULP apart"):
        assert_bitwise(torch.tensor([1.0], dtype=torch.bfloat16), torch.tensor([1.0078125], dtype=torch.bfloat16))


def test_dtype_and_shape_mismatches():
    with pytest.raises(AssertionError, match="dtype torch.float32 != expected torch.float64"):
        assert_bitwise(torch.zeros(2), torch.zeros(2, dtype=torch.float64))
    with pytest.raises(AssertionError, match=r"shape \(2,\) != expected \(3,\)"):
        assert_bitwise(torch.zeros(2), torch.zeros(3))


def test_baseline_flags_follow_the_mode():
    assert baseline_flags("sm_90a", "strict")[-4:] == nvcc_flags("strict")
    assert "-gencode=arch=compute_90a,code=sm_90a" in baseline_flags("sm_90a")
