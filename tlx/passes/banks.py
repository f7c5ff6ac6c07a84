"""Shared-memory bank-conflict degree of every thread-level shared access, with witnesses.

Hardware model (sm_80 / sm_90 LSU path), stated once here because every figure depends on it:

* Shared memory has 32 banks of 4-byte words; word ``w`` lives in bank ``w % 32``.
* A warp's access is served in *phases* that each move at most 128 bytes: accesses of
  at most 4 bytes per lane form one phase of 32 lanes; 8-byte accesses two phases
  (lanes 0-15, 16-31); 16-byte accesses four phases of 8 lanes. ``ldmatrix`` /
  ``stmatrix`` ``.xN`` take one 16-byte row address from each of the first ``8N``
  lanes, served in ``N`` phases of 8 lanes.
* Within one phase, lanes reading the same word are served together (broadcast);
  distinct words in the same bank are serialized. The phase's *degree* is the largest
  number of distinct words that fall in one bank; the instruction's degree is the
  largest phase degree. Degree 1 means conflict-free. Nsight Compute's
  ``l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_{ld,st}`` counts, per executed
  warp instruction, ``sum over phases of (degree - 1)``.
* Inactive lanes (enclosing conditions false, threads past the block size) take no part.

The degree of one instruction is the maximum over every warp, block, loop iteration
and shape allowed. It is found exactly with Z3: a model gives one execution context,
all 32 lanes are evaluated in it, then Z3 is asked for a context with one more word in
a single bank; when that is unsatisfiable the degree is proven maximal.

The walker here (:func:`collect_program`) also serves the race and vector analyses:
it lists every memory access of the device kernels with its thread/loop/condition
context and, for shared memory, its byte address in the block's shared space.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import z3

from tilelang import tvm
from tlx.ir.tir import const_int, elem_bytes, free_vars
from tlx.lowering import LoweredKernel
from tlx.passes import PassContext
from tlx.passes.smt import Encoder, kernel_encoder

tir = tvm.tirx

__all__ = ["Access", "Program", "bank_conflicts", "banks_report", "collect_program", "count_conflicts", "predict_ncu"]

SHARED_SCOPES = ("shared", "shared.dyn")
_BARRIER_CALLS = ("tirx.tvm_storage_sync",)


@dataclass
class Access:
    """One memory access statement of a device kernel, in its context.

    ``index`` is in elements of ``dtype`` (possibly a ``Ramp``), ``width`` the bytes one
    lane touches, ``base_bytes`` the byte offset of the buffer inside its root
    allocation (``root``), so ``base_bytes + index * elem_bytes`` is comparable between
    buffers carved out of one merged shared allocation.
    """

    buffer: str
    root: Any
    scope: str
    dtype: str
    index: Any
    lanes: int
    width: int
    base_bytes: int
    read: bool
    write: bool
    op: str
    conds: list
    loops: list
    epoch: Any
    commits: Any
    order: int
    text: str
    is_async: bool = False
    phase_lanes: int | None = None  # ldmatrix-style: lanes that supply addresses
    exact: bool = True  # False when the index reads memory or calls something opaque
    extent_elems: int = 1  # elements touched per lane (for pointer-style accesses)


@dataclass
class Wait:
    """``cp.async.wait_group(n)``: every commit group but the newest ``n`` has landed."""

    n: int
    conds: list
    loops: list
    epoch: Any
    commits: Any
    order: int


@dataclass
class Program:
    """Everything the layout analyses need from one device kernel."""

    name: str
    threads: list  # (var, extent) for threadIdx.x/y/z, in that order
    blocks: list  # (var, extent) for blockIdx.*
    accesses: list[Access] = field(default_factory=list)
    waits: list[Wait] = field(default_factory=list)
    opaque: list[str] = field(default_factory=list)  # shared accesses no analysis can see
    divergent_barriers: list[str] = field(default_factory=list)
    calls: set = field(default_factory=set)  # every intrinsic called, for sync primitives no model covers

    @property
    def block_threads(self) -> int:
        n = 1
        for _, e in self.threads:
            n *= e
        return n


def _scope_of(var) -> str:
    ta = getattr(var, "type_annotation", None)
    return str(getattr(ta, "storage_scope", "")) if ta is not None else ""


def _depends_on(expr, vars_) -> bool:
    found = False
    names = set(vars_)

    def visit(n):
        nonlocal found
        if isinstance(n, tir.Var) and n in names:
            found = True

    tir.stmt_functor.post_order_visit(tir.Evaluate(expr) if isinstance(expr, tir.PrimExpr) else expr, visit)
    return found


def _reads_memory(expr) -> bool:
    found = False

    def visit(n):
        nonlocal found
        if isinstance(n, tir.BufferLoad):
            found = True
        elif isinstance(n, tir.Call) and hasattr(n.op, "name"):
            if str(n.op.name) not in ("tirx.if_then_else", "tirx.likely", "tirx.bitwise_and", "tirx.bitwise_or", "tirx.bitwise_xor", "tirx.shift_left", "tirx.shift_right", "tirx.bitwise_not"):
                found = True

    tir.stmt_functor.post_order_visit(tir.Evaluate(expr), visit)
    return found


class _Walker:
    """Program-order walk that tracks threads, loops, conditions, bindings and barrier counts."""

    def __init__(self, name: str):
        self.prog = Program(name, [], [])
        self.thread_ext: dict[str, tuple[Any, int]] = {}
        self.lets: dict = {}
        self.roots: dict = {}  # data var -> (root var, byte offset)
        self.loops: list = []
        self.conds: list = []
        self.epoch = tir.IntImm("int32", 0)
        self.commits = tir.IntImm("int32", 0)
        self.order = 0

    # -- helpers
    def sub(self, e):
        return tir.stmt_functor.substitute(e, self.lets) if self.lets else e

    def thread_vars(self):
        return [v for v, _ in self.prog.threads]

    def root_of(self, data):
        return self.roots.get(data, (data, 0))

    def _next(self):
        self.order += 1
        return self.order

    # -- counting barriers / commits of a statement (for loop bodies and branches)
    def count(self, stmt) -> tuple[Any, Any]:
        syncs, commits = tir.IntImm("int32", 0), tir.IntImm("int32", 0)
        if isinstance(stmt, tir.SeqStmt):
            for s in stmt.seq:
                a, b = self.count(s)
                syncs, commits = syncs + a, commits + b
            return syncs, commits
        if isinstance(stmt, tir.For):
            a, b = self.count(stmt.body)
            return a * stmt.extent, b * stmt.extent
        if isinstance(stmt, tir.IfThenElse):
            a1, b1 = self.count(stmt.then_case)
            a2, b2 = self.count(stmt.else_case) if stmt.else_case is not None else (syncs, commits)
            c = self.sub(stmt.condition)
            if _depends_on(c, self.thread_vars()) and not (_is_zero(a1) and _is_zero(a2)):
                self.prog.divergent_barriers.append(str(stmt.condition))
            return tir.Select(c, a1, a2), tir.Select(c, b1, b2)
        if isinstance(stmt, tir.Evaluate) and isinstance(stmt.value, tir.Call) and hasattr(stmt.value.op, "name"):
            name = str(stmt.value.op.name)
            if name in _BARRIER_CALLS and _is_block_barrier(stmt.value):
                return tir.IntImm("int32", 1), commits
            if name == "tirx.ptx_commit_group":
                return syncs, tir.IntImm("int32", 1)
        if hasattr(stmt, "body") and isinstance(getattr(stmt, "body"), tir.Stmt):
            return self.count(stmt.body)
        return syncs, commits

    # -- statements
    def stmt(self, s):
        if isinstance(s, tir.SeqStmt):
            for x in s.seq:
                self.stmt(x)
        elif isinstance(s, tir.AttrStmt):
            if s.attr_key == "thread_extent":
                iv = s.node
                tag, ext = str(iv.thread_tag), const_int(s.value)
                if tag.startswith("threadIdx"):
                    self.thread_ext[tag] = (iv.var, ext)
                elif tag.startswith("blockIdx"):
                    self.prog.blocks.append((iv.var, ext if ext is not None else s.value))
            self.stmt(s.body)
        elif isinstance(s, tir.Bind):
            self.lets[s.var] = self.sub(s.value)
            self.note_root(s.var, s.value)
        elif isinstance(s, tir.For):
            base_e, base_c = self.epoch, self.commits
            body_e, body_c = self.count(s.body)
            it = s.loop_var - s.min
            self.loops.append((s.loop_var, self.sub(s.min), self.sub(s.extent)))
            self.epoch, self.commits = base_e + it * body_e, base_c + it * body_c
            self.stmt(s.body)
            self.loops.pop()
            self.epoch, self.commits = base_e + s.extent * body_e, base_c + s.extent * body_c
        elif isinstance(s, tir.IfThenElse):
            c = self.sub(s.condition)
            self.exprs([c])
            base_e, base_c = self.epoch, self.commits
            self.conds.append(c)
            self.stmt(s.then_case)
            self.conds.pop()
            if s.else_case is not None:
                self.epoch, self.commits = base_e, base_c
                self.conds.append(tir.Not(c))
                self.stmt(s.else_case)
                self.conds.pop()
            a1, b1 = self.count(s.then_case)
            a2, b2 = self.count(s.else_case) if s.else_case is not None else (tir.IntImm("int32", 0),) * 2
            self.epoch, self.commits = base_e + tir.Select(c, a1, a2), base_c + tir.Select(c, b1, b2)
        elif isinstance(s, tir.BufferStore):
            self.exprs([s.value] + list(s.indices))
            self.buffer_access(s.buffer, s.indices, s.value.dtype, read=False, write=True, op="store", text=f"{s.buffer.name}[{', '.join(map(str, s.indices))}] = {s.value}")
        elif isinstance(s, tir.Evaluate):
            self.evaluate(s.value)
        elif isinstance(s, tir.While):
            self.prog.opaque.append("while loop (not modelled)")
        elif isinstance(s, (tir.AllocBuffer, tir.DeclBuffer)):
            buf = s.buffer
            if buf.data not in self.roots:
                self.roots.setdefault(buf.data, self.root_of(buf.data))
        elif hasattr(s, "body") and isinstance(getattr(s, "body"), tir.Stmt):
            self.stmt(s.body)

    def note_root(self, var, value):
        if isinstance(value, tir.Call) and hasattr(value.op, "name") and str(value.op.name) == "tirx.handle_add_byte_offset":
            data, off = value.args[0], const_int(value.args[1])
            if off is not None:
                root, base = self.root_of(data)
                self.roots[var] = (root, base + off)

    def finish_threads(self):
        self.prog.threads = [self.thread_ext[t] for t in ("threadIdx.x", "threadIdx.y", "threadIdx.z") if t in self.thread_ext]

    def context(self):
        return list(self.conds), list(self.loops), self.epoch, self.commits

    def buffer_access(self, buf, indices, dtype, read, write, op, text):
        scope = buf.scope()
        if len(indices) != 1:
            return
        index = self.sub(indices[0])
        lanes = int(index.lanes) if isinstance(index, tir.Ramp) else 1
        if isinstance(index, tir.Ramp) and const_int(index.stride) != 1:
            lanes = 1  # a strided vector is emitted lane by lane; the Ramp is kept as one access
        root, base = self.root_of(buf.data)
        conds, loops, epoch, commits = self.context()
        eb = elem_bytes(buf.dtype)
        self.prog.accesses.append(
            Access(buf.name, root, scope, str(buf.dtype), index, lanes, eb * lanes, base, read, write, op, conds, loops, epoch, commits, self._next(), text[:200], exact=not _reads_memory(index))
        )

    def exprs(self, es):
        """Loads inside expressions are reads; calls inside them handed shared pointers are accesses too."""
        loads, calls = [], []

        def visit(n):
            if isinstance(n, tir.BufferLoad):
                loads.append(n)
            elif isinstance(n, tir.Call) and hasattr(n.op, "name") and str(n.op.name) != "tirx.tvm_access_ptr":
                calls.append(n)

        for e in es:
            tir.stmt_functor.post_order_visit(tir.Evaluate(e), visit)
        for ld in loads:
            self.buffer_access(ld.buffer, ld.indices, ld.dtype, read=True, write=False, op="load", text=str(ld))
        for c in calls:
            self.call_pointers(c)

    def call_pointers(self, call):
        name = str(call.op.name)
        self.prog.calls.add(name)
        if name == "tirx.call_extern" and call.args and isinstance(call.args[0], tir.StringImm):
            name = str(call.args[0].value)
        ptrs = [a for a in call.args if isinstance(a, tir.Call) and hasattr(a.op, "name") and str(a.op.name) == "tirx.tvm_access_ptr"]
        shared_ptrs = [p for p in ptrs if _scope_of(p.args[1]) in SHARED_SCOPES]
        for p in shared_ptrs:
            self.pointer_access(name, call, p)
        if not shared_ptrs and any(_scope_of(a) in SHARED_SCOPES for a in _handle_args(call)):
            self.prog.opaque.append(f"{name} touches shared memory through a descriptor or raw handle")

    def evaluate(self, call):
        if not isinstance(call, tir.Call) or not hasattr(call.op, "name"):
            self.exprs([call])
            return
        name = str(call.op.name)
        self.prog.calls.add(name)
        if name in _BARRIER_CALLS:
            if _is_block_barrier(call):
                self.epoch = self.epoch + 1
            else:
                self.prog.opaque.append(f"partial barrier {call} (not modelled)")
            return
        if name == "tirx.ptx_commit_group":
            self.commits = self.commits + 1
            return
        if name == "tirx.ptx_wait_group":
            conds, loops, epoch, commits = self.context()
            self.prog.waits.append(Wait(int(const_int(call.args[0])), conds, loops, epoch, commits, self._next()))
            return
        self.exprs([call])

    def pointer_access(self, name, call, ptr):
        _, data, offset, extent, mask = ptr.args
        dtype = ptr.args[0].dtype
        root, base = self.root_of(data)
        conds, loops, epoch, commits = self.context()
        eb = elem_bytes(dtype)
        offset = self.sub(offset)
        rw = const_int(mask) or 3
        ext = const_int(extent)
        short = name.split(".")[-1]
        common = dict(conds=conds, loops=loops, epoch=epoch, commits=commits, order=self._next(), text=f"{short}(...{data.name}[{offset}]...)"[:200])
        if short in ("ptx_ldmatrix", "ptx_stmatrix"):
            num = const_int(call.args[1])
            self.prog.accesses.append(
                Access(data.name, root, _scope_of(data), str(dtype), offset, 1, 16, base, short == "ptx_ldmatrix", short == "ptx_stmatrix", short, phase_lanes=8 * (num or 4), exact=not _reads_memory(offset), extent_elems=16 // eb, **common)
            )
        elif short == "ptx_cp_async":
            nbytes = const_int(call.args[2]) if len(call.args) > 2 else None
            width = nbytes if nbytes is not None else eb * (ext or 1)
            self.prog.accesses.append(
                Access(data.name, root, _scope_of(data), str(dtype), offset, 1, width, base, False, True, short, is_async=True, exact=not _reads_memory(offset), extent_elems=max(width // eb, 1), **common)
            )
        else:
            # Any other call handed a shared pointer (library collectives, TMA, ...): it may read and
            # write its whole range from every thread, and no bank model applies.
            self.prog.accesses.append(
                Access(data.name, root, _scope_of(data), str(dtype), offset, 1, eb * (ext or 1), base, bool(rw & 1), bool(rw & 2), short, is_async=short.startswith("tma") or "bulk" in short, exact=False, extent_elems=ext or 1, **common)
            )


def _handle_args(call):
    out = []
    for a in call.args:
        if isinstance(a, tir.Var):
            out.append(a)
    return out


def _is_zero(e) -> bool:
    return const_int(e) == 0


def _is_block_barrier(call) -> bool:
    """``tvm_storage_sync("shared")`` with no barrier id/count is ``__syncthreads()``."""
    return len(call.args) == 1


def collect_program(kernel: LoweredKernel) -> list[Program]:
    """Walk every device function of ``kernel`` into a :class:`Program`."""
    progs = []
    for gv, fn in kernel.device_mod.functions.items():
        if not isinstance(fn, tir.PrimFunc):
            continue
        w = _Walker(gv.name_hint)
        # thread extents are known before the body is walked: collect them first
        def visit(n):
            if isinstance(n, tir.AttrStmt) and n.attr_key == "thread_extent":
                tag = str(n.node.thread_tag)
                if tag.startswith("threadIdx"):
                    w.thread_ext[tag] = (n.node.var, const_int(n.value))

        tir.stmt_functor.post_order_visit(fn.body, visit)
        w.finish_threads()
        w.stmt(fn.body)
        progs.append(w.prog)
    return progs


# ----- per-warp encoding ------------------------------------------------------------------------


def context_facts(enc: Encoder, prog: Program, acc) -> list:
    """Ranges of blocks and the loops around ``acc`` (shared by all lanes of a warp)."""
    facts = []
    for v, ext in prog.blocks:
        facts += enc.range_facts(v, 0, ext)
    for v, lo, ext in acc.loops:
        facts += enc.range_facts(v, lo, ext)
    return facts


def _phase(acc) -> tuple[int, int]:
    """(lanes per phase, lanes that take part) for this access under the model above."""
    if acc.phase_lanes is not None:
        return 8, acc.phase_lanes
    if acc.width <= 4:
        return 32, 32
    if acc.width == 8:
        return 16, 32
    return 8, 32


def _lane_split(prog: Program, acc: Access, ana):
    """(warp var, lane-bit vars, address expr, active expr) with thread ids rewritten per warp and lane bit.

    Writing the lane as five 0/1 variables lets TVM's simplifier turn ``tx % 64 // 32``
    and friends into single bits, which keeps the many-lane Z3 queries small.
    """
    nwarps = max((prog.block_threads + 31) // 32, 1)
    warp_bits = [tir.Var(f"warp.b{i}", "int32") for i in range((nwarps - 1).bit_length())]
    bits = [tir.Var(f"lane.b{i}", "int32") for i in range(5)]
    for b in bits + warp_bits:
        ana.bind(b, tvm.ir.Range(0, 2))
    lane = bits[0] + bits[1] * 2 + bits[2] * 4 + bits[3] * 8 + bits[4] * 16
    warp = tir.IntImm("int32", 0)
    for i, b in enumerate(warp_bits):
        warp = warp + b * (1 << i)
    tid = warp * 32 + lane
    sub, stride = {}, 1
    for v, ext in prog.threads:
        sub[v] = tir.floormod(tir.floordiv(tid, stride), ext)
        stride *= ext
    index = acc.index.base if isinstance(acc.index, tir.Ramp) else acc.index
    addr = ana.simplify(ana.simplify(tir.stmt_functor.substitute(index, sub) * elem_bytes(acc.dtype) + acc.base_bytes))
    # word = hi * 32 + lo // 4: the bank depends on ``lo`` only, and both halves simplify further.
    hi, lo = (ana.simplify(ana.simplify(op(addr, 128))) for op in (tir.floordiv, tir.floormod))
    active = ana.simplify(tir.stmt_functor.substitute(tir.all(*acc.conds), sub)) if acc.conds else tir.const(True)
    return warp, bits, hi, lo, active


def bank_conflicts(enc: Encoder, prog: Program, acc: Access) -> dict:
    """Exact worst-case conflict degree of one shared access for one warp, with a witness."""
    per_phase, participating = _phase(acc)
    nthreads = prog.block_threads
    ctx = enc.ctx
    ana = tvm.arith.Analyzer()
    for v, lo, ext in acc.loops:
        if const_int(lo) is not None and const_int(ext) is not None:
            ana.bind(v, tvm.ir.Range.from_min_extent(const_int(lo), const_int(ext)))
    for v, ext in prog.blocks:
        if const_int(ext) is not None:
            ana.bind(v, tvm.ir.Range(0, const_int(ext)))
    warp_v, bits, hi, lo, active = _lane_split(prog, acc, ana)
    warp = enc.encode(warp_v)
    warp_bits = [enc.var(v) for v in free_vars(warp_v)]
    base = [c for b in warp_bits for c in (b >= 0, b <= 1)] + [warp * 32 < nthreads] + context_facts(enc, prog, acc)
    words_per_lane = max(acc.width // 4, 1)
    zero, one = z3.IntVal(0, ctx), z3.IntVal(1, ctx)
    lane_terms = []
    for lane in range(32):
        env = {b: (one if (lane >> i) & 1 else zero) for i, b in enumerate(bits)}
        live = z3.And(enc.encode_bool(active, env), warp * 32 + lane < nthreads) if lane < participating else z3.BoolVal(False, ctx)
        lane_terms.append((enc.encode(hi, env) * 128 + enc.encode(lo, env), live))
    enc.take_obligations()
    result = {"buffer": acc.buffer, "op": acc.op, "width_bytes": acc.width, "statement": acc.text, "lanes_per_phase": per_phase, "exact": acc.exact}

    v = enc.check(base + [z3.Or([live for _, live in lane_terms])])
    if v.status != "violation":
        result.update(degree=0 if v.status == "proven" else None, status="unreachable" if v.status == "proven" else "unknown")
        return result
    ctx_terms = [("warp", warp)] + [(str(b.name), enc.var(b)) for b, _ in prog.blocks] + [(str(lv.name), enc.var(lv)) for lv, _, _ in acc.loops]
    best, witness = _degree_in(enc, v.model, lane_terms, per_phase, words_per_lane, ctx_terms)
    status = "proven"
    phase_bits = per_phase.bit_length() - 1
    while best < per_phase:
        k = best + 1
        copies = [[z3.Int(f"l{i}.b{j}@{acc.order}", ctx) for j in range(5)] for i in range(k)]
        os_ = [z3.Int(f"o{i}@{acc.order}", ctx) for i in range(k)]
        words, lanes, banks = [], [], []
        cons = list(base)
        for i, (lb, oi) in enumerate(zip(copies, os_, strict=True)):
            env = dict(zip(bits, lb, strict=True))
            li = z3.Sum([b * (1 << j) for j, b in enumerate(lb)])
            lanes.append(li)
            cons += [c for b in lb for c in (b >= 0, b <= 1)]
            cons += [oi >= 0, oi < words_per_lane, li < participating, warp * 32 + li < nthreads, enc.encode_bool(active, env)]
            cons += [lb[j] == copies[0][j] for j in range(phase_bits, 5)]  # same phase
            bank = enc.encode(lo, env) / 4 + oi
            w = enc.encode(hi, env) * 32 + bank
            words.append(w)
            banks.append(bank)
            if i:
                cons += [words[i - 1] < w, bank % 32 == banks[0] % 32]
        enc.take_obligations()
        v = enc.check(cons)
        if v.status == "proven":
            break
        if v.status == "unknown":
            status = "unknown"
            break
        got, wit = _degree_in(enc, v.model, lane_terms, per_phase, words_per_lane, ctx_terms)
        if got < k:  # cannot happen when both evaluations agree; keep the symbolic witness then
            got, wit = k, {"lanes": [enc.model_value(v.model, x) for x in lanes], "words": [enc.model_value(v.model, x) for x in words], "context": wit["context"]}
        best, witness = got, wit
    result.update(degree=best, status=status)
    if best > 1:
        result["witness"] = witness
    return result


def _degree_in(enc, model, lane_terms, per_phase, words_per_lane, ctx_terms):
    """Evaluate all 32 lanes in the model's context; the worst bank of the worst phase."""
    addrs = []
    for addr, live in lane_terms:
        on = enc.model_value(model, live)
        addrs.append(enc.model_value(model, addr) if on else None)
    best, witness = 0, None
    for p in range(0, 32, per_phase):
        banks: dict[int, dict[int, list[int]]] = {}
        for lane in range(p, p + per_phase):
            a = addrs[lane]
            if a is None:
                continue
            for o in range(words_per_lane):
                w = a // 4 + o
                banks.setdefault(w % 32, {}).setdefault(w, []).append(lane)
        for bank, words in banks.items():
            if len(words) > best:
                best = len(words)
                witness = {"bank": bank, "lanes": [ls[0] for ls in words.values()], "byte_addresses": [addrs[ls[0]] for ls in words.values()]}
    ctx = {name: enc.model_value(model, t) for name, t in ctx_terms}
    if witness is not None:
        witness["context"] = ctx
    return best, witness or {"context": ctx}


