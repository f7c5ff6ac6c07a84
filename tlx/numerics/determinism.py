"""Static determinism and batch-invariance analysis (``ctx.reports["determinism"]``).

Findings, each ``{"kind", "function", "detail", ...}``:

- ``fp_atomic``: a floating-point atomic add (``T.atomic_add`` and its vectorized forms, or a
  ``call_extern`` of ``atomicAdd``): the summation order follows the hardware's scheduling.
- ``split_k``: an element of a global buffer accumulated by several blocks — a floating-point
  atomic add or a read-modify-write whose address does not depend on some block index with
  extent > 1 (split-K / stream-K partial sums; without atomics it is also a race). Integer
  atomics are exact in any order and are not flagged.
- ``batch_dependent_order``: a serial loop or grid dimension that walks an axis of the
  inputs (its variable indexes that axis) but whose extent depends on another symbolic shape
  variable — e.g. a K loop whose chunking is derived from M, so a row's reduction order
  changes with the number of rows. A shape variable that reaches the extent only as the bound
  of a ``min``/``max`` clamping a value read from memory (``min(cu_q[b + 1], TQ)``: offsets
  clamped into the tensor) is a dependence on data, listed as unresolved, not a finding.

``unresolved`` lists what the analysis could not classify (a symbolic-extent loop that
indexes no global buffer, a branch on a shape variable that is not a bounds guard, a shape
variable that reaches a branch or a loop extent only through a thread variable — ``T.alloc_var``
/ ``T.alloc_local``, followed to every value ever stored to it —, a call to an unknown external
function). A branch around barrier waits, arrivals and fences only moves
no data and is not a value branch (whether skipping them races is the race analysis' part).
The verdicts ``deterministic`` and ``batch_invariant`` are ``False`` when a finding says so,
``True`` only when nothing was found and nothing was left unresolved, and ``"unknown"``
otherwise. A kernel whose shapes are all static gets
``batch_invariant: "unknown"``: each batch size is then a separate compile, whose tile choices
only the GPU harness (:mod:`tlx.numerics.invariance`) can compare.

Synchronization helpers written as inline PTX (flags between CTAs, kernels or GPUs) are opaque
calls; a kernel library declares them by effect (:func:`declare_sync`). A spin-wait on another
agent's flag is then accepted under a stated assumption, listed in ``assumptions``: every wait
arrives (its 0 result, a timeout or an abort, leaves the outputs unspecified and the caller
raises an error), and a flag's release orders the data it guards. A failure record must sit in
the branch of a wait that returned 0, or it stays unresolved.

Split-K is a floating-point read-modify-write (or atomic add) of global memory that two blocks
can apply to one element. An index that does not use some block index (a block index that
occurs only inside a condition, the branch test of an ``if_then_else`` or a comparison, does
not count as used) is a finding at once. An index that uses every block index goes to Z3
(:func:`_shared_elements`, the bounds verifier's encoder): can two blocks that differ in one
block index, with any threads, loop iterations and lanes, store to one element under the
stores' conditions? A model is a finding (a causal tile's first query block,
``max(col0 - d, 0) // bm``, uses the key tile yet maps several tiles to one block), an unknown
answer, or a question past the budget (``SPLIT_K_QUERY_RLIMIT``, ``SPLIT_K_QUERIES``: the
analysis runs on every compile), is unresolved. Values loaded from memory are unknowns (the same element of a read-only
input is one value), so an index built on offsets read from memory (``cu_q[b]``) can be found
to collide for offsets the caller would reject.
"""

from __future__ import annotations

from tilelang import tvm

from tlx.ir.tir import device_functions, extern_name, op_name

__all__ = ["SYNC_EFFECTS", "analyze", "analyze_device", "analyze_program", "declare_pure", "declare_sync"]


ATOMIC_ADD_OPS = frozenset(
    f"tl.atomic_add{w}{r}_elem_op" for w in ("", "x2", "x4") for r in ("", "_ret")
)
KNOWN_EXTERN_PREFIXES = ("tl::", "tlx_ieee_", "__", "cute::", "cutlass::")
_PURE_EXTERNS: set[str] = set()


