"""Top-k selection (kernels/attention/topk.py): compiles for sm_90a and refuses bad input on the
CPU; on the GPU it equals a stable descending sort's first k (as a set, listed ascending) on
random rows, ties, ±0, ±inf and NaN, at k 512 / 1024 / 2048 and N up to 131072; 100 runs give
the same bits; a row's result does not depend on the other rows of the batch."""

import pytest
import torch

from kernels.attention.topk import KS, MAX_N, topk_indices, topk_kernel


def reference_topk(x: torch.Tensor, k: int) -> torch.Tensor:
    """The first k indices of a stable descending sort (ties: lower index first), ascending;
    rows shorter than k padded with -1. Sorted on the CPU (a comparison sort: -0 == +0, NaN
    above +inf), so the reference does not rest on how the GPU's radix sort orders signed zeros."""
    idx = torch.sort(x.cpu(), dim=-1, descending=True, stable=True).indices[:, :k]
    idx = torch.sort(idx, dim=-1).values.to(torch.int32)
    return torch.nn.functional.pad(idx, (0, k - idx.shape[1]), value=-1).to(x.device)


@pytest.mark.parametrize("k", KS)
def test_compiles_with_vector_loads(k):
    src = topk_kernel(k).device_source
    assert "*(float4*)(X" in src  # 16-byte loads of the logits
    assert "atomicAdd" in src or "AtomicAdd" in src  # shared-memory histogram (integer: order-free)


def test_rejects_bad_input():
    x = torch.zeros(2, 4096)
    with pytest.raises(ValueError, match="k: expected one of"):
        topk_indices(x, 100)
    with pytest.raises(TypeError, match="x: expected a 2-d float32"):
        topk_indices(x.double(), 512)
    with pytest.raises(ValueError, match="N a multiple of 4"):
        topk_indices(torch.zeros(2, 4094), 512)
    with pytest.raises(ValueError, match="N a multiple of 4"):
        topk_indices(torch.zeros(2, 0), 512)
    with pytest.raises(ValueError, match=f"N <= {MAX_N}"):
        topk_indices(torch.zeros(1, MAX_N + 4), 512)
    with pytest.raises(ValueError, match="contiguous CUDA tensor"):
        topk_indices(x, 512)  # a CPU tensor


def _rows(kind: str, r: int, n: int, g: torch.Generator) -> torch.Tensor:
    x = torch.randn(r, n, device="cuda", generator=g)
    if kind == "ties":  # few distinct values: the threshold value is shared by thousands
        x = torch.randint(0, 5, (r, n), device="cuda", generator=g).float()
    elif kind == "all_equal":
        x = torch.full((r, n), 0.5, device="cuda")
    elif kind == "specials":
        x[:, ::7] = -0.0
        x[:, 3::7] = 0.0
        x[:, 5::11] = float("-inf")
        x[:, 1::13] = float("inf")
        x[0, 2::17] = float("nan")
    elif kind == "masked":  # causal rows: most keys -inf
        for i in range(r):
            x[i, (i + 1) * n // (r + 1):] = float("-inf")
    return x


@pytest.mark.gpu
@pytest.mark.parametrize("k", KS)
@pytest.mark.parametrize("n", [1000, 2048, 4100, 32768, 65536, 131072])
@pytest.mark.parametrize("kind", ["random", "ties", "all_equal", "specials", "masked"])
def test_equals_stable_sort(k, n, kind):
    g = torch.Generator(device="cuda").manual_seed(n + k)
    x = _rows(kind, 6, n, g)
    got = topk_indices(x, k)
    assert torch.equal(got, reference_topk(x, k))


@pytest.mark.gpu
def test_deterministic_and_batch_invariant():
    g = torch.Generator(device="cuda").manual_seed(3)
    x = torch.randint(0, 50, (64, 65536), device="cuda", generator=g).float()  # many ties
    first = topk_indices(x, 2048)
    for _ in range(100):
        assert torch.equal(topk_indices(x, 2048), first)
    for rows in ([5], [0, 5, 9], list(range(7, 64, 3))):
        assert torch.equal(topk_indices(x[rows].contiguous(), 2048), first[rows])


@pytest.mark.gpu
def test_every_output_written():
    g = torch.Generator(device="cuda").manual_seed(4)
    x = torch.randn(9, 8192, device="cuda", generator=g)
    outs = []
    for poison in (0, -1):
        out = torch.full((9, 1024), poison, dtype=torch.int32, device="cuda")
        topk_kernel(1024)(x.view(9, 2048, 4), out)
        outs.append(out)
    assert torch.equal(outs[0], outs[1])
    assert torch.equal(outs[0], reference_topk(x, 1024))