# ----- the pass -------------------------------------------------------------------------------

BANK_OPS = ("load", "store", "ptx_ldmatrix", "ptx_stmatrix")


def banks_report(kernel: LoweredKernel, programs: list[Program] | None = None, budget: int | None = None, assume=()) -> dict:
    """Conflict degree of every thread-level shared load/store/ldmatrix/stmatrix of ``kernel``.

    ``budget`` caps the Z3 resource units for the whole kernel; accesses left when it is
    spent get ``status: "unknown"`` and no degree.
    """
    t0 = time.perf_counter()
    enc = kernel_encoder(kernel, assume)
    entries = []
    for prog in programs or collect_program(kernel):
        for acc in prog.accesses:
            if acc.scope in SHARED_SCOPES and acc.op in BANK_OPS:
                if budget is not None and enc.rlimit_used > budget:
                    entries.append({"buffer": acc.buffer, "op": acc.op, "statement": acc.text, "degree": None, "status": "unknown", "kernel": prog.name, "reason": "kernel budget spent"})
                    continue
                e = bank_conflicts(enc, prog, acc)
                e["kernel"] = prog.name
                entries.append(e)
    worst = sorted((e for e in entries if (e["degree"] or 0) > 1), key=lambda e: -e["degree"])
    summary = [f"{len(entries)} shared accesses, worst conflict degree {max([e['degree'] or 0 for e in entries], default=0)}"]
    summary += [f"{e['degree']}-way {e['op']} `{e['statement'][:80]}`: lanes {e['witness']['lanes'][:8]} in bank {e['witness'].get('bank')}" for e in worst[:5]]
    return {
        "summary": summary,
        "accesses": entries,
        "checked": len(entries),
        "conflicted": sum((e["degree"] or 0) > 1 for e in entries),
        "unknown": sum(e["status"] == "unknown" for e in entries),
        "max_degree": max([e["degree"] or 0 for e in entries], default=0),
        "exit_code": 0,  # conflicts cost time, not correctness
        "model": "32 banks x 4 B; phases of 32/16/8 lanes for <=4/8/16-byte accesses; ldmatrix/stmatrix 8 lanes per matrix",
        "seconds": round(time.perf_counter() - t0, 4),
    }


