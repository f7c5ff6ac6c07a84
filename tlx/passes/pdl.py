"""Programmatic dependent launches: the global memory a kernel touches before ``T.pdl_sync()``.

A kernel that calls ``T.pdl_sync()`` is launched as a programmatic dependent (``tlx/hostgen``): it
may start while the grids before it on the stream still run, and only the wait ``T.pdl_sync()``
lowers to (``griddepcontrol.wait``: those grids have finished and their writes are visible)
orders it after them. What it reads or writes of global memory before that wait therefore races
with those grids where one of them writes the same buffer, or reads what it writes.

Per program, in launch order (the host launch plan): the grids a dependent kernel may overlap are
the launches since the last ordinary one that surely runs whenever it does, that one included (an
ordinary launch waits for all earlier work; one under an ``if`` of the program, or whose grid may
be empty while the dependent's is not, may be skipped). A dependent kernel's *early* accesses are those of the statements that run
before its first ``T.pdl_sync()`` on the kernel body's path of unconditional statements; a
``T.pdl_sync()`` under a condition or a loop orders nothing for certain, so then the whole body
is early. Buffers are named as the host passes them (a tensor argument, a workspace, the
tensor a TMA descriptor maps): an early access to a buffer that an overlapping grid writes, or an
early write to one it reads, is a race. Where the overlapping grid is not in the program (the
dependent launch is the program's first, or only dependent launches precede it) tlx cannot see
what it touches: early accesses are then "unknown", never "ok"; so are accesses through an
argument that names no single buffer. Accesses are counted per buffer, not per element, so two
grids that touch disjoint halves of one buffer are reported; distinct arguments are taken to be
distinct memory (as each kernel's ``__restrict__`` pointers already are).
"""

from __future__ import annotations

from tilelang import tvm

from tlx.hostgen.plan import HostgenError, plan_launcher, walk_steps
from tlx.ir.facts import read_only_params
from tlx.ir.tir import device_functions, free_vars, nodes, op_name
from tlx.lowering import LoweredKernel

__all__ = ["pdl_report"]

tir = tvm.tirx

SYNC = "tl.pdl_sync"
UNNAMED = "an argument tlx cannot name"
_DECLARATIONS = (tir.DeclBuffer, tir.AllocBuffer)  # name memory, touch none


def _has_sync(stmt) -> bool:
    return any(op_name(c) == SYNC for c in nodes(stmt, tir.Call))


def _early_statements(stmt) -> tuple[list, bool]:
    """(the statements and values that run before the first ``T.pdl_sync()`` that every thread
    reaches, whether there is one): a sync only on the path of unconditional statements from
    the body's root counts; without one, everything."""
    if isinstance(stmt, tir.Evaluate) and isinstance(stmt.value, tir.Call) and op_name(stmt.value) == SYNC:
        return [], True
    if isinstance(stmt, tir.SeqStmt):
        early: list = []
        for s in stmt.seq:
            inner, synced = _early_statements(s) if _has_sync(s) else ([s], False)
            early += [e for e in inner if not isinstance(e, _DECLARATIONS)]
            if synced:
                return early, True
        return early, False
    if isinstance(stmt, tir.AttrStmt):
        inner, synced = _early_statements(stmt.body)
        return [stmt.value, *inner], synced
    if isinstance(stmt, tir.SBlockRealize) and _true(stmt.predicate):
        return _early_statements(stmt.block.body)
    return [stmt], False  # a condition, a loop, anything else: nothing in it is ordered for certain


def _true(cond) -> bool:
    return isinstance(cond, tir.IntImm) and cond.value == 1


def _as_stmt(part):
    """A statement, or an expression (an attribute's value) as one."""
    return part if isinstance(part, tir.Stmt) else tir.Evaluate(part)


_DESCRIPTOR_READS = ("tl.tma_load", "tl.prefetch_tma_descriptor")


def _touches(func, parts) -> dict:
    """Device pointer parameter -> "write" or "read", for the parameters ``parts`` use: a read
    where every use is a load or a read-only access pointer (``read_only_params`` of those
    parts alone), a TMA descriptor where every use is a TMA load or a prefetch; else a write."""
    if not parts:
        return {}
    params = [p for p in func.params if str(p.dtype) == "handle"]
    body = tir.SeqStmt([_as_stmt(p) for p in parts]) if len(parts) > 1 else _as_stmt(parts[0])
    used = ({v for v in nodes(body, tir.Var)} | {n.buffer.data for n in nodes(body, (tir.BufferLoad, tir.BufferStore))}) & set(params)
    read_only = read_only_params(tir.PrimFunc(params, body))
    out = {}
    for p in used:
        if "grid_constant" in str(getattr(p, "type_annotation", "")):
            users = [c for c in nodes(body, tir.Call) if any(a.same_as(p) for a in c.args)]
            out[p] = "read" if users and all(op_name(c) in _DESCRIPTOR_READS for c in users) else "write"
        else:
            out[p] = "read" if p in read_only else "write"
    return out


