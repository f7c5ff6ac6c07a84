"""What a device function's code says about its shapes and values, derived once and handed to
the SMT encoder as an explicit :class:`FunctionFacts`: which device parameters are the user's
shape variables, which pointer parameters are read-only, and which private scalars are counters;
and, per loop, which private scalars the loop only accumulates into (:func:`accumulators`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from tilelang import tvm

from tlx.ir.tir import PRIVATE_SCOPES, arith_only, device_functions, free_vars, nodes, op_name, scalar_dtype, unit_step

tir = tvm.tirx

__all__ = ["FunctionFacts", "accumulators", "counters", "dimension_vars", "function_facts", "launcher_checks", "param_buffers",
           "private_int_cell", "read_only_params", "stride_vars", "user_name"]


@dataclass
class FunctionFacts:
    """``read_only``: data vars of inputs the function never writes; ``counters``: data var ->
    (start, [(step, [loop extents] or None), ...]) (see :func:`counters`)."""

    read_only: set = field(default_factory=set)
    counters: dict = field(default_factory=dict)


def function_facts(f) -> FunctionFacts:
    return FunctionFacts(read_only_params(f), counters(f))


def user_name(name: str) -> str:
    """``C_1`` (a re-declaration made by lowering) -> ``C``."""
    base, _, suffix = name.rpartition("_")
    return base if base and suffix.isdigit() else name


def dimension_vars(prim_func) -> set[str]:
    """Names of the symbolic variables that are a tensor dimension themselves: the launcher binds
    each from an argument's shape, so it is >= 0. A scalar parameter, or a variable seen only
    inside a stride or a larger extent expression, carries no sign beyond its dtype's range."""
    return {
        dim.name
        for buf in prim_func.buffer_map.values()
        for dim in buf.shape
        if isinstance(dim, tir.Var) and dim not in prim_func.params
    }


def stride_vars(prim_func) -> set[str]:
    """Names of the symbolic variables that only a tensor's stride gives (a ``StridedTensor`` with
    a stride of its own): the launcher binds each from that stride (tlx/hostgen/plan.py) and
    refuses a negative one, so it is >= 0."""
    dims = dimension_vars(prim_func)
    scalars = {p.name for p in prim_func.params if p not in prim_func.buffer_map}
    return {
        stride.name
        for buf in prim_func.buffer_map.values()
        for stride in buf.strides or []
        if isinstance(stride, tir.Var) and stride.name not in dims and stride.name not in scalars
    }


def launcher_checks(kernel) -> set:
    """The conditions of the asserts in the host code's compute scope, as text: the program's
    ``T.assume`` conditions, which the generated launcher checks (tlx/hostgen/plan.py; the
    argument checks outside that scope are TileLang's own launcher's, not tlx's)."""
    out = set()
    for _, h in device_functions(kernel.host_mod):
        for scope in nodes(h.body, tir.AttrStmt):
            if scope.attr_key == "compute_scope":
                out.update(str(a.condition) for a in nodes(scope.body, tir.AssertStmt))
    return out


def param_buffers(kernel, f) -> dict:
    """Device pointer parameter -> the user's declared buffer of that name (for pointer accesses
    such as ``cp.async`` sources, which have no ``decl_buffer`` in the device code)."""
    declared = {}
    for buf in kernel.prim_func.buffer_map.values():
        declared[buf.data.name] = buf
        declared.setdefault(buf.name, buf)
    return {p: declared[p.name] for p in f.params if str(p.dtype) == "handle" and p.name in declared}


def read_only_params(f) -> set:
    """Device pointer parameters the function never writes through: no store, no ``address_of``
    (atomics), and no use of the pointer itself but as a read-only ``tvm_access_ptr`` (a bare use
    anywhere else, e.g. a let alias or another call, counts as a write). TileLang declares them
    ``const __restrict__``, so their elements keep one value for the whole kernel."""
    handles = {p for p in f.params if str(p.dtype) == "handle"}
    written: set = set()
    uses: dict = {}  # handle -> bare occurrences
    read_ptrs: dict = {}  # handle -> occurrences as a read-only tvm_access_ptr's data

    for node in nodes(f.body, (tir.BufferStore, tir.Var, tir.Call)):
        if isinstance(node, tir.BufferStore):
            written.add(node.buffer.data)
        elif isinstance(node, tir.Var) and node in handles:
            uses[node] = uses.get(node, 0) + 1
        elif isinstance(node, tir.Call):
            name = op_name(node)
            if name == "tirx.address_of" and isinstance(node.args[0], tir.BufferLoad):
                written.add(node.args[0].buffer.data)
            elif name == "tirx.tvm_access_ptr" and node.args[1] in handles:
                mask = node.args[4]
                if isinstance(mask, tir.IntImm) and mask.value & 2 == 0:
                    read_ptrs[node.args[1]] = read_ptrs.get(node.args[1], 0) + 1
    written |= {v for v, n in uses.items() if n > read_ptrs.get(v, 0)}
    return handles - written


