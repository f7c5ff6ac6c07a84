"""The float64 references on tiny CPU examples: the conventions every kernel follows."""

import pytest
import torch

from kernels.moe import reference as R


def test_gating_ties_go_to_lower_expert_id():
    logits = torch.tensor([[1.0, 3.0, 3.0, 0.0, 3.0]])
    ids, w = R.gating_ref(logits, None, 2, "sigmoid", renormalize=False)
    assert ids.tolist() == [[1, 2]]
    assert torch.allclose(w, torch.sigmoid(torch.tensor([[3.0, 3.0]], dtype=torch.float64)))


def test_gating_bias_steers_selection_only():
    logits = torch.tensor([[0.0, 1.0, 2.0, 3.0]])
    bias = torch.tensor([10.0, 0.0, 0.0, 0.0])
    ids, w = R.gating_ref(logits, bias, 2, "softmax", renormalize=False, routed_scaling=2.0)
    assert ids.tolist() == [[0, 3]]
    p = torch.softmax(logits.double(), -1)
    assert torch.allclose(w, 2.0 * p[:, [0, 3]])


def test_gating_group_limited_and_renormalised():
    # groups {0,1} {2,3} {4,5}; group maxima 0.9, 0.8, 0.95 -> keep groups 2 and 0.
    logits = torch.tensor([[0.9, 0.1, 0.8, 0.85, 0.95, 0.0]]).logit()
    ids, w = R.gating_ref(logits, None, 3, "sigmoid", n_groups=3, topk_groups=2, routed_scaling=1.5)
    assert ids.tolist() == [[4, 0, 1]]
    assert w.sum().item() == pytest.approx(1.5)


def test_gating_rejects_bad_groups():
    with pytest.raises(ValueError, match="n_groups"):
        R.gating_ref(torch.zeros(1, 6), None, 2, "softmax", n_groups=4, topk_groups=1)
    with pytest.raises(ValueError, match="score_func"):
        R.scores_ref(torch.zeros(1, 6), "relu")


def test_metadata_padding_empty_experts_and_round_trip():
    ids = torch.tensor([[3, 0], [3, 1], [0, 3]], dtype=torch.int32)
    m = R.metadata_ref(ids, 4, align=4)
    assert m["counts"].tolist() == [2, 1, 0, 3]
    assert m["offsets"].tolist() == [0, 4, 8, 8, 12]
    assert m["row_of"].tolist() == [[8, 0], [9, 4], [1, 10]]
    assert m["entry_of_row"].tolist() == [1, 4, -1, -1, 3, -1, -1, -1, 0, 2, 5, -1]
    assert m["block_expert"].tolist() == [0, 1, 3]
    x = torch.randn(3, 8)
    xp = R.permute_ref(x, m["entry_of_row"], 2)
    assert torch.equal(xp[m["row_of"][:, 1].long()], x)
    assert torch.equal(xp[2], torch.zeros(8))
    w = torch.tensor([[0.25, 0.75]] * 3)
    assert torch.allclose(R.combine_ref(xp, m["row_of"], w), x.double())


def test_metadata_rank_mask():
    ids = torch.tensor([[3, 0], [2, 1]], dtype=torch.int32)
    m = R.metadata_ref(ids, 4, rank=1, n_ranks=2, align=2)
    assert m["counts"].tolist() == [1, 1]
    assert m["row_of"].tolist() == [[2, -1], [0, -1]]
    assert m["entry_of_row"].tolist() == [2, -1, 0, -1]


def test_grouped_gemm_references_agree():
    torch.manual_seed(0)
    e, n, k = 2, 128, 256
    b = torch.randn(e, n, k).to(torch.float8_e4m3fn)
    sb = torch.rand(e, 1, 2) + 0.5
    counts = torch.tensor([3, 0])
    a = torch.randn(e, 128, k).to(torch.float8_e4m3fn)
    sa = torch.rand(e, 128, 2) + 0.5
    masked = R.grouped_gemm_masked_ref(a, sa, b, sb, counts)
    contiguous = R.grouped_gemm_contiguous_ref(a.view(-1, k), sa.view(-1, 2), b, sb, torch.tensor([0, -1]))
    assert torch.allclose(masked.view(-1, n)[:3], contiguous[:3], rtol=1e-12, atol=1e-12)
    assert torch.count_nonzero(masked[0, 3:]) == 0 and torch.count_nonzero(masked[1]) == 0
