"""Bijectivity of every Layout and Fragment a kernel uses, proven with Z3 (no enumeration cap).

A ``Layout`` maps a buffer's logical index to its physical index: it must be injective
(two elements never share a physical slot), stay inside its output shape, and, when it
is meant to be a permutation, reach every slot. A ``Fragment`` maps a tile element (and
its replica number) to a (thread, register) pair; the same three properties apply to
that map. Each property is one Z3 query over the whole domain, so there is no size limit:

* range: is some input mapped outside the output shape? (witness: the input)
* injective: ``f(x) = f(y)`` with ``x != y``? (witness: the colliding pair)
* onto: once injective and in range, onto holds exactly when the domain and the
  codomain have the same size (pigeonhole); otherwise a Z3 search for an unreached
  slot gives a witness when it can.

A fragment whose layout's domain differs from its declared shape is wrong only if the kernel
reaches an element outside the domain (such an element has no register): every access in the IR
after LayoutInference is checked against the domain, with Z3 over the enclosing loops and branch
conditions. All inside is fine (a note names the declaration to fix); one proven outside is a
violation with the access; anything undecided is unknown.

XOR swizzles are cross-checked by an independent method: :func:`gf2_map` evaluates the
index expressions symbolically bit by bit (each output bit a GF(2) polynomial in the
input bits, additions with exact carries) and, when every output bit is affine, the
rank of the resulting matrix decides injectivity and onto-ness. The two methods must
agree; a disagreement is reported as an error, never resolved silently.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import z3

from tilelang import tvm
from tlx.ir.tir import const_int
from tlx.lowering import LoweredKernel
from tlx.passes import PassContext, TlxError, exit_status, raise_or_warn
from tlx.passes.smt import Encoder

tir = tvm.tirx

__all__ = ["LayoutError", "check_layout", "collect_layouts", "gf2_map", "gf2_rank", "layouts_report"]


class LayoutError(TlxError):
    """A layout was proven wrong (collision or out of range) under ``verify="error"``."""


@dataclass(frozen=True)
class UsedLayout:
    """One buffer's layout as annotated by TileLang's LayoutInference."""

    buffer: str
    scope: str
    dtype: str
    layout: Any
    shape: tuple = ()  # the buffer's shape (empty: not known, the coverage check is skipped)
    data: Any = None  # the buffer's data variable, to find its accesses (None: not known)

    @property
    def kind(self) -> str:
        return "fragment" if hasattr(self.layout, "forward_thread") else "layout"


def collect_layouts(kernel: LoweredKernel) -> list[UsedLayout]:
    """Every distinct (buffer, layout) pair in the ``layout_map`` annotations of the kernel."""
    if kernel.layout_mod is None:
        raise ValueError("kernel: expected a LoweredKernel from tlx.lowering.lower (layout_mod set), got layout_mod=None")
    found: dict[tuple[str, str], UsedLayout] = {}

    def visit(node):
        if isinstance(node, tir.SBlock) and node.annotations and "layout_map" in node.annotations:
            for buf, lay in node.annotations["layout_map"].items():
                key = (buf.name, str(lay))
                if key not in found:
                    found[key] = UsedLayout(buf.name, buf.scope(), str(buf.dtype), lay, tuple(buf.shape), buf.data)

    for _, fn in kernel.layout_mod.functions.items():
        if isinstance(fn, tir.PrimFunc):
            tir.stmt_functor.post_order_visit(fn.body, visit)
    return list(found.values())


# ----- the map as plain data ----------------------------------------------------------------


@dataclass
class _Map:
    """``inputs`` (var, extent) -> ``outputs`` (expr, extent); extents are TIR exprs or ints."""

    inputs: list[tuple[Any, Any]]
    outputs: list[tuple[Any, Any]]
    names: list[str]  # output component names, for witnesses


def _as_map(used: UsedLayout) -> _Map:
    lay = used.layout
    in_shape = list(lay.get_input_shape())
    fvars = list(lay.get_forward_vars())
    data_vars = fvars[len(fvars) - len(in_shape) :]
    inputs = list(zip(data_vars, in_shape, strict=True))
    index = list(lay.get_forward_index())
    out_shape = list(lay.get_output_shape())
    outputs = list(zip(index, out_shape, strict=True))
    names = [f"index[{k}]" for k in range(len(outputs))]
    if used.kind == "fragment":
        extra = fvars[: len(fvars) - len(in_shape)]
        rep = int(lay.replicate_size)
        if extra:
            inputs.insert(0, (extra[0], rep))
        elif rep != 1:
            raise ValueError(f"layout of {used.buffer}: replicate_size={rep} but no replica variable")
        outputs.insert(0, (lay.forward_thread, lay.get_thread_size()))
        names.insert(0, "thread")
    return _Map(inputs, outputs, names)


# ----- Z3 proof -------------------------------------------------------------------------------


def check_layout(used: UsedLayout, enc: Encoder | None = None) -> dict:
    """Prove range, injectivity and onto-ness of one layout; JSON-able verdict with witnesses."""
    enc = enc or Encoder()
    m = _as_map(used)
    split = _bit_split(m)
    ctx = enc.ctx
    xs = [z3.Int(f"{v.name}", ctx) for v, _ in split.inputs]
    ys = [z3.Int(f"{v.name}'", ctx) for v, _ in split.inputs]
    env_x = {v: x for (v, _), x in zip(split.inputs, xs, strict=True)}
    env_y = {v: y for (v, _), y in zip(split.inputs, ys, strict=True)}
    dom_x, dom_y = [], []
    for (_, ext), x, y in zip(split.inputs, xs, ys, strict=True):
        e = enc.encode(ext)
        dom_x += [x >= 0, x < e]
        dom_y += [y >= 0, y < e]
    dom_x += [enc.encode_bool(c, env_x) for c in split.constraints]
    dom_y += [enc.encode_bool(c, env_y) for c in split.constraints]
    dom = dom_x + dom_y
    fx = [enc.encode(o, env_x) for o, _ in split.outputs]
    fy = [enc.encode(o, env_y) for o, _ in split.outputs]
    ext_out = [enc.encode(e) for _, e in m.outputs]
    orig_x = [enc.encode(split.recon[v], env_x) for v, _ in m.inputs]
    orig_y = [enc.encode(split.recon[v], env_y) for v, _ in m.inputs]
    enc.take_obligations()  # layout arithmetic is exact integer math, not machine words
    result: dict[str, Any] = {
        "buffer": used.buffer,
        "scope": used.scope,
        "kind": used.kind,
        "input_shape": [str(e) for _, e in m.inputs],
        "output_shape": [str(e) for _, e in m.outputs],
    }
    if used.kind == "fragment":
        result["replicate"] = int(used.layout.replicate_size)
    uncovered = _uncovered(used)
    if uncovered:
        result["uncovered"] = uncovered

    def inputs_of(model, terms):
        return {str(v.name): enc.model_value(model, t) for (v, _), t in zip(m.inputs, terms, strict=True)}

    def outputs_of(model, terms):
        return {n: enc.model_value(model, t) for n, t in zip(m.names, terms, strict=True)}

    out_of_range = z3.Or([z3.Or(f < 0, f >= e) for f, e in zip(fx, ext_out, strict=True)])
    v = enc.check(dom_x + [out_of_range])
    result["in_range"] = v.status
    if v.status == "violation":
        result["range_witness"] = {"input": inputs_of(v.model, orig_x), "output": outputs_of(v.model, fx)}

    differ = z3.Or([x != y for x, y in zip(xs, ys, strict=True)])
    same = z3.And([a == b for a, b in zip(fx, fy, strict=True)])
    v = enc.check(dom + [differ, same])
    result["injective"] = v.status
    if v.status == "violation":
        result["collision"] = {"x": inputs_of(v.model, orig_x), "y": inputs_of(v.model, orig_y), "output": outputs_of(v.model, fx)}

    result["onto"] = _onto(enc, m.inputs, result, xs, dom_x, fx, ext_out, m.names)
    result["verdict"] = _verdict(result)
    result["gf2"] = _gf2_cross_check(m, result)
    return result


@dataclass
class _Split:
    """A map over the bits of its power-of-two inputs; ``recon`` rebuilds each original input."""

    inputs: list[tuple[Any, Any]]
    outputs: list[tuple[Any, Any]]
    recon: dict
    constraints: list


def _bit_split(m: _Map) -> _Split:
    """Substitute each power-of-two input by its bits and let TVM simplify the map.

    ``x // 8 % 2`` becomes the single bit ``x.b3``, so the division and modulo terms
    that make the integer problem hard for Z3 mostly vanish; the map is unchanged.
    Inputs whose extent is not a constant power of two stay whole.
    """
    extents = dict(m.inputs)
    outs, inputs, recon, constraints = bit_split([bits_to_arith(o, extents) for o, _ in m.outputs], m.inputs)
    return _Split(inputs, list(zip(outs, [e for _, e in m.outputs], strict=True)), recon, constraints)


def bit_split(exprs: list, ranges: list, tag: str = "", fresh: bool = False):
    """Rewrite ``exprs`` over ``ranges`` ((var, extent), each var in ``[0, extent)``) in bits.

    Every variable with a constant extent becomes ``sum(2^i * v.b_i)`` over new 0/1
    variables (plus the constraint ``< extent`` when the extent is not a power of two);
    the others stay (renamed when ``fresh``, so several independent copies can coexist
    in one solver). Returns ``(exprs, inputs, recon, constraints)``: the simplified
    expressions, the new variables with their extents, each old variable's expression
    in the new ones, and the boolean constraints the new variables must satisfy.
    """
    ana = tvm.arith.Analyzer()
    inputs, recon, constraints = [], {}, []
    for v, ext in ranges:
        n = const_int(ext)
        k = None if n is None or n < 1 else (n - 1).bit_length()
        if k is None:
            nv = tir.Var(f"{v.name}{tag}", v.dtype) if fresh else v
            inputs.append((nv, ext))
            recon[v] = nv
            if const_int(ext) is not None:
                ana.bind(nv, tvm.ir.Range(0, const_int(ext)))
            continue
        whole = tir.IntImm(v.dtype, 0)
        for i in range(k):
            b = tir.Var(f"{v.name}{tag}.b{i}", v.dtype)
            ana.bind(b, tvm.ir.Range(0, 2))
            inputs.append((b, 2))
            whole = whole + b * (1 << i)
        recon[v] = whole
        if n != 1 << k:
            constraints.append(whole < n)
    outs = [ana.simplify(ana.simplify(tir.stmt_functor.substitute(e, recon))) for e in exprs]
    return outs, inputs, recon, constraints



def bits_to_arith(expr, extents: dict):
    """Rewrite bitwise and/or/xor of bounded non-negative operands into div/mod arithmetic.

    ``a ^ b`` on k-bit values equals ``sum_i 2^i * ((a_i + b_i) % 2)`` with
    ``a_i = a // 2^i % 2``; and/or use ``(a_i + b_i) // 2`` and ``(a_i + b_i + 1) // 2``.
    The result is the same integer function in linear arithmetic with constant divisors,
    which Z3 decides far faster than the bit-vector round trip of ``int2bv``.
    Operands whose bounds cannot be shown non-negative and finite are left as they are.
    """
    ana = tvm.arith.Analyzer()
    for v, ext in extents.items():
        if const_int(ext) is not None:
            ana.bind(v, tvm.ir.Range(0, const_int(ext)))

    def rewrite(e):
        if not (isinstance(e, tir.Call) and hasattr(e.op, "name")):
            return None
        name = str(e.op.name)
        if name not in ("tirx.bitwise_xor", "tirx.bitwise_and", "tirx.bitwise_or"):
            return None
        a, b = e.args
        ba, bb = ana.const_int_bound(a), ana.const_int_bound(b)
        if ba.min_value < 0 or bb.min_value < 0 or max(ba.max_value, bb.max_value) >= 1 << 30:
            return None
        k = max(ba.max_value, bb.max_value).bit_length()
        total = tir.IntImm(e.dtype, 0)
        for i in range(k):
            ai = tir.floormod(tir.floordiv(a, 1 << i), 2)
            bi = tir.floormod(tir.floordiv(b, 1 << i), 2)
            if name == "tirx.bitwise_xor":
                bit = tir.floormod(ai + bi, 2)
            elif name == "tirx.bitwise_and":
                bit = tir.floordiv(ai + bi, 2)
            else:
                bit = tir.floordiv(ai + bi + 1, 2)
            total = total + bit * (1 << i)
        return total

    return tir.stmt_functor.ir_transform(tir.Evaluate(expr), None, rewrite, ["tirx.Call"]).value


def _onto(enc, inputs, result, xs, dom_x, fx, ext_out, names) -> str:
    """Onto by counting once injective and in range; a witness search otherwise.

    The domain is counted on the map's own ``inputs`` (var, extent): after the bit split an
    extent such as 192 is eight bits under a ``< 192`` constraint, and counting 2^8 would
    make an injective 192-row map look smaller than its range."""
    if result["injective"] != "proven" or result["in_range"] != "proven":
        return "unknown"
    size_in = 1
    for _, e in inputs:
        size_in = size_in * enc.encode(e)
    size_out = 1
    for e in ext_out:
        size_out = size_out * e
    v = enc.prove(size_in == size_out)
    if v.status == "proven":
        return "proven"
    if v.status == "unknown":
        return "unknown"
    # Sizes can differ: look for a slot no input reaches (a quantified query, so it may stay unknown).
    zs = [z3.Int(f"slot{k}", enc.ctx) for k in range(len(fx))]
    bound = [c for z, e in zip(zs, ext_out, strict=True) for c in (z >= 0, z < e)]
    reach = z3.And([f == z for f, z in zip(fx, zs, strict=True)])
    unreached = z3.ForAll(xs, z3.Implies(z3.And(dom_x), z3.Not(reach))) if xs else z3.Not(reach)
    w = enc.check(bound + [unreached])
    if w.status == "violation":
        result["unreached"] = {n: enc.model_value(w.model, z) for n, z in zip(names, zs, strict=True)}
        return "violation"
    return "unknown"


def _uncovered(used: UsedLayout) -> dict | None:
    """The layout's domain against the buffer's shape: a fragment's must be the whole buffer, a
    shared layout's its trailing dimensions (a pipelined buffer's stages share one layout).
    Returns the mismatch, or None. TileLang 0.1.15 can give a (128, 64) fragment the (64, 64)
    layout of a ``T.Parallel`` over part of it, and then only half the fragment exists."""
    if not used.shape:
        return None
    domain = list(used.layout.get_input_shape())
    shape = list(used.shape)
    rank_ok = len(domain) == len(shape) if used.kind == "fragment" else len(domain) <= len(shape)
    if rank_ok and all(_same_extent(a, b) for a, b in zip(domain, shape[len(shape) - len(domain):])):
        return None
    return {"layout": [str(e) for e in domain], "buffer": [str(e) for e in shape]}


def _same_extent(a, b) -> bool:
    if const_int(a) is not None or const_int(b) is not None:
        return const_int(a) == const_int(b)
    return bool(tvm.ir.structural_equal(a, b))


def _verdict(r: dict) -> str:
    """``bijective`` | ``injective`` (padding left unreached) | ``invalid`` | ``unknown``.

    A layout whose domain is not the buffer's shape is invalid unless :func:`_access_coverage`
    ran: then only an access proven to fall outside the layout makes it invalid, and one it
    could not decide makes it unknown."""
    if r["injective"] == "violation" or r["in_range"] == "violation":
        return "invalid"
    if "uncovered" in r and r.get("coverage", {"status": "violation"})["status"] == "violation":
        return "invalid"
    if "uncovered" in r:
        return "unknown"
    if r["injective"] == "proven" and r["in_range"] == "proven":
        return "bijective" if r["onto"] == "proven" else "injective" if r["onto"] == "violation" else "unknown"
    return "unknown"


# ----- GF(2) cross-check ----------------------------------------------------------------------

_MAX_MONOMIALS = 512
_MAX_BITS = 48

# A bit is a GF(2) polynomial: a frozenset of monomials, each a frozenset of input-bit ids
# (the empty monomial is the constant 1). A value is a list of bits, least significant first.
_ONE = frozenset([frozenset()])
_ZERO = frozenset()


class _NotLinear(Exception):
    """The expression leaves the power-of-two bit algebra this evaluator models."""


def _pmul(a, b):
    out: set = set()
    for ma in a:
        for mb in b:
            out ^= {ma | mb}
    if len(out) > _MAX_MONOMIALS:
        raise _NotLinear("polynomial too large")
    return frozenset(out)


def _padd(*ps):
    out: set = set()
    for p in ps:
        out ^= set(p)
    return frozenset(out)


def _trim(bits):
    bits = list(bits)
    while bits and not bits[-1]:
        bits.pop()
    if len(bits) > _MAX_BITS:
        raise _NotLinear("value too wide")
    return bits


def _bit(bits, i):
    return bits[i] if i < len(bits) else _ZERO


def _add(a, b):
    out, carry = [], _ZERO
    for i in range(max(len(a), len(b)) + 1):
        x, y = _bit(a, i), _bit(b, i)
        out.append(_padd(x, y, carry))
        carry = _padd(_pmul(x, y), _pmul(x, carry), _pmul(y, carry))
    return _trim(out)


def _const(c: int):
    if c < 0:
        raise _NotLinear("negative constant")
    return _trim([_ONE if (c >> i) & 1 else _ZERO for i in range(c.bit_length())])


def _pow2(c) -> int | None:
    c = const_int(c)
    return c.bit_length() - 1 if c is not None and c > 0 and c & (c - 1) == 0 else None


def _bits_of(expr, env) -> list:
    if isinstance(expr, int | tir.IntImm):
        return _const(int(expr))
    if isinstance(expr, tir.Var):
        if expr not in env:
            raise _NotLinear(f"free variable {expr}")
        return env[expr]
    if isinstance(expr, tir.Add):
        return _add(_bits_of(expr.a, env), _bits_of(expr.b, env))
    if isinstance(expr, tir.Mul):
        a, b = expr.a, expr.b
        if const_int(a) is not None:
            a, b = b, a
        c = const_int(b)
        if c is None or c < 0:
            raise _NotLinear("product of two variables")
        val, acc = _bits_of(a, env), []
        for i in range(c.bit_length()):
            if (c >> i) & 1:
                acc = _add(acc, [_ZERO] * i + val)
        return acc
    if isinstance(expr, tir.FloorDiv | tir.Div):
        k = _pow2(expr.b)
        if k is None:
            raise _NotLinear("division by a non-power of two")
        return _bits_of(expr.a, env)[k:]
    if isinstance(expr, tir.FloorMod | tir.Mod):
        k = _pow2(expr.b)
        if k is None:
            raise _NotLinear("modulo by a non-power of two")
        return _trim(_bits_of(expr.a, env)[:k])
    if isinstance(expr, tir.Call) and hasattr(expr.op, "name"):
        name = str(expr.op.name)
        if name in ("tirx.bitwise_xor", "tirx.bitwise_and", "tirx.bitwise_or"):
            a, b = (_bits_of(x, env) for x in expr.args)
            n = max(len(a), len(b))
            if name == "tirx.bitwise_xor":
                return _trim([_padd(_bit(a, i), _bit(b, i)) for i in range(n)])
            if name == "tirx.bitwise_and":
                return _trim([_pmul(_bit(a, i), _bit(b, i)) for i in range(n)])
            return _trim([_padd(_bit(a, i), _bit(b, i), _pmul(_bit(a, i), _bit(b, i))) for i in range(n)])
        if name in ("tirx.shift_left", "tirx.shift_right") and const_int(expr.args[1]) is not None:
            a, k = _bits_of(expr.args[0], env), const_int(expr.args[1])
            return _trim([_ZERO] * k + a) if name == "tirx.shift_left" else a[k:]
    raise _NotLinear(f"unsupported node {type(expr).__name__}")


def gf2_map(inputs: list[tuple[Any, int]], outputs: list[tuple[Any, int]]):
    """The affine GF(2) map (rows, constant, in_bits, out_bits) of a power-of-two layout.

    ``rows[r]`` is an int whose bit ``c`` is the coefficient of input bit ``c`` in output
    bit ``r`` (output bits concatenated, first component most significant). Raises
    ``_NotLinear`` when a dimension is not a power of two, a bit is not affine, or an
    output bit beyond its component's extent can be set.
    """
    env, nbits = {}, 0
    for v, ext in inputs:
        k = _pow2(ext)
        if k is None:
            raise _NotLinear(f"input extent {ext} is not a power of two")
        env[v] = [frozenset([frozenset([nbits + i])]) for i in range(k)]
        nbits += k
    rows, const = [], 0
    for expr, ext in reversed(outputs):
        k = _pow2(ext)
        if k is None:
            raise _NotLinear(f"output extent {ext} is not a power of two")
        bits = _bits_of(expr, env)
        if any(bits[k:]):
            raise _NotLinear("an output bit beyond the extent can be set")
        for i in range(k):
            row = 0
            for mono in _bit(bits, i):
                if len(mono) > 1:
                    raise _NotLinear("output bit is not affine")
                if not mono:
                    const |= 1 << len(rows)
                else:
                    row |= 1 << next(iter(mono))
            rows.append(row)
    return rows, const, nbits, len(rows)


def gf2_rank(rows: list[int]) -> int:
    """Rank over GF(2) of a matrix given as row bit-masks (Gaussian elimination)."""
    pivots: dict[int, int] = {}
    for r in rows:
        while r:
            top = r.bit_length() - 1
            if top not in pivots:
                pivots[top] = r
                break
            r ^= pivots[top]
    return len(pivots)


def _gf2_cross_check(m: _Map, result: dict) -> dict:
    ins = [(v, const_int(e)) for v, e in m.inputs]
    outs = [(o, const_int(e)) for o, e in m.outputs]
    if any(e is None for _, e in ins + outs):
        return {"applicable": False, "reason": "symbolic extents"}
    try:
        rows, _const_vec, n_in, n_out = gf2_map(ins, outs)
    except _NotLinear as exc:
        return {"applicable": False, "reason": str(exc)}
    rank = gf2_rank(rows)
    injective, onto = rank == n_in, rank == n_out
    agrees = True
    if result["injective"] != "unknown":
        agrees &= injective == (result["injective"] == "proven")
    if result["onto"] != "unknown" and result["injective"] == "proven":
        agrees &= onto == (result["onto"] == "proven")
    out = {"applicable": True, "rank": rank, "input_bits": n_in, "output_bits": n_out, "injective": injective, "onto": onto, "agrees": agrees}
    if not agrees:
        result["verdict"] = "error"
    return out


# ----- does every access stay inside a fragment's layout? -----------------------------------------


_ONE_ELEMENT = tir.IntImm("int32", 1)  # the extent of an element access in each dimension


class _AccessWalk:
    """The accesses of one fragment in the IR after LayoutInference, each with the facts that hold
    where it runs (enclosing loops, thread extents, branch conditions, bindings) as Z3 terms.

    ``exact`` is False once a fact had to be approximated (an opaque value, a ``while`` loop): such
    an access can still be proven inside the layout, but a model of it is no witness."""

    def __init__(self, enc: Encoder, data):
        self.enc, self.data = enc, data
        self.accesses: list[tuple[list, list, list, bool]] = []  # (indices, extents, facts, exact)
        self.unread: list[str] = []  # what the walk could not follow

    def term(self, expr, boolean=False):
        """The Z3 term of ``expr``, and whether it is exact (no opaque value stood in for part of it)."""
        before = (self.enc._fresh, len(self.enc.opaque_loads))
        term = self.enc.encode_bool(expr) if boolean else self.enc.encode(expr)
        self.enc.take_obligations()  # index arithmetic is read as exact integer math
        return term, before == (self.enc._fresh, len(self.enc.opaque_loads))

    def expr(self, e, facts, exact):
        """Record the fragment's loads and tile-op regions inside expression ``e``."""
        found, bare = [], []

        def visit(n):
            if isinstance(n, tir.BufferLoad) and n.buffer.data.same_as(self.data):
                found.append((list(n.indices), [_ONE_ELEMENT] * len(n.indices)))
            elif isinstance(n, tir.Call) and getattr(n.op, "name", "") == "tl.region":
                load = n.args[0]
                if isinstance(load, tir.BufferLoad) and load.buffer.data.same_as(self.data):
                    extents = list(n.args[2:])
                    if len(extents) == len(load.indices):
                        found.append((list(load.indices), extents))
                    else:
                        self.unread.append(f"a region of {len(extents)} extents over a rank-{len(load.indices)} buffer")
            elif isinstance(n, tir.Var) and n.same_as(self.data):
                bare.append(n)

        tir.stmt_functor.post_order_visit(e, visit)
        if bare:
            self.unread.append("a use of the buffer's address")
        guarded = _has_conditional(e)
        for indices, extents in found:
            self.accesses.append((indices, extents, facts, exact and not guarded))

    def stmt(self, s, facts, exact):
        if isinstance(s, tir.SeqStmt):
            for c in s.seq:
                facts, exact = self._sequential(c, facts, exact)
            return
        self._sequential(s, facts, exact)

    def _sequential(self, s, facts, exact):
        """Walk ``s``; return the facts and exactness that hold after it (a ``Bind`` adds one)."""
        enc = self.enc
        if isinstance(s, tir.Bind):
            self.expr(s.value, facts, exact)
            value, ok = self.term(s.value)
            return facts + [enc.var(s.var) == value], exact and ok
        if isinstance(s, tir.For):
            self.expr(s.min, facts, exact)
            self.expr(s.extent, facts, exact)
            self.stmt(s.body, facts + enc.range_facts(s.loop_var, s.min, s.extent), exact)
        elif isinstance(s, tir.AttrStmt):
            inner = facts
            if s.attr_key == "thread_extent":
                inner = facts + enc.range_facts(s.node.var, 0, s.value)
            self.stmt(s.body, inner, exact)
        elif isinstance(s, tir.IfThenElse):
            self.expr(s.condition, facts, exact)
            cond, ok = self.term(s.condition, boolean=True)
            self.stmt(s.then_case, facts + [cond], exact and ok)
            if s.else_case is not None:
                self.stmt(s.else_case, facts + [z3.Not(cond)], exact and ok)
        elif isinstance(s, tir.SBlockRealize):
            self.expr(s.predicate, facts, exact)
            inner, ok = list(facts), exact
            for iv, value in zip(s.block.iter_vars, s.iter_values, strict=True):
                self.expr(value, facts, exact)
                term, exact_value = self.term(value)
                inner.append(enc.var(iv.var) == term)
                ok = ok and exact_value
            pred, exact_pred = self.term(s.predicate, boolean=True)
            self.stmt(s.block, inner + [pred], ok and exact_pred)
        elif isinstance(s, tir.SBlock):
            if s.init is not None:
                self.stmt(s.init, facts, exact)
            self.stmt(s.body, facts, exact)
        elif isinstance(s, tir.BufferStore):
            if s.buffer.data.same_as(self.data):
                self.accesses.append((list(s.indices), [_ONE_ELEMENT] * len(s.indices), facts, exact))
            for e in list(s.indices) + [s.value]:
                self.expr(e, facts, exact)
        elif isinstance(s, tir.Evaluate):
            self.expr(s.value, facts, exact)
        elif isinstance(s, tir.While):
            self.expr(s.condition, facts, exact)
            self.stmt(s.body, facts, False)
        elif isinstance(s, tir.AssertStmt):
            self.expr(s.condition, facts, exact)
        elif isinstance(s, tir.AllocBuffer | tir.DeclBuffer):
            if isinstance(getattr(s, "body", None), tir.Stmt):
                self.stmt(s.body, facts, exact)
        else:
            self.unread.append(f"a {type(s).__name__} statement")
        return facts, exact