def _host_names(plan) -> dict:
    """Host data variable of a tensor, a workspace or a descriptor -> the buffer's name."""
    names = {t.data_var: t.name for t in plan.tensors}
    for step in walk_steps(plan.steps):
        if step.kind == "workspace":
            names[step.workspace.data_var] = step.workspace.name
        elif step.kind == "desc":
            names[step.desc.var] = step.desc.tensor
    return names


def _by_buffer(func, launch, touched: dict, names: dict) -> dict:
    """Host buffer name -> "write" / "read" of ``touched`` (device parameters) for ``launch``; an
    argument that names no single buffer (an expression over none or several) is keyed
    ``UNNAMED``: it may be any of them."""
    out: dict = {}
    for param, arg in zip(func.params, launch.args):
        if param in touched:
            bases = {names[v] for v in ([arg] if isinstance(arg, tir.Var) else free_vars(arg)) if v in names}
            name = bases.pop() if len(bases) == 1 else UNNAMED
            if out.get(name) != "write":
                out[name] = touched[param]
    return out


def _orders(earlier, dependent, unconditional: set) -> bool:
    """Whether ``earlier``, an ordinary launch, surely runs whenever ``dependent`` does (then all
    work before it has finished when ``dependent`` starts): not under an ``if`` of the program,
    and each grid dimension a positive constant or one of ``dependent``'s (the launcher skips a
    launch with an empty grid)."""
    if earlier.pdl or id(earlier) not in unconditional:
        return False
    return all((isinstance(g, tir.IntImm) and g.value > 0) or any(tvm.ir.structural_equal(g, h) for h in dependent.grid)
               for g in earlier.grid)


def pdl_report(kernel: LoweredKernel) -> dict:
    """``{"races": [...], "unknown": [...], "dependents": n}``: each finding names the dependent
    kernel, the buffer, what it does early and, for a race, the overlapping kernel."""
    funcs = dict(device_functions(kernel.device_mod))
    syncing = [name for name, f in funcs.items() if _has_sync(f.body)]
    races: list[dict] = []
    unknown: list[dict] = []
    if not syncing:
        return {"races": races, "unknown": unknown, "dependents": 0}
    try:
        plan = plan_launcher(kernel)
    except HostgenError as exc:
        unknown.append({"kernel": ", ".join(syncing), "reason": f"the launch order is not known ({exc})"})
        return {"races": races, "unknown": unknown, "dependents": len(syncing)}
    names = _host_names(plan)
    launches = [s.launch for s in walk_steps(plan.steps) if s.kind == "launch"]
    unconditional = {id(s.launch) for s in plan.steps if s.kind == "launch"}  # not under an ``if`` of the program
    whole = [_by_buffer(funcs[lc.kernel], lc, _touches(funcs[lc.kernel], [funcs[lc.kernel].body]), names) for lc in launches]
    for n, lc in enumerate(launches):
        if not lc.pdl:
            continue
        func = funcs[lc.kernel]
        parts, synced = _early_statements(func.body)
        early = _by_buffer(func, lc, _touches(func, parts), names)
        where = "before its T.pdl_sync()" if synced else "anywhere (its T.pdl_sync() runs under a condition or loop)"
        start = max((j for j in range(n) if _orders(launches[j], lc, unconditional)), default=None)
        for buffer, how in sorted(early.items()):
            if start is None:
                unknown.append({"kernel": lc.kernel, "buffer": buffer, "access": how,
                                "reason": f"{lc.kernel} may {how} {buffer} {where} while the stream's previous launch, "
                                          "outside this program, runs"})
            for j in range(start or 0, n):
                other = whole[j].get(buffer)
                vague = UNNAMED in (buffer, *whole[j]) and (how == "write" or "write" in whole[j].values())
                if other == "write" or (other and how == "write"):
                    (unknown if buffer == UNNAMED else races).append(
                        {"kernel": lc.kernel, "buffer": buffer, "access": how, "other": launches[j].kernel, "other_access": other,
                         "reason": f"{lc.kernel} may {how} {buffer} {where} while {launches[j].kernel}, which {other}s it, runs"})
                elif vague:
                    unknown.append({"kernel": lc.kernel, "buffer": buffer, "access": how, "other": launches[j].kernel,
                                    "reason": f"{lc.kernel} may {how} {buffer} {where} while {launches[j].kernel} runs, "
                                              "which passes an argument tlx cannot name"})
    return {"races": races, "unknown": unknown, "dependents": len(syncing)}
