"""Bounds verification: every buffer access of the device kernels, proven in bounds for all shapes or refuted.

The device kernels in ``kernel.device_mod`` are what runs on the GPU (flattened
buffers, vector ``Ramp`` indices, TileLang's inserted guards), so they are what is
verified. For each access the verifier asks Z3, under the access's context (block and
thread indices with their launch extents, loop variables with their ranges,
enclosing conditions, bindings, shape variables >= 0 and the user's assumptions),
whether the index can leave ``[0, extent)``; and whether any integer operation of
the index can overflow its dtype. Verdicts: ``proven``, ``violation`` with a concrete
counterexample, or ``unknown`` when the rlimit budget runs out.

TMA copies address global memory through descriptors and the hardware clips
out-of-bounds boxes, so only their shared-memory side (a ``tvm_access_ptr``) is an
access here.

The walk is a :class:`~tlx.ir.walk.DeviceWalker` (the program model's too): a statement it
has no rule for is an ``unknown`` entry, and the ranges of ``cp.async`` and ``ldmatrix`` /
``stmatrix`` come from :func:`~tlx.ir.walk.pointer_uses`. With ``prove_guards`` the walk
also asks which of TileLang's bound-check guards always hold and records them
(:attr:`BoundsReport.proven_guards`); :mod:`tlx.passes.guards` drops those. :mod:`tlx.passes.preconditions` derives the shape
conditions that prove what stays unproven, and :mod:`tlx.passes.bounds` is the compile-time pass.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import z3

import tilelang  # noqa: F401
from tilelang import tvm

from tlx.ir.facts import accumulators, function_facts, launcher_checks, param_buffers, user_name
from tlx.ir.tir import PRIVATE_SCOPES, arith_only, device_functions, elem_bytes, op_name, scalar_dtype, unit_step
from tlx.ir.walk import MATRIX_MOVES, DeviceWalker, is_access_ptr, is_cp_async, pointer_uses
from tlx.lowering import LoweredKernel
from tlx.passes import TlxError
from tlx.passes.private_arrays import candidate_arrays, initialized_by
from tlx.passes.smt import (DEFAULT_RLIMIT, Encoder, MemoryFacts, Obligation, allocation_elements, bind_params, known_term, row_major,
                            shape_setup)

tir = tvm.tirx

__all__ = ["CheckedAccess", "BoundsReport", "VerificationError", "format_violation", "verify_kernel"]


class VerificationError(TlxError, RuntimeError):
    """Raised by ``verify="error"`` when an access is out of bounds for some allowed shape."""


@dataclass
class CheckedAccess:
    """One checked access (or index overflow) and its verdict."""

    func: str
    buffer: str
    scope: str
    kind: str  # "load" | "store" | "pointer" | "overflow"
    index: str
    extent: str
    status: str = "unknown"  # "proven" | "violation" | "unknown"
    counterexample: dict[str, int] = field(default_factory=dict)
    detail: str = ""
    source: str = "unknown line"
    least: dict[str, int] = field(default_factory=dict)  # smallest violating shape values (focus mode)
    data_dependent: bool = False  # the counterexample needs particular values in input memory

    def key(self) -> tuple:
        return (self.func, self.buffer, self.kind, self.index)

    def to_json(self) -> dict:
        return {
            "func": self.func,
            "buffer": self.buffer,
            "scope": self.scope,
            "kind": self.kind,
            "index": self.index,
            "extent": self.extent,
            "status": self.status,
            "counterexample": dict(self.counterexample),
            "detail": self.detail,
            "source": self.source,
            "data_dependent": self.data_dependent,
        }


@dataclass
class BoundsReport:
    kernel: str
    accesses: list[CheckedAccess]
    seconds: float
    queries: int
    rlimit_used: int
    guards: dict = field(default_factory=dict)
    # the bound-check guards (``IfThenElse`` statements, ``if_then_else`` calls) proven always
    # true, found with ``verify_kernel(prove_guards=True)``
    proven_guards: set = field(default_factory=set)
    # function -> private array -> (lo, hi) of its stored values: valid under any further
    # conditions, so later walks of the same kernel reuse them (``verify_kernel(hulls=)``)
    hulls: dict = field(default_factory=dict)
    # the extra conditions the walk assumed (``verify_kernel``'s ``extra_conditions``)
    conditions: tuple = ()
    # a fresh ``verify_kernel`` under the same conditions would walk with the same hulls: this
    # one collected them itself, or the kernel has no private array they could bound
    own_hulls: bool = True

    @property
    def proven(self) -> int:
        return sum(a.status == "proven" for a in self.accesses if a.kind != "overflow")

    @property
    def checked(self) -> int:
        return sum(a.kind != "overflow" for a in self.accesses)

    def violations(self) -> list[CheckedAccess]:
        return [a for a in self.accesses if a.status == "violation"]

    def unknowns(self) -> list[CheckedAccess]:
        return [a for a in self.accesses if a.status == "unknown"]

    def to_json(self) -> dict:
        return {
            "kernel": self.kernel,
            "accesses": self.checked,
            "proven": self.proven,
            "violations": [a.to_json() for a in self.violations()],
            "unknown": [a.to_json() for a in self.unknowns()],
            "seconds": round(self.seconds, 4),
            "queries": self.queries,
            "rlimit_used": self.rlimit_used,
        }


# --------------------------------------------------------------------------------------
# The walk
# --------------------------------------------------------------------------------------

_BINARY = (tir.Add, tir.Sub, tir.Mul, tir.Div, tir.Mod, tir.FloorDiv, tir.FloorMod, tir.Min, tir.Max,
           tir.EQ, tir.NE, tir.LT, tir.LE, tir.GT, tir.GE, tir.And, tir.Or)


@dataclass
class _Frame:
    facts: list
    names: list  # (name, z3 term) shown in counterexamples
    tainted: list = field(default_factory=list)  # facts dropped because their arithmetic may overflow


_OPAQUE = "a pointer bound to an address this analysis does not model: its allocation is not known"


class _Walker(DeviceWalker):
    """Visits one device function, checks every access, and (optionally) proves guards."""

    def __init__(self, enc: Encoder, func_name: str, shape_terms: dict[str, Any], prove_guards: bool, source_map, focus=None,
                 least_of=None, arrays: dict | None = None, hulls: dict | None = None):
        super().__init__(func_name)
        self.enc = enc
        self.memory = MemoryFacts()  # what the walk knows of private memory here (the encoder reads it)
        # Private arrays (see private_arrays): without ``hulls`` the walk collects the hull of each
        # one's stored values (None once unbounded); with them, loads after a full initialization
        # are known to lie in it.
        self.arrays = arrays or {}
        self.hulls = hulls
        self.collected: dict = {}
        self.initialized: frozenset = frozenset()
        self.focus = focus
        self.least_of = least_of
        self.shape_terms = shape_terms
        self.prove_guards = prove_guards
        self.source_map = source_map
        self.frames: list[_Frame] = [_Frame([], list(shape_terms.items()))]
        self.accesses: list[CheckedAccess] = []
        self.guards_seen = 0
        self.guard_occurrences: dict = {}  # guard node -> [times met, times proven]
        self._overflow_seen: set[str] = set()
        self.statement = None  # the statement being checked, named where no source line is found
        self.loops: list[str] = []  # enclosing loop variables, innermost last
        self.opaque_pointers: set = set()  # pointers bound to addresses the walk does not model
        # pointers the program made (address_of, another pointer's name): their buffers are views
        # checked against the allocation they point into; TileLang's own carve-outs of the
        # dynamic shared memory (handle_add_byte_offset) keep their planned shapes
        self.program_views: set = set()
        self.host_checked: set = set()  # conditions of the host's asserts (the launcher's checks), as text

    # ----- where --------------------------------------------------------------------
    def locate(self, name: str, kind: str, index: str) -> str:
        """``file:line`` of the kernel statement, else the device statement and its loops."""
        store = _first_store(self.statement) if not name else None
        if store is not None:  # arithmetic of an unnamed value (an index, a guard): the store it serves
            name, kind = user_name(store.buffer.name), "store"
            index = ", ".join(str(i) for i in store.indices)
        found = self.source_map(name, kind, index) if name else "unknown line"
        if found != "unknown line" or self.statement is None:
            return found
        where = f"{self.func}: {_statement_text(self.statement)}"
        return where + (f" (in loops over {', '.join(self.loops)})" if self.loops else "")

    # ----- context ----------------------------------------------------------------
    def context(self) -> list:
        return [f for fr in self.frames for f in fr.facts]

    def push(self, facts=(), names=()):
        self.frames.append(_Frame(list(facts), list(names)))

    def pop(self):
        self.frames.pop()

    def add_fact(self, fact):
        self.frames[-1].facts.append(fact)

    def add_name(self, name, term):
        self.frames[-1].names.append((name, term))

    def counterexample(self, model, extra: dict, facts=()) -> dict[str, int]:
        """The model's values of the named variables and of ``extra``'s terms, and of the loads
        they depend on, also through the context's facts and ``facts`` (the query's own)."""
        out: dict[str, int] = {}
        for fr in self.frames:
            for name, term in fr.names:
                v = self.enc.model_value(model, term)
                if isinstance(v, bool):
                    v = int(v)
                if v is not None:
                    out[name] = v
        for name, term in extra.items():
            v = self.enc.model_value(model, term)
            if v is not None:
                out[name] = int(v)
        # Data-dependent indices: the loaded values that make the access fail.
        loaded = self.enc.loaded_values(model, list(extra.values()), self.context() + self.enc.facts + list(facts),
                                        fixed=self.shape_terms.values())
        out.update({k: v for k, (v, _) in loaded.items()})
        calls = sorted(k for k, (_, scope) in loaded.items() if scope == "call")
        private = sorted(k for k, (_, scope) in loaded.items() if scope not in ("global", "call"))
        data = sorted(k for k, (_, scope) in loaded.items() if scope != "call")
        if data:
            out["__data__"] = data
        if calls:
            # The value of a call the encoder does not model: the assignment may be impossible.
            out["__opaque__"] = calls
        if private:
            # Values the kernel itself computed into shared/local memory are not tracked, so
            # this assignment may be impossible: the caller reports "unknown", not a violation.
            out["__untracked__"] = private
        return out

    def record_least(self, access: CheckedAccess, verdict):
        """In focus mode: the least value of each shape variable that still violates (for upper-bound preconditions)."""
        if self.focus is None or access.key() != self.focus:
            return
        for name, term in self.shape_terms.items():
            if name != self.least_of:
                continue
            low = self.enc.minimize(term, verdict.formulas, lo=0)
            if low is not None:
                access.least[name] = low

    def reliable(self, expr, what: str, as_bool=False, subject: str = ""):
        """Encode ``expr``; if its fixed-width arithmetic may overflow, report that and return None.

        ``what`` describes where the expression sits; ``subject`` names the variable or
        buffer its value lands in (the ``buffer`` of the overflow entry)."""
        term = self.enc.encode_bool(expr) if as_bool else self.enc.encode(expr)
        obs = self.enc.take_obligations()
        if not obs:
            return term
        verdict, bad = self.enc.prove_obligations(obs, self.context())
        if verdict.proven:
            return term
        self.report_overflow(verdict, bad, what, subject)
        self.frames[-1].tainted.append(what)
        return None

    def taint(self) -> list[str]:
        return [t for fr in self.frames for t in fr.tainted]

    def demote(self, access: CheckedAccess) -> None:
        """A violation that may be spurious becomes unknown: found in a context weakened by a
        possible overflow, relying on values the kernel computed into its own memory, or needing
        particular input contents (data-dependent: the verifier does not know the input's
        contract, so it is not refuted for valid inputs)."""
        untracked = access.counterexample.pop("__untracked__", None)
        data = access.counterexample.pop("__data__", None)
        opaque = access.counterexample.pop("__opaque__", None)
        if access.status != "violation":
            return
        if data:
            access.data_dependent = True
            access.detail += f" when the input holds {', '.join(f'{k} = {access.counterexample[k]}' for k in data)}"
        if opaque:
            access.status = "unknown"
            access.detail = f"not proven; depends on the value of {', '.join(opaque)}, which the verifier does not model"
            return
        if untracked:
            access.status = "unknown"
            access.detail = f"not proven; depends on {', '.join(untracked)}, whose contents the verifier does not track"
            return
        taint = self.taint()
        if taint:
            access.status = "unknown"
            access.counterexample = {}
            access.detail = f"not proven; depends on {taint[0]}, which may overflow (reported separately)"
        elif data:
            access.status = "unknown"

    def report_overflow(self, verdict, bad: Obligation | None, what: str, subject: str = ""):
        text = bad.text() if bad is not None else what
        if text in self._overflow_seen:
            return
        self._overflow_seen.add(text)
        a = CheckedAccess(self.func, subject, "", "overflow", str(bad.node) if bad else what, bad.dtype if bad else "", verdict.status)
        a.source = self.locate(subject, "overflow", a.index)
        if self.focus is not None and a.key() != self.focus:
            a.status = "skipped"
        if a.status == "skipped":
            pass
        elif verdict.status == "violation" and bad is not None:
            a.counterexample = self.counterexample(verdict.model, {"value": bad.term})
            self.record_least(a, verdict)
            a.detail = f"in {what}: {bad.node} leaves {bad.dtype} [{bad.lo}, {bad.hi}]"
            self.demote(a)
        else:
            a.detail = f"in {what}: overflow check {verdict.reason or 'ran out of budget'}"
        self.accesses.append(a)

    # ----- accesses -----------------------------------------------------------------
    def check_access(self, buffer, indices, kind: str, predicate=None):
        lanes = max(scalar_dtype(i.dtype)[2] for i in indices) if indices else 1
        name = user_name(buffer.name)
        scope = str(buffer.scope())
        shape = list(buffer.shape)
        declared = self.buffers.get(buffer.data)
        if declared is not None and declared.strides and len(indices) == 1 and not row_major(declared) \
                and declared.dtype == buffer.dtype:
            # a strided tensor argument, flattened by TileLang to stride * rows: the memory it is
            # known to hold is its view's span (allocation_elements), not that product
            shape = [allocation_elements(declared)]
        access = CheckedAccess(self.func, name, scope, kind, ", ".join(str(i) for i in indices), " x ".join(str(s) for s in shape))
        access.source = self.locate(name, kind, access.index)
        self.accesses.append(access)
        lane = None
        ctx_extra = []
        extra_names = {}
        if lanes > 1:
            lane = z3.Int(f"lane!{len(self.accesses)}", self.enc.ctx)
            ctx_extra += [lane >= 0, lane < lanes]
            extra_names["lane"] = lane
        if len(indices) != len(shape):
            access.status, access.detail = "unknown", f"{len(indices)} indices for a {len(shape)}-d buffer"
            return
        if self.root_of(buffer.data)[0] in self.opaque_pointers:
            access.status, access.detail = "unknown", _OPAQUE
            return
        offset = buffer.elem_offset
        if offset is not None and not (isinstance(offset, tir.IntImm) and offset.value == 0):
            # A view into a larger allocation: its own shape does not bound the real one.
            access.status, access.detail = "unknown", f"buffer view at element offset {offset}; its allocation is not known here"
            return
        if buffer.data in self.program_views:
            self.check_view(access, buffer, indices, lane, ctx_extra, extra_names)
            return
        # Extents are allocation sizes computed on the host in 64 bits, not device arithmetic.
        self.enc.take_obligations()
        extents = [self.enc.encode(ext) for ext in shape]
        self.enc.take_obligations()
        if self.focus is not None and access.key() != self.focus:
            access.status = "skipped"
            return
        goals = []
        for i, (idx, e) in enumerate(zip(indices, extents)):
            t = self.enc.encode(idx, lane=lane)
            goals.append(z3.And(t >= 0, t < e))
            extra_names[f"index{i}" if len(indices) > 1 else "index"] = t
            extra_names[f"extent{i}" if len(indices) > 1 else "extent"] = e
        if predicate is not None and lane is not None:
            ctx_extra.append(self.enc.encode_bool(predicate, lane=lane))
        obs = self.enc.take_obligations()
        context = self.context() + ctx_extra
        if obs:
            v, bad = self.enc.prove_obligations(obs, context)
            if not v.proven:
                access.status = v.status if v.status == "unknown" else "violation"
                if v.status == "violation" and bad is not None:
                    extra_names["overflowing value"] = bad.term
                    access.counterexample = self.counterexample(v.model, extra_names, ctx_extra)
                    self.record_least(access, v)
                    access.detail = f"index arithmetic overflows {bad.dtype}: {bad.node}"
                    self.demote(access)
                else:
                    access.detail = f"overflow check: {v.reason or 'budget exhausted'}"
                return
        v = self.enc.prove(z3.And(goals) if len(goals) > 1 else goals[0], context)
        access.status = v.status
        if v.status == "violation":
            access.counterexample = self.counterexample(v.model, extra_names, ctx_extra)
            access.detail = "index outside [0, extent)"
            self.record_least(access, v)
            self.demote(access)
        elif v.status == "unknown":
            access.detail = v.reason or "budget exhausted"

    def check_view(self, access, buffer, indices, lane, ctx_extra, extra_names):
        """An access through a view into another allocation (a pointer bound to an offset into
        it): the bytes it touches must lie in the root allocation; the view's own shape is
        whatever the program declared and bounds nothing."""
        root, byte_off = self.root_of(buffer.data)
        buf = self.buffers.get(root)
        if buf is None or self.focus is not None and access.key() != self.focus:
            access.status, access.detail = ("skipped", "") if buf is not None else ("unknown", _OPAQUE)
            return
        strides = list(buffer.strides) if buffer.strides else None
        if strides is None:
            strides, acc = [], 1
            for ext in reversed(list(buffer.shape)):
                strides.insert(0, acc)
                acc = acc * ext
        self.enc.take_obligations()
        size = 1
        for ext in buf.shape:
            size = size * ext
        cap = self.enc.encode(size) * elem_bytes(buf.dtype)
        self.enc.take_obligations()
        flat = sum((self.enc.encode(i, lane=lane) * self.enc.encode(st) for i, st in zip(indices, strides)), 0)
        lo = self.enc.encode(byte_off) + flat * elem_bytes(buffer.dtype)
        extra_names.update({"first byte": lo, "bytes": cap})
        obs = self.enc.take_obligations()
        context = self.context() + ctx_extra
        if obs:
            v, _ = self.enc.prove_obligations(obs, context)
            if not v.proven:
                access.status, access.detail = "unknown", "view arithmetic may overflow"
                return
        v = self.enc.prove(z3.And(lo >= 0, lo + elem_bytes(buffer.dtype) <= cap), context)
        access.status = v.status
        if v.status == "violation":
            access.counterexample = self.counterexample(v.model, extra_names, ctx_extra)
            access.detail = f"outside {user_name(buf.name)}, which the view points into"
            self.record_least(access, v)
            self.demote(access)
        elif v.status == "unknown":
            access.detail = v.reason or "budget exhausted"

    def check_pointer(self, call, extent_override=None):
        """``tvm_access_ptr(type, data, offset, extent, rw)``: elements [offset, offset+extent) of ``data``
        (``extent_override`` elements when the consumer says how many it really touches)."""
        _, data, offset, extent, _ = call.args
        if extent_override is not None:
            extent = extent_override
        ptr_bytes = elem_bytes(call.args[0].dtype)
        base, byte_off = self.root_of(data)
        buf = self.buffers.get(base)
        if buf is None or base in self.opaque_pointers:
            access = CheckedAccess(self.func, user_name(data.name), "global", "pointer", f"[{offset}, {offset} + {extent})", "?")
            access.status, access.detail = "unknown", _OPAQUE
            self.accesses.append(access)
            return
        name = user_name(data.name)
        buf_bytes = elem_bytes(buf.dtype)
        size = allocation_elements(buf)
        access = CheckedAccess(self.func, name, str(buf.scope()), "pointer", f"[{offset}, {offset} + {extent})", f"{size} x {buf.dtype}")
        access.source = self.locate(name, "pointer", access.index)
        self.accesses.append(access)
        if self.focus is not None and access.key() != self.focus:
            access.status = "skipped"
            return
        # The allocation's size is computed on the host in 64 bits, not device arithmetic.
        self.enc.take_obligations()
        cap = self.enc.encode(size) * buf_bytes
        self.enc.take_obligations()
        # The extent is not computed by the device code either (the CUDA code generator emits
        # ``data + offset``): its int32 expression may wrap without an effect, so it is taken as
        # the integer it denotes; the offset is device arithmetic and must not wrap.
        span = self.enc.encode(extent) * ptr_bytes
        self.enc.take_obligations()
        lo = self.enc.encode(byte_off) + self.enc.encode(offset) * ptr_bytes
        hi = lo + span
        obs = self.enc.take_obligations()
        if obs:
            v, _ = self.enc.prove_obligations(obs, self.context())
            if not v.proven:
                access.status, access.detail = "unknown", "pointer arithmetic may overflow"
                return
        v = self.enc.prove(z3.And(lo >= 0, hi <= cap), self.context())
        access.status = v.status
        if v.status == "violation":
            access.counterexample = self.counterexample(v.model, {"first byte": lo, "end byte": hi, "bytes": cap})
            access.detail = "pointer range outside the allocation"
            self.record_least(access, v)
            self.demote(access)

    def check_cp_async(self, call):
        """``ptx_cp_async(dst, src, n[, predicate])`` (see :func:`~tlx.ir.walk.pointer_uses`): the
        destination range, then the source range under the predicate."""
        dst, src = pointer_uses(call, self.is_shared)
        for a in list(dst.ptr.args[2:4]) + list(src.ptr.args[2:4]) + list(call.args[2:]):
            self.visit_expr(a)
        self.check_pointer(dst.ptr, dst.elems)
        pred = self.reliable(src.predicate, "cp.async predicate", as_bool=True) if src.predicate is not None else None
        self.push([pred] if pred is not None else [])
        self.check_pointer(src.ptr, src.elems)
        self.pop()

    def check_matrix_move(self, call):
        """``ptx_ldmatrix`` / ``ptx_stmatrix``: each pointer for the bytes the instruction moves
        (see :func:`~tlx.ir.walk.pointer_uses`), not TileLang's extents."""
        uses = iter(pointer_uses(call, self.is_shared))
        for arg in call.args[2:]:
            if not is_access_ptr(arg):
                self.visit_expr(arg)
                continue
            for a in arg.args[2:4]:
                self.visit_expr(a)
            use = next(uses)
            self.check_pointer(use.ptr, use.elems)

    # ----- expressions ----------------------------------------------------------------
    def visit_expr(self, e):
        """Check the accesses inside ``e``."""
        if isinstance(e, tir.BufferLoad):
            for i in e.indices:
                self.visit_expr(i)
            self.check_access(e.buffer, list(e.indices), "load", getattr(e, "predicate", None))
            return
        if isinstance(e, tir.Call):
            op = op_name(e)
            if op == "tirx.if_then_else":
                self.visit_conditional_expr(e)
                return
            if op == "tirx.tvm_access_ptr":
                for a in e.args[2:4]:
                    self.visit_expr(a)
                self.check_pointer(e)
                return
            if is_cp_async(e):
                self.check_cp_async(e)
                return
            if op in MATRIX_MOVES:
                self.check_matrix_move(e)
                return
            for a in e.args:
                self.visit_expr(a)
            return
        if isinstance(e, tir.Let):
            self.visit_expr(e.value)
            t = self.reliable(e.value, f"let {e.var.name}", subject=e.var.name)
            self.push()
            if t is not None:
                self.add_fact(self.enc.var(e.var) == t)
            self.visit_expr(e.body)
            self.pop()
            return
        if isinstance(e, (tir.And, tir.Or)) and scalar_dtype(e.dtype)[2] == 1:
            # C's && and || (CUDA's code generator prints them): the right operand is evaluated
            # only where the left one does not decide, so its accesses are checked only there
            self.visit_expr(e.a)
            c = self.reliable(e.a, f"condition {e.a}", as_bool=True)
            self.push([] if c is None else [c if isinstance(e, tir.And) else z3.Not(c)])
            self.visit_expr(e.b)
            self.pop()
            return
        if isinstance(e, _BINARY):
            self.visit_expr(e.a)
            self.visit_expr(e.b)
            return
        for attr in ("a", "value", "condition", "true_value", "false_value", "base", "stride"):
            sub = getattr(e, attr, None) if not isinstance(e, (tir.IntImm, tir.FloatImm, tir.StringImm, tir.Var)) else None
            if sub is not None and isinstance(sub, tvm.ir.PrimExpr):
                self.visit_expr(sub)

    def visit_conditional_expr(self, e):
        cond, a, b = e.args
        self.visit_expr(cond)
        c = self.reliable(cond, f"condition {cond}", as_bool=True)
        self.push([c] if c is not None else [])
        self.visit_expr(a)
        self.pop()
        self.push([z3.Not(c)] if c is not None else [])
        self.visit_expr(b)
        self.pop()
        self.note_guard(e, cond, a, c)

    def note_guard(self, node, cond, guarded, c) -> None:
        """Count a bound-check guard and, with ``prove_guards``, whether it always holds here (one
        node may stand in several places: it is dropped only where every one is proven)."""
        guard = _is_bound_guard(cond, guarded)
        self.guards_seen += guard
        if self.prove_guards and guard:
            met = self.guard_occurrences.setdefault(node, [0, 0])
            met[0] += 1
            met[1] += c is not None and self.enc.prove(c, self.context()).proven

    def proven_guards(self) -> dict:
        """Guard node -> how often it stands in the function, for the guards proven everywhere."""
        return {node: met for node, (met, proven) in self.guard_occurrences.items() if met == proven}

    # ----- statements ----------------------------------------------------------------
    def unmodelled(self, s):
        """A statement the walk cannot read: nothing in it is proven."""
        self.statement = s
        access = CheckedAccess(self.func, "", "", "statement", _statement_text(s), "", "unknown",
                               detail=f"{type(s).__name__} statement not modelled by the verifier")
        access.source = self.locate("", "statement", access.index)
        self.accesses.append(access)

    # ----- thread-private scalars (T.alloc_local((1,)) / T.alloc_var) --------------------
    def track_local(self, s):
        """Remember ``buf[c] = v`` for thread-private integer buffers so later loads of ``buf[c]`` mean ``v``."""
        data = s.buffer.data
        private = str(s.buffer.scope()) in PRIVATE_SCOPES and scalar_dtype(s.buffer.dtype)[0] in ("int", "uint", "bool")
        if private and len(s.indices) == 1 and isinstance(s.indices[0], tir.IntImm) and scalar_dtype(s.value.dtype)[2] == 1:
            name = user_name(s.buffer.name)
            t = self.reliable(s.value, f"{name}[{s.indices[0]}] = {s.value}", as_bool=str(s.buffer.dtype) == "bool", subject=name)
            key = (data, int(s.indices[0].value))
            if t is None:
                self.memory.forget_element(key)
            else:
                self.memory.remember(key, t)
            return
        self.memory.forget(data)

    # ----- private arrays (see private_arrays) --------------------------------------------
    def set_initialized(self, arrays) -> None:
        """Record which private arrays are fully initialized here; in the second walk, loads
        of those are known to lie in their hull."""
        self.initialized = frozenset(arrays)
        if self.hulls is not None:
            self.memory.set_ranges({d: self.hulls[d] for d in self.initialized if d in self.hulls})

    def collect_content(self, s) -> None:
        """Widen the hull of the array's stored values by this store's value (first walk). A value
        that may lie outside +-2^20, or whose arithmetic may overflow, leaves the array unbounded."""
        data = s.buffer.data
        if data in self.collected and self.collected[data] is None:
            return
        if isinstance(s.value, tir.IntImm):
            lo = hi = int(s.value.value)
        else:
            term = self.enc.encode(s.value)
            ctx = self.context()
            verdict, _ = self.enc.prove_obligations(self.enc.take_obligations(), ctx)
            far = 1 << 20
            if not verdict.proven or any(self.enc.check(ctx + [out]).status != "proven" for out in (term < -far, term > far)):
                self.collected[data] = None
                return
            lo = self.enc.minimize(term, ctx, lo=-far)
            if lo is None:  # the store cannot run
                return
            hi = -self.enc.minimize(-term, ctx, lo=-far)
        old = self.collected.get(data)
        self.collected[data] = (lo, hi) if old is None else (min(old[0], lo), max(old[1], hi))

    def visit_SeqStmt(self, s):
        self.push()
        super().visit_SeqStmt(s)
        self.pop()

    def visit_AttrStmt(self, s):
        self.statement = s
        self.push()
        if s.attr_key == "thread_extent" and isinstance(s.node, tir.IterVar):
            v = s.node.var
            ext = self.reliable(s.value, f"launch extent of {v.name}", subject=v.name)
            t = self.enc.var(v)
            self.add_fact(t >= 0)
            if ext is not None:
                self.add_fact(t < ext)
            self.add_name(v.name, t)
            if str(s.node.thread_tag).startswith("threadIdx"):
                self.enc.launch(str(s.node.thread_tag), t, ext)
        elif s.attr_key == "tl.assume" and isinstance(s.node, tvm.ir.PrimExpr) and str(s.node) in self.host_checked:
            # a program's T.assume over the kernel's parameters: the launcher checks it (the
            # host assert TileLang made of it), so the kernel only runs where it holds
            c = self.reliable(s.node, "T.assume condition", as_bool=True)
            if c is not None:
                self.add_fact(c)
        else:
            self.visit_expr(s.value) if isinstance(s.value, tvm.ir.PrimExpr) else None
        self.visit(s.body)
        self.pop()

    def visit_For(self, s):
        self.statement = s
        self.visit_expr(s.min)
        self.visit_expr(s.extent)
        stored = _stored_data_vars(s.body)
        sums = {d: (buf, lo_step, hi_step, self.scalar_value(buf)) for d, (buf, lo_step, hi_step) in accumulators(s).items()}
        self.memory.forget(stored)
        self.push()
        v = self.enc.var(s.loop_var)
        lo = self.reliable(s.min, f"loop start of {s.loop_var.name}", subject=s.loop_var.name)
        ext = self.reliable(s.extent, f"loop extent of {s.loop_var.name}", subject=s.loop_var.name)
        if lo is not None:
            self.add_fact(v >= lo)
            if ext is not None:
                self.add_fact(v < lo + ext)
        plain_step = unit_step(s)
        if not plain_step and lo is not None:
            k = z3.Int(f"{s.loop_var.name}!iter", self.enc.ctx)
            st = self.reliable(s.step, f"loop step of {s.loop_var.name}", subject=s.loop_var.name)
            if st is not None:
                self.add_fact(k >= 0)
                self.add_fact(v == lo + k * st)
        self.add_name(s.loop_var.name, v)
        if lo is not None and plain_step:
            self.bound_sums(sums, v - lo)
        outside = self.initialized
        self.loops.append(s.loop_var.name)
        self.visit(s.body)
        self.loops.pop()
        self.pop()
        self.memory.forget(stored)
        if ext is not None and plain_step:
            self.bound_sums(sums, z3.If(ext > 0, ext, 0))
        self.set_initialized(outside | set(initialized_by(s, self.arrays)))

    def scalar_value(self, buf):
        """The term of what private scalar ``buf`` holds here (tracked, or a fixed unknown)."""
        known = self.memory.values.get((buf.data, 0))
        return known_term(known) if known is not None else self.unknown_scalar(buf)

    def unknown_scalar(self, buf):
        """A fresh value for private scalar ``buf``, remembered as what it holds from here on."""
        value = self.enc.opaque_load(tir.BufferLoad(buf, [tir.IntImm("int32", 0)])).term
        self.memory.remember((buf.data, 0), value)
        return value

    def bound_sums(self, sums: dict, steps) -> None:
        """After ``steps`` iterations of a loop, each of its accumulators (``tlx.ir.facts.
        accumulators``) holds its entry value moved by ``[lo * steps, hi * steps]``: a fresh value
        so bounded stands for it (inside the loop, at the start of iteration ``steps``)."""
        for buf, lo_step, hi_step, entry in sums.values():
            value = self.unknown_scalar(buf)
            self.add_fact(value >= entry + lo_step * steps)
            self.add_fact(value <= entry + hi_step * steps)

    def visit_IfThenElse(self, s):
        self.statement = s
        self.visit_expr(s.condition)
        c = self.reliable(s.condition, f"condition {s.condition}", as_bool=True)
        before = self.memory.snapshot()
        outside = self.initialized
        self.push([c] if c is not None else [])
        self.visit(s.then_case)
        self.pop()
        self.set_initialized(outside)
        after_then = self.memory.restore(before)
        if s.else_case is not None:
            self.push([z3.Not(c)] if c is not None else [])
            self.visit(s.else_case)
            self.pop()
            self.set_initialized(outside)
        after_else = self.memory.restore(before)
        stored = _stored_data_vars(s.then_case) | (_stored_data_vars(s.else_case) if s.else_case is not None else set())
        self.memory.forget(stored)
        if c is not None:
            self.join_branches(c, stored, after_then, after_else)
        self.note_guard(s, s.condition, s.then_case, c)

    def join_branches(self, cond, stored, after_then: dict, after_else: dict) -> None:
        """After an ``if``, a private scalar that a branch stored holds ``If(cond, its value at the
        end of the then branch, its value at the end of the else branch)``; a branch at whose end
        it is not tracked leaves some fixed unknown value (a fresh term, as for an untracked load)."""
        for key in set(after_then) | set(after_else):
            data, index = key
            buf = self.buffers.get(data)
            if buf is None or not isinstance(index, int) or not any(data.same_as(d) for d in stored):
                continue
            sides = [None if known.get(key) is None else known_term(known[key]) for known in (after_then, after_else)]
            if None in sides:
                if scalar_dtype(buf.dtype)[0] == "bool":
                    continue
                unknown = lambda: self.enc.opaque_load(tir.BufferLoad(buf, [tir.IntImm("int32", index)])).term  # noqa: E731
                sides = [v if v is not None else unknown() for v in sides]
            if sides[0].sort() == sides[1].sort():
                self.memory.remember(key, z3.If(cond, sides[0], sides[1]))

    def visit_While(self, s):
        self.statement = s
        stored = _stored_data_vars(s.body)
        self.memory.forget(stored)
        self.visit_expr(s.condition)
        c = self.reliable(s.condition, "while condition", as_bool=True)
        outside = self.initialized
        self.push([c] if c is not None else [])
        self.visit(s.body)
        self.pop()
        self.set_initialized(outside)
        self.memory.forget(stored)

    def visit_Bind(self, s):
        self.statement = s
        if str(s.var.dtype) == "handle":
            if not self.note_alias(s):
                self.opaque_pointers.add(s.var)
            elif not (isinstance(s.value, tir.Call) and op_name(s.value) == "tirx.handle_add_byte_offset"):
                self.program_views.add(s.var)
            return
        self.visit_expr(s.value)
        t = self.reliable(s.value, f"binding of {s.var.name}", subject=s.var.name)
        if t is not None and z3.is_bool(t) == (str(s.var.dtype) == "bool"):
            self.add_fact(self.enc.var(s.var) == t)
            # A value loaded through the variable (``end = cu[b + 1]``) shows in counterexamples, and
            # one the kernel computed into its own memory still makes a refutation unknown.
            self.enc.define(s.var, t)
            self.add_name(s.var.name, self.enc.var(s.var))

    def visit_AssertStmt(self, s):
        self.statement = s
        self.visit_expr(s.condition)
        c = self.reliable(s.condition, "assert condition", as_bool=True)
        if c is not None:
            self.add_fact(c)

    def visit_Evaluate(self, s):
        self.statement = s
        self.visit_expr(s.value)
        self.memory.forget(_stored_data_vars(s))

    def visit_BufferStore(self, s):
        self.statement = s
        for i in s.indices:
            self.visit_expr(i)
        self.visit_expr(s.value)
        self.check_access(s.buffer, list(s.indices), "store", s.predicate)
        self.track_local(s)
        if self.hulls is None and s.buffer.data in self.arrays:
            self.collect_content(s)