PASS_BUDGET = 20_000_000
"""Z3 resource units the compile-time pass spends per kernel; ``banks_report`` alone has no cap."""


def banks_pass(kernel: LoweredKernel, ctx: PassContext) -> LoweredKernel:
    """Bank conflicts cost time, not correctness: reported in ``ctx.reports["bank_conflicts"]`` only."""
    ctx.reports["bank_conflicts"] = banks_report(kernel, budget=ctx.options.get("bank_budget", PASS_BUDGET), assume=ctx.options.get("assume", ()))
    return kernel


# ----- totals for Nsight Compute comparison ---------------------------------------------------


def _np_eval(expr, env: dict):
    """Evaluate an integer/boolean TIR expression on numpy arrays (TVM floor semantics = numpy's)."""
    import numpy as np

    e = expr
    if isinstance(e, tir.IntImm):
        return int(e.value)
    if isinstance(e, tir.Var):
        if e not in env:
            raise ValueError(f"count_conflicts: {e.name} has no known range; only constant-extent kernels can be enumerated")
        return env[e]
    ops = {
        tir.Add: np.add, tir.Sub: np.subtract, tir.Mul: np.multiply, tir.FloorDiv: np.floor_divide, tir.FloorMod: np.mod,
        tir.Min: np.minimum, tir.Max: np.maximum, tir.EQ: np.equal, tir.NE: np.not_equal, tir.LT: np.less,
        tir.LE: np.less_equal, tir.GT: np.greater, tir.GE: np.greater_equal, tir.And: np.logical_and, tir.Or: np.logical_or,
    }
    for cls, fn in ops.items():
        if isinstance(e, cls):
            return fn(_np_eval(e.a, env), _np_eval(e.b, env))
    if isinstance(e, tir.Not):
        return np.logical_not(_np_eval(e.a, env))
    if isinstance(e, tir.Select):
        return np.where(_np_eval(e.condition, env), _np_eval(e.true_value, env), _np_eval(e.false_value, env))
    if isinstance(e, tir.Cast):
        return _np_eval(e.value, env)
    if isinstance(e, tir.Call) and str(e.op.name) in ("tirx.if_then_else", "tirx.likely"):
        args = [_np_eval(a, env) for a in e.args]
        return args[0] if len(args) == 1 else np.where(*args)
    raise ValueError(f"count_conflicts: cannot enumerate {type(e).__name__} ({e})")


