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

The accesses come from the device program model of :mod:`tlx.ir.program`, which the race and
vector analyses read too.
"""

from __future__ import annotations

import time

import z3

from tilelang import tvm
from tlx.ir.program import SHARED_SCOPES, Access, Program, collect_program
from tlx.ir.tir import const_int, elem_bytes, eval_numpy, free_vars
from tlx.lowering import LoweredKernel
from tlx.passes import PassContext
from tlx.passes.smt import Encoder, context_facts, kernel_encoder

tir = tvm.tirx

__all__ = ["bank_conflicts", "banks_report", "count_conflicts", "predict_ncu"]

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
        entries += [{"op": "", "statement": what, "degree": None, "status": "unknown", "kernel": prog.name, "reason": "not read by the program model"}
                    for what in prog.unread]
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
    budget = PASS_BUDGET if ctx.options.bank_budget is None else ctx.options.bank_budget
    ctx.reports["bank_conflicts"] = banks_report(kernel, budget=budget, assume=ctx.options.assume)
    return kernel


# ----- totals for Nsight Compute comparison ---------------------------------------------------


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
        addr = np.broadcast_to(eval_numpy(index, env) * elem_bytes(acc.dtype) + acc.base_bytes, (n_ctx, 32))
        live = np.broadcast_to(tid < nthreads, (n_ctx, 32)).copy()
        for c in acc.conds:
            live &= np.broadcast_to(np.asarray(eval_numpy(c, env), dtype=bool), (n_ctx, 32))
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
