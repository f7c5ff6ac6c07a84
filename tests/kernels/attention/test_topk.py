"""Top-k selection (kernels/attention/topk.py), both variants (one CTA per row, a 2-CTA cluster
per row): compiles for sm_90a (the cluster variant with its cluster launch and barriers) and
refuses bad input on the CPU; on the GPU it equals a stable descending sort's first k (as a set,
listed ascending) on random rows, ties, ±0, ±inf and NaN, at k 512 / 1024 / 2048 and N up to
131072; the two variants give the same bits; 100 runs give the same bits; a row's result does
not depend on the other rows of the batch."""

import pytest
import torch

from kernels.attention.topk import CTAS_PER_ROW, KS, MAX_N, topk_indices, topk_kernel


def reference_topk(x: torch.Tensor, k: int) -> torch.Tensor:
    """The first k indices of a stable descending sort (ties: lower index first), ascending;
    rows shorter than k padded with -1. Sorted on the CPU (a comparison sort: -0 == +0, NaN
    above +inf), so the reference does not rest on how the GPU's radix sort orders signed zeros."""
    idx = torch.sort(x.cpu(), dim=-1, descending=True, stable=True).indices[:, :k]
    idx = torch.sort(idx, dim=-1).values.to(torch.int32)
    return torch.nn.functional.pad(idx, (0, k - idx.shape[1]), value=-1).to(x.device)


@pytest.mark.parametrize("ctas_per_row", CTAS_PER_ROW)
@pytest.mark.parametrize("k", KS)
def test_compiles_with_vector_loads(k, ctas_per_row):
    src = topk_kernel(k, ctas_per_row).device_source
    assert "*(float4*)(X" in src  # 16-byte loads of the logits
    assert "atomicAdd" in src or "AtomicAdd" in src  # shared-memory histogram (integer: order-free)


def test_cluster_variant_launches_clusters_and_exchanges_through_dsmem():
    """The 2-CTA variant launches 2-CTA clusters, writes each histogram into the peer CTA's
    shared memory and publishes it with a cluster barrier once per histogram pass; the 1-CTA
    kernel has none of it."""
    clustered = topk_kernel(2048, 2)
    assert "static const unsigned cluster[3] = {2, 1, 1};" in clustered.host_source
    (launch,) = clustered.metadata["launches"]
    assert launch["cluster"] == [2, 1, 1] and launch["grid"][0] == "(R * 2)"  # two CTAs per row
    src = clustered.device_source
    assert src.count("tl::cluster_sync();") == 3  # one exchange per histogram pass
    assert src.count("tl::cluster_arrive_relaxed();") == 1 and src.count("tl::cluster_wait();") == 1
    assert src.count("map_shared_rank(") == 3  # the peer's receive buffer of each pass
    single = topk_kernel(2048, 1)
    assert "cluster" not in single.device_source and "cluster[3]" not in single.host_source


def test_rejects_bad_variant():
    with pytest.raises(ValueError, match=r"ctas_per_row: expected one of \(1, 2\), got 4"):
        topk_kernel(2048, 4)


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
    with pytest.raises(ValueError, match="ctas_per_row: expected one of"):
        topk_indices(x, 512, ctas_per_row=3)


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
@pytest.mark.parametrize("ctas_per_row", CTAS_PER_ROW)
@pytest.mark.parametrize("k", KS)
@pytest.mark.parametrize("n", [1000, 2048, 4100, 32768, 65536, 131072])
@pytest.mark.parametrize("kind", ["random", "ties", "all_equal", "specials", "masked"])
def test_equals_stable_sort(k, n, kind, ctas_per_row):
    g = torch.Generator(device="cuda").manual_seed(n + k)
    x = _rows(kind, 6, n, g)
    got = topk_indices(x, k, ctas_per_row)
    assert torch.equal(got, reference_topk(x, k))


@pytest.mark.gpu
@pytest.mark.parametrize("k", KS)
@pytest.mark.parametrize("n", [2052, 4100, 8196, 65536, 131068])  # halves of odd quad counts too
@pytest.mark.parametrize("kind", ["random", "ties", "all_equal", "specials", "masked"])
def test_cluster_variant_bitwise_equals_single_cta(k, n, kind):
    """Both variants on the same rows, outputs poisoned differently first: the same bits."""
    g = torch.Generator(device="cuda").manual_seed(7 * n + k)
    x = _rows(kind, 64, n, g)
    outs = {}
    for ctas, poison in ((1, -7), (2, -9)):
        outs[ctas] = torch.full((64, k), poison, dtype=torch.int32, device="cuda")
        topk_kernel(k, ctas)(x.view(64, n // 4, 4), outs[ctas])
    assert torch.equal(outs[1], outs[2])
    assert torch.equal(outs[2], reference_topk(x, k))


@pytest.mark.gpu
def test_default_variant_across_batch_sizes():
    """No ``ctas_per_row``: a batch small enough for 2-CTA clusters and one too large for them
    give the rows' stable-sort top-k, and a row's indices do not depend on which was taken."""
    g = torch.Generator(device="cuda").manual_seed(11)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    x = torch.randn(sms + 1, 8192, device="cuda", generator=g)
    small, large = topk_indices(x[:8].contiguous(), 512), topk_indices(x, 512)
    assert torch.equal(large, reference_topk(x, 512))
    assert torch.equal(small, large[:8])


@pytest.mark.gpu
@pytest.mark.parametrize("ctas_per_row", CTAS_PER_ROW)
def test_deterministic_and_batch_invariant(ctas_per_row):
    g = torch.Generator(device="cuda").manual_seed(3)
    x = torch.randint(0, 50, (64, 65536), device="cuda", generator=g).float()  # many ties
    first = topk_indices(x, 2048, ctas_per_row)
    for _ in range(100):
        assert torch.equal(topk_indices(x, 2048, ctas_per_row), first)
    for rows in ([5], [0, 5, 9], list(range(7, 64, 3))):
        assert torch.equal(topk_indices(x[rows].contiguous(), 2048, ctas_per_row), first[rows])


@pytest.mark.gpu
@pytest.mark.parametrize("ctas_per_row", CTAS_PER_ROW)
def test_every_output_written(ctas_per_row):
    g = torch.Generator(device="cuda").manual_seed(4)
    x = torch.randn(9, 8192, device="cuda", generator=g)
    outs = []
    for poison in (0, -1):
        out = torch.full((9, 1024), poison, dtype=torch.int32, device="cuda")
        topk_kernel(1024, ctas_per_row)(x.view(9, 2048, 4), out)
        outs.append(out)
    assert torch.equal(outs[0], outs[1])
    assert torch.equal(outs[0], reference_topk(x, 1024))
