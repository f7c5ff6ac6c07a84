"""bench/mega_moe_ep.py's parts that need no GPU: its arguments and the count of bytes that cross
between GPUs (checked against a count done by hand)."""

import pytest
import torch

from bench.mega_moe_ep import crossing_bytes, parse_args


def test_crossing_bytes_counts_remote_rows_each_way():
    # 2 ranks, 2 tokens each, 2 experts a rank, H 256 (two fp32 scales a row)
    ids = torch.tensor([[0, 3], [2, 1], [3, 0], [1, 1]])  # owners [0, 1] [1, 0] | [1, 0] [0, 0]
    row_in, row_out = 256 + 2 * 4, 256 * 2
    # rank 0 receives 3 rows from rank 1 (tokens 2: slot 1, 3: both) and 2 results (token 0 slot 1, token 1 slot 0)
    assert crossing_bytes(ids, 0, 2, 2, 2, 256) == 3 * row_in + 2 * row_out
    assert crossing_bytes(ids, 1, 2, 2, 2, 256) == 2 * row_in + 3 * row_out
    assert crossing_bytes(torch.zeros(2, 2, dtype=torch.int64), 0, 2, 1, 4, 256) == 0  # one rank: nothing crosses


def test_arguments_are_checked():
    args = parse_args(["--tokens", "8,512", "--models", "V4-Pro"])
    assert (args.tokens, args.models) == ([8, 512], ["V4-Pro"])
    with pytest.raises(SystemExit):
        parse_args(["--models", "V5"])
    with pytest.raises(SystemExit):
        parse_args(["--tokens", "0"])