def declare_pure(*names: str) -> None:
    """Declare device helpers (a kernel's own prelude) as pure functions of their arguments: no
    memory access, no atomics, same result on every call. Calls to them then count as
    arithmetic; any other unknown external call keeps the verdicts at "unknown"."""
    _PURE_EXTERNS.update(names)


SYNC_EFFECTS = {
    "fence": "orders this thread's memory accesses; moves no data",
    "flag_store": "stores its integer argument to a flag word",
    "counter_add": "adds an integer to a counter word: exact in any order",
    "wait": "spins until another agent's flag arrives; returns 0 only on a timeout or an abort",
    "failure_record": "records which wait failed (run only where a wait returned 0)",
}
_SYNC_EXTERNS: dict[str, str] = {}
WAIT_ASSUMPTION = ("every wait on a flag or counter arrives (a wait that returns 0 leaves the outputs unspecified "
                   "and the caller raises an error), and a flag's release orders the data it guards")


def declare_sync(**effects: str) -> None:
    """Declare device helpers that synchronize through memory (inline PTX the analysis cannot
    read) by their effect, one of :data:`SYNC_EFFECTS`: ``declare_sync(tlx_wait_flag_sys="wait")``.
    Integer arguments only: a helper given a floating-point value stays unresolved."""
    for name, effect in effects.items():
        if effect not in SYNC_EFFECTS:
            raise ValueError(f"declare_sync: effect of {name} expected one of {sorted(SYNC_EFFECTS)}, got {effect!r}")
    _SYNC_EXTERNS.update(effects)


def _failure_branches(body) -> set:
    """The failure-record calls that sit in the then-branch of ``if (wait(...) == 0)``."""
    covered: set = set()

    def visit(node):
        if isinstance(node, tvm.tirx.IfThenElse) and isinstance(node.condition, tvm.tirx.EQ):
            cond = node.condition
            for call, zero in ((cond.a, cond.b), (cond.b, cond.a)):
                if (isinstance(call, tvm.tirx.Call) and _SYNC_EXTERNS.get(extern_name(call)) == "wait"
                        and isinstance(zero, tvm.tirx.IntImm) and int(zero) == 0):
                    _visit(node.then_case, lambda n: covered.add(n) if isinstance(n, tvm.tirx.Call)
                           and _SYNC_EXTERNS.get(extern_name(n)) == "failure_record" else None)  # fmt: skip

    _visit(body, visit)
    return covered


_COMPARISONS = (tvm.tirx.LT, tvm.tirx.LE, tvm.tirx.GT, tvm.tirx.GE, tvm.tirx.EQ, tvm.tirx.NE)
_COMPARISONS_AND_LOGIC = _COMPARISONS + (tvm.tirx.And, tvm.tirx.Or, tvm.tirx.Not)
_SERIAL_KINDS = (tvm.tirx.ForKind.SERIAL, tvm.tirx.ForKind.UNROLLED)


def _visit(node, fn):
    tvm.tirx.stmt_functor.post_order_visit(node, fn)


_LOCAL_SCOPES = ("local", "local.var")  # T.alloc_local / T.alloc_var: a thread's variables


def _let_bindings(body, local_variables: bool = False) -> dict:
    """Let-bound variables and their values. ``local_variables``: also a thread's local
    variables (``T.alloc_var``, ``T.alloc_local``) by their data pointer, with every value
    stored to them (several: one ``if_then_else`` whose arms are all of them), so that a branch
    on a variable is seen through to what it was set from (``seq = min(SL[b], MP * 64)`` makes
    a branch on ``seq`` one on ``MP``)."""
    lets = {}
    stored: dict = {}

    def visit(node):
        if isinstance(node, (tvm.tirx.Bind, tvm.tirx.Let)):
            lets[node.var] = node.value
        elif local_variables and isinstance(node, tvm.tirx.BufferStore) and node.buffer.scope() in _LOCAL_SCOPES:
            stored.setdefault(node.buffer.data, []).append(node.value)

    _visit(body, visit)
    for data, values in stored.items():
        value = values[-1]
        for other in reversed(values[:-1]):
            value = tvm.tirx.call_intrin(value.dtype, "tirx.if_then_else", tvm.tirx.const(True, "bool"), other, value)
        lets[data] = value
    return lets