def _has_conditional(e) -> bool:
    """Does ``e`` contain a select or ``if_then_else`` (an access in it may never run)?"""
    found = []

    def visit(n):
        if isinstance(n, tir.Select) or (isinstance(n, tir.Call) and getattr(n.op, "name", "") == "tirx.if_then_else"):
            found.append(n)

    tir.stmt_functor.post_order_visit(e, visit)
    return bool(found)


def _access_coverage(kernel: LoweredKernel, used: UsedLayout) -> dict:
    """Does every access of fragment ``used`` fall inside its layout's domain?

    TileLang allocates a fragment's registers from its layout, not from the declared shape, and
    every access goes through the layout's map: an access inside the domain has a register of its
    own whatever the declaration says, one outside it has none (it lands on another element's
    register, or past the thread's array). Seen in TileLang 0.1.15's CUDA: a ``[8]`` fragment
    used in ``T.Parallel(64)`` loops on 128 threads becomes ``half_t sinks[2]`` per thread, a
    (128, 64) fragment laid out for (64, 64) becomes ``float acc[32]``.

    Returns ``{"status": "proven"}``, ``{"status": "violation", "access": text, "first": index,
    "last": index}`` (a reachable access that leaves the domain; ``first``..``last`` is the
    element or region it touches) or ``{"status": "unknown", "why": text}``."""
    enc = Encoder()
    walk = _AccessWalk(enc, used.data)
    for _, fn in kernel.layout_mod.functions.items():
        if isinstance(fn, tir.PrimFunc):
            walk.stmt(fn.body, [], True)
    if walk.unread:
        return {"status": "unknown", "why": f"the walk could not follow {walk.unread[0]}"}
    domain = list(used.layout.get_input_shape())
    undecided = None
    for indices, extents, facts, exact in walk.accesses:
        if len(indices) != len(domain):
            return {"status": "unknown", "why": f"an access of rank {len(indices)} against a rank-{len(domain)} layout"}
        encoded = [walk.term(e) for e in indices + extents]
        exact = exact and all(ok for _, ok in encoded)
        terms = [t for t, _ in encoded[: len(indices)]]
        lasts = [t + x - 1 for t, (x, _) in zip(terms, encoded[len(indices) :], strict=True)]
        bounds = [enc.encode(d) for d in domain]
        enc.take_obligations()
        outside = z3.Or([z3.Or(t < 0, last >= b) for t, last, b in zip(terms, lasts, bounds, strict=True)])
        v = enc.check(facts + [outside])
        if v.status == "proven":
            continue
        if v.status == "violation" and exact:
            first = [enc.model_value(v.model, t) for t in terms]
            last = [enc.model_value(v.model, t) for t in lasts]
            return {"status": "violation", "access": _access_text(used.buffer, indices, extents), "first": first, "last": last}
        undecided = undecided or f"{_access_text(used.buffer, indices, extents)} was not proven inside it"
    if undecided:
        return {"status": "unknown", "why": undecided}
    return {"status": "proven"}


