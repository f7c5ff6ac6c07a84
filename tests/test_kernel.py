"""Output extents of allocating kernels: parsed once at load, evaluated per call."""

import pytest

from tlx.kernel import output_extent


def test_extents_evaluate_constants_dims_and_expressions():
    env = {"M": 10, "N": 7}
    assert output_extent("64", "k", "out")(env) == 64
    assert output_extent("M", "k", "out")(env) == 10
    assert output_extent("(M + 3) // 4 * N", "k", "out")(env) == 21
    assert output_extent("min(M, N) % 4", "k", "out")(env) == 3


def test_unbound_or_unsupported_extent_names_the_output():
    with pytest.raises(ValueError, match=r"k: cannot size output scales from extent 'K \* 2'"):
        output_extent("K * 2", "k", "scales")({"M": 1})
    with pytest.raises(ValueError, match="cannot size output out from extent 'M ?"):
        output_extent("M ?", "k", "out")({"M": 1})
    with pytest.raises(ValueError, match="unsupported extent expression"):
        output_extent("M ** 2", "k", "out")({"M": 3})
