"""The parity harness's pieces that need no GPU: assert_bitwise's reports, baseline flags, and
which headers a baseline's build name hashes."""

from pathlib import Path

import pytest
import torch

from tlx.numerics.modes import nvcc_flags
from tlx.numerics.parity import assert_bitwise, baseline_flags, build_baseline, local_headers


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


def test_quoted_includes_are_hashed_through_parent_folders(tmp_path):
    family, shared = tmp_path / "family", tmp_path / "shared.cuh"
    family.mkdir()
    shared.write_text('#pragma once\n#include "deeper.h"\n__device__ __forceinline__ int twice(int x) { return 2 * x; }\n')
    (tmp_path / "deeper.h").write_text("#pragma once\n")
    (family / "unused.cuh").write_text("#pragma once\n")  # beside the source but not included
    source = family / "k.cu"
    source.write_text('#include <cstdint>\n#include "../shared.cuh"\n__global__ void k(int* y) { *y = twice(*y); }\n')
    assert local_headers(source) == [shared.resolve(), (tmp_path / "deeper.h").resolve()]
    first = build_baseline(source, compile_only=True, build_directory=str(tmp_path / "a"))
    (tmp_path / "deeper.h").write_text("#pragma once\n// edited\n")
    second = build_baseline(source, compile_only=True, build_directory=str(tmp_path / "b"))
    assert Path(first).name != Path(second).name  # the name hashes the edited header two levels down
    (family / "unused.cuh").write_text("#pragma once\n// edited\n")
    third = build_baseline(source, compile_only=True, build_directory=str(tmp_path / "c"))
    assert Path(third).name == Path(second).name
