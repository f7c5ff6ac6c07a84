"""Progress of a CTA's barrier protocol: no thread waits forever, by simulation at concrete values.

A warp-specialized kernel hands tiles between its warpgroups through mbarriers (arrive, parity
wait) and named barriers (``bar.sync id, n``). A wrong count, a wrong parity or a wait placed
before the arrive it needs hangs the GPU, and the race analysis (``races.py``) does not ask
whether waits end. This pass runs the protocol instead:

1. Traces. For every thread of one CTA (block 0), the device function's statements are executed
   on concrete values (the thread index, loop counters, the ``values`` given for shape
   variables; every loop must have a known trip count), keeping only the synchronisation:
   mbarrier init, arrive (``cp.async.mbarrier.arrive.noinc`` is one arrival), parity wait, named
   barriers, ``__syncthreads``, the barriers of TileLang's cross-warp ``tl::AllReduce`` (two a
   butterfly level that goes through shared memory) and register reallocation (``setmaxnreg``).
   Subtrees without synchronisation are skipped, but for the stores they make to the thread's
   private integer scalars (``T.alloc_var``: a ring position carried across a persistent
   kernel's tiles), which are run to keep those values (a store the walk cannot evaluate leaves
   its scalar unknown, as memory). A branch whose condition reads memory is simulated without it when both arms take
   the same synchronisation steps, none of them an aligned barrier (``bar.sync``,
   ``__syncthreads``: a warp whose lanes disagree would diverge at it, which PTX leaves
   undefined) unless the condition has one value in every thread (``_lane_uniform``: no thread
   index, loads at such indices); otherwise, and for a loop bound that reads memory or a value
   not given, the verdict is "unknown" (never "ok"). A bound variable that reads memory (a tile
   count from a loaded length) is then tried at each value of ``SWEEP`` in turn, and a second
   one at each value of ``SWEEP`` for each of those: the verdict stays "unknown", and the detail
   says whether some value hangs (a real hang wherever the data can give that value) or none of
   them did.
   Aligned barriers (``bar.sync``, ``__syncthreads``, an ``AllReduce``'s) are also recorded by
   statement: two lanes of one warp whose k-th aligned barrier is a different statement (a
   branch on the thread with a barrier in each arm) are a "deadlock" before any simulation, as
   PTX leaves that undefined and it hangs.
2. Simulation. Every thread runs its trace; a parity wait passes when the barrier's current phase
   parity differs from the awaited one (PTX semantics: ``wait(p)`` on a barrier that completed
   ``c`` phases returns iff ``c % 2 != p``), a phase completes when its arrivals reach the init
   count, a named barrier releases when ``n`` threads reached it, ``__syncthreads`` when all
   did; ``setmaxnreg.dec`` returns a thread's registers above its new count to the CTA's pool and
   ``setmaxnreg.inc`` waits until the pool holds the ones it adds (every thread starts with
   ``launch_registers``: the CTA holds no more than the register file allows its thread count
   and the CTAs a SM its ``__launch_bounds__`` asks for, so warpgroups that together ask for
   more wait forever; that count is ptxas's choice, taken as observed). The order of steps is drawn at random (``seeds`` schedules, each thread run
   until it blocks, then another picked); a state in which no thread can move and some have not
   finished is a deadlock, reported with the waits that never end. A named barrier that releases
   part of the team it first released together with other threads is reported too (as a
   "deadlock": a proven synchronisation error, as above): two groups share its id, so it releases
   whichever ``n`` threads come first and orders neither group. Before any simulation, and for
   any control values, the counts a kernel's warps reallocate to are added up
   (``register_budget``, also on every verified compile): more than the CTA holds is a deadlock.
3. Late waiters. A random schedule lets a thread fall behind: one that waits on a barrier it
   never arrives on (the non-elected threads of a producer warpgroup that TileLang's warp
   specialization makes poll the consumers' barriers) can come to its wait two phases late and
   find its parity back in the current phase, which never completes. When only such threads are
   left and a fair schedule (round robin: every runnable thread one step in turn) finishes, the
   verdict is "unknown" (``LATE``), not "deadlock": the hang needs a warp held back two whole
   phases, which CUDA allows and a GPU is not known to do.

Not modelled: TMA transaction bytes (a TMA load is assumed to land, so ``expect_tx`` never holds a
phase back), clusters, and TileLang's collective templates other than ``AllReduce`` that name a
barrier (unknown). Out of scope: waits on flags in global memory
between CTAs, kernels or GPUs (a ``while`` loop makes the verdict unknown; an opaque helper that
spins, such as MegaMoE's, is not a barrier of the CTA: those waits end by their own timeouts).
A finished simulation shows progress for the schedules drawn, at these values; the deadlocks it
finds are real for these values.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, field

from tilelang import tvm

from tlx.ir.facts import private_int_cell
from tlx.ir.tir import device_functions, eval_numpy, extern_name, free_vars, nodes, op_name
from tlx.lowering import LoweredKernel
from tlx.passes import PassContext, TlxError, raise_or_warn

tir = tvm.tirx

__all__ = ["DeadlockError", "ProgressReport", "Unknown", "check_progress", "progress_pass", "register_budget",
           "register_budget_pass", "simulate", "simulate_schedules", "thread_traces"]

SWEEP = tuple(range(10))  # values tried, one at a time, for a control variable that reads memory
MAX_SWEPT = 2  # such variables swept together (each value of one with every value of the other)
MAX_STEPS = 2_000_000  # synchronisation steps of all threads together: more is "unknown" (too long to simulate)
SEEDS = 8  # random schedules per kernel in tlx check
LATE = ("only threads that wait on a barrier they never arrive on are left, each of which would have passed had it "
        "reached its wait before the barrier's last phase completed (it fell behind, and a parity wait cannot tell "
        "phase n from n + 2); when every thread takes one step in turn, the protocol finishes. Nothing in "
        "it keeps those threads within a phase of the barrier and CUDA does not bound how far a warp falls behind, "
        "so progress is not proven; a GPU would have to hold such a warp back for two whole phases")

_SET_MAX_NREG = "tl.set_max_nreg"  # setmaxnreg.{inc,dec}: a warp's registers from / to the CTA's pool
_MBARRIER = {"tirx.ptx_init_barrier_thread_count": "init", "tirx.ptx_arrive_barrier": "arrive",
             "tirx.ptx_arrive_barrier_expect_tx": "arrive", "tl.ptx_cp_async_barrier_noinc": "arrive",
             "tl.mbarrier_wait_parity": "wait"}  # tl.mbarrier_expect_tx is left out: TMA loads are assumed to land


class DeadlockError(TlxError):
    """Some threads of a CTA wait forever (found by simulation) under ``verify="error"``."""


class Unknown(Exception):
    """The trace cannot be built from what is known (a value read from memory, an unmodelled
    synchronisation); the verdict is "unknown". ``unread``: the bound variable that reads
    memory, when that is the cause."""

    def __init__(self, message: str, unread: str | None = None):
        super().__init__(message)
        self.unread = unread


_ALL_REDUCE = re.compile(r"tl::AllReduce<\s*[\w:]+\s*,\s*(\d+)\s*,\s*(\d+)\s*(?:,\s*\d+\s*)?"
                         r"(?:,\s*(?:tl::NamedBarrier<\s*(\d+)\s*>|tl::(SyncThreadsBarrier)"
                         r"|tlx::NamedBarrierIds<\s*(\d+)\s*,\s*(\d+)\s*,\s*(\d+)\s*>)\s*)?[,>]")


def _all_reduce_barriers(ext: str) -> list[tuple] | None:
    """The trace of one ``tl::AllReduce<Op, threads, scale, offset, Barrier>::run``
    (``tl_templates/cuda/reduce.h``): its butterfly halves the offset from ``threads / 2`` down
    to ``scale``; a level at offset >= 32 goes through shared memory between two barriers
    (``bar.sync 1, n`` and ``bar.sync 2, n`` for ``NamedBarrier<n>``, ids a and b for
    ``tlx::NamedBarrierIds<n, a, b>`` (tlx/passes/reduce_barriers.py), ``__syncthreads`` for
    ``SyncThreadsBarrier``, the default), a smaller offset shuffles. None: not an AllReduce."""
    if not ext.startswith("tl::AllReduce<"):
        return None
    m = _ALL_REDUCE.match(ext)
    if m is None:
        raise Unknown(f"{ext}: an AllReduce whose template arguments the simulation does not read")
    threads, scale = int(m.group(1)), int(m.group(2))
    named, ids = (m.group(3), (1, 2)) if m.group(5) is None else (m.group(5), (int(m.group(6)), int(m.group(7))))
    trace, offset = [], threads // 2
    while offset >= scale and offset >= 1:
        if offset >= 32:
            trace += [("bar", ids[0], int(named)), ("bar", ids[1], int(named))] if named else [("sync",), ("sync",)]
        offset //= 2
    return trace


def _is_sync(call) -> bool:
    name = op_name(call)
    if name in _MBARRIER or name in ("tirx.tvm_storage_sync", _SET_MAX_NREG):
        return True
    ext = extern_name(call) or ""
    if ext.startswith("tl::AllReduce<"):
        try:
            return bool(_all_reduce_barriers(ext))
        except Unknown:
            return True  # kept: _call then says why the verdict is unknown
    return "NamedBarrier<" in ext or "NamedBarrierIds<" in ext


def _sync_nodes():
    """``stmt -> bool``: does the statement contain a synchronisation call or a while loop
    (memoized), so the walk skips the subtrees that have none."""
    contains: dict = {}

    def has_sync(s) -> bool:
        if s not in contains:
            contains[s] = any(isinstance(n, tir.While) or _is_sync(n) for n in nodes(s, (tir.Call, tir.While)))
        return contains[s]

    return has_sync


def _cell_stores(func):
    """``stmt -> set``: the private integer scalars (data vars) the statement stores to (memoized),
    of those whose storage never escapes (no ``address_of``, no use of the pointer itself), so
    that the thread's own stores are the only ones."""
    escaped = {n for n in nodes(func.body, tir.Var) if str(n.dtype) == "handle"}
    escaped |= {c.args[0].buffer.data for c in nodes(func.body, tir.Call)
                if op_name(c) == "tirx.address_of" and isinstance(c.args[0], tir.BufferLoad)}
    stored: dict = {}

    def cells(s) -> set:
        if s not in stored:
            stored[s] = {n.buffer.data for n in nodes(s, tir.BufferStore)
                         if private_int_cell(n.buffer) and not any(n.buffer.data.same_as(e) for e in escaped)}
        return stored[s]

    return cells