def private_int_cell(buf) -> bool:
    """A thread-private integer buffer of one element (``T.alloc_var``, ``T.alloc_local((1,))``): a
    scalar only its own thread's stores change."""
    shape = list(buf.shape)
    return (str(buf.scope()) in PRIVATE_SCOPES and scalar_dtype(buf.dtype)[0] in ("int", "uint")
            and len(shape) == 1 and isinstance(shape[0], tir.IntImm) and shape[0].value == 1)


def _pointer_taken(body, data_vars) -> set:
    """Those of ``data_vars`` that ``body`` uses as a bare pointer or takes an element's
    ``address_of``: their values may change where no store shows it."""
    taken = set()
    for n in nodes(body, (tir.Var, tir.Call)):
        if isinstance(n, tir.Var) and n in data_vars:
            taken.add(n)
        elif (isinstance(n, tir.Call) and op_name(n) == "tirx.address_of" and isinstance(n.args[0], tir.BufferLoad)
              and n.args[0].buffer.data in data_vars):
            taken.add(n.args[0].buffer.data)
    return taken


def counters(f) -> dict:
    """Thread-private integer scalars used as counters (a pipeline's stage/phase counter
    ``it = it + 1``): set once to a constant, outside every loop and branch and before any other
    use, then only incremented by non-negative constants, and never addressed by pointer. Their
    value is then at least the start and, where every increment sits in loops whose trip counts
    depend only on the kernel's parameters and thread indices, at most the start plus each step
    times those trip counts (see ``Encoder.counters``). Returns data var -> (start, [(step,
    [loop extents] or None where a loop around the increment has no such trip count), ...])."""
    fixed = {p for p in f.params if not str(p.dtype) == "handle"}
    state: dict = {}  # data var -> {"start": int | None, "sites": [...], "ok": bool}

    def entry(buf):
        return state.setdefault(buf.data, {"start": None, "sites": [], "ok": True})

    def scan(expr):
        """Loads: one before the start disqualifies."""
        for load in nodes(expr, tir.BufferLoad):
            if private_int_cell(load.buffer):
                e = entry(load.buffer)
                e["ok"] &= e["start"] is not None

    def step_of(value, data):
        """c for ``data[0] + c`` (or ``c + data[0]``) with a constant c >= 0, else None."""
        if not isinstance(value, tir.Add):
            return None
        for load, c in ((value.a, value.b), (value.b, value.a)):
            if isinstance(load, tir.BufferLoad) and load.buffer.data.same_as(data) and isinstance(c, tir.IntImm) and c.value >= 0:
                return int(c.value)
        return None

    def invariant(ext) -> bool:
        """A trip count fixed for the thread: arithmetic over parameters and thread indices only."""
        return arith_only(ext) and all(v in fixed for v in free_vars(ext))

    def walk(s, loops, nested):
        if isinstance(s, tir.AttrStmt) and s.attr_key == "thread_extent" and isinstance(s.node, tir.IterVar):
            fixed.add(s.node.var)
        for attr in ("value", "condition", "min", "extent"):
            sub = getattr(s, attr, None)
            if isinstance(sub, tvm.ir.PrimExpr):
                scan(sub)
        if isinstance(s, tir.BufferStore):
            for i in s.indices:
                scan(i)
            if private_int_cell(s.buffer):
                e = entry(s.buffer)
                step = step_of(s.value, s.buffer.data)
                if e["start"] is None and isinstance(s.value, tir.IntImm) and not nested:
                    e["start"] = int(s.value.value)
                elif step is not None and e["start"] is not None:
                    e["sites"].append((step, None if loops is None else list(loops)))
                else:
                    e["ok"] = False
            return
        if isinstance(s, tir.For):
            trip_known = loops is not None and invariant(s.extent) and unit_step(s)
            walk(s.body, loops + [s.extent] if trip_known else None, True)
            return
        if isinstance(s, tir.While):
            walk(s.body, None, True)  # no trip count: increments inside leave the counter unbounded above
            return
        if isinstance(s, tir.SeqStmt):
            for x in s.seq:
                walk(x, loops, nested)
            return
        branch = isinstance(s, tir.IfThenElse)
        for attr in ("then_case", "else_case", "body"):
            sub = getattr(s, attr, None)
            if isinstance(sub, tir.Stmt):
                walk(sub, loops, nested or branch)

    walk(f.body, [], False)
    for data in _pointer_taken(f.body, state):
        state[data]["ok"] = False
    return {d: (e["start"], e["sites"]) for d, e in state.items() if e["ok"] and e["start"] is not None}