def _local_load(node, lets: dict) -> bool:
    """A load of a thread's local variable whose stored values ``lets`` holds."""
    return isinstance(node, tvm.tirx.BufferLoad) and node.buffer.data in lets


def _through_lets(expr, lets: dict) -> list:
    """``expr`` and the value of every let-bound variable it reaches, transitively, each once."""
    seen: set = set()
    out, todo = [], [expr]
    while todo:
        e = todo.pop()
        out.append(e)
        found: list = []
        _visit(e, lambda n: found.append(n) if isinstance(n, tvm.tirx.Var)
               else found.append(n.buffer.data) if _local_load(n, lets) else None)
        for v in found:
            if v in lets and v not in seen:
                seen.add(v)
                todo.append(lets[v])
    return out


def _free_vars(expr, lets: dict) -> set:
    """Variables of ``expr``, looking through let-bound variables."""
    out: set = set()
    for e in _through_lets(expr, lets):
        _visit(e, lambda n: out.add(n) if isinstance(n, tvm.tirx.Var) and n not in lets else None)
    return out


def _address_vars(expr, lets: dict) -> set:
    """Variables that reach the value of an index ``expr`` (looking through let-bound
    variables), not counting those that occur only in a condition: the condition of an
    ``if_then_else`` / ``Select`` or a comparison. A block index that only picks which branch
    is taken (``n_qb = bx * 128 < len_k ? ... : 0``) does not make different blocks' elements
    different, so it must not count as the index using that block."""
    out: set = set()
    seen: set = set()
    lets = dict(lets)  # a Let inside the index binds its variable here only

    def walk(e):
        if isinstance(e, tvm.tirx.Var):
            if e in lets:
                if e not in seen:
                    seen.add(e)
                    walk(lets[e])
            else:
                out.add(e)
        elif isinstance(e, _COMPARISONS_AND_LOGIC):
            return
        elif isinstance(e, tvm.tirx.Call) and op_name(e) == "tirx.if_then_else":
            walk(e.args[1])
            walk(e.args[2])
        elif isinstance(e, tvm.tirx.Select):
            walk(e.true_value)
            walk(e.false_value)
        elif isinstance(e, tvm.tirx.Call):
            for a in e.args:
                walk(a)
        elif isinstance(e, tvm.tirx.BufferLoad):
            if _local_load(e, lets):
                walk(e.buffer.data)
            for i in e.indices:
                walk(i)
        elif isinstance(e, tvm.tirx.Cast):
            walk(e.value)
        elif isinstance(e, tvm.tirx.Ramp):
            walk(e.base)
            walk(e.stride)
        elif isinstance(e, tvm.tirx.Broadcast):
            walk(e.value)
        elif hasattr(e, "a") and hasattr(e, "b"):
            walk(e.a)
            walk(e.b)
        elif isinstance(e, tvm.tirx.Let):
            lets[e.var] = e.value
            walk(e.body)
        else:  # anything else: every variable in it counts
            _visit(e, lambda n: out.add(n) if isinstance(n, tvm.tirx.Var) and n not in lets else None)

    for e in [expr] if isinstance(expr, tvm.ir.PrimExpr) else expr:
        walk(e)
    return out


def _reads_memory(expr, lets: dict) -> bool:
    """Whether ``expr`` loads from a buffer, looking through let-bound variables."""
    found: list = []
    for e in _through_lets(expr, lets):
        _visit(e, lambda n: found.append(n) if isinstance(n, tvm.tirx.BufferLoad) and not _local_load(n, lets) else None)
    return bool(found)


def _children(e):
    """The sub-expressions of ``e`` that the value walks below descend into."""
    for attr in ("a", "b", "value", "condition", "true_value", "false_value"):
        sub = getattr(e, attr, None)
        if isinstance(sub, tvm.ir.PrimExpr):
            yield sub
    for sub in list(getattr(e, "args", ())) + list(getattr(e, "indices", ())):
        if isinstance(sub, tvm.ir.PrimExpr):
            yield sub