def _lane_uniform(func):
    """``expr -> bool``: the expression has one value in every thread of the block (so no warp
    can split on it): no thread index, and every load at an index that has one value everywhere,
    of a buffer that is not the thread's own, or of a private scalar every store of which stores
    such a value; a loop variable counts when its loop's bounds do. Conservative: False when
    unsure."""
    threads = {a.node.var for a in _attrs(func.body) if str(a.node.thread_tag).startswith("threadIdx")}
    loops = {f.loop_var: f for f in nodes(func.body, tir.For)}
    stores: dict = {}
    for st in nodes(func.body, tir.BufferStore):
        stores.setdefault(st.buffer.data, []).append(st)
    memo: dict = {}

    def uniform(e) -> bool:
        if isinstance(e, tir.Var):
            if e in threads:
                return False
            if e in loops:
                return cached(e, lambda: uniform(loops[e].min) and uniform(loops[e].extent))
            return True  # a kernel parameter, a block index or a let-bound name of one
        if isinstance(e, tir.BufferLoad):
            if not all(uniform(i) for i in e.indices):
                return False
            if str(e.buffer.scope()) not in ("local", "local.var", "local.fragment"):
                return True  # global or shared memory at one index: one value at a time
            return cached(e.buffer.data, lambda: all(all(uniform(i) for i in st.indices) and uniform(st.value)
                                                     for st in stores.get(e.buffer.data, [])))
        if isinstance(e, tir.Call):
            return op_name(e) not in ("tl.tl_shuffle_elect", "tirx.tvm_warp_shuffle") and all(uniform(a) for a in e.args)
        children = [getattr(e, f) for f in ("a", "b", "value", "condition", "true_value", "false_value")
                    if isinstance(getattr(e, f, None), tir.PrimExpr)]
        if children or isinstance(e, (tir.IntImm, tir.FloatImm, tir.StringImm)):
            return all(uniform(c) for c in children)
        return False

    active: set = set()

    def cached(key, compute) -> bool:
        """A scalar updated from itself (``last = max(last, ...)``) is assumed uniform while its
        stores are checked (by induction over its stores); results that leaned on such an
        assumption are kept only once the outermost check holds them."""
        if key in memo:
            return memo[key]
        if key in active:
            return True
        active.add(key)
        try:
            result = compute()
        finally:
            active.discard(key)
        if not active:
            memo[key] = result
        return result

    return uniform


