"""Assumption strings are parsed with ``ast`` into TIR over shape variables; bad input is named."""

import pytest
import z3

from tilelang import tvm
from tlx.passes.assume import AssumptionError, parse_assumption
from tlx.passes.smt import Encoder

tir = tvm.tirx
M = tir.Var("M", "int32")
K = tir.Var("K", "int32")
VARS = {"M": M, "K": K}


def _holds(text, **values):
    enc = Encoder()
    cond = enc.encode_bool(parse_assumption(text, VARS))
    s = z3.Solver(ctx=enc.ctx)
    s.add(*[enc.var(VARS[k]) == v for k, v in values.items()])
    s.add(cond)
    return s.check() == z3.sat


@pytest.mark.parametrize(
    "text,good,bad",
    [
        ("M % 128 == 0", {"M": 256}, {"M": 130}),
        ("1 <= M <= 1 << 20", {"M": 5}, {"M": 0}),
        ("M >= 1 and not K < 64", {"M": 1, "K": 64}, {"M": 1, "K": 63}),
        ("M // 64 * 64 == M or K == 0", {"M": 1, "K": 0}, {"M": 65, "K": 3}),
        ("M - K != 2 * K", {"M": 5, "K": 1}, {"M": 6, "K": 2}),
    ],
)
def test_parse_and_meaning(text, good, bad):
    assert _holds(text, **good)
    assert not _holds(text, **bad)


@pytest.mark.parametrize(
    "text,match",
    [
        ("N > 0", "not a shape variable"),
        ("M +", "not a valid expression"),
        ("M / 2 == 0", "not supported"),
        ("M + 1", "not a condition"),
        ("__import__('os')", "not supported"),
        (42, "expected a string"),
    ],
)
def test_errors_name_the_problem(text, match):
    with pytest.raises(AssumptionError, match=match):
        parse_assumption(text, VARS)