def step_range(expr) -> tuple[int, int] | None:
    """The closed range every value of integer ``expr`` lies in, read from its form alone (no
    value it loads is known): constants, ``x & C`` (C >= 0), ``x >> s`` (by x's width and
    signedness), narrowing-free casts, selects, sums and differences; else None."""
    kind, bits, lanes = scalar_dtype(expr.dtype)
    if lanes != 1 or kind not in ("int", "uint", "bool"):
        return None
    if isinstance(expr, tir.IntImm):
        return (int(expr.value), int(expr.value))
    if kind == "bool":
        return (0, 1)
    if isinstance(expr, tir.Cast):
        inner = step_range(expr.value)
        lo, hi = (-(1 << (bits - 1)), (1 << (bits - 1)) - 1) if kind == "int" else (0, (1 << bits) - 1)
        return inner if inner is not None and lo <= inner[0] and inner[1] <= hi else None
    if isinstance(expr, (tir.Add, tir.Sub)):
        a, b = step_range(expr.a), step_range(expr.b)
        if a is None or b is None:
            return None
        return (a[0] + b[0], a[1] + b[1]) if isinstance(expr, tir.Add) else (a[0] - b[1], a[1] - b[0])
    if isinstance(expr, tir.Select) or (isinstance(expr, tir.Call) and op_name(expr) == "tirx.if_then_else"):
        a, b = (expr.true_value, expr.false_value) if isinstance(expr, tir.Select) else expr.args[1:]
        a, b = step_range(a), step_range(b)
        return None if a is None or b is None else (min(a[0], b[0]), max(a[1], b[1]))
    if isinstance(expr, tir.Call) and op_name(expr) == "tirx.bitwise_and":
        masks = [int(x.value) for x in expr.args if isinstance(x, tir.IntImm) and x.value >= 0]
        return (0, min(masks)) if masks else None
    if isinstance(expr, tir.Call) and op_name(expr) == "tirx.shift_right" and isinstance(expr.args[1], tir.IntImm):
        shift, (src, width, _) = int(expr.args[1].value), scalar_dtype(expr.args[0].dtype)
        if not 0 <= shift < width or src not in ("int", "uint"):
            return None
        return (0, (1 << (width - shift)) - 1) if src == "uint" else (-(1 << (width - 1 - shift)), (1 << (width - 1 - shift)) - 1)
    return None


def accumulators(loop) -> dict:
    """Private integer scalars that ``loop``'s body changes only by ``x = x + d`` (or ``x - d``) with ``d`` of a
    known range (:func:`step_range`), at sites inside loops of constant trip count only and
    never through a pointer. Returns data var -> (buffer, lo, hi): one iteration of ``loop``
    moves ``x`` by an amount in ``[lo, hi]`` (a site a branch skips adds 0, so ``lo <= 0 <= hi``);
    at the start of iteration ``k`` it holds its entry value plus ``[lo * k, hi * k]``."""
    found: dict = {}  # data var -> [buffer, lo, hi] or None once disqualified

    def site(store, trips):
        buf, value, data = store.buffer, store.value, store.buffer.data

        def own(load, d) -> bool:
            return (isinstance(load, tir.BufferLoad) and load.buffer.data.same_as(data)
                    and not any(x.buffer.data.same_as(data) for x in nodes(d, tir.BufferLoad)))

        step = None
        if isinstance(value, tir.Add):
            step = next((step_range(d) for load, d in ((value.a, value.b), (value.b, value.a)) if own(load, d)), None)
        elif isinstance(value, tir.Sub) and own(value.a, value.b):
            down = step_range(value.b)
            step = None if down is None else (-down[1], -down[0])
        entry = found.setdefault(data, [buf, 0, 0])
        if step is None or entry is None or trips is None:
            found[data] = None
            return
        entry[1] += min(step[0], 0) * trips
        entry[2] += max(step[1], 0) * trips

    def walk(s, trips):
        if isinstance(s, tir.BufferStore):
            if private_int_cell(s.buffer):
                site(s, trips)
            return
        if isinstance(s, tir.For):
            extent = s.extent.value if isinstance(s.extent, tir.IntImm) else None
            inner = trips * max(extent, 0) if extent is not None and unit_step(s) and trips is not None else None
            walk(s.body, inner)
            return
        if isinstance(s, tir.While):
            walk(s.body, None)
            return
        if isinstance(s, tir.SeqStmt):
            for x in s.seq:
                walk(x, trips)
            return
        for attr in ("then_case", "else_case", "body", "init"):
            sub = getattr(s, attr, None)
            if isinstance(sub, tir.Stmt):
                walk(sub, trips)

    walk(loop.body, 1)
    for data in _pointer_taken(loop.body, found):
        found[data] = None
    return {d: tuple(e) for d, e in found.items() if e is not None}