def _with_cells(expr, env):
    """``expr`` with each load of a private integer scalar whose value the walk holds replaced by
    that value (the others stay loads: unknown)."""
    known = env.get(_CELLS, {})
    if not known:
        return expr

    def replace(node):
        if isinstance(node, tir.BufferLoad) and node.buffer.data in known:
            return tir.IntImm(node.dtype, known[node.buffer.data])
        return None

    return tir.stmt_functor.ir_transform(tir.Evaluate(expr), None, replace, ["tirx.BufferLoad"]).value


def _evaluate(expr, env) -> int:
    return int(eval_numpy(_with_cells(expr, env), env))


def thread_traces(func, values: dict, threads: int, swept: dict | None = None) -> list[list[tuple]]:
    """Per thread of one CTA (block 0), its synchronisation trace: ``("init", bar, count)``,
    ``("arrive", bar)``, ``("wait", bar, parity)``, ``("bar", id, n)`` (named barrier),
    ``("sync",)`` (``__syncthreads``); ``bar`` is (buffer name, index). ``swept``: values, by
    name, of bound variables that read memory."""
    has_sync = _sync_nodes()
    thread_var, env0 = _block_env(func, values, swept)
    traces, sites, steps = [], [], 0
    for t in range(threads):
        env = dict(env0)
        env[_CELLS] = {}
        env[_SITES] = []
        env[_THREAD] = t
        if thread_var is not None:
            env[thread_var] = t
        trace: list = []
        _run(func.body, env, trace, has_sync)
        traces.append(trace)
        sites.append(env[_SITES])
        steps += len(trace)
        if steps > MAX_STEPS:
            raise Unknown(f"over {MAX_STEPS} synchronisation steps to simulate")
    _check_warps_aligned(sites)
    return traces


class Diverged(Exception):
    """Lanes of one warp reach an aligned barrier at different instructions."""


def _check_warps_aligned(sites: list[list]) -> None:
    """``bar.sync`` and ``__syncthreads`` are warp-aligned: every lane of a warp must execute the
    same instruction, and PTX leaves a warp that reaches one with its lanes split between two
    (a branch on the thread around a barrier) undefined; it hangs in practice. Raises
    :class:`Diverged` naming the warp, its two lanes and the barriers when two lanes' k-th aligned
    barriers are different statements (a lane that finished earlier is not compared further)."""
    for w in range(0, len(sites), 32):
        lanes = sites[w:w + 32]
        for lane, seq in enumerate(lanes[1:], 1):
            for k, (a, b) in enumerate(zip(lanes[0], seq)):
                if not a.same_as(b):
                    raise Diverged(f"warp {w // 32}: its lanes 0 and {lane} reach their aligned barrier {k} at two "
                                   f"instructions (`{a}` and `{b}`), which PTX leaves undefined (it hangs)")


