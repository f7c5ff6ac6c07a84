"""Shared-memory races: two threads, one address, at least one write, nothing ordering them.
(The report also carries ``pdl.py``'s finding: global memory a dependent launch touches before
its ``T.pdl_sync()`` while the grids before it may still run.)

Model. ``__syncthreads()`` (``tvm_storage_sync`` without a barrier id) splits each
thread's execution into *epochs*; the epoch of an access instance is the number of
block barriers executed before it, a symbolic expression of the enclosing loop
variables (a loop whose body passes ``s`` barriers adds ``s`` per iteration; a branch
adds ``Select(cond, then, else)``). Two plain accesses of different threads are
unordered exactly when their epochs are equal. A ``cp.async`` write stays in flight
from its issue until a ``cp.async.wait_group(n)`` of the issuing thread retires its
commit group (``commits(wait) - n > group``) *and* a barrier follows that wait: it
races with another thread's access in any epoch from its issue until then.

Both instances get their own loop iterations and threads; the block and shape
variables are shared. Each pair of shared accesses to one allocation (at least one
writing) is one Z3 query: unsat is a proof of absence; a model is a witness.

The async proxy (sm_90a, as TileLang lowers it). A TMA load writes its shared range
asynchronously and is published only by the mbarrier it completes on; a wgmma reads the
ranges its descriptors span until a ``warpgroup_wait(0)`` of its thread, and a TMA store its
shared box until a ``tma_store_wait(0)`` of its thread (later arrives of that thread release
either read only with that wait between; a wait that leaves groups in flight is not counted,
which can only report more races). mbarriers are
tabulated over the pipeline loop (:class:`_Pipeline`): in iteration ``k`` a statement uses
barrier ``index[k]`` for its ``round[k]``-th time; phase ``j`` of a barrier collects round
``j`` (checked: the threads arriving per round equal the init count, and the TMA bytes per
round equal the expect-tx bytes); a parity wait in round ``j`` waits for phase ``j`` or
``j - 1``, whichever has its parity (checked: no wait skips a phase). ``X`` happens before
``Y`` when a release of ``X`` (its own TMA completion, or a later arrive of its thread) is in
a phase that a wait of ``Y``'s thread before ``Y`` covers, directly or through a third
thread that waits and then arrives (two hops). That round ``j``'s arrivals all follow round
``j - 1``'s is itself checked with these queries; where it is not shown, races found are
still reported but absence is "unknown". A generic write read or overwritten by the async
proxy needs ``fence.proxy.async`` (by the writer before the barrier, or by the reader after
it). Two instances of one elected statement (``tl_shuffle_elect``) in one group are one
thread; async-proxy accesses of one thread are not ordered by its program order.

Single-element shared atomics (``tl.atomic_*_elem_op``) of one width never race with each
other; against plain accesses they are ordered like any access. A fence.proxy.async the async
reader ran after a generic write reached it, in an earlier epoch than its read, fences that
write too. A race whose witness needs values read from memory (an index or a condition that
loads) is reported ``unknown`` (data-dependent): the program may never hold those values.

A pipeline loop of symbolic trip count (or over ``_TABLE_LIMIT`` steps) is not tabulated: each
barrier index must repeat with one period ``p`` for every step and each wait's parity be its
round's or the previous round's (both proven with Z3 over the step); round is ``step // p``, and
orderings through other threads (wait, then arrive) take any number of hops, as the smallest
round distance between barriers (:meth:`_Pipeline._round_distances`). Every trip count is covered
at once. ``cp.async.mbarrier.arrive.noinc`` (TileLang's non-TMA producer) is one arrival that
releases the thread's cp.async writes and, as TileLang relies on, its earlier plain stores.
In a tabulated loop a wait may run in some iterations only (``if k == 0``): its rounds count
those iterations, and it acquires for the rest of the loop. A wait acquires for an access after
the loop it is in (its iterations that run; the last 8 of a long loop) or outside any loop.

Named barriers (``bar.sync id, n``) order accesses in two forms. Every statement's id is known
per thread (a constant, or a function of the thread: ``2 + tx / 128``, one barrier per
warpgroup), and each id is run by exactly its ``n`` threads, one group per id. Then an id whose
statements all stand outside loops orders an access before such a barrier before an access
after it, for two threads of the group, with what the async proxy needs
(:func:`_named_barrier_orders`); and an id whose one statement stands in one loop, run in every
iteration, orders two plain accesses in that loop when one of its instances lies between them
(the k-th barrier of every member is iteration k's: :func:`_looped_barrier_orders`). A witness
that such a barrier orders is set aside and the pair solved again without it: for a thread
outside the group, or in iterations the barrier does not order. Other named barriers are not
counted: ignoring an ordering can only report more races. A race found is reported as certain only when no named barrier can order it (the two
threads are in no common group left uncounted, and every group runs its waits and arrives uniformly, see
:func:`_named_barrier_gap`) and, in a periodic pipeline, its orderings are exact (no elected wait
or arrive, one block-barrier epoch); otherwise it is ``unknown``.

Not modelled, and therefore reported as ``unknown`` rather than safe: multicast and cluster
barriers, pipelines whose barrier index or parity depends on more than the loop
or has no period, barriers under thread-dependent conditions, and wgmma descriptors this model
did not see built. Calls into TileLang's collective templates
(``tl::AllReduce`` and the like) are treated as one access of their whole workspace by every
thread, synchronised inside the call but not with anything outside it.
"""

from __future__ import annotations

import contextlib
import functools
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import z3

from tilelang import tvm
from tlx.lowering import LoweredKernel
from tlx.passes import PassContext, TlxError, exit_status, raise_or_warn
from tlx.ir.program import SHARED_SCOPES, Access, Program, collect_program
from tlx.ir.tir import const_int, elem_bytes, eval_numpy, free_vars, nodes, op_name
from tlx.passes.layouts import bit_split, bits_to_arith
from tlx.passes.pdl import pdl_report
from tlx.passes.smt import Encoder, Verdict, kernel_encoder

tir = tvm.tirx

__all__ = ["RaceError", "find_races", "races_report"]

_THREAD_OPS = ("load", "store", "ptx_ldmatrix", "ptx_stmatrix", "ptx_cp_async")
_ASYNC_PROXY_OPS = ("tma_load", "wgmma", "tma_store")  # ordered only through mbarriers, waits (and proxy fences)
# async-proxy reads and the wait kind whose ``wait(0)`` by the reading thread ends them
_READ_WAITS = {"wgmma": "wgmma_wait", "tma_store": "bulk_wait"}
_MBARRIER_HINTS = ("mbarrier", "arrive_barrier", "ptx_arrive", "barrier_wait")
# The sync calls the mbarrier model understands (tlx.ir.program turns them into SyncOps / accesses);
# any other call that looks like an mbarrier, TMA, cluster or wgmma primitive leaves it unmodelled.
_MODELLED_CALLS = {
    "tirx.ptx_init_barrier_thread_count", "tl.mbarrier_expect_tx", "tirx.ptx_arrive_barrier",
    "tirx.ptx_arrive_barrier_expect_tx", "tl.mbarrier_wait_parity", "tl.tma_load", "tl.ptx_wgmma_ss",
    "tl.tma_store", "tl.tma_store_arrive", "tl.tma_store_wait",
    "tl.initialize_wgmma_descriptor", "tl.increase_descriptor_offset", "tl.warpgroup_wait", "tl.wait_wgmma", "tl.fence_proxy_async",
    "tl.prefetch_tma_descriptor", "tl.ptx_fence_barrier_init", "tl.warpgroup_arrive", "tl.warpgroup_commit_batch",
    "tl.warpgroup_fence_operand", "tl.ptx_wgmma_rs", "tl.ptx_cp_async_barrier_noinc",
    # generic shared accesses (thread accesses of the program model) whose names look async
    "tl.ptx_stmatrix", "tl.ptx_ldmatrix", "tirx.ptx_stmatrix", "tirx.ptx_ldmatrix",
}
_ASYNC_HINTS = ("barrier", "arrive", "tma", "cluster", "wgmma", "warpgroup", "fence", "bulk", "mbarrier")
_ELECT = "tl.tl_shuffle_elect"
_TABLE_LIMIT = 1024  # iterations of a pipeline loop the mbarrier model tabulates
_MAX_PERIOD = 16  # longest barrier-index period looked for in a pipeline loop it does not tabulate
_SHORT_TABLE = 8  # iterations up to which a barrier table stays one If per iteration (cheap enough, and the old queries)


