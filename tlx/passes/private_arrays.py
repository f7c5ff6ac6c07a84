"""Thread-private integer arrays whose contents the bounds verifier can bound.

A kernel often computes a small per-thread array (an entry's expert, a slot) and later indexes
shared memory with its elements. Such an array lives in the thread's registers: only the
thread's own stores change it, and the verifier sees every one of them. So every element ever
loaded lies in the hull of the values ever stored, provided that the element was stored before
it was loaded. This module finds the arrays for which both hold:

* ``candidate_arrays``: private integer arrays of more than one element, accessed one element at
  a time, whose storage never escapes (no pointer to them is taken);
* ``initialized_by``: the arrays a loop fully initializes, that is, a loop ``for v in [0, n)``
  with a constant ``n`` at least the array's size whose body stores ``a[v]`` unconditionally.

``bounds`` collects the hull of the stored values in a first walk and, where it is bounded, walks
again with ``lo <= a[i] <= hi`` known for every load made after a full initialization.
"""

from __future__ import annotations

from tilelang import tvm

from tlx.ir.tir import PRIVATE_SCOPES, op_name, scalar_dtype, unit_step

tir = tvm.tirx

__all__ = ["candidate_arrays", "initialized_by"]


def _size(buf) -> int | None:
    n = 1
    for d in buf.shape:
        if not isinstance(d, tir.IntImm):
            return None
        n *= int(d.value)
    return n


def candidate_arrays(f) -> dict:
    """Data var -> Buffer of the arrays whose every load reads a value some store of the
    function wrote, or an uninitialized one (``initialized_by`` rules the latter out)."""
    found: dict = {}
    excluded: set = set()

    def consider(buf, indices, lanes_ok: bool):
        kind, _, lanes = scalar_dtype(buf.dtype)
        size = _size(buf)
        if str(buf.scope()) not in PRIVATE_SCOPES or kind not in ("int", "uint") or size is None or size < 2:
            return
        if lanes != 1 or not lanes_ok or len(indices) != 1 or any(isinstance(i, (tir.Ramp, tir.Broadcast)) for i in indices):
            excluded.add(buf.data)
            return
        found.setdefault(buf.data, buf)

    def visit(n):
        if isinstance(n, tir.BufferStore):
            consider(n.buffer, n.indices, scalar_dtype(n.value.dtype)[2] == 1)
        elif isinstance(n, tir.BufferLoad):
            consider(n.buffer, n.indices, scalar_dtype(n.dtype)[2] == 1)
        elif isinstance(n, tir.Var) and str(n.dtype) == "handle":
            excluded.add(n)  # the storage itself appears: a pointer escapes
        elif (isinstance(n, tir.Call) and op_name(n) == "tirx.address_of"
              and isinstance(n.args[0], tir.BufferLoad)):
            excluded.add(n.args[0].buffer.data)

    tir.stmt_functor.post_order_visit(f.body, visit)
    return {d: b for d, b in found.items() if not any(d.same_as(x) for x in excluded)}


def _is_var(index, var) -> bool:
    while isinstance(index, tir.Cast):
        index = index.value
    return isinstance(index, tir.Var) and index.same_as(var)


_EVERY_ITERATION = (tir.ForKind.SERIAL, tir.ForKind.UNROLLED, tir.ForKind.VECTORIZED)  # run by the thread itself


def _leaves_early(body) -> bool:
    """Whether ``body`` may leave the loop before its last iteration (``T.loop_break``, a return)."""
    found = []
    tir.stmt_functor.post_order_visit(body, lambda n: found.append(n) if isinstance(n, tir.Call) and hasattr(n.op, "name")
                                      and (str(n.op.name).endswith("loop_break") or str(n.op.name) == "tirx.ret") else None)
    return bool(found)


def initialized_by(loop, candidates: dict) -> list:
    """Data vars of the candidate arrays that ``loop`` stores at every index: the thread itself
    runs ``v`` over every value of ``[0, n)``, ``n`` constant and at least the array's size, and
    the body stores ``a[v]`` outside any branch or inner loop."""
    if not (loop.kind in _EVERY_ITERATION and unit_step(loop)
            and isinstance(loop.min, tir.IntImm) and loop.min.value == 0 and isinstance(loop.extent, tir.IntImm)):
        return []
    body = loop.body
    if _leaves_early(body):
        return []
    top = list(body.seq) if isinstance(body, tir.SeqStmt) else [body]
    out = []
    for s in top:
        if isinstance(s, tir.BufferStore) and len(s.indices) == 1 and _is_var(s.indices[0], loop.loop_var):
            data = s.buffer.data
            buf = next((b for d, b in candidates.items() if d.same_as(data)), None)
            if buf is not None and int(loop.extent.value) >= _size(buf):
                out.append(buf.data)
    return out