def _block_env(func, values: dict, swept: dict | None = None) -> tuple:
    """(threadIdx.x's variable or None, the environment of block 0: other thread and block
    indices 0, the shape parameters named in ``values``, the ``swept`` bound variables)."""
    thread_var, env = None, {_SWEPT: dict(swept or {}), _STORES: _cell_stores(func), _UNIFORM: _lane_uniform(func),
                             _LABELS: _bind_labels(func)}
    for attr in _attrs(func.body):
        tag = str(attr.node.thread_tag)
        if tag == "threadIdx.x":
            thread_var = attr.node.var
        elif tag.startswith(("threadIdx", "blockIdx")):
            env[attr.node.var] = 0
    by_name = {p.name: p for p in func.params}
    env.update({by_name[n]: v for n, v in values.items() if n in by_name})
    return thread_var, env


def _bind_labels(func) -> dict:
    """Each bound variable's label in reports and sweeps: one per name and value text, the name
    itself for the first, ``name#k`` for the k-th. Bindings of one name and one expression (a
    count each branch computes alike, over loop variables that step alike) are one control value,
    swept together; TileLang also gives one name to different values (two splits' page counts),
    which are swept apart."""
    labels, seen = {}, {}
    for b in nodes(func.body, tir.Bind):
        if b.var not in labels:
            names = seen.setdefault(b.var.name, {})
            k = names.setdefault(str(b.value), len(names) + 1)
            labels[b.var] = b.var.name if k == 1 else f"{b.var.name}#{k}"
    return labels


def _attrs(body) -> list:
    """The thread_extent attributes: the kernel's thread and block indices."""
    return [a for a in nodes(body, tir.AttrStmt) if a.attr_key == "thread_extent"]


_THREAD = "thread"  # env key of the simulated thread's index, for tl_shuffle_elect
_UNREAD = "unread"  # env key: var -> (label, value) of the bound variables that could not be evaluated
_SWEPT = "swept"  # env key: label -> the value given to a bound variable that reads memory
_LABELS = "labels"  # env key: var -> its label (_bind_labels)
_CELLS = "cells"  # env key: data var -> the value of a private integer scalar (T.alloc_var) the walk holds
_STORES = "stores"  # env key: stmt -> the private integer scalars it stores to (_cell_stores)
_UNIFORM = "uniform"  # env key: expr -> whether every thread of the block gives it one value (_lane_uniform)
_SITES = "sites"  # env key: the aligned barrier statements (bar.sync, __syncthreads) the thread reached, in order


def _elected(expr, env):
    """``expr`` with each ``tl_shuffle_elect(n)`` replaced by whether this thread is elected: the
    first thread of the block for n = 0, else the first of each group of n threads."""
    t = env.get(_THREAD, 0)

    def replace(node):
        if isinstance(node, tir.Call) and op_name(node) == "tl.tl_shuffle_elect":
            n = int(node.args[0])
            return tir.IntImm("bool", int(t == 0 if n == 0 else t % n == 0))
        return None

    return tir.stmt_functor.ir_transform(tir.Evaluate(expr), None, replace, ["tirx.Call"]).value


def _value(expr, env) -> int:
    try:
        return _evaluate(expr, env)
    except ValueError:
        pass
    try:
        return _evaluate(_elected(expr, env), env)
    except ValueError as e:
        unread = env.get(_UNREAD, {})
        for var in free_vars(expr):
            if var in unread:
                label, value = unread[var]
                raise Unknown(f"a control value is not known: {label} = {value}, which reads memory", label) from None
        raise Unknown(f"a control value is not known: {e}") from None


def _run(s, env: dict, trace: list, has_sync) -> None:
    if isinstance(s, tir.SeqStmt):
        for x in s.seq:
            _run(x, env, trace, has_sync)
        return
    if isinstance(s, tir.Bind):  # a value later statements may branch on
        try:
            env[s.var] = _evaluate(s.value, env)
        except ValueError:  # unknown only if control reads it
            env.pop(s.var, None)
            label = env[_LABELS].get(s.var, s.var.name)
            if label in env[_SWEPT]:
                env[s.var] = env[_SWEPT][label]
            else:
                env.setdefault(_UNREAD, {})[s.var] = (label, str(s.value)[:80])
        return
    if isinstance(s, tir.BufferStore) and s.buffer.data in env[_STORES](s):
        try:
            env[_CELLS][s.buffer.data] = _evaluate(s.value, env)
        except ValueError:  # from here on unknown, as memory
            env[_CELLS].pop(s.buffer.data, None)
        return
    if not has_sync(s):
        stored = env[_STORES](s)
        if stored:  # no synchronisation, but values of the thread's own scalars: kept where computable
            try:  # its loops and branches walked as here, only the scalars' stores run
                _run(s, env, [], lambda x: bool(env[_STORES](x)))
            except Unknown:
                for cell in stored:
                    env[_CELLS].pop(cell, None)
        return
    if isinstance(s, tir.For):
        lo, n = _value(s.min, env), _value(s.extent, env)
        for i in range(lo, lo + n):
            env[s.loop_var] = i
            _run(s.body, env, trace, has_sync)
        return
    if isinstance(s, tir.IfThenElse):
        try:
            taken = _value(s.condition, env)
        except Unknown:
            _run_either(s, env, trace, has_sync)
            return
        if taken:
            _run(s.then_case, env, trace, has_sync)
        elif s.else_case is not None:
            _run(s.else_case, env, trace, has_sync)
        return
    if isinstance(s, tir.While):
        raise Unknown("a while loop (a spin wait on memory) is not simulated")
    if isinstance(s, tir.Evaluate) and isinstance(s.value, tir.Call):
        _call(s.value, env, trace)
        return
    if isinstance(s, tir.BufferStore):  # a value computed by a collective (an AllReduce's result)
        for call in nodes(s.value, tir.Call):
            if _is_sync(call):
                _call(call, env, trace)
        return
    body = getattr(s, "body", None)
    if isinstance(body, tir.Stmt):
        _run(body, env, trace, has_sync)
        return
    raise Unknown(f"a {type(s).__name__} holding a synchronisation is not simulated")