def count_conflicts(prog: Program, acc: Access) -> dict:
    """Exact totals over every block, warp and loop iteration: executed warp instructions and
    extra phases (``sum(degree - 1)`` per phase), which is what Nsight Compute's bank-conflict
    counters measure. Needs constant extents; meant for validation on small launches.
    """
    import itertools

    import numpy as np

    per_phase, participating = _phase(acc)
    nthreads = prog.block_threads
    words_per_lane = max(acc.width // 4, 1)
    dims = [(v, int(e)) for v, e in prog.blocks] + [(v, int(const_int(ext))) for v, lo, ext in acc.loops if const_int(lo) == 0 and const_int(ext) is not None]
    if len(dims) != len(prog.blocks) + len(acc.loops):
        raise ValueError("count_conflicts: loops with symbolic bounds cannot be enumerated")
    grids = np.meshgrid(*[np.arange(n) for _, n in dims], indexing="ij") if dims else []
    ctx = {v: g.reshape(-1, 1) for (v, _), g in zip(dims, grids, strict=True)}
    n_ctx = grids[0].size if dims else 1
    index = acc.index.base if isinstance(acc.index, tir.Ramp) else acc.index
    executions = extra = 0
    for warp in range((nthreads + 31) // 32):
        lanes = np.arange(32).reshape(1, 32)
        tid = warp * 32 + lanes
        env = dict(ctx)
        stride = 1
        for v, ext in prog.threads:
            env[v] = (tid // stride) % ext
            stride *= ext
        addr = np.broadcast_to(_np_eval(index, env) * elem_bytes(acc.dtype) + acc.base_bytes, (n_ctx, 32))
        live = np.broadcast_to(tid < nthreads, (n_ctx, 32)).copy()
        for c in acc.conds:
            live &= np.broadcast_to(np.asarray(_np_eval(c, env), dtype=bool), (n_ctx, 32))
        live[:, participating:] = False
        for row in range(n_ctx):
            if not live[row].any():
                continue
            executions += 1
            for p in range(0, 32, per_phase):
                banks: dict[int, set] = {}
                for lane, o in itertools.product(range(p, p + per_phase), range(words_per_lane)):
                    if live[row, lane]:
                        w = int(addr[row, lane]) // 4 + o
                        banks.setdefault(w % 32, set()).add(w)
                if banks:
                    extra += max(len(s) for s in banks.values()) - 1
    return {"executions": executions, "extra_phases": extra}


def predict_ncu(kernel: LoweredKernel) -> dict:
    """Predicted ``l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_{ld,st}.sum`` of one launch."""
    out = {"ld": 0, "st": 0}
    for prog in collect_program(kernel):
        for acc in prog.accesses:
            if acc.scope in SHARED_SCOPES and acc.op in BANK_OPS:
                out["ld" if acc.read else "st"] += count_conflicts(prog, acc)["extra_phases"]
    return out