@functools.lru_cache(maxsize=256)
def _repeat(values: tuple) -> tuple[int, int] | None:
    """``(p, c)`` with ``values[i] == values[i - p] + c`` for every ``i >= p``, the smallest such
    ``p``, when it is at most half the table; else None. Cached: a site's table is encoded once
    per query."""
    n = len(values)
    for p in range(1, n // 2 + 1):
        c = values[p] - values[0]
        if all(values[i] - values[i - p] == c for i in range(p, n)):
            return p, c
    return None


class RaceError(TlxError):
    """A shared-memory race was found under ``verify="error"``."""


def _collective(acc: Access) -> bool:
    return acc.op == "call_extern" or acc.op.startswith("tl::")


def _atomic(acc: Access) -> bool:
    """A single-element atomic read-modify-write (``tl.atomic_*_elem_op`` on a shared pointer)."""
    return acc.op.startswith("atomic_") and acc.op.endswith("_elem_op") and acc.read and acc.write and acc.lanes == 1


def _data_dependent(acc: Access) -> bool:
    """Its address, one of its conditions or the count of barriers before it reads memory
    (elections aside), so a witness may need values the program never holds there."""
    def reads(expr) -> bool:
        return bool(nodes(expr, tir.BufferLoad))
    # the program model marks every atomic's pointer inexact: look at its index itself
    inexact = reads(acc.index) if _atomic(acc) else not acc.exact
    # a barrier count that depends on a loaded value (a branch on ``block_indices[i] >= 0``)
    return inexact or reads(acc.epoch) or any(reads(c) for c in acc.conds if not _has_call(c, _ELECT))


def _modelled(acc: Access) -> bool:
    return acc.op in _THREAD_OPS or _collective(acc) or _atomic(acc)


def _async_proxy(acc: Access) -> bool:
    return acc.op in _ASYNC_PROXY_OPS and (acc.op != "tma_load" or acc.barrier is not None)


class _Copy:
    """One dynamic instance of an access: its own threads and loop iterations.

    Thread indices and power-of-two loops are split into bits (see ``bit_split``) so the
    swizzled addresses of TileLang kernels stay easy for Z3; every copy gets fresh
    variables, so two copies are two independent instances.
    """

    def __init__(self, enc: Encoder, prog: Program, acc: Access, tag: str):
        ctx_vars = [(v, ext) for v, ext in prog.threads]
        split_loops = [(v, ext) for v, lo, ext in acc.loops if const_int(lo) == 0 and const_int(ext) is not None]
        other_loops = [(v, lo, ext) for v, lo, ext in acc.loops if not (const_int(lo) == 0 and const_int(ext) is not None)]
        index = acc.index.base if isinstance(acc.index, tir.Ramp) else acc.index
        extents = dict(ctx_vars + split_loops)
        exprs = [bits_to_arith(e, extents) for e in [index, acc.epoch, acc.commits] + list(acc.conds)]
        outs, inputs, recon, constraints = bit_split(exprs, ctx_vars + split_loops + [(v, None) for v, _, _ in other_loops], tag=f"@{tag}", fresh=True)
        facts = []
        for nv, ext in inputs:
            if const_int(ext) is not None:
                t = enc.var(nv)
                facts += [t >= 0, t < const_int(ext)]
        for v, lo, ext in other_loops:
            t = enc.encode(recon[v])
            lo_t = enc.encode(tir.stmt_functor.substitute(lo, recon))
            facts += [t >= lo_t, t < lo_t + enc.encode(tir.stmt_functor.substitute(ext, recon))]
        self.threads = [(str(v.name), enc.encode(recon[v])) for v, _ in prog.threads]
        self.loops = [(str(v.name), enc.encode(recon[v])) for v, _, _ in acc.loops]
        self.loop_env = {v: t for (v, _, _), (_, t) in zip(acc.loops, self.loops, strict=True)}
        self.thread_env = {v: t for (v, _), (_, t) in zip(prog.threads, self.threads, strict=True)}
        index, epoch, commits, *conds = outs
        self.facts = facts + [enc.encode_bool(c) for c in list(conds) + constraints]
        self.lo = acc.base_bytes + enc.encode(index) * elem_bytes(acc.dtype)
        self.hi = self.lo + acc.width  # exclusive
        self.epoch = enc.encode(epoch)
        self.group = enc.encode(commits)
        enc.take_obligations()


def _not_landed(enc: Encoder, prog: Program, ca: _Copy, other: _Copy) -> object:
    """``ca``'s async write may still be in flight (or unpublished) when ``other`` runs.

    It has landed for ``other`` once some ``wait_group(n)`` instance of the issuing thread
    retired its group (``commits - n > group``) before a barrier that precedes ``other``
    (``epoch(wait) < epoch(other)``). Instead of quantifying over every wait instance,
    a few candidate instances are tried: for each loop around the wait, the iteration
    of ``other`` or the one before it, that of ``ca`` or the one after, and the first and
    last. Trying fewer waits can only report more races, never fewer: no false "safe".
    """
    import itertools

    landed = []
    for w in prog.waits:
        choices = []
        for v, lo, ext in w.loops:
            opts = []
            if v in other.loop_env:
                opts += [other.loop_env[v], other.loop_env[v] - 1]
            if v in ca.loop_env:
                opts += [ca.loop_env[v], ca.loop_env[v] + 1]
            opts += [None, "last"]
            choices.append([(v, lo, ext, o) for o in opts])
        for combo in itertools.product(*choices):
            env = dict(ca.thread_env)
            dom = []
            for v, lo, ext, o in combo:
                lo_t, ext_t = enc.encode(lo, env), enc.encode(ext, env)
                t = lo_t if o is None else lo_t + ext_t - 1 if isinstance(o, str) else o
                env[v] = t
                dom += [t >= lo_t, t < lo_t + ext_t]
            dom += [enc.encode_bool(c, env) for c in w.conds]
            dom += [enc.encode(w.commits, env) - w.n > ca.group, enc.encode(w.epoch, env) < other.epoch]
            landed.append(z3.And(dom))
    enc.take_obligations()
    return z3.Not(z3.Or(landed)) if landed else z3.BoolVal(True, enc.ctx)


class _NotModelled(Exception):
    """The kernel's mbarrier use falls outside what :class:`_Pipeline` can decide."""


def _has_call(expr, name: str) -> bool:
    return any(op_name(c) == name for c in nodes(expr, tir.Call))


@dataclass
class _Site:
    """One mbarrier statement (or TMA load) tabulated over the iterations of its pipeline loop.

    ``index[k]`` is the barrier it uses in iteration ``k``, ``round[k]`` how many earlier
    iterations used that barrier, and for a wait ``phase[k]`` the phase whose completion it
    waits for: its parity names one of ``round`` and ``round - 1`` (``-1``: none, it returns
    at once). ``threads`` are the linear thread ids that run it (one per group when elected).
    """

    op: Any
    kind: str
    barrier: Any
    loop: Any  # the pipeline loop's variable, None outside loops
    index: list
    round: list
    phase: list | None
    threads: frozenset
    elected: bool
    runners: frozenset  # the threads it may run in: ``threads``, or every thread of each group when elected
    bytes: int  # TMA: bytes per iteration (all inner-loop copies); expect-tx / arrive: bytes expected
    # periodic (a loop it does not tabulate): ``index`` lists one period, round ``k // period``,
    # and a wait's ``phase`` holds its offset from the round (0 or -1) for every residue
    period: int | None = None
    # a wait under a condition of the iteration (``if k == 0``): whether it runs in iteration k;
    # its rounds count only those iterations (None: it runs in every one)
    present: list | None = None

    def runs_in(self, k: int) -> bool:
        return self.present is None or self.present[k]

    @property
    def order(self) -> int:
        return self.op.order

    def at(self, k: int) -> tuple[int, int, int | None]:
        """(barrier index, round, phase) of iteration ``k`` (concrete)."""
        if self.period is None:
            return self.index[k], self.round[k], self.phase[k] if self.phase else None
        r, rnd = k % self.period, k // self.period
        return self.index[r], rnd, rnd + self.phase[r] if self.phase else None


class _Pipeline:
    """The mbarrier protocol of one device function: rounds, phases and their checks.

    Phase ``j`` of a barrier is taken to collect round ``j`` of its arrivals: every arriving
    thread once (their number equals the init count) and TMA bytes equal to the bytes it was
    told to expect. ``incomplete`` says why that identity is not established for every round
    (then a race found is still reported, but no proof of absence is claimed).
    """

    def __init__(self, enc: Encoder, prog: Program):
        self.enc, self.prog = enc, prog
        self.incomplete: str | None = None
        self.nthreads = prog.block_threads
        self.exts = [e for _, e in prog.threads]
        foreign = sorted(c for c in prog.calls if c not in _MODELLED_CALLS and any(h in c for h in _ASYNC_HINTS) and c != "tirx.tvm_storage_sync")
        if foreign:
            raise _NotModelled(f"{', '.join(foreign)} not modelled")
        if prog.divergent_barriers:
            raise _NotModelled("divergent block barriers next to mbarriers")
        self.inits = {}
        for s in prog.syncs:
            if s.kind == "init":
                i, n = const_int(s.index), const_int(s.arg)
                if s.loops or i is None or n is None:
                    raise _NotModelled("mbarrier init inside a loop or with a computed index or count")
                self.inits[(s.barrier, i)] = n
        self.sites = [self._site(s, s.kind) for s in prog.syncs if s.barrier is not None and s.kind != "init"]
        self.sites += [self._site(a, "tma") for a in prog.accesses if a.barrier is not None]
        self.fences = [s for s in prog.syncs if s.kind == "fence_proxy_async"]
        self.read_waits = {kind: [s for s in prog.syncs if s.kind == kind and const_int(s.arg) == 0] for kind in _READ_WAITS.values()}
        periodic = [st for st in self.sites if st.period is not None]
        self.period = periodic[0].period if periodic else None
        if periodic and any(st.period != self.period for st in self.sites):
            raise _NotModelled("a pipeline loop without a constant trip count next to other mbarrier statements, or barrier periods that differ")
        self._check_rounds()
        self.distance = self._round_distances() if periodic else None

    # -- tabulation
    def _const(self, expr, env):
        """``expr`` at the given thread / iteration values (ints or numpy arrays)."""
        try:
            return eval_numpy(expr, env)
        except ValueError:
            raise _NotModelled(f"mbarrier index, parity or condition `{expr}` is not a function of the pipeline loop and thread alone") from None

    def _threads(self, conds) -> tuple[frozenset, bool, frozenset]:
        return _thread_sets(self.prog, conds)

    def _site(self, op, kind) -> _Site:
        loops = op.loops
        bar, idx_expr = (op.barrier, op.index) if kind != "tma" else op.barrier
        trips, period = 1, None
        if kind == "tma" and loops and not any(loops[0][0].same_as(s.loops[0][0]) for s in self.prog.syncs if s.barrier is not None and s.loops):
            # a loop of copies with no mbarrier statement in it (the unrolled boxes of one tile,
            # outside the pipeline loop): one TMA statement of all its copies' bytes
            for v, _, iext in loops:
                if const_int(iext) is None or any(x.same_as(v) for x in free_vars(idx_expr)):
                    raise _NotModelled(f"TMA copies in loop `{v}` outside any mbarrier loop: unknown trip count or barrier per copy")
                trips *= const_int(iext)
            loops = []
        if loops:
            k, lo, ext = loops[0]
            if const_int(lo) != 0:
                raise _NotModelled(f"pipeline loop `{k}` does not start at 0")
            for _, _, iext in loops[1:]:
                if kind != "tma" or const_int(iext) is None:
                    raise _NotModelled(f"{kind} inside a nested loop")
                trips *= const_int(iext)
            if const_int(ext) is None or const_int(ext) > _TABLE_LIMIT:
                period = self._period([idx_expr], k)
                iters = [{k: i} for i in range(period)]
            else:
                iters = [{k: i} for i in range(const_int(ext))]
        else:
            k, iters = None, [{}]
        present = None
        varying = [c for c in op.conds if _varies_with(c, loops)]
        if varying:
            # a wait that runs in some iterations only, each known (a condition of the iteration
            # alone, in a tabulated loop); its acquires carry the condition itself (``_conds``)
            if kind != "wait" or period is not None:
                raise _NotModelled(f"{kind} under a condition that changes between iterations")
            present = [all(bool(self._const(c, env)) for c in varying) for env in iters]
        index = [int(self._const(idx_expr, env)) for env in iters]
        if period is not None:
            if len(set(index)) != period:
                raise _NotModelled(f"{kind} uses one barrier twice in a period of `{k}`")
            rounds = [0] * period
            phase = [self._phase_offset(op.arg, k, period)] * period if kind == "wait" else None
        else:
            seen: dict = {}
            rounds = []
            for i, b in enumerate(index):
                rounds.append(seen.get(b, 0))
                if present is None or present[i]:
                    seen[b] = seen.get(b, 0) + 1
            phase = None
            if kind == "wait":
                phase = [r if int(self._const(op.arg, env)) % 2 == r % 2 else r - 1 for r, env in zip(rounds, iters, strict=True)]
        threads, elected, runners = self._threads([c for c in op.conds if not any(c is v for v in varying)])
        if kind == "tma":
            nbytes = op.width * trips
        else:
            nbytes = const_int(op.arg) if kind in ("expect_tx", "arrive") else 0
            if nbytes is None:
                raise _NotModelled(f"{kind} of a computed byte count")
        return _Site(op, kind, bar, k, index, rounds, phase, threads, elected, runners, nbytes, period, present)

    def _prove_for_every_step(self, k, claim) -> bool:
        """``claim(step)`` (a Z3 formula) holds for every step ``>= 0`` of the pipeline loop ``k``."""
        step = z3.Int(f"{k.name}@period", self.enc.ctx)
        try:
            formula = z3.Not(claim(step))
        except _NotModelled:
            return False
        # the step alone: the kernel's shape facts are not needed (and may be nonlinear)
        solver = z3.SolverFor("QF_LIA", ctx=self.enc.ctx)
        solver.set("rlimit", self.enc.rlimit)
        solver.add(step >= 0, formula)  # _step_term is exact over all integers: no wrap-around bound
        self.enc.queries += 1
        return solver.check() == z3.unsat

    def _period(self, exprs, k) -> int:
        """The smallest ``p`` with every expression of ``exprs`` equal at steps ``s`` and ``s + p``
        for every ``s >= 0`` (Z3 over the step): a loop of any trip count then repeats one period."""
        for e in exprs:
            if any(not v.same_as(k) for v in free_vars(e)):
                raise _NotModelled(f"mbarrier index or parity `{e}` depends on more than the pipeline loop `{k}`")

        def same_after(p):
            return lambda s: z3.And([_step_term(e, k, s) == _step_term(e, k, s + p) for e in exprs])

        for p in range(1, _MAX_PERIOD + 1):
            if self._prove_for_every_step(k, same_after(p)):
                return p
        raise _NotModelled(f"mbarrier index or parity in loop `{k}` has no period up to {_MAX_PERIOD}")

    def _phase_offset(self, parity, k, period: int) -> int:
        """0 when the wait's parity is its round's (``step // period``) at every step, -1 when it is
        the previous round's (Z3 over the step); a wait whose parity is neither is not modelled."""
        for offset in (0, -1):
            if self._prove_for_every_step(k, lambda s, o=offset: _step_term(parity, k, s) % 2 == (s / period + o + 2) % 2):
                return offset
        raise _NotModelled(f"wait parity `{parity}` is not shown to be its round's or the previous round's at every step of pipeline loop `{k}`")

    def _check_rounds(self):
        """Arrivals per round equal the init count, TMA bytes the expected bytes, waits step one phase at a time."""
        used = {}
        for st in self.sites:
            for b in set(st.index):
                used.setdefault((st.barrier, b), []).append(st)
        for key, sts in used.items():
            if key not in self.inits:
                raise _NotModelled(f"mbarrier {key[0].name}[{key[1]}] used but never initialised")
            count = self.inits[key]
            arrives = [st for st in sts if st.kind == "arrive"]
            if sum(len(st.threads) for st in arrives) != count or _overlap([st.threads for st in arrives]):
                raise _NotModelled(f"{key[0].name}[{key[1]}]: the threads arriving per round do not match its count {count}")
            nrounds = {st.index.count(key[1]) for st in arrives}
            if len(nrounds) != 1:
                raise _NotModelled(f"{key[0].name}[{key[1]}]: its arrivals run different numbers of rounds")
            for j in range(nrounds.pop()):
                def per_round(kinds, j=j):
                    return sum(st.bytes * len(st.threads)
                               for st in sts if st.kind in kinds for i, b in enumerate(st.index) if b == key[1] and st.round[i] == j)
                if per_round(("tma",)) != per_round(("expect_tx", "arrive")):
                    raise _NotModelled(f"{key[0].name}[{key[1]}] round {j}: TMA bytes differ from the bytes expected")
            waits = [st for st in sts if st.kind == "wait"]
            if _overlap([st.threads for st in waits]):
                raise _NotModelled(f"{key[0].name}[{key[1]}]: a thread waits on it from two statements")
            for st in waits:
                phases = [p for i, (b, p) in enumerate(zip(st.index, st.phase, strict=True)) if b == key[1] and st.runs_in(i)]
                if any(p > q + 1 for q, p in zip([-1] + phases, phases)):
                    raise _NotModelled(f"{key[0].name}[{key[1]}]: a wait skips a phase (its parity cannot tell them apart)")

    # -- happens-before through mbarriers
    def _table(self, values: list, k_term):
        """``values[k]`` as a Z3 term of the iteration ``k_term`` (``values[-1]`` outside the table).

        A table that repeats with a step, ``values[i] == values[i - p] + c`` (a barrier index
        ``k % 3``: c 0; its round ``k // 3``: c 1), is written ``values[k % p] + (k / p) * c``,
        exactly the same function, instead of one ``If`` per iteration: a pipeline of 32 steps
        then costs the solver 3 cases, not 32 (TileLang's own TMA GEMM ran out of budget). Short
        tables keep the chain: there the closed form saves nothing and shifts Z3's budget outcomes."""

        def chain(vals, k):
            term = z3.IntVal(vals[-1], self.enc.ctx)
            for i in range(len(vals) - 2, -1, -1):
                term = z3.If(k == i, vals[i], term)
            return term

        n = len(values)
        repeat = _repeat(tuple(values)) if n > _SHORT_TABLE else None
        if repeat is None:  # a short or barely repeating table: the If chain
            return chain(values, k_term)
        period, step = repeat
        closed = chain(values[:period], k_term % period) + (k_term / period) * step
        return z3.If(z3.And(k_term >= 0, k_term < n), closed, values[-1])

    def _terms(self, st: _Site, k):
        """(barrier index, round, phase) of ``st`` in iteration ``k`` (a Z3 term)."""
        if st.period is None:
            return self._table(st.index, k), self._table(st.round, k), self._table(st.phase, k) if st.phase else None
        rnd = k / st.period
        return self._table(st.index, k % st.period), rnd, rnd + st.phase[0] if st.phase else None

    def _conds(self, op, env):
        if any(_has_call(c, _ELECT) for c in op.conds):
            return None  # which thread an election picks is not known: no ordering through it
        return z3.And([self.enc.encode_bool(c, env) for c in op.conds] + [z3.BoolVal(True, self.enc.ctx)])

    def _iteration(self, site: _Site, ev: "_Event"):
        """Z3 term of ``site``'s iteration when run by ``ev``'s thread in ``ev``'s iteration (same loop)."""
        if site.loop is None:
            return z3.IntVal(0, self.enc.ctx)
        return ev.loops.get(site.loop)

    def _read_waits(self, op) -> list:
        """The ``wait(0)`` statements that end ``op``'s async read (none for other accesses)."""
        return self.read_waits[_READ_WAITS[op.op]] if _async_read(op) else []

    def releases(self, ev: "_Event", need_fence: bool) -> list:
        """(condition, barrier, index, round): arrivals that publish ``ev``'s access (its own TMA completion, or a later arrive of its thread)."""
        own = [st for st in self.sites if st.op is ev.op and st.kind in ("tma", "arrive")]
        if own:
            st = own[0]
            k = self._iteration(st, ev)
            if st.period is not None:
                return [(k % st.period == r, st.barrier, z3.IntVal(b, self.enc.ctx), k / st.period) for r, b in enumerate(st.index)]
            index, rnd, _ = self._terms(st, k)
            return [(z3.BoolVal(True, self.enc.ctx), st.barrier, index, rnd)]
        if self.period is not None:
            return self._periodic_releases(ev, need_fence)
        if isinstance(ev.op, Access) and ev.op.op in ("tma_load", "ptx_cp_async"):
            return []  # a TMA write is published only by its own barrier, a cp.async one by its wait_group
        out = []
        for st in self.sites:
            if st.kind != "arrive" or st.order <= ev.order or not self._same_loop(st, ev):
                continue
            k = self._iteration(st, ev)
            cond = self._conds(st.op, ev.env(st.loop, k))
            # a wgmma read is over only after a warpgroup_wait(0) of its thread; a generic write
            # reaches the async proxy only through a fence of its thread, both before the arrive
            for needed, ops in ((_async_read(ev.op), self._read_waits(ev.op)), (need_fence, self.fences)):
                if needed and cond is not None:
                    between = [self._conds(w, ev.env()) for w in ops if ev.order < w.order < st.order and self._same_loop_op(w, ev)]
                    between = [c for c in between if c is not None]
                    cond = z3.And(cond, z3.Or(between)) if between else None
            if cond is not None:
                index, rnd, _ = self._terms(st, k)
                out.append((cond, st.barrier, index, rnd))
        return out

    def acquires(self, ev: "_Event") -> list:
        """(condition, barrier, index, phase): waits of ``ev``'s thread before it in its iteration
        and, for a wait that runs in some iterations only, in every earlier iteration it runs in."""
        if self.period is not None:
            return self._periodic_acquires(ev)
        out = []
        for st in self.sites:
            if st.kind != "wait":
                continue
            if not self._same_loop(st, ev):
                if st.order < ev.order:
                    # a wait that ran to completion before ``ev``'s loop began: outside loops, or every
                    # iteration of a loop that ``ev`` is not in (those it runs in; the last 8 of a long one)
                    kps = [0] if st.loop is None else ([i for i, runs in enumerate(st.present) if runs] if st.present is not None
                                                       else range(max(0, len(st.index) - 8), len(st.index)))
                    out += [acq for kp in kps if (acq := self._acquire_at(st, ev, kp)) is not None]
                continue
            if st.present is not None and st.loop is not None:
                k = self._iteration(st, ev)
                out += [acq for kp, runs in enumerate(st.present)
                        if runs and (acq := self._acquire_at(st, ev, kp, kp < k if st.order >= ev.order else kp <= k)) is not None]
                continue
            if st.order >= ev.order:
                continue
            k = self._iteration(st, ev)
            cond = self._conds(st.op, ev.env(st.loop, k))
            if cond is not None:
                index, _, phase = self._terms(st, k)
                out.append((cond, st.barrier, index, phase))
        return out

    def _acquire_at(self, st: _Site, ev: "_Event", kp: int, when=None):
        """(condition, barrier, index, phase) of wait ``st`` in its iteration ``kp`` (a number) as
        ``ev``'s thread runs it, under ``when`` if given; None where an election hides the thread."""
        env = ev.env(st.loop, z3.IntVal(kp, self.enc.ctx)) if st.loop is not None else ev.env()
        cond = self._conds(st.op, env)
        if cond is None:
            return None
        index, _, phase = st.at(kp)
        return cond if when is None else z3.And(cond, when), st.barrier, z3.IntVal(index, self.enc.ctx), z3.IntVal(phase, self.enc.ctx)

    # -- a pipeline loop of any trip count: every iteration's statements, in closed form
    def _periodic_releases(self, ev: "_Event", need_fence: bool) -> list:
        """(condition, barrier, index, round) of every arrive of ``ev``'s thread after ``ev``, in its
        iteration or a later one: per residue of the period, the first such iteration (a later one
        of that residue is in a later round, which a wait covers only if it covers this one).

        A plain arrive releases the thread's generic accesses, and a wgmma read once a
        ``warpgroup_wait(0)`` lies between; ``cp.async.mbarrier.arrive.noinc`` releases its
        cp.async writes too (and, as TileLang's producer relies on, its earlier plain stores); a
        generic write the async proxy reads needs a ``fence.proxy.async`` of the thread between.
        The residue of ``ev``'s iteration is enumerated, so every term is linear in its quotient.
        """
        if isinstance(ev.op, Access) and ev.op.op == "tma_load":
            return []
        period, out = self.period, []
        needs = [ops for needed, ops in ((_async_read(ev.op), self._read_waits(ev.op)), (need_fence, self.fences)) if needed]
        cp_async = isinstance(ev.op, Access) and ev.op.op == "ptx_cp_async"
        for st, cond, _, quotient, residue in self._loop_sites(ev, "arrive"):
            if cp_async and not st.op.cp_async:
                continue
            first = 0 if st.order > ev.order else 1
            for own in range(period):
                for r in range(period):
                    # later candidates of the residue, for the ops that must lie between (two periods on, one always does)
                    for later in (0, period, 2 * period) if needs else (0,):
                        ahead = first + (r - own - first) % period + later  # the arrive runs in iteration k + ahead
                        between = [z3.Or([self._between(w, ev, st, ahead) for w in ops] + [z3.BoolVal(ahead >= 2, self.enc.ctx)]) for ops in needs]
                        out.append((z3.And([cond, residue == own] + between), st.barrier, z3.IntVal(st.index[r], self.enc.ctx),
                                    quotient + (own + ahead) // period))
        return out

    def _loop_sites(self, ev: "_Event", kind: str):
        """(site, condition, k, quotient, residue) of every ``kind`` site of the pipeline loops around
        ``ev`` whose condition is known: ``k`` is ``ev``'s iteration of that loop, split by the period."""
        for st in self.sites:
            if st.kind != kind or st.loop not in ev.loops:
                continue
            cond = self._conds(st.op, ev.env())
            if cond is not None:
                k = ev.loops[st.loop]
                yield st, cond, k, k / self.period, k % self.period

    def _between(self, w, ev: "_Event", st: _Site, ahead: int):
        """The thread of ``ev`` runs ``w`` after ``ev`` and before ``st``, ``ahead`` iterations later."""
        if not self._same_loop_op(w, ev):
            return z3.BoolVal(False, self.enc.ctx)
        cond = self._conds(w, ev.env())
        if cond is None:
            return z3.BoolVal(False, self.enc.ctx)
        between = ev.order < w.order < st.order if ahead == 0 else w.order > ev.order or w.order < st.order
        return z3.And(cond, z3.BoolVal(between, self.enc.ctx))

    def _periodic_acquires(self, ev: "_Event") -> list:
        """(condition, barrier, index, phase) of the waits of ``ev``'s thread before it: per residue,
        the last such iteration (an earlier one of that residue waits for an earlier phase)."""
        period, out = self.period, []
        for st, cond, k, quotient, residue in self._loop_sites(ev, "wait"):
            last = 0 if st.order < ev.order else 1
            for own in range(period):
                for r in range(period):
                    behind = last + (own - last - r) % period  # the wait runs in iteration k - behind
                    out.append((z3.And(cond, residue == own, k >= behind), st.barrier, z3.IntVal(st.index[r], self.enc.ctx),
                                quotient + (own - behind) // period + st.phase[r]))
        return out

    def _round_distances(self) -> dict:
        """``{(b1, b2): d}``: a release of barrier ``b1`` in round ``j`` reaches a release of ``b2`` in
        round ``j + d`` (smallest ``d``) through threads that wait on one and then arrive on the
        next, any number of hops (Floyd-Warshall over the barriers; ``d >= 0``)."""
        period, keys = self.period, sorted({(st.barrier, b) for st in self.sites for b in st.index}, key=lambda x: (x[0].name, x[1]))
        dist = {(a, b): 0 if a == b else None for a in keys for b in keys}
        for w in (st for st in self.sites if st.kind == "wait"):
            for r2 in (st for st in self.sites if st.kind == "arrive"):
                if not w.loop.same_as(r2.loop) or not _one_thread_runs_both(w, r2):
                    continue
                step = 0 if r2.order > w.order else 1
                for rw in range(period):
                    # w covers round j first in step period * (j - offset) + rw; r2 next runs rw + step + c
                    for r in range(period):
                        c = (r - rw - step) % period
                        d = -w.phase[rw] + (rw + step + c) // period
                        a, b = (w.barrier, w.index[rw]), (r2.barrier, r2.index[r])
                        if dist[(a, b)] is None or d < dist[(a, b)]:
                            dist[(a, b)] = d
        for m in keys:
            for a in keys:
                for b in keys:
                    if dist[(a, m)] is not None and dist[(m, b)] is not None and (dist[(a, b)] is None or dist[(a, m)] + dist[(m, b)] < dist[(a, b)]):
                        dist[(a, b)] = dist[(a, m)] + dist[(m, b)]
        return dist

    def _periodic_ordered(self, rels: list, acqs: list):
        """A release of ``rels`` reaches a wait of ``acqs`` directly or through other threads."""
        hb = []
        for cond, bar, index, rnd in rels:
            for acond, abar, aindex, phase in acqs:
                a, b = (bar, _int_of(index)), (abar, _int_of(aindex))
                d = self.distance.get((a, b))
                if d is not None:
                    hb.append(z3.And(cond, acond, phase >= rnd + d))
        return z3.Or(hb) if hb else z3.BoolVal(False, self.enc.ctx)

    def _same_loop(self, st: _Site, ev: "_Event") -> bool:
        return st.loop is None and not ev.loops or st.loop is not None and st.loop in ev.loops

    def _same_loop_op(self, op, ev: "_Event") -> bool:
        return all(v in ev.loops for v, _, _ in op.loops)

    @staticmethod
    def _match(rel, acq):
        if not rel[1].same_as(acq[1]):
            return None
        return z3.And(rel[0], acq[0], rel[2] == acq[2], acq[3] >= rel[3])

    def ordered(self, first: "_Event", second: "_Event", need_fence: bool = False):
        """Z3 condition under which ``first`` happens before ``second`` through one or two mbarrier hops."""
        rels, acqs = self.releases(first, need_fence), self.acquires(second)
        if self.period is not None:
            result = self._periodic_ordered(rels, acqs)
            self.enc.take_obligations()
            return result
        hb = [m for r in rels for a in acqs if (m := self._match(r, a)) is not None]
        # two hops: a third thread waits for first's release, then arrives on a barrier second waits
        # on. Its thread and iteration are enumerated (the tables are concrete), so the condition
        # stays quantifier-free and can be negated.
        true = z3.BoolVal(True, self.enc.ctx)
        for w in (st for st in self.sites if st.kind == "wait"):
            for r2 in (st for st in self.sites if st.kind == "arrive"):
                if w.loop is None or r2.loop is None or not w.loop.same_as(r2.loop) or w.order >= r2.order:
                    continue
                if not _one_thread_runs_both(w, r2):
                    continue
                for km in range(len(w.index)):
                    if not w.runs_in(km):
                        continue  # no wait in that iteration
                    acq1 = (true, w.barrier, z3.IntVal(w.index[km], self.enc.ctx), z3.IntVal(w.phase[km], self.enc.ctx))
                    hop1 = [m for r in rels if (m := self._match(r, acq1)) is not None]
                    if hop1:
                        rel2 = (z3.Or(hop1), r2.barrier, z3.IntVal(r2.index[km], self.enc.ctx), z3.IntVal(r2.round[km], self.enc.ctx))
                        hb += [m for a in acqs if (m := self._match(rel2, a)) is not None]
        self.enc.take_obligations()
        return z3.Or(hb) if hb else z3.BoolVal(False, self.enc.ctx)

    def inexact(self, race: dict) -> str | None:
        """Why the orderings of a periodic pipeline might miss one of the witness ``race``; None when
        they are exact: every wait and arrive runs in known threads (an elected one's thread is not
        known), and both accesses are in one block-barrier epoch (so no ``__syncthreads`` lies on a
        chain between them). A tabulated pipeline keeps its two-hop ordering, as before."""
        if self.period is None:
            return None
        elected = [st for st in self.sites if st.kind in ("wait", "arrive") and st.elected]
        if elected:
            return f"the elected {elected[0].kind} (statement {elected[0].order}) orders it"
        if len(set(race["epochs"])) != 1:
            return "a block barrier between the two, with the mbarriers, orders it"
        return None

    def check_induction(self):
        """Every arrival, expect-tx and TMA of round ``j`` follows every arrival of round ``j - 1`` on its barrier.

        Without that, a thread's next arrival could count towards the phase still open, and a
        phase could complete early: then races found are still reported, but absence is not.
        """
        arrives = [st for st in self.sites if st.kind == "arrive"]
        for later in (st for st in self.sites if st.kind in ("arrive", "expect_tx", "tma")):
            for earlier in arrives:
                if not earlier.barrier.same_as(later.barrier):
                    continue
                e1 = _Event.fresh(self.enc, self.prog, earlier.op, "i1")
                e2 = _Event.fresh(self.enc, self.prog, later.op, "i2")
                k1, k2 = self._iteration(earlier, e1), self._iteration(later, e2)
                same_thread = z3.And([x == y for x, y in zip(e1.threads, e2.threads, strict=True)] + [z3.BoolVal(True, self.enc.ctx)])
                program_order = z3.And(same_thread, k1 < k2) if earlier.loop is not None and later.loop is not None and earlier.loop.same_as(later.loop) else z3.BoolVal(False, self.enc.ctx)
                # an election is left out (any thread of its group): more instances, still a proof
                cons = e1.facts + e2.facts + [self.enc.encode_bool(c, e.env()) for e, st in ((e1, earlier), (e2, later))
                                              for c in st.op.conds if not _has_call(c, _ELECT)]
                (i1, r1, _), (i2, r2, _) = self._terms(earlier, k1), self._terms(later, k2)
                cons += [i1 == i2, r1 + 1 == r2]
                cons += [z3.Not(program_order), z3.Not(self.ordered(e1, e2))]
                if _solve(self.enc, cons).status != "proven":
                    self.incomplete = (f"round order of {earlier.barrier.name}: an arrival of one round is not shown to precede "
                                       f"the next round's {later.kind} (statement {later.order})")
                    return


    def schedule(self, op, loops: dict, thread: dict, verb: str) -> list[str]:
        """Concrete steps of one witness instance: the waits its thread passed, the access, its publication."""
        steps = []
        for st in self.sites:
            same = st.loop is not None and str(st.loop.name) in loops or st.loop is None
            if not same:
                continue
            k = loops.get(str(st.loop.name), 0) if st.loop is not None else 0
            if k is None or k < 0 or st.period is None and k >= len(st.index):
                continue
            index, rnd, ph = st.at(k)
            bar = f"{st.barrier.name}[{index}]"
            if st.kind == "wait" and st.order < op.order and self._thread_runs(st, thread) and st.runs_in(k):
                steps.append(f"thread {thread} iteration {loops}: waits on {bar} for phase {ph}" + (" (returns at once)" if ph < 0 else ""))
            if st.kind == "arrive" and st.order < op.order and self._thread_runs(st, thread):
                # a release before the access: what a wait for this round no longer orders
                steps.append(f"thread {thread} iteration {loops}: arrives on {bar} (round {rnd}), before the access")
            if st.op is op:
                steps.append(f"thread {thread} iteration {loops}: {verb} `{op.text}`, published when {bar} completes phase {rnd}")
                return steps
        steps.append(f"thread {thread} iteration {loops}: {verb} `{op.text}`")
        return steps

    def _thread_runs(self, st: _Site, thread: dict) -> bool:
        t, mult = 0, 1
        for (v, _), ext in zip(self.prog.threads, self.exts, strict=True):
            t += (thread.get(str(v.name)) or 0) * mult
            mult *= ext
        return t in st.threads or st.elected

class _Event:
    """One instance of a statement for the happens-before queries: its thread and loop iterations as Z3 terms."""

    def __init__(self, op, threads: list, thread_env: dict, loops: dict, facts: list):
        self.op, self.threads, self.thread_env, self.loops, self.facts = op, threads, thread_env, loops, facts

    @property
    def order(self) -> int:
        return self.op.order

    def env(self, loop=None, k=None) -> dict:
        env = dict(self.thread_env)
        env.update(self.loops)
        if loop is not None and k is not None:
            env[loop] = k
        return env

    @classmethod
    def of_copy(cls, acc: Access, copy: "_Copy") -> "_Event":
        return cls(acc, [t for _, t in copy.threads], copy.thread_env, dict(copy.loop_env), [])

    @classmethod
    def fresh(cls, enc: Encoder, prog: Program, op, tag: str) -> "_Event":
        facts, thread_env, loops = [], {}, {}
        for v, ext in prog.threads:
            t = z3.Int(f"{v.name}@{tag}", enc.ctx)
            facts += [t >= 0, t < ext]
            thread_env[v] = t
        for v, lo, ext in op.loops:
            t = z3.Int(f"{v.name}@{tag}", enc.ctx)
            lo_t, ext_t = enc.encode(lo, thread_env), enc.encode(ext, thread_env)  # a symbolic trip count too
            facts += [t >= lo_t, t < lo_t + ext_t]
            loops[v] = t
        return cls(op, list(thread_env.values()), thread_env, loops, facts)


def _step_term(expr, k, step):
    """``expr`` (a barrier index or parity: integer arithmetic of the step ``k`` and constants) as a
    linear-integer Z3 term of ``step``. Bit operations with the constant 0 or 1 are written arithmetically
    (``x & 1 = x mod 2``, ``x ^ 1 = x + 1 - 2 (x mod 2)``, exact in two's complement), so the
    period and parity proofs stay in linear integer arithmetic."""
    def go(e):
        if isinstance(e, tir.IntImm):
            return z3.IntVal(int(e.value), step.ctx)
        if isinstance(e, tir.Var) and e.same_as(k):
            return step
        if isinstance(e, tir.Cast):
            return go(e.value)
        for cls, fn in ((tir.Add, lambda a, b: a + b), (tir.Sub, lambda a, b: a - b), (tir.Mul, lambda a, b: a * b)):
            if isinstance(e, cls):
                return fn(go(e.a), go(e.b))
        if isinstance(e, (tir.FloorDiv, tir.FloorMod)) and const_int(e.b) is not None and const_int(e.b) > 0:
            # Z3's integer division and modulus round toward -inf for a positive divisor, like TIR's floor ones
            return go(e.a) / const_int(e.b) if isinstance(e, tir.FloorDiv) else go(e.a) % const_int(e.b)
        name = op_name(e) if isinstance(e, tir.Call) else ""
        if name in ("tirx.bitwise_and", "tirx.bitwise_xor") and const_int(e.args[1]) in (0, 1):
            x, one = go(e.args[0]), const_int(e.args[1])
            if name == "tirx.bitwise_and":
                return x % 2 if one else z3.IntVal(0, step.ctx)
            return x + 1 - 2 * (x % 2) if one else x
        if name == "tirx.shift_right" and const_int(e.args[1]) is not None and const_int(e.args[1]) >= 0:
            return go(e.args[0]) / (1 << const_int(e.args[1]))
        raise _NotModelled(f"`{e}` in a barrier index or parity is not modelled")
    return go(expr)


def _int_of(term) -> int:
    """The integer of a Z3 numeral (the periodic tables hand out constants)."""
    return term.as_long() if z3.is_int_value(term) else None


def _async_read(op) -> bool:
    """An async-proxy read (wgmma, TMA store): over only once its thread's wait(0) has passed."""
    return isinstance(op, Access) and op.op in _READ_WAITS


def _one_thread_runs_both(a: _Site, b: _Site) -> bool:
    """Some thread certainly runs both: an elected one only when its whole group runs the other."""
    if a.elected and b.elected:
        return False
    if a.elected or b.elected:
        chosen, other = (a, b) if a.elected else (b, a)
        return bool(chosen.threads) and chosen.runners <= other.threads
    return bool(a.threads & b.threads)


def _overlap(sets: list) -> bool:
    seen = set()
    for s in sets:
        if seen & s:
            return True
        seen |= s
    return False




def _thread_env(prog: Program) -> dict:
    """Each thread variable as a numpy array over the block's linear thread ids."""
    t, env, stride = np.arange(prog.block_threads), {}, 1
    for v, ext in prog.threads:
        env[v] = (t // stride) % ext
        stride *= ext
    return env


def _thread_sets(prog: Program, conds) -> tuple[frozenset, bool, frozenset]:
    """(threads, elected, runners) of a statement under ``conds``: the linear thread ids that run
    it (one per group when elected), and every thread of each group when elected."""
    nthreads = prog.block_threads
    env = _thread_env(prog)
    plain = [c for c in conds if not _has_call(c, _ELECT)]
    elects = [c for c in conds if _has_call(c, _ELECT)]
    groups = []
    for c in elects:
        if not (isinstance(c, tir.Call) and len(c.args) == 1 and const_int(c.args[0]) is not None):
            raise _NotModelled(f"condition `{c}` mixes an election with other terms")
        groups.append(const_int(c.args[0]) or nthreads)
    live = np.ones(nthreads, dtype=bool)
    for c in plain:
        try:
            value = eval_numpy(c, env)
        except ValueError:
            raise _NotModelled(f"condition `{c}` is not a function of the thread alone") from None
        live &= np.broadcast_to(np.asarray(value, dtype=bool), live.shape)
    members = [int(x) for x in np.nonzero(live)[0]]
    if not groups:
        return frozenset(members), False, frozenset(members)
    size = min(groups)
    chosen = {}
    for x in members:
        chosen.setdefault(x // size, []).append(x)
    if any(len(ts) != min(size, nthreads) for ts in chosen.values()):
        raise _NotModelled("an elected thread is chosen from a group only part of which runs the statement")
    return frozenset(min(ts) for ts in chosen.values()), True, frozenset(members)


def _member(term, members: frozenset):
    """Z3: the linear thread id ``term`` is one of ``members`` (as a few id ranges)."""
    ids, spans = sorted(members), []
    for t in ids:
        if spans and t == spans[-1][1] + 1:
            spans[-1][1] = t
        else:
            spans.append([t, t])
    return z3.Or([z3.And(term >= lo, term <= hi) for lo, hi in spans] + [z3.BoolVal(False, term.ctx)])


def _barrier_ids(prog: Program, nb) -> dict:
    """{id: the threads that run named barrier statement ``nb`` with that id}: its id may be a
    function of the thread (``bar.sync 2 + tx / 128, 128``: one barrier per warpgroup). Raises
    :class:`_NotModelled` for an elected statement or an id or thread set not known per thread."""
    members, elected, _ = _thread_sets(prog, nb.conds)
    if elected:
        raise _NotModelled(f"named barrier `{nb.index}, {nb.arg}` run by an elected thread")
    if const_int(nb.index) is not None:
        return {const_int(nb.index): members}
    try:
        ids = np.broadcast_to(np.asarray(eval_numpy(nb.index, _thread_env(prog))), (prog.block_threads,))
    except ValueError:
        raise _NotModelled(f"named barrier id `{nb.index}` is not a function of the thread alone") from None
    out = {}
    for t in sorted(members):
        out.setdefault(int(ids[t]), set()).add(t)
    return {i: frozenset(ts) for i, ts in out.items()}


def _barrier_groups(prog: Program) -> tuple[dict, str | None]:
    """(id -> the threads of each named barrier (``bar.sync id, n``), None) when every named
    barrier is run by exactly its ``n`` threads for each id it takes and one id always by one
    group; else ({}, why). Raises :class:`_NotModelled` as :func:`_barrier_ids`."""
    groups = {}
    for nb in prog.named_barriers:
        for ident, members in _barrier_ids(prog, nb).items():
            if const_int(nb.arg) != len(members):
                return {}, f"named barrier `{nb.index}, {nb.arg}` run by {len(members)} threads with id {ident}"
            if groups.setdefault(ident, members) != members:
                return {}, f"named barrier {ident} run by different thread groups"
    return groups, None


def _looped_barrier(prog: Program, ident: int):
    """The one statement of named barrier ``ident`` when it is its only statement and stands in
    exactly one loop, run by its group in every iteration (no condition of the iteration): the
    k-th barrier every member passes is then iteration k's, so instances pair up by iteration.
    None otherwise."""
    stmts = [nb for nb in prog.named_barriers if ident in _barrier_ids(prog, nb)]
    if len(stmts) != 1 or len(stmts[0].loops) != 1:
        return None
    nb = stmts[0]
    return None if any(_varies_with(c, nb.loops) for c in nb.conds) else nb


def _named_groups(prog: Program) -> tuple[dict, dict]:
    """(groups, looped): the groups of :func:`_barrier_groups` whose barriers pair up: an id
    whose statements all stand outside any loop (each member passes them in the same sequence),
    or whose one statement stands in one loop (:func:`_looped_barrier`, kept in ``looped``).
    ({}, {}) when the barriers are not modelled."""
    try:
        groups, why = _barrier_groups(prog)
        if why:
            return {}, {}
        looped = {i: nb for i in groups if (nb := _looped_barrier(prog, i)) is not None}
        loop_free = {i for i in groups if all(not nb.loops for nb in prog.named_barriers if i in _barrier_ids(prog, nb))}
    except _NotModelled:
        return {}, {}
    return {i: m for i, m in groups.items() if i in loop_free or i in looped}, looped


def _prefix_loops(op, acc: Access) -> bool:
    """``op`` sits in ``acc``'s loops or an enclosing part of them (so it runs in ``acc``'s iteration)."""
    inner = [v for v, _, _ in acc.loops]
    return len(op.loops) <= len(inner) and all(v.same_as(w) for (v, _, _), w in zip(op.loops, inner))


def _runs_in_all(prog: Program, op, members: frozenset, holding: list) -> bool:
    """Every thread of ``members`` runs ``op`` (its conditions shared with ``holding`` taken as held)."""
    try:
        ran, elected, _ = _thread_sets(prog, _unshared(op.conds, holding))
    except _NotModelled:
        return False
    return not elected and members <= ran


def _named_barrier_orders(prog: Program, groups: dict, first: Access, second: Access, ident: int) -> bool:
    """Every instance of ``first`` run by a thread of named barrier ``ident``'s group happens before
    every instance of ``second`` run by one: a ``bar.sync`` of that id lies between them in program
    order, and with it what the async proxy needs (a ``wait(0)`` of an async reader before the
    barrier; a proxy fence of the writer before it, or of the async reader after it, for a generic
    write the async proxy then touches). A TMA or cp.async write is published only by its mbarrier
    or wait_group: never by this."""
    members = groups[ident]
    if first.op in ("tma_load", "ptx_cp_async"):
        return False
    fences = [f for f in prog.syncs if f.kind == "fence_proxy_async"]
    for nb in prog.named_barriers:
        if ident not in _barrier_ids(prog, nb) or not first.order < nb.order < second.order:
            continue
        if first.op in _READ_WAITS and not any(
                w.kind == _READ_WAITS[first.op] and const_int(w.arg) == 0 and first.order < w.order < nb.order
                and _prefix_loops(w, first) and _runs_in_all(prog, w, members, first.conds) for w in prog.syncs):
            continue
        if _generic_write(first) and _async_proxy(second) and not any(
                (first.order < f.order < nb.order and _prefix_loops(f, first) and _runs_in_all(prog, f, members, first.conds))
                or (nb.order < f.order < second.order and _prefix_loops(f, second) and _runs_in_all(prog, f, members, second.conds))
                for f in fences):
            continue
        return True
    return False


def _looped_barrier_orders(nb, first: Access, cf: "_Copy", second: Access, cs: "_Copy"):
    """Z3: instance ``cf`` of ``first`` happens before instance ``cs`` of ``second`` (two threads
    of the group of :func:`_looped_barrier` ``nb``): an instance of ``nb`` lies between them, the
    one of ``first``'s iteration after it, or a later one before ``second``. None where this model
    does not apply: both accesses must be plain (generic) ones inside ``nb``'s loop."""
    if any(acc.is_async or _async_proxy(acc) for acc in (first, second)):
        return None
    ((loop, _, _),) = nb.loops
    if not all(acc.loops and acc.loops[0][0].same_as(loop) for acc in (first, second)):
        return None
    kf, ks = cf.loops[0][1], cs.loops[0][1]
    after_first, before_second = first.order < nb.order, nb.order < second.order
    later = z3.And(kf < ks, z3.Or(z3.BoolVal(after_first or before_second, kf.ctx), kf + 1 < ks))
    return z3.Or(later, kf == ks) if after_first and before_second else later


def _named_barrier_gap(prog: Program, a: Access, b: Access, threads: tuple[int, int], accounted=()) -> str | None:
    """Why a named barrier (``bar.sync id, n``, which this model does not count) might order a race
    between ``a`` and ``b`` run by the linear ``threads``; None when none can.

    The groups of named barriers (the threads that run each id, exactly ``n`` of them) must be
    disjoint. Then a chain of orderings through a named barrier of group G leaves G through one of
    its threads' mbarrier arrives (or enters through a wait): when every thread of G runs every
    such statement (the kinds the pair needs: waits and arrives, proxy fences for a generic write
    the async proxy reads, wgmma waits for a wgmma), the barrier's own thread does the same, and the
    chain needs no named barrier. Only a pair inside one group is then left to it, unless its
    group is ``accounted``: the witness's query already excluded what that barrier orders.
    """
    if not prog.named_barriers:
        return None
    try:
        groups, why = _barrier_groups(prog)
        if why:
            return why
        if _overlap(list(set(groups.values()))):
            return "named barriers of overlapping thread groups"
        for ident, members in groups.items():
            if threads[0] in members and threads[1] in members and members not in accounted:
                return f"both threads pass named barrier {ident} ({len(members)} threads), which may order them"
        kinds = {"wait", "arrive"}
        if _generic_write(a) and _async_proxy(b) or _generic_write(b) and _async_proxy(a):
            kinds.add("fence_proxy_async")
        kinds.update(_READ_WAITS[x.op] for x in (a, b) if x.op in _READ_WAITS)
        for op in prog.syncs:
            if op.kind not in kinds:
                continue
            # which threads run it; a condition of the iteration (``k == 0``) is the same for all
            members_op, elected, runners = _thread_sets(prog, [c for c in op.conds if not _varies_with(c, op.loops)])
            for ident, members in groups.items():
                part = (runners if elected else members_op) & members
                if part and (elected or part != members):
                    return f"{op.kind} (statement {op.order}) runs in part of named barrier {ident}'s threads"
    except _NotModelled as e:
        return f"named barriers: {e}"
    return None


def _epoch_ordered(enc, prog, first: Access, cf: "_Copy", second: Access, cs: "_Copy"):
    """``first`` precedes ``second`` through a block barrier, counting what the async proxy needs.

    A TMA write is never published by a block barrier; a wgmma read (a TMA store's) is over once a
    ``warpgroup_wait(0)`` (``tma_store_wait(0)``) of its thread precedes the barrier; a cp.async write once its group
    is retired; a generic write that an async-proxy access reads or overwrites needs a
    ``fence.proxy.async`` of the writing thread before the barrier, or of the async reader
    after it and before its access (where TileLang places it).
    """
    false = z3.BoolVal(False, enc.ctx)
    env = dict(cf.thread_env)
    env.update(cf.loop_env)

    def after_first(kind_ops):
        return [s for s in kind_ops if s.order > first.order and all(v in cf.loop_env for v, _, _ in s.loops)]

    if first.op == "tma_load":
        return false
    if first.op in _READ_WAITS:
        waits = after_first(s for s in prog.syncs if s.kind == _READ_WAITS[first.op] and const_int(s.arg) == 0)
        return z3.Or([z3.And([enc.encode_bool(c, env) for c in _unshared(w.conds, first.conds)] + [enc.encode(w.epoch, env) < cs.epoch])
                      for w in waits] + [false])
    published = z3.Not(_not_landed(enc, prog, cf, cs)) if first.op == "ptx_cp_async" else cf.epoch < cs.epoch
    if first.write and _async_proxy(second):
        # the fence by the writer before the barrier, or (as TileLang places it) by the async
        # reader after the barrier and before its read
        fences = [s for s in prog.syncs if s.kind == "fence_proxy_async"]
        env2 = dict(cs.thread_env)
        env2.update(cs.loop_env)
        writer = [z3.And([enc.encode_bool(c, env) for c in _unshared(f.conds, first.conds)] + [enc.encode(f.epoch, env) == cf.epoch])
                  for f in fences if f.order > first.order and all(v in cf.loop_env for v, _, _ in f.loops)]
        reader = [z3.And([enc.encode_bool(c, env2) for c in _unshared(f.conds, second.conds)] + [enc.encode(f.epoch, env2) == cs.epoch])
                  for f in fences if f.order < second.order and all(v in cs.loop_env for v, _, _ in f.loops)]
        return z3.Or(z3.And(published, z3.Or(writer + reader + [false])), _fenced_earlier(enc, prog, first, cf, cs, fences))
    return published


def _varies_with(cond, loops: list) -> bool:
    """``cond`` names one of the ``(var, min, extent)`` loops: a condition of the iteration."""
    return any(v.same_as(lv) for v in free_vars(cond) for lv, _, _ in loops)


def _unshared(conds: list, holding: list) -> list:
    """``conds`` less those that also guard an access known to run (``holding``), for a statement
    of the same thread and loop iterations: such a condition holds there too. That covers an
    election (``tl_shuffle_elect(n)`` picks the same thread each time, which the encoder cannot
    see) as well as plain guards; a condition that reads memory may change and is kept."""
    return [c for c in conds if nodes(c, tir.BufferLoad) or not any(tvm.ir.structural_equal(c, h) for h in holding)]


class _At:
    """A point of the reader's execution for :func:`_not_landed`: its epoch and loop iterations."""

    def __init__(self, epoch, loop_env: dict):
        self.epoch, self.loop_env = epoch, loop_env


def _fenced_earlier(enc, prog, first: Access, cf: "_Copy", cs: "_Copy", fences: list):
    """The async reader ran a ``fence.proxy.async`` after ``first``'s write was published to it
    and in an earlier epoch than its read (so before the read in its own program order).

    The fence instance is one of a few candidates per loop around it (the read's iteration or
    the one before, the first, the last): fewer candidates can only report more races."""
    import itertools

    out = []
    for f in fences:
        choices = []
        for v, lo, ext in f.loops:
            opts = [cs.loop_env[v], cs.loop_env[v] - 1] if v in cs.loop_env else []
            choices.append([(v, lo, ext, o) for o in opts + [None, "last"]])
        for combo in itertools.product(*choices):
            env, dom, loops = dict(cs.thread_env), [], {}
            for v, lo, ext, o in combo:
                lo_t, ext_t = enc.encode(lo, env), enc.encode(ext, env)
                t = lo_t if o is None else lo_t + ext_t - 1 if isinstance(o, str) else o
                env[v], loops[v] = t, t
                dom += [t >= lo_t, t < lo_t + ext_t]
            epoch = enc.encode(f.epoch, env)
            landed = z3.Not(_not_landed(enc, prog, cf, _At(epoch, loops))) if first.op == "ptx_cp_async" else cf.epoch < epoch
            out.append(z3.And(dom + [enc.encode_bool(c, env) for c in f.conds] + [epoch < cs.epoch, landed]))
    enc.take_obligations()
    return z3.Or(out + [z3.BoolVal(False, enc.ctx)])


def _pair_query(enc, prog, a: Access, b: Access, pipeline: "_Pipeline | None" = None, ordered_groups=()):
    """``ordered_groups``: (threads, looped barrier or None) of named barriers that order pairs of
    their threads: every instance pair (:func:`_named_barrier_orders`), or, for a barrier in a
    loop, the instances :func:`_looped_barrier_orders` says; a witness must avoid each."""
    ca, cb = _Copy(enc, prog, a, "1"), _Copy(enc, prog, b, "2")
    cons = ca.facts + cb.facts
    for members, nb in ordered_groups:
        both = z3.And(_member(_linear(prog, ca), members), _member(_linear(prog, cb), members))
        if nb is not None:
            both = z3.And(both, z3.Or(_looped_barrier_orders(nb, a, ca, b, cb), _looped_barrier_orders(nb, b, cb, a, ca)))
        cons.append(z3.Not(both))
    other_thread = z3.Or([x != y for (_, x), (_, y) in zip(ca.threads, cb.threads, strict=True)])
    if _async_proxy(a) or _async_proxy(b):
        # an async-proxy access is not ordered by its own thread's program order: the same
        # thread counts too, only the very same instance does not
        other_loop = [x != y for (_, x), (_, y) in zip(ca.loops, cb.loops, strict=True)] if a is b else [z3.BoolVal(True, enc.ctx)]
        cons.append(z3.Or([other_thread] + other_loop))
    else:
        cons.append(other_thread)
    group = _elected_group(a)
    if group is not None and group == _elected_group(b):
        # one elected thread per group: two instances in one group are one thread
        la, lb = _linear(prog, ca), _linear(prog, cb)
        cons.append(z3.Or(la / group != lb / group, z3.And([x == y for (_, x), (_, y) in zip(ca.threads, cb.threads, strict=True)])))
    cons += [ca.lo < cb.hi, cb.lo < ca.hi]
    if a is b and _collective(a):
        cons.append(z3.Or([x != y for (_, x), (_, y) in zip(ca.loops, cb.loops, strict=True)]) if ca.loops else z3.BoolVal(False, enc.ctx))
    if _async_proxy(a) or _async_proxy(b):
        window = z3.And(z3.Not(_epoch_ordered(enc, prog, a, ca, b, cb)), z3.Not(_epoch_ordered(enc, prog, b, cb, a, ca)))
    elif a.is_async and b.is_async:
        window = z3.Or(
            z3.And(cb.epoch >= ca.epoch, z3.Or(cb.epoch == ca.epoch, _not_landed(enc, prog, ca, cb))),
            z3.And(ca.epoch >= cb.epoch, z3.Or(ca.epoch == cb.epoch, _not_landed(enc, prog, cb, ca))),
        )
    elif a.is_async:
        window = z3.And(cb.epoch >= ca.epoch, z3.Or(cb.epoch == ca.epoch, _not_landed(enc, prog, ca, cb)))
    elif b.is_async:
        window = z3.And(ca.epoch >= cb.epoch, z3.Or(ca.epoch == cb.epoch, _not_landed(enc, prog, cb, ca)))
    else:
        window = ca.epoch == cb.epoch
    cons.append(window)
    if pipeline is not None:
        ea, eb = _Event.of_copy(a, ca), _Event.of_copy(b, cb)
        cons.append(z3.Not(pipeline.ordered(ea, eb, need_fence=_generic_write(a) and _async_proxy(b))))
        cons.append(z3.Not(pipeline.ordered(eb, ea, need_fence=_generic_write(b) and _async_proxy(a))))
    return _solve(enc, cons), ca, cb


def _elected_group(acc: Access) -> int | None:
    """``N`` when ``acc`` runs only in the thread ``tl_shuffle_elect(N)`` picks (``N = 0``: the block's)."""
    for c in acc.conds:
        if isinstance(c, tir.Call) and getattr(c.op, "name", None) == _ELECT and const_int(c.args[0]) is not None:
            return const_int(c.args[0]) or 1 << 30
    return None


def _linear(prog: Program, copy: "_Copy"):
    term, stride = 0, 1
    for (_, t), (_, ext) in zip(copy.threads, prog.threads, strict=True):
        term, stride = term + t * stride, stride * ext
    return term


def _generic_write(acc: Access) -> bool:
    return acc.write and not acc.is_async


def _solve(enc: Encoder, formulas: list) -> Verdict:
    """One-shot QF_LIA solve on the encoder's context and facts, same rlimit budget (the general
    solver's proof where the query divides by a symbol, which QF_LIA cannot read).

    Race queries compare two full instances; Z3's non-incremental solver preprocesses
    them (bounded 0/1 bit variables, equalities) several times faster than the
    encoder's incremental solver, with the same deterministic budget.
    """
    s = z3.SolverFor("QF_LIA", ctx=enc.ctx)
    s.set("rlimit", enc.rlimit)
    s.add(*enc.facts)
    s.add(*formulas)
    before = _rlimit_count(s)  # the count is the context's, cumulative over every solver in it
    r = s.check()
    enc.queries += 1
    enc.rlimit_used += _rlimit_count(s) - before
    if r == z3.unknown and "uninterpreted function" in s.reason_unknown():
        # a division by a shape (a symbolic trip count ``H // HK * n``) is outside QF_LIA: the
        # general solver, same budget, for a proof only (its model may divide by zero)
        general = z3.Solver(ctx=enc.ctx)
        general.set("rlimit", enc.rlimit)
        general.add(*enc.facts)
        general.add(*formulas)
        before = _rlimit_count(general)
        proven = general.check() == z3.unsat
        enc.queries += 1
        enc.rlimit_used += _rlimit_count(general) - before
        if proven:
            return Verdict("proven")
    if r == z3.unsat:
        return Verdict("proven")
    if r == z3.sat:
        return Verdict("violation", s.model())
    return Verdict("unknown", reason=s.reason_unknown())


def _rlimit_count(solver) -> int:
    st = solver.statistics()
    return int(st.get_key_value("rlimit count")) if "rlimit count" in st.keys() else 0


def _byte_span(prog: Program, acc: Access, cache: dict) -> tuple[int, int] | None:
    """Bytes ``[lo, hi)`` that every instance of ``acc`` stays within, by TVM's interval bounds over
    the thread and constant loop ranges (loaded values by their dtype); None when unbounded."""
    key = id(acc)
    if key not in cache:
        ana = tvm.arith.Analyzer()
        for v, ext in prog.threads:
            ana.bind(v, tvm.ir.Range.from_min_extent(0, ext))
        for v, lo, ext in acc.loops:
            if const_int(lo) is not None and const_int(ext) is not None and const_int(ext) > 0:
                ana.bind(v, tvm.ir.Range.from_min_extent(const_int(lo), const_int(ext)))
        index = acc.index.base if isinstance(acc.index, tir.Ramp) else acc.index
        with contextlib.ExitStack() as scopes:
            for c in acc.conds:  # the conditions it runs under (a guard such as ``tx >= 32``)
                if not _has_call(c, _ELECT):
                    scopes.enter_context(ana.constraint_scope(c))
            bound = ana.const_int_bound(index)
        limit = 1 << 62
        if -limit < bound.min_value and bound.max_value < limit:
            eb = elem_bytes(acc.dtype)
            cache[key] = (acc.base_bytes + bound.min_value * eb, acc.base_bytes + bound.max_value * eb + acc.width)
        else:
            cache[key] = None
    return cache[key]


def _disjoint(enc, prog, a: Access, b: Access, distinct_threads: bool = False, spans: dict | None = None) -> bool:
    """Proven: no instance of ``a`` and no instance of ``b`` (by another thread) touch a common byte.

    Byte intervals decide most pairs of a merged shared allocation at once; Z3 the rest."""
    if spans is not None:
        sa, sb = _byte_span(prog, a, spans), _byte_span(prog, b, spans)
        if sa is not None and sb is not None and (sa[1] <= sb[0] or sb[1] <= sa[0]):
            return True
    if not (a.exact and b.exact):
        return False  # an index read from memory: the pair's own query (with its ordering) decides, not this
    ca, cb = _Copy(enc, prog, a, "1"), _Copy(enc, prog, b, "2")
    cons = ca.facts + cb.facts + [ca.lo < cb.hi, cb.lo < ca.hi]
    if distinct_threads:
        cons.append(z3.Or([x != y for (_, x), (_, y) in zip(ca.threads, cb.threads, strict=True)]))
    return _solve(enc, cons).status == "proven"


def find_races(enc: Encoder, prog: Program, budget: int | None = None) -> dict:
    """Check every pair of shared accesses of one device function.

    ``budget`` caps the Z3 resource units spent on the whole kernel (deterministic, like
    the per-query rlimit); pairs left when it is spent are reported as unknown.
    """
    shared = [a for a in prog.accesses if a.scope in SHARED_SCOPES]
    mbarriers = bool(prog.syncs) and any(s.barrier is not None for s in prog.syncs) or any(any(h in c for h in _MBARRIER_HINTS) for c in prog.calls)
    pipeline, pipeline_gap = None, None
    if mbarriers:
        try:
            pipeline = _Pipeline(enc, prog)
            pipeline.check_induction()
        except _NotModelled as e:
            pipeline, pipeline_gap = None, f"mbarrier synchronisation not modelled: {e}"

    def modelled(acc: Access) -> bool:
        return _modelled(acc) or _async_proxy(acc) and (acc.op != "tma_load" or pipeline is not None)

    unmodelled = sorted({a.op for a in shared if not modelled(a)})
    named, looped = _named_groups(prog)
    pairs, races, unknown, spans = 0, [], [], {}
    for i, a in enumerate(shared):
        for b in shared[i:]:
            if not a.root.same_as(b.root):
                continue
            if not (a.write or b.write):
                continue
            if _atomic(a) and _atomic(b) and a.dtype == b.dtype:
                continue  # atomics of one width on one element are serialised by the hardware, never torn
            if not (modelled(a) and modelled(b)):
                if _disjoint(enc, prog, a, b, spans=spans):
                    continue
                op = a.op if not modelled(a) else b.op
                unknown.append({"first": a.text, "second": b.text, "reason": pipeline_gap if op == "tma_load" and pipeline_gap else f"{op} not modelled"})
                continue
            if budget is not None and enc.rlimit_used > budget:
                unknown.append({"first": a.text, "second": b.text, "reason": "kernel race-analysis budget spent"})
                continue
            pairs += 1
            sa, sb = _byte_span(prog, a, spans), _byte_span(prog, b, spans)
            if sa is not None and sb is not None and (sa[1] <= sb[0] or sb[1] <= sa[0]):
                continue  # disjoint byte ranges; otherwise the pair's query decides overlap and order at once
            v, ca, cb = _pair_query(enc, prog, a, b, pipeline)
            if v.status == "unknown":
                unknown.append({"first": a.text, "second": b.text, "reason": "solver budget"})
            elif v.status == "violation" and (_data_dependent(a) or _data_dependent(b)):
                # the witness picks values read from memory (a scan's result, an index table): the
                # program may never produce them, so this is not a certain race
                unknown.append({"first": a.text, "second": b.text, "data_dependent": True,
                                "reason": "a race only for some values read from memory (data-dependent index or condition)"})
            elif v.status == "violation":
                def _orders(ident, a=a, b=b, ca=ca, cb=cb):
                    """Named barrier ``ident`` orders a's and b's instances (some, when looped)."""
                    if ident in looped:
                        return _looped_barrier_orders(looped[ident], a, ca, b, cb) is not None
                    return _named_barrier_orders(prog, named, a, b, ident) or _named_barrier_orders(prog, named, b, a, ident)

                # a witness inside one named barrier's group that the barrier orders: look again
                # for one with a thread outside that group (or, for a barrier in a loop, in
                # iterations it does not order)
                ordered = []
                while v.status == "violation":
                    threads = (enc.model_value(v.model, _linear(prog, ca)), enc.model_value(v.model, _linear(prog, cb)))
                    ident = next((i for i, m in named.items() if threads[0] in m and threads[1] in m
                                  and (m, looped.get(i)) not in ordered and _orders(i)), None)
                    if ident is None:
                        break
                    ordered.append((named[ident], looped.get(ident)))
                    v, ca, cb = _pair_query(enc, prog, a, b, pipeline, ordered)
                if v.status != "violation":
                    if v.status == "unknown":
                        unknown.append({"first": a.text, "second": b.text, "reason": "solver budget"})
                    continue
                race = _witness(enc, v.model, a, b, ca, cb, pipeline)
                gap = _named_barrier_gap(prog, a, b, threads, [m for m, _ in ordered]) or (pipeline.inexact(race) if pipeline is not None else None)
                if gap:
                    unknown.append({"first": a.text, "second": b.text, "reason": f"a race unless {gap}"})
                else:
                    races.append(race)
    reasons = []
    if prog.divergent_barriers:
        reasons.append("barrier under a thread-dependent condition")
    if pipeline_gap:
        reasons.append(pipeline_gap)
    if reasons:
        # The epoch model may miss an ordering here: what it found is possible, not certain.
        unknown += [dict(r, reason="; ".join(reasons)) for r in races]
        races = []
    if pipeline is not None and pipeline.incomplete and not races:
        unknown.append({"first": "every pair ordered through mbarriers", "second": "", "reason": pipeline.incomplete})
    # shared accesses the program model could not see (opaque descriptors, raw handles, while
    # loops): nothing is known about them, so no pair with them is proven
    unknown += [{"first": o, "second": "", "reason": "shared accesses not visible to the model"}
                for o in sorted(set(prog.opaque))]
    notes = reasons + ([f"mbarrier pipeline modelled ({len(pipeline.sites)} barrier statements)"] if pipeline is not None else [])
    return {"kernel": prog.name, "pairs": pairs, "races": races, "unknown": unknown, "unmodelled_ops": unmodelled, "notes": notes}


def _witness(enc, model, a, b, ca, cb, pipeline=None) -> dict:
    def val(t):
        return enc.model_value(model, t)

    lo = max(val(ca.lo), val(cb.lo))
    first = {"statement": a.text, "write": a.write, "async": a.is_async, "thread": {n: val(t) for n, t in ca.threads}, "loops": {n: val(t) for n, t in ca.loops}}
    second = {"statement": b.text, "write": b.write, "async": b.is_async, "thread": {n: val(t) for n, t in cb.threads}, "loops": {n: val(t) for n, t in cb.loops}}
    out = {"buffer": a.buffer if a.buffer == b.buffer else f"{a.buffer}/{b.buffer}", "first": first, "second": second, "byte_address": lo,
           "epochs": [val(ca.epoch), val(cb.epoch)]}
    if pipeline is not None:
        # Each side's waits and publication: the schedule in which neither is ordered before the other.
        out["schedule"] = [step for acc, side in ((a, first), (b, second))
                           for step in pipeline.schedule(acc, side["loops"], side["thread"], "writes" if acc.write else "reads")]
    return out


def _proxy_side(side: dict) -> bool:
    """The witness side is a TMA or wgmma access (the async proxy)."""
    return side["statement"].startswith(("wgmma", "tma_load"))


def describe_race(r: dict) -> str:
    text = (
        f"shared-memory race on {r['buffer']} byte {r['byte_address']}: thread {r['first']['thread']} "
        f"{'writes' if r['first']['write'] else 'reads'} in `{r['first']['statement']}` and thread {r['second']['thread']} "
        f"{'writes' if r['second']['write'] else 'reads'} in `{r['second']['statement']}` with no barrier between"
        + (" (nor the fence.proxy.async the async proxy needs)" if sum(map(_proxy_side, (r["first"], r["second"]))) == 1 else "")
    )
    if r.get("schedule"):
        text += "; schedule: " + "; ".join(r["schedule"])
    return text


def races_report(kernel: LoweredKernel, programs: list[Program] | None = None, budget: int | None = None, assume=()) -> dict:
    """``{"kernels": [...], "races": n, "unknown": n, "verdict": "race-free"|"race"|"unknown"}``."""
    t0 = time.perf_counter()
    enc = kernel_encoder(kernel, assume)
    per = [find_races(enc, p, budget) for p in (programs or collect_program(kernel))]
    shared_verdict = "race" if any(p["races"] for p in per) else "unknown" if any(p["unknown"] for p in per) else "race-free"
    dependent = pdl_report(kernel)
    n_races = sum(len(p["races"]) for p in per) + len(dependent["races"])
    n_unknown = sum(len(p["unknown"]) for p in per) + len(dependent["unknown"])
    verdict = "race" if n_races else "unknown" if n_unknown else "race-free"
    summary = [f"shared memory: {shared_verdict} ({sum(p['pairs'] for p in per)} access pairs checked, "
               f"{sum(len(p['unknown']) for p in per)} unknown)"]
    if dependent["dependents"]:
        summary.append(f"global memory before T.pdl_sync(): {len(dependent['races'])} races, {len(dependent['unknown'])} unknown "
                       f"({dependent['dependents']} dependent kernels)")
    summary += [f"race: {r['reason']}" for r in dependent["races"]][:5]
    summary += [describe_race(r) for p in per for r in p["races"]][:5]
    summary += sorted({f"unknown: {u['reason']}" for u in dependent["unknown"]} | {f"unknown: {u['reason']}" for p in per for u in p["unknown"]})[:5]
    return {"summary": summary, "kernels": per, "dependent_launches": dependent, "races": n_races, "unknown": n_unknown,
            "verdict": verdict, "exit_code": exit_status(n_races, n_unknown), "rlimit_used": enc.rlimit_used,
            "seconds": round(time.perf_counter() - t0, 4)}


PASS_BUDGET = 6_000_000
"""Z3 resource units the compile-time pass spends per kernel, each query's own work counted once
(about 2-6 s on 2 cores: the top-k kernel's 584 pairs take 10.7M units, 23 s on a loaded
machine); pairs beyond it are unknown. ``races_report(kernel)`` without a budget checks every pair.
(Until this was counted per query, 20M of the context's running totals bought about 1M of work.)
6M, not 5M: TileLang's FP8 2xAcc GEMM example needs 4.9M or 5.3M units depending only on the
order in which the same terms reach Z3 (a refactor that kept every query's meaning moved it from
one to the other, 2026-12-02), so 5M decided it by chance."""


def races_pass(kernel: LoweredKernel, ctx: PassContext) -> LoweredKernel:
    """Report into ``ctx.reports["races"]``; a proven race raises or warns per ``verify``."""
    budget = PASS_BUDGET if ctx.options.race_budget is None else ctx.options.race_budget
    report = races_report(kernel, budget=budget, assume=ctx.options.assume)
    ctx.reports["races"] = report
    if report["races"]:
        raise_or_warn(ctx, RaceError("\n".join([*(describe_race(r) for p in report["kernels"] for r in p["races"]),
                                                 *(r["reason"] for r in report["dependent_launches"]["races"])])))
    return kernel