_ALIGNED = ("sync", "bar")  # trace steps of warp-aligned barriers (__syncthreads, bar.sync)


def _run_either(s, env: dict, trace: list, has_sync) -> None:
    """A branch whose condition is not known (a value read from memory): both arms run; when
    they synchronise alike (the same steps, as a producer's per-slot copy or zeros, each followed
    by the same arrive), either is this thread's trace; otherwise, or when the arms hold an
    aligned barrier and the condition may differ between lanes (:func:`_lane_uniform`: lanes
    that disagree would reach it at two instructions), the condition is needed (unknown)."""
    arms, cells = [], []
    for arm in (s.then_case, s.else_case):
        steps: list = []
        arm_env = {**env, _CELLS: dict(env[_CELLS]), _SITES: []}
        if arm is not None:
            try:
                _run(arm, arm_env, steps, has_sync)
            except Unknown:
                arms = None
                break
        arms.append(steps)
        cells.append(arm_env[_CELLS])
    if arms is None or arms[0] != arms[1]:
        _value(s.condition, env)  # raises the Unknown that names the value
    if any(step[0] in _ALIGNED for step in arms[0]) and not env[_UNIFORM](s.condition):
        # bar.sync and __syncthreads are warp-aligned: the lanes of a warp that disagree on the
        # condition reach them at two instructions, which PTX leaves undefined (it hung: the
        # sparse decode's e4m3 gather on a short sequence, H100, 2026-12-06)
        raise Unknown(f"an aligned barrier in both arms of a branch on a value read from memory "
                      f"(`{s.condition}`): a warp whose lanes disagree diverges at it and may hang")
    trace.extend(arms[0])
    # a private scalar the arms leave with different values is unknown after the branch
    env[_CELLS] = {c: v for c, v in cells[0].items() if cells[1].get(c) == v}


def _call(call, env: dict, trace: list) -> None:
    name = op_name(call)
    if name == "tirx.tvm_storage_sync":
        env[_SITES].append(call)
        if len(call.args) == 1:
            trace.append(("sync",))
        else:
            trace.append(("bar", _value(call.args[1], env), _value(call.args[2], env)))
        return
    if name == _SET_MAX_NREG:
        trace.append(("nreg", _value(call.args[0], env), bool(_value(call.args[1], env))))
        return
    reduce = _all_reduce_barriers(extern_name(call) or "")
    if reduce is not None:
        if reduce:
            env[_SITES].append(call)
        trace.extend(reduce)
        return
    kind = _MBARRIER.get(name)
    if kind is None:
        raise Unknown(f"{extern_name(call) or name} synchronises in a way the simulation does not model")
    ref = call.args[0]
    if not (isinstance(ref, tir.BufferLoad) and len(ref.indices) == 1):
        raise Unknown(f"{name} on a barrier it cannot name")
    bar = (ref.buffer.data.name, _value(ref.indices[0], env))
    if kind == "init":
        trace.append(("init", bar, _value(call.args[1], env)))
    elif kind == "wait":
        trace.append(("wait", bar, _value(call.args[1], env) & 1))
    else:
        trace.append(("arrive", bar))


@dataclass
class ProgressReport:
    verdict: str  # "ok", "deadlock" or "unknown"
    detail: str = ""
    schedules: int = 0
    stuck: list = field(default_factory=list)  # deadlock: (threads, op) groups
    late: bool = False  # deadlock: only threads that wait on a barrier they never arrive on are left (simulate)

    def __str__(self) -> str:
        return f"progress: {self.verdict}" + (f" ({self.detail})" if self.detail else "")


def _ranges(threads: list[int]) -> str:
    out, start = [], None
    for i, t in enumerate(threads):
        if start is None:
            start = t
        if i + 1 == len(threads) or threads[i + 1] != t + 1:
            out.append(f"{start}" if start == t else f"{start}-{t}")
            start = None
    return ", ".join(out)