def _clamp_bound_only(expr, lets: dict, shape_vars: set) -> set:
    """The shape variables of ``expr`` that occur in it only as the bound of a ``min``/``max``
    whose other side reads memory (``min(cu_q[b + 1], TQ)``: an offset clamped into the
    tensor). Such a variable changes the value only for inputs the clamp cuts, so the
    dependence is on data, not on the shape alone."""
    direct: set = set()
    clamped: set = set()

    def walk(e, into: set, depth=0):
        if depth > 64:
            into.update(_free_vars(e, lets) & shape_vars)  # too deep to follow: count as direct
            return
        if isinstance(e, tvm.tirx.Var):
            if e in lets:
                walk(lets[e], into, depth + 1)
            elif e in shape_vars:
                into.add(e)
            return
        if _local_load(e, lets):
            walk(e.buffer.data, into, depth + 1)
        if isinstance(e, (tvm.tirx.Min, tvm.tirx.Max)):
            for data, bound in ((e.a, e.b), (e.b, e.a)):
                if _reads_memory(data, lets) and not _reads_memory(bound, lets):
                    walk(data, into, depth + 1)
                    walk(bound, clamped if into is direct else into, depth + 1)
                    return
        for sub in _children(e):
            walk(sub, into, depth + 1)

    walk(expr, direct)
    return clamped - direct


def _value_shape_vars(expr, lets: dict, shape_vars: set) -> tuple[set, set]:
    """(direct, clamped): the shape variables that reach the value of ``expr``, looking through
    let-bound and local variables, leaving out the two forms that do not make a value depend on
    a shape: a bounds guard (a comparison of an index expression with a shape-only one, as
    ``check_condition`` has it) and an index clamped to a shape (``min(bx, NB - 1)``). A shape
    that bounds a ``min``/``max`` whose other side reads memory goes to ``clamped`` (a
    dependence on data, as ``_clamp_bound_only`` has it)."""
    direct: set = set()
    clamped: set = set()
    seen: set = set()

    def shape_only(e) -> bool:  # of shape variables alone (at least one)
        free = _free_vars(e, lets)
        return bool(free) and free <= shape_vars and not _reads_memory(e, lets)

    def walk(e, depth=0):
        if depth > 64:
            direct.update(_free_vars(e, lets) & shape_vars)
            return
        if isinstance(e, tvm.tirx.Var):
            if e in lets:
                if e not in seen:
                    seen.add(e)
                    walk(lets[e], depth + 1)
            elif e in shape_vars:
                direct.add(e)
            return
        if _local_load(e, lets):
            walk(e.buffer.data, depth + 1)
        if isinstance(e, _COMPARISONS) and shape_only(e.a) != shape_only(e.b):
            return  # a bounds guard
        if isinstance(e, (tvm.tirx.Min, tvm.tirx.Max)):
            for other, bound in ((e.a, e.b), (e.b, e.a)):
                if shape_only(bound) and not shape_only(other):
                    if _reads_memory(other, lets):
                        clamped.update(_free_vars(bound, lets) & shape_vars)
                    walk(other, depth + 1)
                    return
        for sub in _children(e):
            walk(sub, depth + 1)

    walk(expr)
    return direct, clamped

def _is_float(dtype) -> bool:
    return str(dtype).startswith(("float", "bfloat"))


def _names(vs) -> list[str]:
    return sorted(v.name for v in vs)


# ---- device level: atomics and cross-block accumulation --------------------------------
def _block_vars(func) -> list[tuple]:
    """(var, tag) of every blockIdx launch whose extent is not the constant 1."""
    out = []

    def visit(node):
        if isinstance(node, tvm.tirx.AttrStmt) and node.attr_key == "thread_extent":
            iv = node.node
            tag = str(iv.thread_tag)
            if tag.startswith("blockIdx") and not (isinstance(node.value, tvm.tirx.IntImm) and int(node.value) == 1):
                out.append((iv.var, tag))

    _visit(func.body, visit)
    return out


def _atomic_target(call):
    """(buffer data var, offset expression, element dtype) of an atomic's destination."""
    dst = call.args[0]
    if isinstance(dst, tvm.tirx.Call) and op_name(dst) == "tirx.tvm_access_ptr":
        return dst.args[1], dst.args[2], dst.args[0].dtype
    if isinstance(dst, tvm.tirx.Call) and op_name(dst) == "tirx.address_of" and isinstance(dst.args[0], tvm.tirx.BufferLoad):
        load = dst.args[0]
        return load.buffer.data, load.indices, load.dtype
    if isinstance(dst, tvm.tirx.BufferLoad):
        return dst.buffer.data, dst.indices, dst.dtype
    return None


