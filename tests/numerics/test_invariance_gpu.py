"""Batch invariance and determinism on the GPU: the clean kernels pass, the planted
batch-dependent split is caught by the harness as the static pass predicts."""

import pytest

torch = pytest.importorskip("torch")

from tests.numerics import determinism_kernels as D  # noqa: E402
from tlx.compiler import compile_kernel  # noqa: E402
from tlx.options import Options  # noqa: E402
from tlx.numerics.invariance import check_batch_invariance, check_determinism  # noqa: E402

pytestmark = pytest.mark.gpu

BATCHES = [*range(1, 70), 128, 200, 333]


def gen(seed):
    return torch.Generator(device="cuda").manual_seed(seed)


def test_plain_gemm_is_batch_invariant_and_deterministic():
    kernel = compile_kernel(D.gemm(), Options.make(out_idx=[2]), name="plain_gemm")
    b = torch.randn(256, 256, device="cuda", generator=gen(1)).half()
    make = lambda n: (torch.randn(n, 256, device="cuda", generator=gen(2)).half(), b)  # noqa: E731
    r = check_batch_invariance(kernel, make, BATCHES, batched_args=[0])
    assert r["ok"], r["mismatches"][:3]
    d = check_determinism(kernel, make(333), runs=100)
    assert d["ok"], d["mismatches"][:3]


def test_row_sum_is_batch_invariant_and_deterministic():
    kernel = compile_kernel(D.row_sum(), Options.make(out_idx=[1]), name="row_sum")
    make = lambda n: (torch.randn(n, 1024, device="cuda", generator=gen(3)),)  # noqa: E731
    r = check_batch_invariance(kernel, make, BATCHES)
    assert r["ok"], r["mismatches"][:3]
    assert check_determinism(kernel, make(200), runs=100)["ok"]


def test_planted_batch_dependent_split_is_caught():
    kernel = compile_kernel(D.batch_split_row_sum(), Options.make(out_idx=[1]), name="batch_split_row_sum")
    make = lambda n: (torch.randn(n, 1000, device="cuda", generator=gen(4)),)  # noqa: E731
    r = check_batch_invariance(kernel, make, [1, 2, 63, 64, 65, 200])
    assert not r["ok"]
    assert {m["batch"] for m in r["mismatches"]} <= {64, 65, 200}
    assert r["rows_differing"] > 100  # most rows of the large batches change bits
    assert check_determinism(kernel, make(200), runs=20)["ok"]  # deterministic, only batch-variant