def launch_registers(threads: int, most: int, ctas_per_sm: int = 1) -> int:
    """Registers a thread holds at launch in a kernel that reallocates them (setmaxnreg, ``most``:
    the largest count it asks for): the most its thread count allows, in units of 8, and no more
    than ``most`` (what ptxas gave every such build in tlx's cache, 423 of them: 240 at 256
    threads asking for 240, 168 at 384, 128 at 512). ``ctas_per_sm``: the kernel's
    ``__launch_bounds__`` minimum of CTAs a SM (``T.annotate_min_blocks_per_sm``), which shares
    the register file among that many CTAs (128 at 256 threads and 2 CTAs)."""
    return min(most, 65536 // max(threads * ctas_per_sm, 1) // 8 * 8)


def ctas_per_sm(func) -> int:
    """The minimum of CTAs a SM the kernel asks its ``__launch_bounds__`` for (1 if none)."""
    found = [int(a.value) for a in nodes(func.body, tir.AttrStmt) if a.attr_key == "tl.min_blocks_per_sm"]
    return max(found, default=1)


def simulate(traces: list[list[tuple]], seed: int, ctas: int = 1, fair: bool = False) -> ProgressReport:
    """Run the traces under one random schedule (module docstring): "ok" or "deadlock"; ``ctas``:
    the kernel's ``ctas_per_sm``. Event driven: a blocked thread sleeps on what it waits for and
    is woken when that changes. ``fair``: instead of a random order, round robin: every runnable
    thread takes one step in turn, so that none falls a phase behind the others."""
    rng = random.Random(seed)
    most = max((op[1] for trace in traces for op in trace if op[0] == "nreg"), default=0)
    at_launch = launch_registers(len(traces), most, ctas)
    regs = [at_launch] * -(-len(traces) // 32)  # registers a thread of each warp holds
    pool = [0]  # registers released by setmaxnreg.dec and not yet taken (all the warp's threads')
    counts: dict = {}  # barrier -> arrivals per phase
    arrived: dict = {}  # barrier -> arrivals in the current phase
    phases: dict = {}  # barrier -> completed phases
    sleepers: dict = {}  # barrier -> threads blocked in a wait on it
    gathering: dict = {}  # (named barrier id, n) or "sync" -> threads that reached it
    teams: dict = {}  # (named barrier id, n) -> the threads its first release joined
    mixed: list = []  # a release that joined part of that team with other threads (_mixed_team)
    pc = [0] * len(traces)
    unfinished = {t for t in range(len(traces)) if traces[t]}
    runnable = sorted(unfinished)
    blocked: dict = {}  # thread -> the op it is blocked at

    def passes(op) -> bool:
        bar = op[1]
        if bar not in counts:
            raise Unknown(f"a wait on {bar} before its init")
        return phases[bar] % 2 != op[2]

    def release_gathered(key, n: int) -> None:
        ts = gathering.get(key, [])
        if len(ts) >= n:
            if key != "sync":
                team, first = frozenset(ts[:n]), teams.setdefault(key, frozenset(ts[:n]))
                if team != first and team & first and not mixed:
                    mixed.append((key, first, team))
            for t in ts[:n]:
                pc[t] += 1
                del blocked[t]
            runnable.extend(ts[:n])
            gathering[key] = ts[n:]

    def take_registers(t: int, op) -> bool:
        """setmaxnreg of thread t, for its whole warp (the instruction is warp-aligned: the first
        of its threads to get there moves the warp's registers, the others find them moved): a
        decrease returns registers to the pool and wakes the threads whose increase they cover; an
        increase passes when the pool covers the warp's."""
        target, increase, w = op[1], op[2], t // 32
        if target == regs[w]:
            return True
        if increase != (target > regs[w]):
            raise Unknown(f"setmaxnreg.{'inc' if increase else 'dec'} to {target} from {regs[w]} registers is undefined")
        if increase and 32 * (target - regs[w]) > pool[0]:
            return False
        pool[0] -= 32 * (target - regs[w])
        regs[w] = target
        if not increase:
            waiting = sleepers.get("registers", [])
            for sleeper in list(waiting):
                if take_registers(sleeper, blocked[sleeper]):
                    waiting.remove(sleeper)
                    del blocked[sleeper]
                    pc[sleeper] += 1
                    runnable.append(sleeper)
        return True

    def check_sync() -> None:
        """``__syncthreads`` releases once every thread that has not finished reached it."""
        if gathering.get("sync") and len(gathering["sync"]) == len(unfinished):
            release_gathered("sync", len(unfinished))

    while runnable:
        t = runnable.pop(0 if fair else rng.randrange(len(runnable)))
        trace = traces[t]
        while pc[t] < len(trace):
            op = trace[pc[t]]
            kind = op[0]
            if kind == "nreg":
                if not take_registers(t, op):
                    blocked[t] = op
                    sleepers.setdefault("registers", []).append(t)
                    break
            elif kind == "wait":
                if not passes(op):
                    blocked[t] = op
                    sleepers.setdefault(op[1], []).append(t)
                    break
            elif kind == "init":
                counts[op[1]], arrived[op[1]], phases[op[1]] = op[2], 0, 0
            elif kind == "arrive":
                bar = op[1]
                if bar not in counts:
                    raise Unknown(f"an arrive on {bar} before its init")
                arrived[bar] += 1
                if arrived[bar] == counts[bar]:
                    arrived[bar], phases[bar] = 0, phases[bar] + 1
                    woken = [w for w in sleepers.get(bar, []) if passes(blocked[w])]
                    sleepers[bar] = [w for w in sleepers.get(bar, []) if w not in woken]
                    for w in woken:
                        del blocked[w]
                    runnable.extend(woken)
            else:  # a named barrier or __syncthreads: wait there until it fills
                blocked[t] = op
                key = (op[1], op[2]) if kind == "bar" else "sync"
                gathering.setdefault(key, []).append(t)
                if kind == "bar":
                    release_gathered(key, op[2])
                else:
                    check_sync()
                break
            pc[t] += 1
            if fair and pc[t] < len(trace):  # one step a turn
                runnable.append(t)
                break
        else:
            unfinished.discard(t)
            check_sync()
    if mixed:
        (bar, n), first, team = mixed[0]
        return ProgressReport("deadlock", _mixed_team(bar, n, first, team), 1)
    if not unfinished:
        return ProgressReport("ok", schedules=1)
    groups: dict = {}
    for t in sorted(unfinished):
        groups.setdefault(traces[t][pc[t]], []).append(t)
    stuck = [(_ranges(ts), op) for op, ts in groups.items()]
    detail = "; ".join(f"threads {ts} at {_describe(op, phases, arrived, counts, pool[0], at_launch, len(traces))}"
                       for ts, op in stuck)
    # every thread left is a parity wait's, on a barrier it never arrives on and that has completed
    # phases: one that ran late can find the parity it waits for back in the current phase
    late = all(op[0] == "wait" and phases.get(op[1]) and ("arrive", op[1]) not in traces[t]
               for op, ts in groups.items() for t in ts)
    return ProgressReport("deadlock", detail, 1, stuck, late)


def _mixed_team(bar: int, n: int, first: frozenset, team: frozenset) -> str:
    """A named barrier that released part of the threads it first joined together with others:
    two groups of threads share its id (each alone holding ``n``), so it releases whichever ``n``
    arrive first and orders neither group's steps (TileLang's AllReduce put two warpgroups'
    reductions on ids 1 and 2; tlx/passes/reduce_barriers.py). A barrier that joins disjoint
    teams in turn, or the same team each time, is not reported."""
    return (f"named barrier {bar} of {n} threads joined threads {_ranges(sorted(team))} after it had joined "
            f"{_ranges(sorted(first))}: two groups of threads share it, and it orders neither")


def _describe(op, phases, arrived, counts, pool: int, at_launch: int, threads: int) -> str:
    if op[0] == "nreg":
        return (f"setmaxnreg.inc to {op[1]} registers a thread ({pool} registers free in the CTA's pool; "
                f"{at_launch} a thread at launch for {threads} threads)")
    if op[0] == "wait":
        bar = op[1]
        return (f"wait {bar[0]}[{bar[1]}] parity {op[2]} (phases completed {phases.get(bar)}, "
                f"{arrived.get(bar)}/{counts.get(bar)} arrivals in the current one)")
    if op[0] == "bar":
        return f"named barrier {op[1]} of {op[2]} threads"
    return "__syncthreads"


def _block_threads(func) -> int:
    n = 1
    for attr in _attrs(func.body):
        if str(attr.node.thread_tag).startswith("threadIdx"):
            n *= int(attr.value)
    return n


def _register_targets(func, values: dict) -> dict[int, set] | None:
    """warp -> the ``(count, increase)`` of every setmaxnreg its threads can reach (a branch is
    followed where the warp's first thread decides it, both arms where the condition is not
    known), or None when a count is not known."""
    if not any(op_name(c) == _SET_MAX_NREG for c in nodes(func.body, tir.Call)):
        return {}  # most kernels: nothing to count
    threads = _block_threads(func)
    thread_var, env0 = _block_env(func, values)
    targets: dict[int, set] = {}

    def walk(s, env, warp):
        if isinstance(s, tir.SeqStmt):
            for x in s.seq:
                walk(x, env, warp)
        elif isinstance(s, tir.Bind):
            try:
                env[s.var] = int(eval_numpy(s.value, env))
            except ValueError:
                pass
        elif isinstance(s, tir.IfThenElse):
            try:
                arms = [s.then_case if _value(s.condition, env) else s.else_case]
            except Unknown:
                arms = [s.then_case, s.else_case]
            for arm in arms:
                if arm is not None:
                    walk(arm, dict(env), warp)
        elif isinstance(s, tir.Evaluate) and isinstance(s.value, tir.Call) and op_name(s.value) == _SET_MAX_NREG:
            targets.setdefault(warp, set()).add((_value(s.value.args[0], env), bool(_value(s.value.args[1], env))))
        elif isinstance(getattr(s, "body", None), tir.Stmt):
            walk(s.body, env, warp)

    try:
        for warp in range(-(-threads // 32)):
            env = dict(env0)
            env[_THREAD] = 32 * warp
            if thread_var is not None:
                env[thread_var] = 32 * warp
            walk(func.body, env, warp)
    except Unknown:
        return None
    return targets


def register_budget(func, values: dict | None = None) -> ProgressReport | None:
    """A deadlock when the warps' setmaxnreg counts (one a warp) add up to more registers than
    the CTA holds at launch (``launch_registers``): an increase then waits forever whenever it
    runs, whatever the data. None when they fit, or when a warp can reach two counts or a count
    is not known (the simulation decides those)."""
    targets = _register_targets(func, values or {})
    if not targets or any(len(t) != 1 for t in targets.values()):
        return None
    threads = _block_threads(func)
    warps = -(-threads // 32)
    at_launch = launch_registers(threads, max(count for t in targets.values() for count, _ in t), ctas_per_sm(func))
    final = {w: next(iter(targets[w]))[0] if w in targets else at_launch for w in range(warps)}
    if 32 * sum(final.values()) <= at_launch * 32 * warps:
        return None
    up = sorted(w for w, t in targets.items() if next(iter(t))[1] and final[w] > at_launch)
    short = 32 * sum(final.values()) - at_launch * 32 * warps
    return ProgressReport("deadlock", f"setmaxnreg: warps {_ranges(up)} increase to "
                          f"{sorted({final[w] for w in up})} registers a thread, {short} registers more than the "
                          f"CTA's {threads} threads x {at_launch} at launch leave once the other warps decreased: "
                          f"an increase waits forever whenever it runs", 0,
                          [(_ranges([t for w in up for t in range(32 * w, 32 * w + 32)]), ("nreg",))])


def check_progress(func, values: dict | None = None, seeds: int = SEEDS, swept: dict | None = None) -> ProgressReport:
    """Simulate the barrier protocol of one device function (one CTA, block 0) under ``seeds``
    random schedules; shape variables by name in ``values``; ``swept``: values for bound
    variables that read memory (else each such variable, up to ``MAX_SWEPT`` of them, is tried
    at each value of ``SWEEP``). The registers the warps reallocate are checked first, for any
    control values (``register_budget``)."""
    if not swept:
        over = register_budget(func, values)
        if over is not None:
            return over
    try:
        traces = thread_traces(func, values or {}, _block_threads(func), swept)
        return simulate_schedules(traces, seeds, ctas_per_sm(func))
    except Diverged as e:
        return ProgressReport("deadlock", str(e))
    except Unknown as e:
        if e.unread is not None and len(swept or {}) < MAX_SWEPT:
            return _sweep(func, values, seeds, dict(swept or {}), e.unread, str(e))
        return ProgressReport("unknown", str(e))


def simulate_schedules(traces: list[list[tuple]], seeds: int = SEEDS, ctas: int = 1) -> ProgressReport:
    """The verdict of ``seeds`` random schedules: the first deadlock, unless only late waiters
    are left in it and a fair schedule finishes ("unknown", ``LATE``: module docstring)."""
    for seed in range(seeds):
        report = simulate(traces, seed, ctas)
        if report.verdict != "ok":
            if report.late and simulate(traces, 0, ctas, fair=True).verdict == "ok":
                return ProgressReport("unknown", f"schedule {seed}: {report.detail}: {LATE}", report.schedules, report.stuck)
            report.detail = f"schedule {seed}: {report.detail}"
            return report
    return ProgressReport("ok", f"{seeds} schedules, {sum(map(len, traces))} synchronisation steps", seeds)


def _sweep(func, values, seeds: int, swept: dict, name: str, why: str) -> ProgressReport:
    """"unknown" with what the protocol does at each value of ``SWEEP`` for ``name`` (a bound
    variable that reads memory; ``swept``: the values already given to others): the first hang
    found, or that none was. A second such variable is swept inside each value of the first."""
    nested = ""
    for value in SWEEP:
        report = check_progress(func, values, seeds, {**swept, name: value})
        if report.verdict == "deadlock":
            return ProgressReport("unknown", f"{why}; at {name} = {value} it hangs (a real hang wherever the data can "
                                             f"make it {value}): {report.detail}", report.schedules, report.stuck)
        if report.verdict == "unknown":
            if "; no hang at " not in report.detail:
                return ProgressReport("unknown", f"{why}; at {name} = {value}: {report.detail}")
            nested = report.detail.split("; no hang at ", 1)[1].split(" (", 1)[0]
    where = f"{name} = {SWEEP[0]}..{SWEEP[-1]}" + (f" x {nested}" if nested else "")
    return ProgressReport("unknown", f"{why}; no hang at {where} ({seeds} schedules each)")


_EXIT = {"ok": 0, "deadlock": 1, "unknown": 3}


def progress_report(kernel: LoweredKernel) -> dict:
    """``tlx check``'s "progress" section: every device function simulated (no shape values: a
    control value that needs one makes the verdict unknown)."""
    kernels = []
    for name, func in device_functions(kernel.device_mod):
        r = check_progress(func)
        kernels.append({"kernel": name, "verdict": r.verdict, "detail": r.detail})
    worst = max((k["verdict"] for k in kernels), key=lambda v: (_EXIT[v] == 1, _EXIT[v]), default="ok")
    summary = "; ".join(f"{k['kernel']}: {k['verdict']}" + (f" ({k['detail']})" if k["detail"] else "") for k in kernels)
    return {"kernels": kernels, "exit_code": _EXIT[worst], "summary": [summary]}


def progress_pass(kernel: LoweredKernel, ctx: PassContext) -> LoweredKernel:
    """Report into ``ctx.reports["progress"]``; a deadlock found raises or warns per ``verify``."""
    report = progress_report(kernel)
    ctx.reports["progress"] = report
    if report["exit_code"] == 1:
        raise_or_warn(ctx, DeadlockError(report["summary"][0]))
    return kernel


def register_budget_pass(kernel: LoweredKernel, ctx: PassContext) -> LoweredKernel:
    """On every verified compile (cheap: a walk per warp): a kernel whose warps reallocate more
    registers than the CTA holds (``register_budget``) raises DeadlockError, whatever ``verify``
    says, since no launch of it could finish (``tlx check`` reports it under "progress")."""
    found = {name: r.detail for name, func in device_functions(kernel.device_mod) if (r := register_budget(func))}
    ctx.reports["registers"] = {"deadlocks": found}
    if found and not ctx.options.report_only:
        name, detail = next(iter(found.items()))
        raise DeadlockError(f"kernel {kernel.name!r} ({name}) would hang: {detail}")
    return kernel
