"""bench/mega_moe_ep.py's parts that need no GPU: its arguments and the count of bytes that cross
between GPUs (checked against a count done by hand)."""

import pytest
import torch

from bench.mega_moe_ep import crossing_bytes, local_logits, parse_args
from kernels.moe.reference import gating_ref


def test_crossing_bytes_counts_remote_rows_each_way():
    # 2 ranks, 2 tokens each, 2 experts a rank, H 256 (two fp32 scales a row)
    ids = torch.tensor([[0, 3], [2, 1], [3, 0], [1, 1]])  # owners [0, 1] [1, 0] | [1, 0] [0, 0]
    row_in, row_out = 256 + 2 * 4, 256 * 2
    # rank 0 receives 3 rows from rank 1 (tokens 2: slot 1, 3: both) and 2 results (token 0 slot 1, token 1 slot 0)
    assert crossing_bytes(ids, 0, 2, 2, 2, 256) == 3 * row_in + 2 * row_out
    assert crossing_bytes(ids, 1, 2, 2, 2, 256) == 2 * row_in + 3 * row_out
    assert crossing_bytes(torch.zeros(2, 2, dtype=torch.int64), 0, 2, 1, 4, 256) == 0  # one rank: nothing crosses


@pytest.mark.parametrize("score_func", ["sqrtsoftplus", "softmax", "sigmoid"])
def test_local_logits_keep_every_token_on_its_rank(score_func):
    n, t, e, k = 4, 16, 32, 6  # 8 experts a rank
    logits = torch.randn(n * t, e, generator=torch.Generator().manual_seed(3)) * 4
    ids, _ = gating_ref(local_logits(logits, t, e // n, k), None, k, score_func)
    owners = ids.long() // (e // n)
    assert torch.equal(owners, (torch.arange(n * t) // t)[:, None].expand_as(owners))
    assert crossing_bytes(ids, 2, t, n, e // n, 256) == 0
    ids_plain, _ = gating_ref(logits, None, k, score_func)
    assert crossing_bytes(ids_plain, 2, t, n, e // n, 256) > 0  # the unshifted batch does cross: the check can fail


def test_local_logits_change_only_the_own_rank_columns_by_one_shift():
    logits = torch.randn(6, 6, generator=torch.Generator().manual_seed(4))
    delta = local_logits(logits, 3, 3, 2) - logits  # 2 ranks of 3 tokens, 3 experts each
    shift = float(logits.max() - logits.min()) + 1.0
    expected = torch.zeros(6, 6)
    expected[:3, :3] = expected[3:, 3:] = shift
    torch.testing.assert_close(delta, expected)
    with pytest.raises(ValueError, match="topk"):
        local_logits(logits, 3, 3, 4)


def test_arguments_are_checked():
    args = parse_args(["--tokens", "8,512", "--models", "V4-Pro"])
    assert (args.tokens, args.models) == ([8, 512], ["V4-Pro"])
    with pytest.raises(SystemExit):
        parse_args(["--models", "V5"])
    with pytest.raises(SystemExit):
        parse_args(["--tokens", "0"])
