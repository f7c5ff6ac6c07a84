"""The device program as the layout analyses see it: every memory access of the device kernels
with its thread, loop and condition context and, for shared memory, its byte address in the
block's shared space; plus barriers and ``cp.async`` waits. Bank conflicts, races and vector
legality (``tlx/passes``) all read this one model (:func:`collect_program`).

The async proxy is modelled as TileLang 0.1.15 lowers it for sm_90a: ``tl.tma_load`` writes a
shared range and completes on an mbarrier (:attr:`Access.barrier`); ``tl.ptx_wgmma_ss`` reads
the shared ranges its two wgmma descriptors span (``op="wgmma"``); ``tl.tma_store`` reads its
shared box (``op="tma_store"``); mbarrier init, expect-tx, arrive and parity waits,
``warpgroup_wait``, ``tma_store_wait`` (``bulk_wait``) and ``fence.proxy.async`` are
:class:`SyncOp` s.

The walk is a :class:`~tlx.ir.walk.DeviceWalker` (the bounds verifier's too), and the ranges
of ``cp.async``, ``ldmatrix`` / ``stmatrix`` and pointer-taking calls come from
:func:`~tlx.ir.walk.pointer_uses`. What it cannot read (an unhandled statement, a
multi-index access, a shared pointer at a symbolic byte offset, a while loop, a descriptor
it did not see built) in shared memory goes to :attr:`Program.opaque`, which leaves the race verdict unknown;
what it did not read at all is also in :attr:`Program.unread`, which leaves the bank-conflict
and vector verdicts unknown.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from tilelang import tvm

from tlx.ir.tir import const_int, elem_bytes, nodes, op_name
from tlx.ir.walk import DeviceWalker, is_access_ptr, pointer_uses, storage_scope
from tlx.lowering import LoweredKernel

tir = tvm.tirx

__all__ = ["SHARED_SCOPES", "Access", "Program", "SyncOp", "Wait", "collect_program"]

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
    barrier: tuple | None = None  # (mbarrier data var, index): a TMA load completes on it


@dataclass
class SyncOp:
    """An mbarrier or async-proxy ordering statement in its context.

    ``kind``: ``init`` (``arg`` the arrival count), ``expect_tx`` (``arg`` bytes), ``arrive``
    (``arg`` the bytes it also expects, or 0; ``cp_async``: ``cp.async.mbarrier.arrive.noinc``,
    one arrival once the thread's earlier cp.async copies have landed), ``wait`` (``arg`` the
    phase parity), ``wgmma_wait`` (``arg`` the batches left in flight), ``bulk_wait``
    (``tma_store_wait``: ``arg`` the bulk groups whose shared reads may still run), ``fence_proxy_async``,
    ``named_barrier`` (``bar.sync index, arg``: ``arg`` threads, not the whole block).
    """

    kind: str
    barrier: Any  # data var of the mbarrier buffer, None for fences and wgmma waits
    index: Any
    arg: Any
    conds: list
    loops: list
    epoch: Any
    order: int
    cp_async: bool = False


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
    syncs: list[SyncOp] = field(default_factory=list)
    opaque: list[str] = field(default_factory=list)  # shared accesses no analysis can see
    unread: list[str] = field(default_factory=list)  # statements and accesses the walk could not read
    divergent_barriers: list[str] = field(default_factory=list)
    named_barriers: list[SyncOp] = field(default_factory=list)  # bar.sync with an id and a thread count
    calls: set = field(default_factory=set)  # every intrinsic called, for sync primitives no model covers

    @property
    def block_threads(self) -> int:
        n = 1
        for _, e in self.threads:
            n *= e
        return n


def _depends_on(expr, vars_) -> bool:
    names = set(vars_)
    return any(v in names for v in nodes(expr, tir.Var))


# operators an address may apply without reading memory
_ARITH_CALLS = ("tirx.if_then_else", "tirx.likely", "tirx.bitwise_and", "tirx.bitwise_or", "tirx.bitwise_xor", "tirx.shift_left",
                "tirx.shift_right", "tirx.bitwise_not")


def _reads_memory(expr) -> bool:
    return bool(nodes(expr, tir.BufferLoad)) or any(op_name(c) not in ("", *_ARITH_CALLS) for c in nodes(expr, tir.Call))


class _Walker(DeviceWalker):
    """Program-order walk that tracks threads, loops, conditions, bindings and barrier counts."""

    def __init__(self, name: str):
        super().__init__(name)
        self.prog = Program(name, [], [])
        self.thread_ext: dict[str, tuple[Any, int]] = {}
        self.lets: dict = {}
        self.descriptors: dict = {}  # wgmma descriptor data var -> (pointer, byte offset added, layout, lbo, sbo)
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

    def rooted(self, data, scope: str):
        """(root data var, constant byte offset) of a pointer, or None (recorded as not read)
        when the offset into the root allocation is symbolic."""
        root, offset = self.root_of(data)
        base = const_int(offset)
        if base is None:
            base = const_int(tvm.arith.Analyzer().simplify(offset))
        if base is None:
            self.not_read(f"pointer {data.name} at symbolic byte offset {offset} into {root.name} (not modelled)", scope)
        return None if base is None else (root, base)

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
            return _either(c, a1, a2), _either(c, b1, b2)
        if isinstance(stmt, tir.Evaluate) and isinstance(stmt.value, tir.Call) and op_name(stmt.value):
            name = op_name(stmt.value)
            if name in _BARRIER_CALLS and _is_block_barrier(stmt.value):
                return tir.IntImm("int32", 1), commits
            if name == "tirx.ptx_commit_group":
                return syncs, tir.IntImm("int32", 1)
        if hasattr(stmt, "body") and isinstance(getattr(stmt, "body"), tir.Stmt):
            return self.count(stmt.body)
        return syncs, commits

    # -- statements
    def unmodelled(self, s):
        self.not_read(f"{type(s).__name__} statement (not modelled)")

    def not_read(self, what: str, scope: str = "shared") -> None:
        """Something the walk could not read: no access in it is known to any analysis (a
        statement may touch shared memory; an access names its scope)."""
        if scope in SHARED_SCOPES:
            self.prog.opaque.append(what)
        self.prog.unread.append(what)

    def visit_AttrStmt(self, s):
        if s.attr_key == "thread_extent":
            iv = s.node
            tag, ext = str(iv.thread_tag), const_int(s.value)
            if tag.startswith("threadIdx"):
                self.thread_ext[tag] = (iv.var, ext)
            elif tag.startswith("blockIdx"):
                self.prog.blocks.append((iv.var, ext if ext is not None else s.value))
        self.visit(s.body)

    def visit_Bind(self, s):
        self.lets[s.var] = self.sub(s.value)
        self.note_alias(s)

    def visit_AssertStmt(self, s):
        self.exprs([self.sub(s.condition)])

    def visit_For(self, s):
        base_e, base_c = self.epoch, self.commits
        body_e, body_c = self.count(s.body)
        it = s.loop_var - s.min
        self.loops.append((s.loop_var, self.sub(s.min), self.sub(s.extent)))
        self.epoch, self.commits = base_e + it * body_e, base_c + it * body_c
        self.visit(s.body)
        self.loops.pop()
        self.epoch, self.commits = base_e + s.extent * body_e, base_c + s.extent * body_c

    def visit_IfThenElse(self, s):
        c = self.sub(s.condition)
        self.exprs([c])
        base_e, base_c = self.epoch, self.commits
        self.conds.append(c)
        self.visit(s.then_case)
        self.conds.pop()
        if s.else_case is not None:
            self.epoch, self.commits = base_e, base_c
            self.conds.append(tir.Not(c))
            self.visit(s.else_case)
            self.conds.pop()
        a1, b1 = self.count(s.then_case)
        a2, b2 = self.count(s.else_case) if s.else_case is not None else (tir.IntImm("int32", 0),) * 2
        self.epoch, self.commits = base_e + _either(c, a1, a2), base_c + _either(c, b1, b2)

    def visit_BufferStore(self, s):
        self.exprs([s.value] + list(s.indices))
        self.buffer_access(s.buffer, s.indices, s.value.dtype, read=False, write=True, op="store", text=f"{s.buffer.name}[{', '.join(map(str, s.indices))}] = {s.value}")

    def visit_Evaluate(self, s):
        self.evaluate(s.value)

    def visit_While(self, s):
        self.prog.opaque.append("while loop (not modelled)")

    def finish_threads(self):
        self.prog.threads = [self.thread_ext[t] for t in ("threadIdx.x", "threadIdx.y", "threadIdx.z") if t in self.thread_ext]

    def context(self):
        return list(self.conds), list(self.loops), self.epoch, self.commits

    def buffer_access(self, buf, indices, dtype, read, write, op, text):
        scope = buf.scope()
        if len(indices) != 1:
            self.not_read(f"{buf.name} accessed with {len(indices)} indices (not modelled)", scope)
            return
        rooted = self.rooted(buf.data, scope)
        if rooted is None:
            return
        root, base = rooted
        index = self.sub(indices[0])
        lanes = int(index.lanes) if isinstance(index, tir.Ramp) else 1
        if isinstance(index, tir.Ramp) and const_int(index.stride) != 1:
            lanes = 1  # a strided vector is emitted lane by lane; the Ramp is kept as one access
        conds, loops, epoch, commits = self.context()
        eb = elem_bytes(buf.dtype)
        self.prog.accesses.append(
            Access(buf.name, root, scope, str(buf.dtype), index, lanes, eb * lanes, base, read, write, op, conds, loops, epoch, commits, self._next(), text[:200], exact=not _reads_memory(index))
        )

    def exprs(self, es):
        """Loads inside expressions are reads; calls inside them handed shared pointers are accesses too."""
        found = [n for e in es for n in nodes(e, (tir.BufferLoad, tir.Call))]
        loads = [n for n in found if isinstance(n, tir.BufferLoad)]
        calls = [n for n in found if isinstance(n, tir.Call) and op_name(n) not in ("", "tirx.tvm_access_ptr")]
        for ld in loads:
            self.buffer_access(ld.buffer, ld.indices, ld.dtype, read=True, write=False, op="load", text=str(ld))
        for c in calls:
            self.call_pointers(c)

    def call_pointers(self, call):
        name = op_name(call)
        self.prog.calls.add(name)
        if name == "tirx.call_extern" and call.args and isinstance(call.args[0], tir.StringImm):
            name = str(call.args[0].value)
        shared_uses = [u for u in pointer_uses(call, self.is_shared) if storage_scope(u.ptr.args[1]) in SHARED_SCOPES]
        for use in shared_uses:
            self.pointer_access(name, call, use)
        if not shared_uses and any(storage_scope(a) in SHARED_SCOPES for a in _handle_args(call)):
            self.prog.opaque.append(f"{name} touches shared memory through a descriptor or raw handle")

    def evaluate(self, call):
        name = op_name(call) if isinstance(call, tir.Call) else ""
        if not name:
            self.exprs([call])
            return
        self.prog.calls.add(name)
        if name in _BARRIER_CALLS:
            if _is_block_barrier(call):
                self.epoch = self.epoch + 1
            else:
                conds, loops, epoch, _ = self.context()
                index, count = (self.sub(a) for a in call.args[1:3]) if len(call.args) == 3 else (None, None)
                self.prog.named_barriers.append(SyncOp("named_barrier", None, index, count, conds, loops, epoch, self._next()))
            return
        if name == "tirx.ptx_commit_group":
            self.commits = self.commits + 1
            return
        if name == "tirx.ptx_wait_group":
            conds, loops, epoch, commits = self.context()
            self.prog.waits.append(Wait(int(const_int(call.args[0])), conds, loops, epoch, commits, self._next()))
            return
        if self.async_proxy(name, call):
            return
        self.exprs([call])

    def sync_op(self, kind, barrier_load, arg, cp_async=False):
        conds, loops, epoch, _ = self.context()
        barrier, index = None, None
        if barrier_load is not None:
            barrier, index = barrier_load.buffer.data, self.sub(barrier_load.indices[0])
        arg = self.sub(arg) if isinstance(arg, tir.PrimExpr) else arg
        self.prog.syncs.append(SyncOp(kind, barrier, index, arg, conds, loops, epoch, self._next(), cp_async))

    def async_proxy(self, name, call) -> bool:
        """Model one mbarrier / TMA / wgmma / fence statement; False for anything else."""
        args = call.args
        if name in _MBARRIER_OPS:
            kind, arg_at = _MBARRIER_OPS[name]
            if not (isinstance(args[0], tir.BufferLoad) and len(args[0].indices) == 1):
                return False
            self.sync_op(kind, args[0], args[arg_at] if arg_at is not None else tir.IntImm("int32", 0), cp_async=name == _CP_ASYNC_ARRIVE)
            return True
        if name == "tl.tma_load" and len(args) > 2 and isinstance(args[1], tir.BufferLoad) and is_access_ptr(args[2]):
            self.exprs(list(args[3:]))
            use = next(u for u in pointer_uses(call, self.is_shared) if u.ptr.same_as(args[2]))
            self.pointer_access("tma_load", call, use, barrier=args[1])
            return True
        if name == "tl.tma_store" and len(args) > 1 and is_access_ptr(args[1]):
            self.exprs(list(args[2:]))
            use = next(u for u in pointer_uses(call, self.is_shared) if u.ptr.same_as(args[1]))
            self.pointer_access("tma_store", call, use)
            return True
        if name == "tl.tma_store_wait":
            self.sync_op("bulk_wait", None, args[0])
            return True
        if name == "tl.initialize_wgmma_descriptor" and isinstance(args[0], tir.BufferLoad):
            ptr, added = args[1], tir.IntImm("int32", 0)
            if op_name(ptr) == "tirx.handle_add_byte_offset":  # a later stage: the pointer plus bytes
                ptr, added = ptr.args[0], self.sub(ptr.args[1])
            if not is_access_ptr(ptr):
                return False
            layout, lbo, sbo = (const_int(a) for a in args[2:5])
            self.descriptors[args[0].buffer.data] = (ptr, added, layout, lbo, sbo)
            return True
        if name == "tl.increase_descriptor_offset" and isinstance(args[0], tir.BufferLoad) and args[0].buffer.data in self.descriptors:
            ptr, off, *rest = self.descriptors[args[0].buffer.data]
            self.descriptors[args[0].buffer.data] = (ptr, off + self.sub(args[1]), *rest)
            return True
        if name == "tl.ptx_wgmma_ss":
            a, b = args[1], args[2]
            return self.wgmma_reads(call, [(args[6], args[7], a, "m"), (args[8], args[9], b, "n")])
        if name == "tl.ptx_wgmma_rs":  # A from registers
            return self.wgmma_reads(call, [(args[7], args[8], args[1], "n")])
        if any(isinstance(x, tir.Var) and x in self.descriptors for x in args):
            self.prog.opaque.append(f"{name} reads shared memory through a wgmma descriptor (not modelled)")
            return True
        if name in ("tl.warpgroup_wait", "tl.wait_wgmma"):  # T.wait_wgmma(n) is warpgroup_wait<n>
            self.sync_op("wgmma_wait", None, args[0])
            return True
        if name == "tl.fence_proxy_async":
            self.sync_op("fence_proxy_async", None, tir.IntImm("int32", 0))
            return True
        return name in _NO_MEMORY_OPS

    def wgmma_reads(self, call, operands) -> bool:
        """The shared reads of ``ptx_wgmma_ss`` / ``ptx_wgmma_rs``: ``operands`` lists each shared
        operand as (descriptor, offset in 16-byte units, K-major flag, "m" or "n").

        Each operand is read from the descriptor's start address plus ``off * 16`` bytes; its
        byte span is bounded by the descriptor's layout: ``rows / 8`` groups of 8 rows ``sbo``
        apart, each row ``swizzle`` bytes wide, ``lbo`` apart across row chunks. A descriptor
        this walk did not see initialised makes the call opaque.
        """
        shape = str(call.args[0].value) if isinstance(call.args[0], tir.StringImm) else ""
        dims = dict((d[0], int(d[1:])) for d in re.findall(r"[mnk]\d+", shape))
        spans = []
        for desc, off, k_major, rows_key in operands:
            info = self.descriptors.get(desc)
            if info is None or set(dims) != {"m", "n", "k"} or None in info[2:] or const_int(k_major) is None:
                self.prog.opaque.append(f"wgmma {shape} through a descriptor this model did not see built")
                return True
            ptr, added, layout, lbo, sbo = info
            swizzle = _SWIZZLE_BYTES.get(layout)
            if swizzle is None:
                self.prog.opaque.append(f"wgmma descriptor layout {layout} not modelled")
                return True
            eb = elem_bytes(ptr.args[0].dtype)
            row_elems, other = (dims["k"], dims[rows_key]) if const_int(k_major) else (dims[rows_key], dims["k"])
            chunks = -(-row_elems * eb // swizzle)
            span = (chunks - 1) * lbo * 16 + (other // 8 - 1) * sbo * 16 + 8 * swizzle
            start = self.sub(ptr.args[2]) * eb + added + self.sub(off) * 16
            spans.append((ptr, tir.floordiv(start, swizzle) * swizzle, span))
        for ptr, start, span in spans:
            data = ptr.args[1]
            rooted = self.rooted(data, storage_scope(data))
            if rooted is None:
                continue
            root, base = rooted
            conds, loops, epoch, commits = self.context()
            self.prog.accesses.append(
                Access(data.name, root, storage_scope(data), "uint8", start, 1, span, base, True, False, "wgmma", conds, loops, epoch, commits,
                       self._next(), f"wgmma(...{data.name} bytes [{start}, +{span})...)"[:200], is_async=True, exact=not _reads_memory(start), extent_elems=span)
            )
        return True

    def pointer_access(self, name, call, use, barrier=None):
        """One shared :class:`~tlx.ir.walk.PointerUse` of ``call`` as an :class:`Access`."""
        _, data, offset, extent, _ = use.ptr.args
        dtype = use.ptr.args[0].dtype
        rooted = self.rooted(data, storage_scope(data))
        if rooted is None:
            return
        root, base = rooted
        conds, loops, epoch, commits = self.context()
        eb = elem_bytes(dtype)
        offset = self.sub(offset)
        elems = const_int(use.elems)
        short = name.split(".")[-1]
        common = dict(conds=conds, loops=loops, epoch=epoch, commits=commits, order=self._next(), text=f"{short}(...{data.name}[{offset}]...)"[:200])
        if barrier is not None and elems is not None:
            self.prog.accesses.append(
                Access(data.name, root, storage_scope(data), str(dtype), offset, 1, eb * elems, base, False, True, short, is_async=True, exact=not _reads_memory(offset),
                       extent_elems=elems, barrier=(barrier.buffer.data, self.sub(barrier.indices[0])), **common)
            )
        elif short in ("ptx_ldmatrix", "ptx_stmatrix") and elems is not None:
            num = const_int(call.args[1])
            self.prog.accesses.append(
                Access(data.name, root, storage_scope(data), str(dtype), offset, 1, eb * elems, base, use.read, use.write, short, phase_lanes=8 * (num or 4), exact=not _reads_memory(offset), extent_elems=elems, **common)
            )
        elif name == "tma_store" and elems is not None:
            # the bulk copy reads its whole box asynchronously, until a tma_store_wait of its thread
            self.prog.accesses.append(
                Access(data.name, root, storage_scope(data), str(dtype), offset, 1, eb * elems, base, True, False, "tma_store", is_async=True,
                       exact=not _reads_memory(offset), extent_elems=elems, **common)
            )
        elif short == "ptx_cp_async":
            width = eb * (elems if elems is not None else const_int(extent) or 1)
            self.prog.accesses.append(
                Access(data.name, root, storage_scope(data), str(dtype), offset, 1, width, base, False, True, short, is_async=True, exact=not _reads_memory(offset), extent_elems=max(width // eb, 1), **common)
            )
        else:
            # Any other call handed a shared pointer (library collectives, TMA, ...): it may read and
            # write its whole range from every thread, and no bank model applies.
            self.prog.accesses.append(
                Access(data.name, root, storage_scope(data), str(dtype), offset, 1, eb * (elems or 1), base, use.read, use.write, short, is_async=short.startswith("tma") or "bulk" in short, exact=False, extent_elems=elems or 1, **common)
            )


_MBARRIER_OPS = {  # name -> (SyncOp kind, index of the argument it carries)
    "tirx.ptx_init_barrier_thread_count": ("init", 1),
    "tl.mbarrier_expect_tx": ("expect_tx", 1),
    "tirx.ptx_arrive_barrier": ("arrive", None),
    "tirx.ptx_arrive_barrier_expect_tx": ("arrive", 1),
    "tl.mbarrier_wait_parity": ("wait", 1),
    "tl.ptx_cp_async_barrier_noinc": ("arrive", None),
}
_CP_ASYNC_ARRIVE = "tl.ptx_cp_async_barrier_noinc"  # cp.async.mbarrier.arrive.noinc: TileLang's non-TMA producer
_SWIZZLE_BYTES = {0: 16, 1: 128, 2: 64, 3: 32}  # wgmma descriptor layout type -> swizzle row bytes
# Calls that order nothing the race model needs and touch no shared memory.
_NO_MEMORY_OPS = ("tl.prefetch_tma_descriptor", "tl.ptx_fence_barrier_init", "tl.warpgroup_arrive", "tl.warpgroup_commit_batch", "tl.warpgroup_fence_operand",
                  "tl.tma_store_arrive")  # commits the bulk group; only tma_store_wait(0) is counted


def _handle_args(call):
    out = []
    for a in call.args:
        if isinstance(a, tir.Var):
            out.append(a)
    return out


def _either(cond, then_count, else_count):
    """The barriers (or commits) a branch passes: one constant when both arms agree, so a branch
    without barriers inside one that has none is not counted as divergent."""
    if const_int(then_count) is not None and const_int(then_count) == const_int(else_count):
        return then_count
    return tir.Select(cond, then_count, else_count)


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
        for attr in nodes(fn.body, tir.AttrStmt):
            if attr.attr_key == "thread_extent" and str(attr.node.thread_tag).startswith("threadIdx"):
                w.thread_ext[str(attr.node.thread_tag)] = (attr.node.var, const_int(attr.value))
        w.finish_threads()
        w.visit(fn.body)
        progs.append(w.prog)
    return progs


# ----- per-warp encoding ------------------------------------------------------------------------