def _first_store(s):
    """``s`` if it is a store, else the first store inside it (a guard's body), else None."""
    if s is None or isinstance(s, tir.BufferStore):
        return s
    found = []
    tir.stmt_functor.post_order_visit(s, lambda n: found.append(n) if isinstance(n, tir.BufferStore) else None)
    return found[0] if found else None


def _for_header(s) -> str:
    return f"for {s.loop_var.name} in range({s.min}, {s.min} + {s.extent})"


def _attr_header(s) -> str:
    node = s.node.var.name if isinstance(s.node, tir.IterVar) else type(s.node).__name__
    return f"attr {s.attr_key} of {node} = {s.value}"


# how each kind of device statement is named in one line (a compound statement by its header)
_STATEMENT_HEADERS = {
    tir.BufferStore: lambda s: f"{s.buffer.name}[{', '.join(str(i) for i in s.indices)}] = {s.value}",
    tir.For: _for_header,
    tir.IfThenElse: lambda s: f"if {s.condition}",
    tir.While: lambda s: f"while {s.condition}",
    tir.AttrStmt: _attr_header,
    tir.Bind: lambda s: f"{s.var.name} = {s.value}",
    tir.AssertStmt: lambda s: f"assert {s.condition}",
    tir.Evaluate: lambda s: str(s.value),
}