def analyze_device(device_mod, accumulations: list | None = None) -> tuple[list[dict], list[str], list[str]]:
    """Findings, unresolved items and assumptions of the lowered device kernels.
    ``accumulations`` (when given) receives ``(function, buffer name, kind)`` of each
    floating-point accumulation into global memory whose index uses every block index: whether
    those uses keep the blocks' elements apart is the solver's question (:func:`_shared_elements`)."""
    findings: list[dict] = []
    unresolved: list[str] = []
    assumptions: list[str] = []
    accumulations = [] if accumulations is None else accumulations
    for fname, func in device_functions(device_mod):
        lets = _let_bindings(func.body)
        blocks = _block_vars(func)
        failure_branches = _failure_branches(func.body)

        def missing_blocks(index):
            used = _address_vars(index, lets)
            return [tag for var, tag in blocks if var not in used]

        def visit(node, fname=fname, missing_blocks=missing_blocks, failure_branches=failure_branches):
            if isinstance(node, tvm.tirx.Call):
                op = op_name(node)
                ext = extern_name(node)
                effect = _SYNC_EXTERNS.get(ext) if op == "tirx.call_extern" else None
                if effect is not None:
                    if any(_is_float(a.dtype) for a in node.args[1:] if isinstance(a, tvm.ir.PrimExpr)):
                        unresolved.append(f"{fname}: {ext} ({effect}) given a floating-point argument")
                    elif effect == "failure_record" and node not in failure_branches:
                        unresolved.append(f"{fname}: {ext} records a failure outside the branch of a wait that returned 0")
                    elif effect == "wait" and WAIT_ASSUMPTION not in assumptions:
                        assumptions.append(WAIT_ASSUMPTION)
                elif op in ATOMIC_ADD_OPS:
                    target = _atomic_target(node)
                    if target is None:
                        unresolved.append(f"{fname}: atomic add with an unrecognized destination {node.args[0]}")
                        return
                    data, offset, dtype = target
                    if _is_float(dtype):
                        findings.append({"kind": "fp_atomic", "function": fname, "buffer": data.name, "dtype": str(dtype),
                                         "detail": f"floating-point atomic add into {data.name} ({dtype}): order follows block scheduling"})
                    lost = missing_blocks(offset) if _is_float(dtype) else []  # integer sums are exact in any order
                    if _is_float(dtype) and not lost:
                        accumulations.append((fname, data.name, "atomically accumulate into"))
                    if lost:
                        findings.append({"kind": "split_k", "function": fname, "buffer": data.name, "blocks": lost,
                                         "detail": f"blocks along {', '.join(lost)} atomically accumulate into the same elements of {data.name}"})
                elif ext is not None and "atomicadd" in ext.lower():
                    dtypes = [str(a.dtype) for a in node.args[1:]]
                    if any(_is_float(d) for d in dtypes[1:]) or _is_float(node.dtype):
                        findings.append({"kind": "fp_atomic", "function": fname, "buffer": "", "dtype": str(node.dtype),
                                         "detail": f"call to {ext} on floating-point data"})
                elif (ext is not None and op == "tirx.call_extern" and not ext.startswith(KNOWN_EXTERN_PREFIXES)
                      and ext not in _PURE_EXTERNS):
                    unresolved.append(f"{fname}: call to external function {ext} (effects unknown)")
            elif isinstance(node, tvm.tirx.BufferStore) and node.buffer.scope() == "global":
                reads_same = []
                _visit(node.value, lambda n: reads_same.append(n) if isinstance(n, tvm.tirx.BufferLoad)
                       and n.buffer.data.same_as(node.buffer.data)
                       and tvm.ir.structural_equal(list(n.indices), list(node.indices)) else None)  # fmt: skip
                if reads_same:
                    lost = missing_blocks(node.indices)
                    if not lost and _is_float(node.buffer.dtype):
                        accumulations.append((fname, node.buffer.data.name, "read-modify-write"))
                    if lost:
                        name = node.buffer.data.name
                        findings.append({"kind": "split_k", "function": fname, "buffer": name, "blocks": lost,
                                         "detail": f"blocks along {', '.join(lost)} read-modify-write the same elements of {name} without atomics (racy split-K)"})

        _visit(func.body, visit)
    return findings, unresolved, assumptions


