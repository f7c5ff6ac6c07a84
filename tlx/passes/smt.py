"""Exact encoding of TIR integer arithmetic into Z3, shared by tlx's index analyses.

One :class:`Encoder` per kernel owns one Z3 context and one solver. TIR integers
become unbounded Z3 ``Int`` terms computed with TVM's exact semantics
(``floordiv``/``floormod``/``truncdiv``/``truncmod``, ``min``/``max``, selects);
the fixed width of each integer operation is not folded into the term but recorded
as an :class:`Obligation` ("this result fits in int32"). A caller that proves every
obligation of an expression knows that the exact term equals what the GPU computes;
one that cannot has found a possible overflow. Bitwise operations go through
bit-vectors of the operand's width. Anything the encoder does not model (floats,
loads, opaque calls) becomes a fresh unconstrained variable bounded only by its
dtype, so every verdict is a sound over-approximation: never a false "safe"; a
counterexample that needs the value of such a load or call is not a witness either
(``opaque_loads`` names them, and the callers report "unknown").

Budgets are Z3 ``rlimit`` units, so a verdict does not depend on the machine or
its load; a query the walk's shared solver leaves unknown is asked again in a solver
of its own, so that an unlucky order of earlier queries does not leave it unknown.

Typical use::

    enc = Encoder()
    facts = enc.range_facts(tx, 0, 128)          # tx's extent, as facts the caller scopes
    idx = enc.encode(bx * 128 + tx)              # z3 term
    obligations = enc.take_obligations()         # width checks produced by encode
    verdict = enc.prove(z3.And(idx >= 0, idx < enc.encode(n)), context=facts)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import z3

import tilelang  # noqa: F401  (sets up the bundled TVM)
from tilelang import tvm

from tlx.ir.facts import FunctionFacts, dimension_vars, stride_vars, user_name
from tlx.ir.tir import PRIVATE_SCOPES, elem_bytes, op_name, scalar_dtype
from tlx.passes.assume import parse_assumption, shape_vars

tir = tvm.tirx

__all__ = ["DEFAULT_RLIMIT", "Encoder", "MemoryFacts", "Obligation", "Verdict", "bind_params", "context_facts", "dtype_range", "kernel_encoder", "shape_setup"]

DEFAULT_RLIMIT = 2_000_000
"""Z3 resource units per query: about 0.1-0.3 s of solver work, identical on every machine."""





def _private_element(load, kinds) -> bool:
    """A load of one element (one index, one lane) of a thread-private buffer of a kind in ``kinds``."""
    kind, _, lanes = scalar_dtype(load.dtype)
    return str(load.buffer.scope()) in PRIVATE_SCOPES and kind in kinds and lanes == 1 and len(load.indices) == 1


def _private_int_scalar(load) -> bool:
    """A load of one element, at a constant index, of a thread-private integer or bool buffer
    (the values ``bounds`` tracks through stores)."""
    return _private_element(load, ("int", "uint", "bool")) and isinstance(load.indices[0], tir.IntImm)


def _private_int_element(load) -> bool:
    """A load of one element, at a computed index, of a thread-private integer array."""
    return _private_element(load, ("int", "uint")) and not isinstance(load.indices[0], (tir.IntImm, tir.Ramp))


def dtype_range(dtype) -> tuple[int, int] | None:
    """The closed value range of an integer dtype, or ``None`` for non-integers."""
    kind, bits, _ = scalar_dtype(dtype)
    if kind == "int":
        return (-(1 << (bits - 1)), (1 << (bits - 1)) - 1)
    if kind == "uint":
        return (0, (1 << bits) - 1)
    if kind == "bool":
        return (0, 1)
    return None


@dataclass(frozen=True)
class Obligation:
    """``term`` (an exact Int) must lie in ``[lo, hi]`` for the fixed-width result to equal it,
    wherever ``when`` holds (the branch of an ``if_then_else`` that computes it; None: always)."""

    term: Any
    lo: int
    hi: int
    dtype: str
    node: Any
    when: Any = None

    def broken(self):
        """The Z3 condition under which the obligation fails."""
        out = z3.Or(self.term < self.lo, self.term > self.hi)
        return out if self.when is None else z3.And(self.when, out)

    def text(self) -> str:
        return f"{self.node} (as {self.dtype})"


@dataclass
class Verdict:
    """Outcome of one query: ``"proven"``, ``"violation"`` (with ``model``) or ``"unknown"``."""

    status: str
    model: Any = None
    reason: str = ""
    rlimit_used: int = 0
    formulas: list = field(default_factory=list)  # what was checked (reusable by ``minimize``)

    @property
    def proven(self) -> bool:
        return self.status == "proven"


@dataclass
class _Enc:
    """An encoded integer: exact term plus a cheap interval (``None`` = unbounded)."""

    term: Any
    lo: int | None
    hi: int | None


def known_term(value):
    """The Z3 term of a :class:`MemoryFacts` value (a term, or an encoded load with its interval)."""
    return value.term if isinstance(value, _Enc) else value


@dataclass
class MemoryFacts:
    """What the verifier's walk knows of thread-private memory where it stands, handed to the
    :class:`Encoder` so that loads mean it; the walk owns and updates it as it goes."""

    values: dict = field(default_factory=dict)  # (buffer data var, index) -> Z3 term of the value it holds
    ranges: dict = field(default_factory=dict)  # private array's data var -> (lo, hi) of every element (private_arrays)

    def remember(self, element, value) -> None:
        self.values[element] = value

    def forget_element(self, element) -> None:
        self.values.pop(element, None)

    def forget(self, data_vars) -> None:
        """Forget every element of the buffers of ``data_vars`` (one data var or a collection)."""
        if not isinstance(data_vars, (set, list, tuple)):
            data_vars = {data_vars}
        for key in [k for k in self.values if any(k[0].same_as(d) for d in data_vars)]:
            del self.values[key]

    def snapshot(self) -> dict:
        return dict(self.values)

    def restore(self, snapshot: dict) -> dict:
        """Go back to ``snapshot`` (e.g. before an ``if``'s other branch); the values it replaces."""
        replaced, self.values = self.values, dict(snapshot)
        return replaced

    def set_ranges(self, ranges: dict) -> None:
        self.ranges = ranges


def _iadd(a, b):
    return None if a is None or b is None else a + b


def _imul_range(a: _Enc, b: _Enc):
    if None in (a.lo, a.hi, b.lo, b.hi):
        return None, None
    prods = [a.lo * b.lo, a.lo * b.hi, a.hi * b.lo, a.hi * b.hi]
    return min(prods), max(prods)


@dataclass
class Encoder:
    """TIR -> Z3 for one kernel: variables, their ranges, and the solver that answers queries.

    ``rlimit`` is the per-query budget in Z3 resource units (deterministic).
    """

    rlimit: int = DEFAULT_RLIMIT
    ctx: Any = field(default_factory=z3.Context)

    def __post_init__(self):
        self.solver = self._new_solver()
        self._vars: dict[Any, _Enc] = {}
        self._names: dict[str, int] = {}
        self._facts: list = []
        self._obligations: list[Obligation] = []
        self._fresh = 0
        self.memory = MemoryFacts()  # what the caller knows of private memory (see know())
        # fresh variable name -> (load text "ids[i]", buffer scope), or (call text, "call") for an unmodelled call
        self.opaque_loads: dict[str, tuple[str, str]] = {}
        self.threads: dict[str, tuple[Any, Any]] = {}  # "threadIdx.x" -> (its term, its launch extent's term)
        self.definitions: dict[str, Any] = {}  # bound variable's term name -> the term bound to it (a ``Bind``)
        self.read_only: set = set()  # data vars of inputs the function never writes (see know())
        self._read_only_loads: dict = {}  # (data var, simplified index terms) -> the value loaded there
        # Counters (see know()): data var -> (start, [(step, [loop extents]), ...]).
        self.counters: dict = {}
        self.queries = 0
        self.rlimit_used = 0

    # ----- variables -------------------------------------------------------------
    def _unique(self, name: str) -> str:
        n = self._names.get(name, 0)
        self._names[name] = n + 1
        return name if n == 0 else f"{name}#{n}"

    def know(self, facts: FunctionFacts, memory: MemoryFacts) -> None:
        """Use what the code of the device function about to be encoded says (tlx.ir.facts), and
        what the caller's walk knows of private memory, which loads then read and extend."""
        self.read_only = facts.read_only
        self.counters = facts.counters
        self.memory = memory

    def bind(self, v, to) -> None:
        """Encode TIR variable ``v`` as the same term as ``to`` (a device parameter that is a shape variable)."""
        self._vars[v] = self._var(to)

    def launch(self, tag: str, term, extent) -> None:
        """Record a launched thread index (``threadIdx.x`` / ``y`` / ``z``) and its extent's term
        (None: not known), from which TileLang's lane / warp / warpgroup intrinsics are encoded."""
        self.threads[tag] = (term, extent)

    def define(self, v, term) -> None:
        """Record that TIR variable ``v`` is bound to ``term`` (a ``Bind``), so that the
        loads behind the variable are found by :meth:`loaded_values`."""
        self.definitions[str(self.var(v))] = term

    def var(self, v) -> Any:
        """The Z3 term of TIR variable ``v`` (registered on first use with its dtype's range)."""
        return self._var(v).term

    def _var(self, v) -> _Enc:
        e = self._vars.get(v)
        if e is not None:
            return e
        kind, _, _ = scalar_dtype(v.dtype)
        name = self._unique(v.name)
        if kind == "bool":
            e = _Enc(z3.Bool(name, self.ctx), None, None)
        else:
            e = self._ranged_int(name, v.dtype)
        self._vars[v] = e
        return e

    def _ranged_int(self, name: str, dtype) -> _Enc:
        term = z3.Int(name, self.ctx)
        rng = dtype_range(dtype)
        if rng is None:
            return _Enc(term, None, None)
        self._facts.append(term >= rng[0])
        self._facts.append(term <= rng[1])
        return _Enc(term, rng[0], rng[1])

    def fresh(self, dtype="int64", hint: str = "opaque") -> Any:
        """A new unconstrained value of ``dtype``: the sound stand-in for anything not modelled."""
        self._fresh += 1
        name = f"{hint}!{self._fresh}"
        if scalar_dtype(dtype)[0] == "bool":
            return z3.Bool(name, self.ctx)
        return self._ranged_int(name, dtype).term

    def range_facts(self, v, lo, extent) -> list:
        """``lo <= v < lo + extent`` as Z3 facts without registering them globally (scoped ranges)."""
        t = self.var(v)
        return [t >= self.encode(lo), t < self.encode(lo) + self.encode(extent)]

    def add_fact(self, fact) -> None:
        """A fact true everywhere in the kernel (shape-variable assumptions, launch facts)."""
        self._facts.append(fact)

    @property
    def facts(self) -> list:
        return list(self._facts)

    def names(self) -> dict[str, Any]:
        """Registered variable name -> Z3 term (for counterexamples)."""
        return {str(e.term): e.term for e in self._vars.values()}

    # ----- constants and helpers -----------------------------------------------
    def int_val(self, v: int):
        return z3.IntVal(int(v), self.ctx)

    def true(self):
        return z3.BoolVal(True, self.ctx)

    def take_obligations(self) -> list[Obligation]:
        """The width obligations produced since the last call, emptied."""
        obs, self._obligations = self._obligations, []
        return obs

    def _oblige(self, node, e: _Enc, dtype) -> _Enc:
        rng = dtype_range(dtype)
        if rng is None:
            return e
        lo, hi = rng
        if e.lo is not None and e.hi is not None and lo <= e.lo and e.hi <= hi:
            return e
        self._obligations.append(Obligation(e.term, lo, hi, str(dtype), node))
        # Past the check the value is known to lie in range, which tightens the interval.
        return _Enc(e.term, max(lo, e.lo) if e.lo is not None else lo, min(hi, e.hi) if e.hi is not None else hi)

    # ----- encoding -------------------------------------------------------------
    def encode(self, expr, env: dict | None = None, lane=None):
        """The Z3 term of TIR expression ``expr`` (Int for integers, Bool for booleans).

        ``env`` maps TIR variables to Z3 terms that override their registered meaning;
        ``lane`` is the Z3 term of the vector lane when ``expr`` is a vector expression
        (``Ramp(b, s, n)`` encodes as ``b + lane * s``).
        """
        return self._enc(expr, env or {}, lane).term

    def encode_bool(self, expr, env: dict | None = None, lane=None):
        t = self.encode(expr, env, lane)
        if z3.is_bool(t):
            return t
        return t != 0

    def _enc(self, expr, env: dict | None = None, lane=None) -> _Enc:
        env = env or {}
        if isinstance(expr, bool):
            return _Enc(z3.BoolVal(expr, self.ctx), None, None)
        if isinstance(expr, int):
            return _Enc(self.int_val(expr), expr, expr)
        if isinstance(expr, tir.IntImm):
            if scalar_dtype(expr.dtype)[0] == "bool":
                return _Enc(z3.BoolVal(bool(expr.value), self.ctx), None, None)
            return _Enc(self.int_val(expr.value), int(expr.value), int(expr.value))
        if isinstance(expr, tir.Var):
            if expr in env:
                t = env[expr]
                return t if isinstance(t, _Enc) else _Enc(t, None, None)
            return self._var(expr)
        method = getattr(self, "_enc_" + type(expr).__name__, None)
        if method is None:
            return self._opaque(expr)
        return method(expr, env, lane)

    def _opaque(self, expr) -> _Enc:
        dtype = getattr(expr, "dtype", "int64")
        kind, bits, _ = scalar_dtype(dtype)
        if kind in ("int", "uint"):
            e = self._ranged_int(self._fresh_name(type(expr).__name__), f"{kind}{bits}")
            if isinstance(expr, tir.Call):  # found by loaded_values like a load: a counterexample may not choose it
                self.opaque_loads[str(e.term)] = (str(expr), "call")
            return e
        if kind == "bool":
            return _Enc(self.fresh("bool", type(expr).__name__), None, None)
        return _Enc(self.fresh("int64", type(expr).__name__), None, None)

    def _fresh_name(self, hint: str) -> str:
        self._fresh += 1
        return f"{hint}!{self._fresh}"

    def _bin(self, expr, env, lane):
        return self._enc(expr.a, env, lane), self._enc(expr.b, env, lane)

    def _int_result(self, expr, term, lo, hi) -> _Enc:
        return self._oblige(expr, _Enc(term, lo, hi), scalar_dtype(expr.dtype)[0] + str(scalar_dtype(expr.dtype)[1]))

    def _enc_Add(self, expr, env, lane):
        a, b = self._bin(expr, env, lane)
        return self._int_result(expr, a.term + b.term, _iadd(a.lo, b.lo), _iadd(a.hi, b.hi))

    def _enc_Sub(self, expr, env, lane):
        a, b = self._bin(expr, env, lane)
        lo = None if a.lo is None or b.hi is None else a.lo - b.hi
        hi = None if a.hi is None or b.lo is None else a.hi - b.lo
        return self._int_result(expr, a.term - b.term, lo, hi)

    def _enc_Mul(self, expr, env, lane):
        a, b = self._bin(expr, env, lane)
        lo, hi = _imul_range(a, b)
        return self._int_result(expr, a.term * b.term, lo, hi)

    def _floordiv(self, a: _Enc, b: _Enc):
        """floor(a / b) with TVM semantics; division by zero yields an unconstrained value."""
        if b.lo is not None and b.lo == b.hi:
            c = b.lo
            if c > 0:
                q = a.term / c  # SMT-LIB div is Euclidean = floor for a positive divisor
                lo = None if a.lo is None else a.lo // c
                hi = None if a.hi is None else a.hi // c
                return q, lo, hi
            if c < 0:
                return (-a.term) / (-c), None, None
        q = z3.If(b.term > 0, a.term / b.term, z3.If(b.term < 0, (-a.term) / (-b.term), self.fresh("int64", "div0")))
        return q, None, None

    def _enc_FloorDiv(self, expr, env, lane):
        a, b = self._bin(expr, env, lane)
        q, lo, hi = self._floordiv(a, b)
        return self._int_result(expr, q, lo, hi)

    def _enc_FloorMod(self, expr, env, lane):
        a, b = self._bin(expr, env, lane)
        if b.lo is not None and b.lo == b.hi and b.lo > 0:
            lo, hi = 0, b.lo - 1
            if a.lo is not None and a.hi is not None and 0 <= a.lo and a.hi < b.lo:
                return _Enc(a.term, a.lo, a.hi)
            return _Enc(a.term % b.lo, lo, hi)
        q, _, _ = self._floordiv(a, b)
        return self._int_result(expr, a.term - b.term * q, None, None)

    def _truncdiv(self, a: _Enc, b: _Enc):
        if a.lo is not None and a.lo >= 0 and b.lo is not None and b.lo > 0:
            return self._floordiv(a, b)[0]
        abs_a = z3.If(a.term >= 0, a.term, -a.term)
        abs_b = z3.If(b.term >= 0, b.term, -b.term)
        q = abs_a / abs_b
        same_sign = (a.term >= 0) == (b.term > 0)
        return z3.If(b.term == 0, self.fresh("int64", "div0"), z3.If(same_sign, q, -q))

    def _enc_Div(self, expr, env, lane):
        kind = scalar_dtype(expr.dtype)[0]
        if kind not in ("int", "uint"):
            return self._opaque(expr)
        a, b = self._bin(expr, env, lane)
        return self._int_result(expr, self._truncdiv(a, b), None, None)

    def _enc_Mod(self, expr, env, lane):
        kind = scalar_dtype(expr.dtype)[0]
        if kind not in ("int", "uint"):
            return self._opaque(expr)
        a, b = self._bin(expr, env, lane)
        return self._int_result(expr, a.term - b.term * self._truncdiv(a, b), None, None)

    def _enc_Min(self, expr, env, lane):
        a, b = self._bin(expr, env, lane)
        lo = None if a.lo is None or b.lo is None else min(a.lo, b.lo)
        hi = b.hi if a.hi is None else a.hi if b.hi is None else min(a.hi, b.hi)
        return _Enc(z3.If(a.term <= b.term, a.term, b.term), lo, hi)

    def _enc_Max(self, expr, env, lane):
        a, b = self._bin(expr, env, lane)
        hi = None if a.hi is None or b.hi is None else max(a.hi, b.hi)
        lo = b.lo if a.lo is None else a.lo if b.lo is None else max(a.lo, b.lo)
        return _Enc(z3.If(a.term >= b.term, a.term, b.term), lo, hi)

    def _cmp(op):
        def enc(self, expr, env, lane):
            a, b = self._bin(expr, env, lane)
            return _Enc(op(a.term, b.term), None, None)

        return enc

    _enc_EQ = _cmp(lambda a, b: a == b)
    _enc_NE = _cmp(lambda a, b: a != b)
    _enc_LT = _cmp(lambda a, b: a < b)
    _enc_LE = _cmp(lambda a, b: a <= b)
    _enc_GT = _cmp(lambda a, b: a > b)
    _enc_GE = _cmp(lambda a, b: a >= b)
    del _cmp

    def _as_bool(self, e: _Enc):
        return e.term if z3.is_bool(e.term) else e.term != 0

    def _enc_And(self, expr, env, lane):
        a, b = self._bin(expr, env, lane)
        return _Enc(z3.And(self._as_bool(a), self._as_bool(b)), None, None)

    def _enc_Or(self, expr, env, lane):
        a, b = self._bin(expr, env, lane)
        return _Enc(z3.Or(self._as_bool(a), self._as_bool(b)), None, None)

    def _enc_Not(self, expr, env, lane):
        return _Enc(z3.Not(self._as_bool(self._enc(expr.a, env, lane))), None, None)

    def _branch(self, expr, taken, env, lane) -> _Enc:
        """``expr`` evaluated only where ``taken`` holds: its new obligations are conditioned on it."""
        before = len(self._obligations)
        e = self._enc(expr, env, lane)
        for i in range(before, len(self._obligations)):
            o = self._obligations[i]
            self._obligations[i] = Obligation(o.term, o.lo, o.hi, o.dtype, o.node,
                                              taken if o.when is None else z3.And(taken, o.when))
        return e

    def _select(self, cond, a: _Enc, b: _Enc) -> _Enc:
        if z3.is_bool(a.term) != z3.is_bool(b.term):
            return _Enc(self.fresh("int64", "select"), None, None)
        lo = None if a.lo is None or b.lo is None else min(a.lo, b.lo)
        hi = None if a.hi is None or b.hi is None else max(a.hi, b.hi)
        return _Enc(z3.If(cond, a.term, b.term), lo, hi)

    def _enc_Select(self, expr, env, lane):
        c = self._as_bool(self._enc(expr.condition, env, lane))
        return self._select(c, self._enc(expr.true_value, env, lane), self._enc(expr.false_value, env, lane))

    def _enc_Let(self, expr, env, lane):
        inner = dict(env)
        inner[expr.var] = self._enc(expr.value, env, lane)
        return self._enc(expr.body, inner, lane)

    def _enc_BufferLoad(self, expr, env, lane):
        """A load is opaque unless the caller recorded the value (a thread-private scalar)."""
        idx = expr.indices
        if len(idx) == 1 and isinstance(idx[0], tir.IntImm):
            t = self.memory.values.get((expr.buffer.data, int(idx[0].value)))
            if t is not None:
                return t if isinstance(t, _Enc) else _Enc(t, None, None)
        key = element = None
        if expr.buffer.data in self.read_only or _private_int_element(expr):
            # An element of a read-only input holds one value, and so does an element of a private
            # array until the next store to the array (which forgets it): a guard's load and an
            # index's load of the same element (even written with other casts) are one term. The
            # index arithmetic's own width obligations belong to the load's own access check.
            pending = self.take_obligations()
            index = tuple(z3.simplify(self._enc(i, env, lane).term).sexpr() for i in idx)
            self._obligations = pending
            if expr.buffer.data in self.read_only:
                key = (expr.buffer.data, index)
                if key in self._read_only_loads:
                    return self._read_only_loads[key]
            else:
                element = (expr.buffer.data, index)
                if element in self.memory.values:
                    return self.memory.values[element]
        e = self.opaque_load(expr)
        rng = self.memory.ranges.get(expr.buffer.data)
        if rng is not None:
            self._facts += [e.term >= rng[0], e.term <= rng[1]]
        if expr.buffer.data in self.counters:
            self._bound_counter(e.term, *self.counters[expr.buffer.data])
        if key is not None:
            self._read_only_loads[key] = e
        elif element is not None:
            self.memory.remember(element, e)
        elif _private_int_scalar(expr):
            # Unknown but fixed until the next store (which the verifier tracks or forgets): every
            # load until then is this one value, e.g. a while loop's condition and its body's.
            self.memory.remember((expr.buffer.data, int(idx[0].value)), e)
        return e

    def opaque_load(self, load) -> _Enc:
        """A fresh value for what ``load`` reads, named after it in counterexamples (a value the
        verifier does not track)."""
        e = self._opaque(load)
        text = f"{load.buffer.name}[{', '.join(str(i) for i in load.indices)}]"
        self.opaque_loads[str(e.term)] = (text, str(load.buffer.scope()))
        return e

    def _bound_counter(self, term, start, sites) -> None:
        """A counter holds at least its start and, when every increment's loops have trip counts
        (``extents`` not None), at most its start plus each increment's step times the trip count
        of the loops around it. The loop extents' own width obligations join the current
        expression's, so the bound is used only where they are proven."""
        self._facts.append(term >= start)
        if any(extents is None for _, extents in sites):
            return
        total = self.int_val(start)
        for step, extents in sites:
            trips = self.int_val(step)
            for ext in extents:
                t = self._enc(ext).term
                trips = trips * z3.If(t > 0, t, 0)
            total = total + trips
        self._facts.append(term <= total)

    def _enc_Ramp(self, expr, env, lane):
        base, stride = self._enc(expr.base, env), self._enc(expr.stride, env)
        if lane is None:
            return self._opaque(expr)
        return _Enc(base.term + lane * stride.term, None, None)

    def _enc_Broadcast(self, expr, env, lane):
        return self._enc(expr.value, env, None)

    def _enc_Cast(self, expr, env, lane):
        src_kind = scalar_dtype(expr.value.dtype)[0]
        dst_kind, dst_bits, _ = scalar_dtype(expr.dtype)
        if src_kind not in ("int", "uint", "bool") or dst_kind not in ("int", "uint", "bool"):
            return self._opaque(expr)
        v = self._enc(expr.value, env, lane)
        if dst_kind == "bool":
            return _Enc(self._as_bool(v), None, None)
        if z3.is_bool(v.term):
            return _Enc(z3.If(v.term, self.int_val(1), self.int_val(0)), 0, 1)
        return self._oblige(expr, v, f"{dst_kind}{dst_bits}")

    def _enc_Call(self, expr, env, lane):
        name = op_name(expr)
        args = expr.args
        if name == "tirx.if_then_else":
            # Lazy (a C conditional): a branch's width obligations hold only where it is taken.
            c = self._as_bool(self._enc(args[0], env, lane))
            a = self._branch(args[1], c, env, lane)
            b = self._branch(args[2], z3.Not(c), env, lane)
            return self._select(c, a, b)
        if name == "tirx.likely":
            return self._enc(args[0], env, lane)
        if name in _LANE_MASKS:  # a warp's 32-lane mask, which CUDA's codegen widens to the op's uint64
            return self._ranged_int(self._fresh_name("lane_mask"), "uint32")
        if name in _THREAD_INTRINSICS:
            e = self._thread_intrinsic(name, args)
            if e is not None:
                return e
        kind, bits, _ = scalar_dtype(expr.dtype)
        if kind in ("int", "uint") and name in _BITWISE:
            return self._bitwise(name, expr, [self._enc(a, env, lane) for a in args], kind, bits)
        return self._opaque(expr)

    def _thread_intrinsic(self, name: str, args) -> _Enc | None:
        """``tl.get_lane_idx`` / ``get_warp_idx(_sync)`` / ``get_warp_group_idx`` as TileLang's
        CUDA helpers compute them (``tl_templates/cuda/intrin.h``): the block-linear thread id
        ``x + X * (y + Y * z)`` modulo / divided by the warp size (32 unless a positive constant is
        given) or by warp size times warps per group (4 unless given). None where a size is not a
        constant or a launched dimension's extent is unknown (the call stays opaque)."""
        sizes = []
        for a, default in zip(args, (32, 4)):
            if not isinstance(a, tir.IntImm):
                return None
            sizes.append(int(a.value) if int(a.value) > 0 else default)
        warp = sizes[0] if sizes else 32
        divisor = warp * (sizes[1] if len(sizes) > 1 else 4) if name == "tl.get_warp_group_idx" else warp
        linear, scale = self.int_val(0), self.int_val(1)
        for tag in ("threadIdx.x", "threadIdx.y", "threadIdx.z"):
            if tag not in self.threads:
                continue  # not launched: index 0, extent 1
            term, extent = self.threads[tag]
            if extent is None:
                return None
            linear, scale = linear + scale * term, scale * extent
        if name == "tl.get_lane_idx":
            return _Enc(linear % divisor, 0, divisor - 1)  # SMT-LIB mod: in [0, divisor) for a positive divisor
        return _Enc(linear / divisor, 0, None)

    def _bitwise(self, name, expr, ops: list[_Enc], kind: str, bits: int) -> _Enc:
        signed = kind == "int"
        if name == "tirx.shift_left" and ops[1].lo is not None and ops[1].lo == ops[1].hi and 0 <= ops[1].lo < bits:
            k = 1 << ops[1].lo
            lo, hi = _imul_range(ops[0], _Enc(None, k, k))
            return self._int_result(expr, ops[0].term * k, lo, hi)
        if name == "tirx.shift_right" and ops[1].lo is not None and ops[1].lo == ops[1].hi and 0 <= ops[1].lo < bits:
            q, lo, hi = self._floordiv(ops[0], _Enc(self.int_val(1 << ops[1].lo), 1 << ops[1].lo, 1 << ops[1].lo))
            return _Enc(q, lo, hi)
        bvs = [z3.Int2BV(o.term, bits) for o in ops]
        if name == "tirx.bitwise_and":
            r = bvs[0] & bvs[1]
        elif name == "tirx.bitwise_or":
            r = bvs[0] | bvs[1]
        elif name == "tirx.bitwise_xor":
            r = bvs[0] ^ bvs[1]
        elif name == "tirx.bitwise_not":
            r = ~bvs[0]
        elif name == "tirx.shift_left":
            r = bvs[0] << bvs[1]
        else:
            r = z3.LShR(bvs[0], bvs[1]) if not signed else bvs[0] >> bvs[1]
        rng = dtype_range(f"{kind}{bits}")
        # Operands wrap into the bit-vector width, so their own range must be checked too.
        for o in ops:
            self._oblige(expr, o, f"{kind}{bits}")
        return _Enc(z3.BV2Int(r, is_signed=signed), rng[0], rng[1])

    # ----- queries --------------------------------------------------------------
    def check(self, formulas: list) -> Verdict:
        """Is the conjunction of ``formulas`` (plus the kernel-wide facts) satisfiable?

        ``"violation"`` here means satisfiable (with a model); ``"proven"`` means unsat.
        """
        s = self.solver
        s.push()
        try:
            r, used = self._solve(s, formulas)
            self.queries += 1
            if r == z3.unknown:
                # the shared solver's state depends on the queries before this one; a solver of
                # this query alone (with no scopes Z3 also picks its non-incremental QF_NIA
                # tactics) gives it a second chance that no earlier query can spoil
                s = self._new_solver()
                r, more = self._solve(s, formulas)
                used += more
            self.rlimit_used += max(used, 0)
            if r == z3.unsat:
                return Verdict("proven", rlimit_used=used)
            if r == z3.sat:
                return Verdict("violation", s.model(), rlimit_used=used, formulas=list(formulas))
            return Verdict("unknown", reason=s.reason_unknown(), rlimit_used=used)
        finally:
            self.solver.pop()

    def _new_solver(self):
        s = z3.Solver(ctx=self.ctx)
        s.set("random_seed", 7)
        return s

    def _solve(self, s, formulas: list):
        """(result, rlimit used) of the kernel facts and ``formulas`` added to solver ``s`` under
        the per-query budget (the count is the context's, shared by its solvers: taken from before)."""
        s.set("rlimit", self.rlimit)
        s.add(*self._facts)
        s.add(*formulas)
        before = _rlimit_count(s)
        r = s.check()
        return r, _rlimit_count(s) - before

    def prove(self, goal, context: list | None = None) -> Verdict:
        """Does ``goal`` hold for every assignment satisfying ``context`` and the kernel facts?"""
        return self.check(list(context or []) + [z3.Not(goal)])

    def prove_obligations(self, obligations: list[Obligation], context: list | None = None):
        """Prove every obligation at once; on failure return the first one the model breaks."""
        if not obligations:
            return Verdict("proven"), None
        bad = z3.Or([o.broken() for o in obligations])
        v = self.check(list(context or []) + [bad])
        if v.status != "violation":
            return v, None
        for o in obligations:
            if z3.is_true(v.model.eval(o.broken(), model_completion=True)):
                return v, o
        return v, obligations[0]

    def minimize(self, term, formulas: list, lo: int = -(1 << 63)) -> int | None:
        """The least value of Int ``term`` over the solutions of ``formulas`` (None if there is none).

        Binary search with the ordinary solver (Z3's optimizer is far slower on these
        nonlinear formulas); a query over budget counts as satisfiable, so the answer
        can only be too small, never too large.
        """
        v = self.check(list(formulas))
        if v.status != "violation":
            return None
        hi = self.model_value(v.model, term)
        # Models tend to sit at or near the minimum: first ask whether anything lies below.
        for _ in range(8):
            r = self.check(list(formulas) + [term < hi])
            if r.status == "proven":
                return hi
            if r.status != "violation":
                break
            hi = self.model_value(r.model, term)
        while lo < hi:
            mid = (lo + hi) // 2
            r = self.check(list(formulas) + [term <= mid])
            if r.status == "proven":
                lo = mid + 1
            elif r.status == "violation":
                hi = min(mid, self.model_value(r.model, term))
            else:
                hi = mid
        return hi

    def loaded_values(self, model, terms, facts=(), fixed=()) -> dict[str, tuple[int, str]]:
        """Values the model gives to the memory loads that ``terms`` depend on ("ids[i]" -> (70, "global")),
        also through bound variables (``end = cu[b + 1]`` then ``X[end - 1]``) and through the
        ``facts`` that constrain their variables: ``j < n`` with ``n = counts[b]`` makes an index
        ``j`` depend on ``counts[b]`` (a loop over a loaded count). ``fixed`` terms (shape
        variables, which a counterexample chooses) link nothing: a load constrained only through
        them does not decide the index's values once the shape is chosen."""
        stop = {str(t) for t in fixed}
        linked: dict[str, list[dict]] = {}  # variable -> the variables of each fact it appears in
        for fact in facts:
            names = _constants(fact)
            for name in names.keys() - stop:
                linked.setdefault(name, []).append(names)
        out: dict[str, tuple[int, str]] = {}
        reached: set = set()
        pending = [_constants(t) for t in terms]
        while pending:
            for name, const in pending.pop().items():
                if name in reached:
                    continue
                reached.add(name)
                desc = self.opaque_loads.get(name)
                v = self.model_value(model, const) if desc else None
                if desc and v is not None:
                    out[desc[0]] = (int(v), desc[1])
                if name in self.definitions:
                    pending.append(_constants(self.definitions[name]))
                if name not in stop:
                    pending.extend(linked.get(name, ()))
        return out

    def model_value(self, model, term) -> int | bool | None:
        val = model.eval(term, model_completion=True)
        if z3.is_int_value(val):
            return val.as_long()
        if z3.is_true(val):
            return True
        if z3.is_false(val):
            return False
        return None


# TileLang's warp votes that return a lane mask: on CUDA (the only target tlx compiles for) the
# mask of a 32-lane warp, never above 2^32 - 1
_LANE_MASKS = frozenset({"tl.ballot_sync", "tl.ballot", "tl.activemask"})
# TileLang's thread-position intrinsics, encoded from the launched thread indices
_THREAD_INTRINSICS = frozenset({"tl.get_lane_idx", "tl.get_warp_idx", "tl.get_warp_idx_sync", "tl.get_warp_group_idx"})
_BITWISE = {
    "tirx.shift_left",
    "tirx.shift_right",
    "tirx.bitwise_and",
    "tirx.bitwise_or",
    "tirx.bitwise_xor",
    "tirx.bitwise_not",
}


def _constants(term) -> dict[str, Any]:
    """The uninterpreted constants (variables) in ``term``, by name."""
    out, seen, stack = {}, set(), [term]
    while stack:
        t = stack.pop()
        if t.get_id() in seen:
            continue
        seen.add(t.get_id())
        if z3.is_const(t) and t.decl().kind() == z3.Z3_OP_UNINTERPRETED:
            out[t.decl().name()] = t
        stack.extend(t.children())
    return out


def _rlimit_count(solver) -> int:
    st = solver.statistics()
    for k in st.keys():
        if k == "rlimit count":
            return int(st.get_key_value(k))
    return 0


# ----- a kernel's shape variables -------------------------------------------------


def shape_setup(enc: Encoder, kernel, assume: tuple[str, ...] | list[str], extra: list):
    """Register shape variables (tensor dimensions >= 0; scalar parameters only their dtype's
    range, as the launcher guarantees nothing more), the user's assumptions and extra TIR
    conditions."""
    variables = shape_vars(kernel.prim_func)
    dims = dimension_vars(kernel.prim_func)
    terms = {}
    strides = stride_vars(kernel.prim_func)
    for name, v in variables.items():
        t = enc.var(v)
        if name in dims or name in strides:  # the launcher binds both from the tensors, >= 0
            enc.add_fact(t >= 0)
        terms[name] = t
    for buf in kernel.prim_func.buffer_map.values():
        enc.add_fact(tensor_size_fact(enc, buf))
    for text in assume:
        cond = parse_assumption(text, variables)
        enc.add_fact(enc.encode_bool(cond))
        enc.take_obligations()
    for cond in extra:
        enc.add_fact(enc.encode_bool(cond))
        enc.take_obligations()
    return variables, terms


INT64_MAX = (1 << 63) - 1


def tensor_size_fact(enc: Encoder, buf):
    """Every tensor argument exists: its element count is an int64 (torch's ``numel``, DLPack's
    shape), and a compact one (no declared strides: the launcher checks row-major strides) spans
    ``numel * element bytes`` of allocated memory, which torch also keeps <= INT64_MAX. So no
    shape makes a tensor larger than that, however large each dimension may be alone (a
    dimension of 0 leaves the others free). A strided one holds at least its view's span
    (``allocation_elements``), which fits in memory the same way. The dimensions and strides are
    the launcher's host values, so their arithmetic is not device arithmetic: no width
    obligations."""
    enc.take_obligations()
    numel = enc.int_val(1)
    for dim in buf.shape:
        numel = numel * enc.encode(dim)
    eb = elem_bytes(buf.dtype)
    if row_major(buf):
        fact = numel <= INT64_MAX // eb
    else:
        fact = z3.And(numel <= INT64_MAX, enc.encode(allocation_elements(buf)) <= INT64_MAX // eb)
    enc.take_obligations()
    return fact


def allocation_elements(buf):
    """The elements of memory a tensor argument ``buf`` (a declared buffer) is known to hold, as
    TIR: its shape's product when it is row-major (the launcher checks those strides), else the
    span of its strided view, ``1 + sum((shape_i - 1) * stride_i)`` (0 when a dimension is 0;
    the launcher binds or checks every stride, each >= 0): what every tensor of that shape and
    those strides holds, and no more, however its rows are padded or overlap."""
    if row_major(buf):
        size = 1
        for dim in buf.shape:
            size = size * dim
        return size
    span, empty = tir.IntImm("int64", 1), tir.const(False, "bool")
    for dim, stride in zip(buf.shape, buf.strides, strict=True):
        span = span + (tir.Cast("int64", dim) - 1) * tir.Cast("int64", stride)
        empty = tir.Or(empty, tir.EQ(dim, tir.IntImm(dim.dtype, 0)))
    return tir.Select(empty, tir.IntImm("int64", 0), span)


def row_major(buf) -> bool:
    """No strides declared, or exactly the row-major ones (TileLang declares them): the launcher
    checks them, so the tensor's elements are one dense block of memory."""
    expected, analyzer = tir.IntImm("int64", 1), tvm.arith.Analyzer()
    for dim, stride in reversed(list(zip(buf.shape, buf.strides or buf.shape, strict=True))):
        if buf.strides and not analyzer.can_prove_equal(stride, expected):
            return False
        expected = expected * dim
    return True


def bind_params(enc: Encoder, f, variables):
    """Device parameters are the user's shape variables (lowering may rename ``T`` to ``T_1``)."""
    for p in f.params:
        if not str(p.dtype).startswith(("int", "uint")):
            continue
        name = p.name if p.name in variables else user_name(p.name)
        if name in variables:
            enc.bind(p, variables[name])


def kernel_encoder(kernel, assume=()) -> Encoder:
    """One encoder for ``kernel`` with its shape variables (>= 0, the user's ``assume`` strings)
    registered the way the bounds verifier does, device parameters bound to them."""
    enc = Encoder()
    variables, _ = shape_setup(enc, kernel, tuple(assume), [])
    for _, fn in kernel.device_mod.functions.items():
        if isinstance(fn, tvm.tirx.PrimFunc):
            bind_params(enc, fn, variables)
    return enc


def context_facts(enc: Encoder, prog, acc) -> list:
    """Ranges of blocks and the loops around ``acc`` (shared by all lanes of a warp)."""
    facts = []
    for v, ext in prog.blocks:
        facts += enc.range_facts(v, 0, ext)
    for v, lo, ext in acc.loops:
        facts += enc.range_facts(v, lo, ext)
    return facts