def _statement_text(s, limit: int = 160) -> str:
    """One line naming a device statement (a compound statement by its header only)."""
    header = _STATEMENT_HEADERS.get(type(s))
    text = " ".join((header(s) if header else type(s).__name__).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _stored_data_vars(stmt) -> set:
    """Data variables of buffers stored to, or passed by pointer (a handle, or ``address_of`` an
    element), anywhere in ``stmt``."""
    out = set()

    def visit(n):
        if isinstance(n, tir.BufferStore):
            out.add(n.buffer.data)
        elif isinstance(n, tir.Var) and str(n.dtype) == "handle":
            out.add(n)
        elif (isinstance(n, tir.Call) and op_name(n) == "tirx.address_of"
              and isinstance(n.args[0], tir.BufferLoad)):
            out.add(n.args[0].buffer.data)

    tir.stmt_functor.post_order_visit(stmt, visit)
    return out


def _is_bound_guard(cond, guarded) -> bool:
    """A bound-check guard: pure arithmetic ordering tests (``<``, ``<=``, ``>``, ``>=``, ``and``)
    around code that touches global memory (what ``LegalizeSafeMemoryAccess`` inserts).
    Equality tests and warp-role tests without global accesses are not guards."""
    if not arith_only(cond):
        return False
    ordered = [True]

    def visit_cond(n):
        if isinstance(n, (tir.EQ, tir.NE, tir.Or, tir.Not)):
            ordered[0] = False

    tir.stmt_functor.post_order_visit(tir.Evaluate(cond), visit_cond)
    if not ordered[0]:
        return False
    touches = [False]

    def visit_body(n):
        if isinstance(n, (tir.BufferLoad, tir.BufferStore)) and str(n.buffer.scope()) == "global":
            touches[0] = True

    body = guarded if isinstance(guarded, tir.Stmt) else tir.Evaluate(guarded)
    tir.stmt_functor.post_order_visit(body, visit_body)
    return touches[0]


# --------------------------------------------------------------------------------------
# Entry points
# --------------------------------------------------------------------------------------


def verify_kernel(
    kernel: LoweredKernel,
    assume=(),
    extra_conditions=(),
    rlimit: int = DEFAULT_RLIMIT,
    prove_guards: bool = False,
    source_map=None,
    focus: tuple | None = None,
    least_of: str | None = None,
    hulls: dict | None = None,
) -> BoundsReport:
    """Verify every access of ``kernel``'s device functions.

    ``assume`` are the user's condition strings; ``extra_conditions`` are TIR conditions
    (derived preconditions). With ``prove_guards`` the report also lists the bound-check
    guards that always hold (``proven_guards``). ``hulls``: an earlier report's ``hulls`` of
    the same kernel (saves the walk that collects them).
    """
    t0 = time.perf_counter()
    source_map = source_map or (lambda name, kind, index="": "unknown line")
    walk = lambda hulls: _walk_kernel(kernel, assume, extra_conditions, rlimit, prove_guards, source_map, focus, least_of, hulls)  # noqa: E731
    queries = used = 0
    walked = hulls is None
    if walked:
        enc, walkers = walk(None)
        hulls = {name: {d: h for d, h in w.collected.items() if h is not None} for name, w in walkers.items()}
        queries, used = enc.queries, enc.rlimit_used
    if any(hulls.values()) or not walked:
        # (Again) from a fresh solver, knowing where the bounded private arrays' elements lie:
        # the same queries as a single walk, plus those facts.
        enc, walkers = walk(hulls)
        enc.queries += queries
        enc.rlimit_used += used
    accesses = [a for w in walkers.values() for a in w.accesses]
    proven = {node: met for w in walkers.values() for node, met in w.proven_guards().items()}
    seen = sum(w.guards_seen for w in walkers.values())
    own_hulls = walked or not any(w.arrays for w in walkers.values())
    return BoundsReport(kernel.name, accesses, time.perf_counter() - t0, enc.queries, enc.rlimit_used,
                        {"seen": seen, "removed": sum(proven.values())}, hulls=hulls, proven_guards=set(proven),
                        conditions=tuple(extra_conditions), own_hulls=own_hulls)


def _walk_kernel(kernel, assume, extra_conditions, rlimit, prove_guards, source_map, focus, least_of, hulls):
    """One walk over every device function with a fresh encoder. ``hulls`` (function name ->
    private array -> (lo, hi)) is None in the first walk, which collects them."""
    enc = Encoder(rlimit=rlimit)
    variables, terms = shape_setup(enc, kernel, tuple(assume), list(extra_conditions))
    walkers = {}
    host_checked = launcher_checks(kernel)
    for name, f in device_functions(kernel.device_mod):
        bind_params(enc, f, variables)
        w = _Walker(enc, name, terms, prove_guards, source_map, focus, least_of, candidate_arrays(f),
                    None if hulls is None else hulls.get(name, {}))
        enc.know(function_facts(f), w.memory)
        w.buffers.update(param_buffers(kernel, f))
        w.host_checked = host_checked
        w.visit(f.body)
        walkers[name] = w
    return enc, walkers


def format_violation(a: CheckedAccess) -> str:
    cex = ", ".join(f"{k}={v}" for k, v in a.counterexample.items())
    return f"{a.func}: {a.kind} {a.buffer}[{a.index}] ({a.scope}, extent {a.extent}) at {a.source}: {a.detail}; counterexample: {cex}"