# ---- program level: loop and grid extents, branches on shape variables -----------------
def _shape_axes(prim_func) -> tuple[dict, set]:
    """{buffer data var: [shape vars of each dim]} of the parameters, and all shape vars."""
    axes, shape_vars = {}, set()
    for _, buf in prim_func.buffer_map.items():
        dims = []
        for extent in buf.shape:
            vs = _free_vars(extent, {})
            dims.append(vs)
            shape_vars |= vs
        axes[buf.data] = dims
    return axes, shape_vars


def _axes_walked(body, var, axes: dict, lets: dict) -> tuple[bool, set]:
    """Whether ``var`` indexes any parameter inside ``body``, and the shape variables of the
    dimensions it indexes."""
    hit = False
    walked: set = set()

    def visit(node):
        nonlocal hit
        if isinstance(node, (tvm.tirx.BufferLoad, tvm.tirx.BufferStore)) and node.buffer.data in axes:
            dims = axes[node.buffer.data]
            for d, index in enumerate(node.indices):
                if d < len(dims) and var in _free_vars(index, lets):
                    hit = True
                    walked.update(dims[d])

    _visit(body, visit)
    return hit, walked


def _comparisons(cond) -> list:
    out = []
    _visit(cond, lambda n: out.append(n) if isinstance(n, _COMPARISONS) else None)
    return out


# barrier waits, arrivals and fences: a branch around only these moves no data (whether the
# program without them is race-free is the race analysis' question, not this one's)
_BARRIER_OPS = frozenset({"tl.mbarrier_wait_parity", "tirx.ptx_arrive_barrier", "tl.mbarrier_arrive", "tl.fence_proxy_async",
                          "tirx.tvm_storage_sync"})


def _only_synchronizes(stmt) -> bool:
    """Whether ``stmt`` (None: an absent else branch) is made of barrier operations only."""
    if stmt is None:
        return True
    if isinstance(stmt, tvm.tirx.SeqStmt):
        return all(_only_synchronizes(s) for s in stmt.seq)
    return isinstance(stmt, tvm.tirx.Evaluate) and isinstance(stmt.value, tvm.tirx.Call) and op_name(stmt.value) in _BARRIER_OPS


