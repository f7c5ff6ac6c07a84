"""The TIR -> Z3 encoder agrees with TVM's own constant folding, and its obligations catch overflow."""

import random

import pytest
import z3

from tilelang import tvm
from tlx.passes.smt import Encoder, _rlimit_count, dtype_range, scalar_dtype

tir = tvm.tirx

x = tir.Var("x", "int32")
y = tir.Var("y", "int32")

BINARY = {
    "floordiv": tir.floordiv,
    "floormod": tir.floormod,
    "truncdiv": tir.truncdiv,
    "truncmod": tir.truncmod,
    "min": tir.min,
    "max": tir.max,
    "add": lambda a, b: a + b,
    "sub": lambda a, b: a - b,
    "mul": lambda a, b: a * b,
    "bitwise_and": lambda a, b: a & b,
    "bitwise_or": lambda a, b: a | b,
    "bitwise_xor": lambda a, b: a ^ b,
    "select": lambda a, b: tir.Select(a < b, a - b, b * 3),
    "if_then_else": lambda a, b: tir.if_then_else(a % 3 == 0, a, b),
}


def _z3_value(enc, term, values):
    s = z3.Solver(ctx=enc.ctx)
    for var, val in values.items():
        s.add(enc.var(var) == val)
    assert s.check() == z3.sat
    return s.model().eval(term, model_completion=True)


def _folded(expr_fn, a, b):
    folded = tvm.arith.Analyzer().simplify(expr_fn(tir.IntImm("int32", a), tir.IntImm("int32", b)))
    assert isinstance(folded, tir.IntImm), f"TVM did not fold {folded}"
    return int(folded.value)


@pytest.mark.parametrize("op", sorted(BINARY))
def test_binary_ops_match_tvm_folding(op):
    rng = random.Random(op)
    enc = Encoder()
    term = enc.encode(BINARY[op](x, y))
    enc.take_obligations()
    for _ in range(25):
        a = rng.randint(-1000, 1000)
        b = rng.choice([v for v in range(-37, 38) if v != 0])
        got = _z3_value(enc, term, {x: a, y: b})
        assert got.as_long() == _folded(BINARY[op], a, b), (op, a, b)


@pytest.mark.parametrize("shift", [0, 1, 3, 7])
def test_constant_shifts_match_tvm_folding(shift):
    enc = Encoder()
    left = enc.encode(tir.shift_left(x, tir.IntImm("int32", shift)))
    right = enc.encode(tir.shift_right(x, tir.IntImm("int32", shift)))
    for a in (-977, -8, -1, 0, 5, 1234):
        assert _z3_value(enc, left, {x: a}).as_long() == _folded(lambda p, q: tir.shift_left(p, q), a, shift)
        assert _z3_value(enc, right, {x: a}).as_long() == _folded(lambda p, q: tir.shift_right(p, q), a, shift)


def test_casts_and_comparisons():
    enc = Encoder()
    wide = enc.encode(tir.Cast("int64", x) * tir.IntImm("int64", 1 << 20))
    assert not enc.take_obligations(), "int32 -> int64 widening times 2**20 cannot overflow int64"
    assert _z3_value(enc, wide, {x: -3}).as_long() == -3 << 20
    cond = enc.encode(tir.And(x < y, tir.Not(tir.EQ(x, 0))))
    assert z3.is_true(_z3_value(enc, cond, {x: 1, y: 2}))
    assert z3.is_false(_z3_value(enc, cond, {x: 0, y: 2}))
    as_int = enc.encode(tir.Cast("int32", x < y))
    assert _z3_value(enc, as_int, {x: 1, y: 2}).as_long() == 1


def test_int32_overflow_is_an_obligation_with_counterexample():
    enc = Encoder()
    n = tir.Var("n", "int32")
    enc.add_fact(enc.var(n) >= 0)
    term = enc.encode(n * 256)
    obs = enc.take_obligations()
    assert len(obs) == 1 and obs[0].dtype == "int32"
    verdict, bad = enc.prove_obligations(obs)
    assert verdict.status == "violation" and bad is obs[0]
    value = enc.model_value(verdict.model, term)
    assert value > dtype_range("int32")[1]
    # Under n < 2**23 the product fits.
    enc.add_fact(enc.var(n) < 1 << 23)
    assert enc.prove_obligations(obs)[0].proven


def test_narrowing_cast_is_checked():
    enc = Encoder()
    big = tir.Var("big", "int64")
    enc.encode(tir.Cast("int32", big))
    obs = enc.take_obligations()
    assert obs and enc.prove_obligations(obs)[0].status == "violation"


def test_unmodelled_nodes_are_unconstrained():
    """A float cast to int is not modelled: the verifier must not prove anything about it."""
    enc = Encoder()
    f = tir.Var("f", "float32")
    t = enc.encode(tir.Cast("int32", f))
    assert enc.prove(t >= 0).status == "violation"
    assert enc.prove(t <= dtype_range("int32")[1]).proven  # still within its dtype


def test_vector_lanes():
    enc = Encoder()
    lane = z3.Int("lane", enc.ctx)
    term = enc.encode(tir.Ramp(x * 4, 1, 4), lane=lane)
    enc.take_obligations()
    v = enc.prove(term < enc.encode(x) * 4 + 4, [lane >= 0, lane < 4])
    assert v.proven
    assert enc.prove(term < enc.encode(x) * 4 + 3, [lane >= 0, lane < 4]).status == "violation"


def test_budget_is_deterministic():
    """The same query reports the same rlimit use every time (the budget is not wall-clock)."""
    used = []
    for _ in range(2):
        enc = Encoder()
        a, b = enc.var(x), enc.var(y)
        enc.add_fact(z3.And(a > 0, b > 0, a < 1 << 16, b < 1 << 16))
        v = enc.prove(enc.encode(tir.floormod(x * y, y)) == 0)
        assert v.proven
        used.append(v.rlimit_used)
    assert used[0] == used[1] > 0


def test_tiny_budget_gives_unknown():
    enc = Encoder(rlimit=1)
    a, b = enc.var(x), enc.var(y)
    v = enc.prove(a * a * b + b * b * a != 7, [a > 1, b > 1])
    assert v.status == "unknown"


def test_an_unknown_is_asked_again_and_counted_once():
    """A query the shared solver leaves unknown is asked again in a solver of its own; its
    reported use is the two attempts' (at most twice the budget), not the context's running
    count, which the earlier queries have raised past that."""
    enc = Encoder(rlimit=3000)
    a, b = enc.var(x), enc.var(y)
    enc.add_fact(z3.And(a > 0, b > 0, a < 1 << 16, b < 1 << 16))
    for _ in range(20):
        assert enc.prove(enc.encode(tir.floormod(x * y, y)) == 0).proven
    v = enc.prove(a * a * b + b * b * a != 7 * 1234567, [a > 1, b > 1])
    assert v.status == "unknown"
    assert enc.rlimit < v.rlimit_used <= 2 * enc.rlimit < _rlimit_count(enc.solver)


def test_scalar_dtype_parsing():
    assert scalar_dtype("int32x4") == ("int", 32, 4)
    assert scalar_dtype("bool") == ("bool", 1, 1)
    assert scalar_dtype("float16")[0] == "other"
    assert dtype_range("uint8") == (0, 255)