def _access_text(buffer: str, indices: list, extents: list) -> str:
    """``acc[i, j]`` for an element, ``acc[0:128, 0:64]`` for a tile operation's region."""
    simplify = tvm.arith.Analyzer().simplify
    parts = [str(i) if const_int(x) == 1 else f"{i}:{simplify(i + x)}" for i, x in zip(indices, extents, strict=True)]
    return f"{buffer}[{', '.join(parts)}]"


# ----- the pass -------------------------------------------------------------------------------


def layouts_report(kernel: LoweredKernel) -> dict:
    """Check every layout of ``kernel``; ``{"layouts": [...], "invalid": n, "unknown": n, "seconds": s}``."""
    t0 = time.perf_counter()
    enc = Encoder()
    entries = [_checked(kernel, u, enc) for u in collect_layouts(kernel)]
    invalid = sum(e["verdict"] in ("invalid", "error") for e in entries)
    unknown = sum(e["verdict"] == "unknown" for e in entries)
    counts = {k: sum(e["verdict"] == k for e in entries) for k in ("bijective", "injective")}
    summary = [f"{len(entries)} layouts: {counts['bijective']} bijective, {counts['injective']} injective with unused slots, {invalid} wrong, {unknown} unknown"]
    summary += [_describe(e, kernel.name) for e in entries if e["verdict"] in ("invalid", "error") or "uncovered" in e or "declared_shape" in e]
    return {
        "summary": summary,
        "layouts": entries,
        "checked": len(entries),
        "invalid": invalid,
        "unknown": unknown,
        "exit_code": exit_status(invalid, unknown),
        "seconds": round(time.perf_counter() - t0, 4),
    }