def analyze_program(prim_func) -> tuple[list[dict], list[str], set]:
    """Findings, unresolved items and the symbolic shape variables of the tile program."""
    findings: list[dict] = []
    unresolved: list[str] = []
    axes, shape_vars = _shape_axes(prim_func)
    lets = _let_bindings(prim_func.body)
    # through local variables too: a shape variable seen only that way is unresolved, not a
    # finding (their values are followed flow-insensitively: every value ever stored)
    lets_and_locals = _let_bindings(prim_func.body, local_variables=True)

    def through_variables(expr, seen: set, what: str) -> None:
        direct, clamped = _value_shape_vars(expr, lets_and_locals, shape_vars)
        if direct - seen:
            unresolved.append(f"{name}: {what} depends on {_names(direct - seen)} through a local variable: {expr}")
        if clamped - direct - seen:
            unresolved.append(f"{name}: {what} depends on {_names(clamped - direct - seen)} through a local variable, only "
                              f"where a value read from memory is clamped to it (batch invariant unless the clamp cuts an "
                              f"input): {expr}")
    name = str(prim_func.attrs["global_symbol"]) if prim_func.attrs and "global_symbol" in prim_func.attrs else "main"

    def check_extent(kind: str, var, extent, body):
        ext_vars = _free_vars(extent, lets) & shape_vars
        through_variables(extent, ext_vars, f"{kind} {var.name}'s extent")
        if not ext_vars:
            return
        hit, walked = _axes_walked(body, var, axes, lets)
        if not hit:
            unresolved.append(f"{name}: {kind} {var.name} has extent {extent} over {_names(ext_vars)} but indexes no input axis")
            return
        foreign = ext_vars - walked
        through_data = foreign & _clamp_bound_only(extent, lets, shape_vars)
        if through_data:
            unresolved.append(f"{name}: {kind} {var.name} has extent {extent}, which depends on {_names(through_data)} "
                              f"only where a value read from memory is clamped to it (batch invariant unless the "
                              f"clamp cuts an input)")
            foreign -= through_data
        if foreign:
            findings.append({"kind": "batch_dependent_order", "function": name, "loop": var.name, "extent": str(extent),
                             "vars": _names(foreign),
                             "detail": f"{kind} {var.name} walks axes over {_names(walked) or 'static extents'} but its extent "
                                       f"{extent} depends on {', '.join(_names(foreign))}: the order of that reduction changes with "
                                       f"{', '.join(_names(foreign))}"})  # fmt: skip

    def check_condition(cond):
        for cmp in _comparisons(cond):
            a, b = _free_vars(cmp.a, lets), _free_vars(cmp.b, lets)
            on_shapes = (a | b) & shape_vars
            through_variables(cmp, on_shapes, "a branch")
            if not on_shapes:
                continue
            a_index, b_index = bool(a - shape_vars), bool(b - shape_vars)
            if a_index != b_index:  # index expression vs shape: a bounds guard
                continue
            unresolved.append(f"{name}: branch on {_names(on_shapes)} that is not a bounds guard: {cmp}")

    def visit(node):
        if isinstance(node, tvm.tirx.For):
            if node.kind in _SERIAL_KINDS:
                check_extent("loop", node.loop_var, node.extent, node.body)
            elif node.kind == tvm.tirx.ForKind.THREAD_BINDING and str(node.thread_binding.thread_tag).startswith("blockIdx"):
                check_extent(f"grid dimension {node.thread_binding.thread_tag}", node.loop_var, node.extent, node.body)
        elif isinstance(node, tvm.tirx.IfThenElse):
            if not (_only_synchronizes(node.then_case) and _only_synchronizes(node.else_case)):
                check_condition(node.condition)
        elif isinstance(node, tvm.tirx.Select):
            check_condition(node.condition)
        elif isinstance(node, tvm.tirx.Call) and op_name(node) == "tirx.if_then_else":
            check_condition(node.args[0])

    _visit(prim_func.body, visit)
    return findings, unresolved, shape_vars


def _verdict(bad: bool, unresolved: list) -> bool | str:
    if bad:
        return False
    return "unknown" if unresolved else True


# Z3 budget of the split-K question, since the analysis runs on every compile: resource units a
# query (machine-independent; one solver, no second try) and queries a kernel. A question that
# needs more stays unknown.
SPLIT_K_QUERY_RLIMIT = 300_000
SPLIT_K_QUERIES = 4


def _shared_elements(kernel, accumulations: list, assume=()) -> tuple[list[dict], list[str]]:
    """Split-K findings (and unresolved items) for accumulations whose index names every block
    index: for each store of the buffer and each block index, can two blocks that differ in that
    index alone (threads, loop iterations and vector lanes free in each) store to one element,
    under the stores' conditions? A model is a finding, an unknown answer is unresolved."""
    import z3

    from tlx.ir.facts import function_facts
    from tlx.ir.program import collect_program
    from tlx.passes.smt import MemoryFacts, context_facts, kernel_encoder

    findings, unresolved = [], []
    if not accumulations:
        return findings, unresolved
    progs = {p.name: p for p in collect_program(kernel)}
    funcs = dict(device_functions(kernel.device_mod))
    enc = kernel_encoder(kernel, assume)
    queries = 0
    for fname, buffer, kind in dict.fromkeys(accumulations):
        prog, func = progs.get(fname), funcs.get(fname)
        stores = [a for a in prog.accesses if a.scope == "global" and a.write and a.buffer == buffer] if prog else []
        if not stores or func is None:
            unresolved.append(f"{fname}: the stores of {buffer} were not found for the split-K check")
            continue
        enc.know(function_facts(func), MemoryFacts())
        shared, unknown = [], False
        for bvar, _ in prog.blocks:
            for a in stores:
                for b in stores:
                    if queries == SPLIT_K_QUERIES:
                        unknown = True
                        break
                    queries += 1
                    env = {v: enc.fresh(v.dtype, f"{v.name}'") for v, _ in prog.threads}
                    env.update({v: enc.fresh(v.dtype, f"{v.name}'") for v, _, _ in b.loops})
                    env[bvar] = enc.fresh(bvar.dtype, f"{bvar.name}'")
                    lane_a, lane_b = (enc.fresh("int32", "lane") for _ in range(2))
                    facts = context_facts(enc, prog, a)  # blocks and a's loops; the second copy's below
                    facts += [env[bvar] >= 0, env[bvar] < enc.encode(dict(prog.blocks)[bvar]), env[bvar] != enc.var(bvar)]
                    for v, ext in prog.threads:
                        facts += enc.range_facts(v, 0, ext) + [env[v] >= 0, env[v] < ext]
                    for v, lo, ext in b.loops:
                        facts += [env[v] >= enc.encode(lo, env), env[v] < enc.encode(lo, env) + enc.encode(ext, env)]
                    facts += [enc.encode_bool(c) for c in a.conds] + [enc.encode_bool(c, env) for c in b.conds]
                    facts += [lane_a >= 0, lane_a < a.lanes, lane_b >= 0, lane_b < b.lanes]
                    facts.append(enc.encode(a.index, lane=lane_a) == enc.encode(b.index, env, lane=lane_b))
                    enc.take_obligations()
                    solver = z3.Solver(ctx=enc.ctx)
                    solver.set("rlimit", SPLIT_K_QUERY_RLIMIT)
                    solver.add(*enc.facts, *facts)
                    result = solver.check()
                    if result == z3.sat:
                        shared.append(bvar)
                        break
                    unknown |= result == z3.unknown
                if bvar in shared:
                    break
        tags = [tag for var, tag in _block_vars(func) if any(var.same_as(v) for v in shared)]
        if tags:
            findings.append({"kind": "split_k", "function": fname, "buffer": buffer, "blocks": tags,
                             "detail": f"blocks along {', '.join(tags)} {kind} the same elements of {buffer} (its index "
                                       f"names them, but two of them can reach one element)"})
        elif unknown:
            unresolved.append(f"{fname}: whether blocks {kind} the same elements of {buffer} is unknown (solver)")
    return findings, unresolved


def analyze(kernel, assume=()) -> dict:
    """The determinism report of one lowered kernel (see the module docstring)."""
    accumulations: list = []
    dev_findings, dev_unresolved, assumptions = analyze_device(kernel.device_mod, accumulations)
    solver_findings, solver_unresolved = _shared_elements(kernel, accumulations, assume)
    dev_findings += solver_findings
    dev_unresolved += solver_unresolved
    prog_findings, prog_unresolved, shape_vars = analyze_program(kernel.prim_func)
    findings = dev_findings + prog_findings
    kinds = {f["kind"] for f in findings}
    deterministic = _verdict(bool(kinds & {"fp_atomic", "split_k"}), dev_unresolved)
    batch_unresolved = list(prog_unresolved)
    if not shape_vars:
        batch_unresolved.append("all shapes are static: each batch size is a separate compile (use tlx.numerics.invariance)")
    batch_invariant = _verdict(bool(kinds), batch_unresolved + dev_unresolved)
    return {
        "deterministic": deterministic,
        "batch_invariant": batch_invariant,
        "findings": findings,
        "unresolved": dev_unresolved + batch_unresolved,
        "assumptions": assumptions,
        "shape_vars": _names(shape_vars),
    }


def determinism_pass(kernel, ctx):
    """Report floating-point atomics, split-K accumulation and batch-dependent reduction order.

    The analysis runs on every compile and only reports, so an IR shape it cannot handle
    yields an "unknown" report with the error (and a warning) instead of failing the compile."""
    try:
        ctx.reports["determinism"] = analyze(kernel, ctx.options.assume)
    except Exception as e:  # noqa: BLE001  (see docstring)
        import warnings

        warnings.warn(f"tlx determinism analysis of {kernel.name!r} failed: {e!r}; reporting unknown", RuntimeWarning, stacklevel=2)
        ctx.reports["determinism"] = {"deterministic": "unknown", "batch_invariant": "unknown", "findings": [],
                                      "unresolved": [f"analysis failed: {e!r}"], "assumptions": [], "shape_vars": []}  # fmt: skip
    return kernel