def _checked(kernel: LoweredKernel, used: UsedLayout, enc: Encoder) -> dict:
    """:func:`check_layout`, and for a fragment laid out on another shape than it is declared
    with, whether the kernel's accesses stay inside the layout (:func:`_access_coverage`)."""
    e = check_layout(used, enc)
    if "uncovered" not in e or used.kind != "fragment" or used.data is None:
        return e
    cov = _access_coverage(kernel, used)
    e["coverage"] = cov
    if cov["status"] == "proven":
        e["declared_shape"] = e.pop("uncovered")
    if e["verdict"] != "error":
        e["verdict"] = _verdict(e)
    return e


def _describe(e: dict, kernel: str) -> str:
    """One line a kernel author can act on: the kernel, the buffer, what is wrong and what follows."""
    where = f"kernel {kernel}: {e['kind']} {e['buffer']}"
    shape = e.get("uncovered") or e.get("declared_shape")
    if shape:
        declared, domain = _shape_text(shape["buffer"]), _shape_text(shape["layout"])
        cov = e.get("coverage", {"status": "not checked"})
        if cov["status"] == "proven":
            return (f"{where} is declared {declared} but used over {domain}, the layout TileLang inferred from the loops "
                    f"that touch it; every access stays inside that layout and TileLang allocates the fragment's registers "
                    f"from it, so the results are not affected (declare it {domain} to say what the kernel does)")
        if cov["status"] == "violation":
            return (f"{where} is declared {declared} but TileLang laid it out for {domain} only: the access {cov['access']} "
                    f"covers {_span(cov)}, which leaves the layout; an element outside it has no register of its own "
                    f"(it reads or overwrites another element's register, or lies past the thread's array)")
        if cov["status"] == "unknown":
            return (f"{where} is declared {declared} but laid out for {domain}; tlx could not prove that every access "
                    f"stays inside the layout ({cov['why']})")
        return f"{where} is declared {declared} but its layout is defined on {domain}"
    if "collision" in e:
        c = e["collision"]
        return f"{where}: layout maps both {c['x']} and {c['y']} to {c['output']}"
    if "range_witness" in e:
        w = e["range_witness"]
        return f"{where}: layout maps {w['input']} outside {e['output_shape']} to {w['output']}"
    return f"{where}: Z3 and GF(2) rank disagree on its layout ({e['gf2']})"


def _span(cov: dict) -> str:
    return str(cov["first"]) if cov["first"] == cov["last"] else f"{cov['first']}..{cov['last']}"


def _shape_text(dims: list) -> str:
    return "[" + ", ".join(dims) + "]"


def layouts_pass(kernel: LoweredKernel, ctx: PassContext) -> LoweredKernel:
    """Report into ``ctx.reports["layouts"]``; a wrong layout raises or warns per ``verify``."""
    if kernel.layout_mod is None:
        ctx.reports["layouts"] = {"layouts": [], "checked": 0, "invalid": 0, "unknown": 0, "note": "no layout IR captured"}
        return kernel
    report = layouts_report(kernel)
    ctx.reports["layouts"] = report
    bad = [_describe(e, kernel.name) for e in report["layouts"] if e["verdict"] in ("invalid", "error")]
    if bad:
        raise_or_warn(ctx, LayoutError("\n".join(bad)))
    return kernel
