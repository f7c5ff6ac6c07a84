"""Emit the C++ source of a launcher from a :class:`~tlx.hostgen.plan.LaunchPlan`.

The launcher is one exported TVM-FFI C-ABI function. It checks, in this order: the
argument count; per tensor the type, dtype, ndim, shape (constants and one consistent
binding per symbolic dimension), strides; scalar types and ranges (a bool is no int, a finite
float past float32's range is no float32); the kernel's shape preconditions; every grid
dimension computable from shapes and scalars against CUDA's limits; then device placement and
data-pointer alignment; and finally allocates the program's global workspaces, encodes TMA
descriptors (cached) and launches on the caller's stream. Every failure raises a Python
exception naming the kernel, the argument, the expected and the actual value. A call in which a
tensor argument has no elements is a no-op (nothing is allocated, encoded or launched).
"""

from __future__ import annotations

from tvm import tirx

from tlx.hostgen.cexpr import c_name, cexpr, pyexpr
from tlx.hostgen.plan import HostgenError, LaunchPlan, Step, TensorArg, Workspace, walk_steps
from tlx.ir.tir import free_vars

__all__ = ["ALLOCATING_NAME", "EXPORT_NAME", "emit_launcher"]

_SCALAR_RANGES = {
    "int8": (-(2**7), 2**7 - 1),
    "int16": (-(2**15), 2**15 - 1),
    "int32": (-(2**31), 2**31 - 1),
    "int64": (-(2**63), 2**63 - 1),
    "uint8": (0, 2**8 - 1),
    "uint16": (0, 2**16 - 1),
    "uint32": (0, 2**32 - 1),
    "bool": (0, 1),
}
_FLOAT_MAX = {"float32": "3.4028234663852886e38", "float64": "1.7976931348623157e308"}
_INT64_MAX = 2**63 - 1
# CUDA's grid limits per axis (compute capability >= 3.0).
_GRID_LIMITS = (("x", 2**31 - 1), ("y", 65535), ("z", 65535))
_C_TYPES = {
    "int8": "int8_t",
    "int16": "int16_t",
    "int32": "int32_t",
    "int64": "int64_t",
    "uint8": "uint8_t",
    "uint16": "uint16_t",
    "uint32": "uint32_t",
    "uint64": "uint64_t",
    "bool": "bool",
    "float32": "float",
    "float64": "double",
}


# The TVM-FFI function every launcher library exports (one kernel per library).
EXPORT_NAME = "launch"
ALLOCATING_NAME = "allocate_and_launch"  # the call with the inputs alone (see _allocating_function)


def _dims(shape) -> str:
    return ", ".join(pyexpr(d) for d in shape)


def _signature(plan: LaunchPlan, outputs: bool = True) -> str:
    """The parameters as text, in order; without ``outputs``, those of the allocating call."""
    parts: list[str] = [""] * plan.num_args
    for t in plan.tensors:
        if outputs or not t.is_output:
            parts[t.index] = f"{t.name}: {t.dtype}[{_dims(t.shape)}]"
    for s in plan.scalars:
        parts[s.index] = f"{s.name}: {s.dtype}"
    return ", ".join(p for p in parts if p)


def _cstr(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


class _Emitter:
    def __init__(self, plan: LaunchPlan, cubin_path: str, cubin_symbol: str, inputs_only: bool = False):
        self.plan = plan
        # The tensors whose checks this function emits: every one, or the inputs alone (allocate_and_launch)
        self.checked = [t for t in plan.tensors if not (inputs_only and t.is_output)]
        self.cubin_path = cubin_path
        self.sym = cubin_symbol
        self.lines: list[str] = []
        self.known: set[str] = set()
        self.checked_grid: set[tuple[str, str]] = set()  # (axis, expression) checked up front
        self.renamed: dict = {}  # host variable -> its C name, where its readable name was taken
        for t in plan.tensors:
            if t.c_id != t.name:  # the data pointers of arguments that share a name
                self.renamed[t.data_var] = f"v_{t.c_id}"
        self.kernel_index = {k: i for i, k in enumerate(plan.kernels)}
        self.workspaces = [s.workspace for s in walk_steps(plan.steps) if s.kind == "workspace"]
        self.counts: dict[int, str] = {}  # id of a workspace -> the C expression of its checked element count

    def out(self, line: str = "", indent: int = 1) -> None:
        self.lines.append(("  " * indent + line) if line else "")

    def expr(self, e) -> str:
        for v in free_vars(e):
            if self.renamed.get(v, c_name(v)) not in self.known:
                raise HostgenError(f"{self.plan.name}: host expression {e} uses {v.name}, which the launcher cannot compute")
        return cexpr(e, self.renamed)

    def declare(self, var) -> str:
        """The C name of a host-computed variable: its readable name, suffixed when another variable
        of that name already holds it (two TMA descriptors of one tensor are both ``A_desc``)."""
        name = self.declare_name(c_name(var))
        if name != c_name(var):
            self.renamed[var] = name
        return name

    def declare_name(self, name: str) -> str:
        """``name`` as a C identifier of its own, suffixed (``_1``, ``_2``, ...) when taken."""
        k, candidate = 0, name
        while candidate in self.known:
            k += 1
            candidate = f"{name}_{k}"
        self.known.add(candidate)
        return candidate

    # ---- sections ---------------------------------------------------------------------
    def header(self) -> None:
        p = self.plan
        n = len(p.kernels)
        names = ", ".join(_cstr(k) for k in p.kernels)
        smem = ", ".join(str(v if v is not None else 0) for v in p.kernels.values())
        self.lines += [
            f"// Launcher for the TileLang kernel `{p.name}`, generated by tlx (tlx/hostgen). Do not edit.",
            f"// Signature: {p.name}({_signature(p)})",
            '#include "tlx_launcher.h"',
            "",
            "// The device code (cubin) is embedded in this library.",
            "extern \"C\" const char " + self.sym + "[];",
            "__asm__(\".section .rodata\\n.balign 64\\n.local " + self.sym + "\\n" + self.sym + ":\\n.incbin \\\"" + self.cubin_path +
            "\\\"\\n.byte 0\\n.previous\");",
            "",
            "namespace {",
            f"constexpr const char* kKernel = {_cstr(p.name)};",
            f"constexpr const char* kSignature = {_cstr(_signature(p))};",
            f"const char* const kFunctionNames[{n}] = {{{names}}};",
            f"const int64_t kStaticSmem[{n}] = {{{smem}}};",
            f"tlx::Module<{n}> g_module({self.sym}, kFunctionNames, kStaticSmem);",
            "",
            "int call(const TVMFFIAny* args, int32_t num_args) {",
        ]
        self.out(f"tlx::check_num_args(kKernel, num_args, {p.num_args}, kSignature);")

    def tensors(self) -> None:
        p = self.plan
        for t in self.checked:
            n = _cstr(t.name)
            self.out(f"// {t.name}: {t.dtype}[{_dims(t.shape)}]")
            self.out(f"const DLTensor* t_{t.c_id} = tlx::tensor_arg(kKernel, args, {t.index}, {n});")
            if t.per_element > 1:  # packed sub-byte data: any byte-sized dtype holds it, as in TileLang
                self.out(f"tlx::check_packed_dtype(kKernel, {n}, t_{t.c_id}, {_cstr(t.dtype)}, {t.per_element});")
            else:
                self.out(f"tlx::check_dtype(kKernel, {n}, t_{t.c_id}, {t.dl_code}, {t.dl_bits}, {t.dl_lanes});")
            self.out(f"tlx::check_ndim(kKernel, {n}, t_{t.c_id}, {len(t.shape)});")
        for name, (var, tensor, dim) in p.shape_vars.items():
            self.out(f"const int64_t {c_name(var)} = tlx::bind_dim(kKernel, {_cstr(tensor.name)}, t_{tensor.c_id}, {dim}, {_cstr(name)});")
            self.known.add(c_name(var))
        for name, (var, tensor, dim) in p.stride_vars.items():
            self.out(f"const int64_t {c_name(var)} = tlx::bind_stride(kKernel, {_cstr(tensor.name)}, t_{tensor.c_id}, {dim}, {_cstr(name)});")
            self.known.add(c_name(var))
        for t in self.checked:
            for d, s in enumerate(t.storage_shape):
                if isinstance(s, tirx.Var) and p.shape_vars[s.name][1] is t and p.shape_vars[s.name][2] == d:
                    continue
                if isinstance(s, int):
                    what = str(s)
                elif isinstance(s, tirx.Var):
                    src = p.shape_vars[s.name]
                    what = f"{s.name} (from {src[1].name}.shape[{src[2]}])"
                else:
                    what = str(s)
                self.out(f"tlx::check_dim(kKernel, {_cstr(t.name)}, t_{t.c_id}, {d}, {self.expr(s)}, {_cstr(what)});")
        for t in self.checked:
            for d, s in enumerate(t.storage_strides):
                if isinstance(s, tirx.Var) and s.name in p.stride_vars and p.stride_vars[s.name][1:] == (t, d):
                    continue  # the stride that binds the variable
                self.out(f"tlx::check_stride(kKernel, {_cstr(t.name)}, t_{t.c_id}, {d}, {self.expr(s)});")

    def scalars(self) -> None:
        for s in self.plan.scalars:
            n = _cstr(s.name)
            if s.dtype in _SCALAR_RANGES:
                lo, hi = _SCALAR_RANGES[s.dtype]
                lo_c = "INT64_MIN" if lo == -(2**63) else f"int64_t({lo})"
                self.out(f"const int64_t {c_name(s.var)} = tlx::int_arg(kKernel, args, {s.index}, {n}, {lo_c}, int64_t({hi}), {_cstr(s.dtype)});")
            elif s.dtype in _FLOAT_MAX:
                self.out(f"const double {c_name(s.var)} = tlx::float_arg(kKernel, args, {s.index}, {n}, {_cstr(s.dtype)}, {_FLOAT_MAX[s.dtype]});")
            else:
                raise HostgenError(f"{self.plan.name}: scalar argument {s.name} has unsupported dtype {s.dtype}")
            self.known.add(c_name(s.var))

    def named_values(self, e, indent: int) -> str:
        """Declare the values of ``e``'s variables for a failure message (``tlx::Named``, printed
        as ``M = 4``); returns the arguments ``n, values`` that pass them."""
        vs = _unique(free_vars(e))
        if not vs:
            return "0, nullptr"
        self.out(f"const tlx::Named values[] = {{{', '.join(f'{{{_cstr(v.name)}, {self.expr(v)}}}' for v in vs)}}};", indent)
        return f"{len(vs)}, values"

    def preconditions(self) -> None:
        for expr, text in self.plan.preconditions:
            self.precondition(expr, text, 1)

    def precondition(self, expr, text: str, indent: int) -> None:
        self.out(f"if (__builtin_expect(!({self.expr(expr)}), 0)) {{", indent)
        values = self.named_values(expr, indent + 1)
        self.out(f"tlx::fail_precondition(kKernel, {_cstr(text)}, {values});", indent + 1)
        self.out("}", indent)

    def grid_limits(self) -> None:
        """Check, before anything touches the GPU, every grid dimension computable from the
        shape variables and scalars alone; a constant one past the limit fails the compile.
        (A dimension that depends on host let-bindings is checked just before its launch.)"""
        seen = set()
        for s in walk_steps(self.plan.steps):
            if s.kind != "launch":
                continue
            for (axis, limit), g in zip(_GRID_LIMITS, s.launch.grid):
                if isinstance(g, (int, tirx.IntImm)):
                    if int(g) > limit:
                        raise HostgenError(f"{self.plan.name}: kernel {s.launch.kernel} has grid.{axis} = {int(g)}, past the CUDA limit {limit}")
                    continue
                if all(c_name(v) in self.known for v in free_vars(g)) and (axis, str(g)) not in seen:
                    seen.add((axis, str(g)))
                    self.grid_check(axis, limit, g, 1)
                    self.checked_grid.add((axis, str(g)))

    def grid_check(self, axis: str, limit: int, g, indent: int) -> None:
        self.out(f"if (__builtin_expect(({self.expr(g)}) > {limit}, 0)) {{", indent)
        values = self.named_values(g, indent + 1)
        self.out(f"tlx::grid_too_large(kKernel, {_cstr(axis)}, {self.expr(g)}, {limit}, {_cstr(str(g))}, {values});", indent + 1)
        self.out("}", indent)

    def empty_problem(self) -> None:
        """A call in which a tensor argument has no elements launches nothing (documented
        no-op): every argument has been checked (placement and alignment included), and nothing
        is encoded or launched, so a
        zero dynamic dimension behaves the same with or without TMA."""
        tensors = self.plan.tensors
        if not any(not isinstance(d, int) for t in tensors for d in t.shape):
            return  # static shapes: an empty tensor was already refused by the shape checks
        empty = " || ".join(f"tlx::num_elements(t_{t.c_id}) == 0" for t in tensors)
        self.out(f"if (__builtin_expect({empty}, 0)) return 0;  // empty problem: a no-op")

    def placement(self) -> None:
        p = self.plan
        first = p.tensors[0].c_id if p.tensors else None
        if first is None:
            raise HostgenError(f"{p.name}: a kernel without tensor arguments has no device to launch on")
        self.out(f"const int32_t device_id = t_{first}->device.device_id;")
        for t in p.tensors:
            self.out(f"tlx::check_cuda_device(kKernel, {_cstr(t.name)}, t_{t.c_id}, device_id);")
        for t in p.tensors:
            data = self.renamed.get(t.data_var, c_name(t.data_var))
            self.out(f"void* const {data} = tlx::data_ptr(t_{t.c_id});")
            self.known.add(data)
            if t.align > 1:
                why = "the kernel's TMA copies" if t.align == 16 and _uses_tma(p, t) else f"the kernel's {t.align}-byte vector accesses"
                self.out(f"tlx::check_align(kKernel, {_cstr(t.name)}, {data}, {t.align}, {_cstr(why)});")
        self.empty_problem()
        self.out("CUfunction const* fn = g_module.enter(kKernel, device_id);")
        self.out("CUstream stream = static_cast<CUstream>(TVMFFIEnvGetStream(kDLCUDA, device_id));")
        if self.workspaces:
            self.out(f"tlx::Workspaces<{len(self.workspaces)}> workspaces;  // handed back to the allocator when the call returns")

    def steps(self, steps: list[Step], indent: int = 1) -> None:
        for s in steps:
            if s.kind == "let":
                if str(s.var.dtype) == "handle":
                    raise HostgenError(f"{self.plan.name}: host let-binding of a handle {s.var.name}")
                value = self.expr(s.value)
                self.out(f"const int64_t {self.declare(s.var)} = {value};", indent)
            elif s.kind == "workspace":
                self.workspace(s.workspace, indent)
            elif s.kind == "desc":
                self.descriptor(s, indent)
            elif s.kind == "launch":
                self.launch(s, indent)
            elif s.kind == "check":
                self.precondition(s.cond, s.value, indent)
            elif s.kind == "if":
                self.out(f"if ({self.expr(s.cond)}) {{", indent)
                self.steps(s.then, indent + 1)
                if s.otherwise:
                    self.out("} else {", indent)
                    self.steps(s.otherwise, indent + 1)
                self.out("}", indent)

    def workspace_sizes(self) -> None:
        """Check, before anything touches the GPU, the size of every workspace computable from the
        shape variables and scalars alone (one that depends on host let-bindings is checked where
        it is allocated)."""
        for w in self.workspaces:
            if all(c_name(v) in self.known for v in free_vars(w.elements)):
                self.workspace_count(w, 1)

    def workspace_count(self, w: Workspace, indent: int) -> str:
        """The C expression of ``w``'s element count, checked once: a count that is negative or
        whose bytes overflow int64 fails the compile when constant, and raises ValueError with
        the values it came from otherwise."""
        if id(w) in self.counts:
            return self.counts[id(w)]
        most = (_INT64_MAX - 7) // w.bits
        if isinstance(w.elements, int):
            if not 0 <= w.elements <= most:
                raise HostgenError(f"{self.plan.name}: workspace {w.name} has {w.elements} elements; at most {most} fit in int64 bytes")
            count = f"int64_t({w.elements})"
        else:
            count = self.declare_name(f"{c_name(w.data_var)}_elements")
            self.out(f"const int64_t {count} = {self.expr(w.elements)};", indent)
            self.out(f"if (__builtin_expect({count} < 0 || {count} > {most}, 0)) {{", indent)
            values = self.named_values(w.elements, indent + 1)
            self.out(f"tlx::fail_workspace_size(kKernel, {_cstr(w.name)}, {_cstr(pyexpr(w.elements))}, {count}, {most}, {values});",
                     indent + 1)
            self.out("}", indent)
        self.counts[id(w)] = count
        return count

    def workspace(self, w: Workspace, indent: int) -> None:
        """Allocate ``w`` (bytes for its elements, sub-byte types packed) for this call."""
        k = [x is w for x in self.workspaces].index(True)
        self.out(f"// {w.name}: {w.dtype}[{pyexpr(w.elements)}], global scratch of this call's kernels", indent)
        count = self.workspace_count(w, indent)
        nbytes = f"int64_t({(w.elements * w.bits + 7) // 8})" if isinstance(w.elements, int) else f"({count} * {w.bits} + 7) / 8"
        self.out(f"void* const {self.declare(w.data_var)} = workspaces.allocate({k}, device_id, {nbytes});", indent)

    def descriptor(self, s: Step, indent: int) -> None:
        d = s.desc
        r = d.rank
        name = self.declare(d.var)

        def arr(values, ctype):
            return "{" + ", ".join(f"{ctype}({self.expr(v)})" for v in values) + "}"

        self.out(f"static thread_local tlx::TensorMapCache<{r}> cache_{name};", indent)
        self.out(
            f"const CUtensorMap& {name} = cache_{name}.get(kKernel, {_cstr(d.tensor)}, CUtensorMapDataType({d.data_type}), "
            f"{self.expr(d.address)}, {arr(d.global_dim, 'cuuint64_t')}, {arr(d.global_stride, 'cuuint64_t')}, "
            f"{arr(d.box_dim, 'cuuint32_t')}, {arr(d.element_strides, 'cuuint32_t')}, CUtensorMapInterleave({d.interleave}), "
            f"CUtensorMapSwizzle({d.swizzle}), CUtensorMapL2promotion({d.l2_promotion}), CUtensorMapFloatOOBfill({d.oob_fill}));",
            indent,
        )

    def launch(self, s: Step, indent: int) -> None:
        lc = s.launch
        k = self.kernel_index[lc.kernel]
        dims = [self.expr(v) for v in (*lc.grid, *lc.block)]
        smem = self.expr(lc.dyn_smem)
        self.out("{", indent)
        i = indent + 1
        self.out(f"// {lc.kernel}<<<({', '.join(dims[:3])}), ({', '.join(dims[3:])}), {smem}>>>", i)
        for j, (a, ty) in enumerate(zip(lc.args, lc.arg_types)):
            if ty == "desc":
                self.out(f"const CUtensorMap& p{j} = {self.expr(a)};  // passed by value (__grid_constant__)", i)
            elif ty == "ptr":
                self.out(f"void* p{j} = {self.expr(a)};", i)
            else:
                if ty not in _C_TYPES:
                    raise HostgenError(f"{self.plan.name}: kernel parameter of unsupported type {ty}")
                self.out(f"{_C_TYPES[ty]} p{j} = static_cast<{_C_TYPES[ty]}>({self.expr(a)});", i)
        params = ", ".join(f"const_cast<void*>(static_cast<const void*>(&p{j}))" for j in range(len(lc.args)))
        self.out(f"void* params[] = {{{params}}};" if lc.args else "void** params = nullptr;", i)
        self.out(f"const int64_t g[3] = {{{', '.join(dims[:3])}}};", i)
        for (axis, limit), g in zip(_GRID_LIMITS, lc.grid):
            if not isinstance(g, (int, tirx.IntImm)) and (axis, str(g)) not in self.checked_grid:
                self.grid_check(axis, limit, g, i)
        self.out("if (g[0] > 0 && g[1] > 0 && g[2] > 0) {", i)
        if not isinstance(lc.dyn_smem, tirx.IntImm):
            self.out(f"g_module.ensure_smem(kKernel, device_id, {k}, {smem});", i + 1)
        cluster = "nullptr"
        if lc.cluster and any(c != 1 for c in lc.cluster):
            self.out(f"static const unsigned cluster[3] = {{{', '.join(str(c) for c in lc.cluster)}}};", i + 1)
            cluster = "&cluster"
        coop, pdl = ("true" if flag else "false" for flag in (lc.cooperative, lc.pdl))
        self.out(
            f"tlx::launch(kKernel, fn[{k}], g[0], g[1], g[2], {', '.join(dims[3:])}, {smem}, stream, params, {cluster}, {coop}, {pdl});",
            i + 1,
        )
        self.out("}", i)
        self.out("}", indent)

    def footer(self) -> None:
        self.out("return 0;")
        self.lines.append("}")
        allocating = _allocating_function(self.plan)
        self.lines += allocating
        self.lines += ["}  // namespace", ""]
        self.lines += _export(EXPORT_NAME, "call")
        if allocating:
            self.lines += _export(ALLOCATING_NAME, "allocate_and_launch", returns=True)


def _export(name: str, function: str, returns: bool = False) -> list[str]:
    """A TVM-FFI C-ABI entry point (``tvm_ffi.load_module(lib).NAME(...)``) around ``function``.
    A failed check has set the Python exception already and unwinds as ``tlx::Raised``; the
    entry returns -1 for TVM-FFI to raise it. A ``function`` that ``returns`` fills the result."""
    call = f"{function}(args, num_args, result)" if returns else f"{function}(args, num_args)"
    return [
        f"// TVM-FFI C ABI entry: tvm_ffi.load_module(lib).{name}(...)",
        f'extern "C" __attribute__((visibility("default"))) int __tvm_ffi_{name}(',
        "    void*, const TVMFFIAny* args, int32_t num_args, TVMFFIAny* result) {",
        "  try {",
        "    result->type_index = kTVMFFINone;",
        "    result->v_int64 = 0;",
        f"    return {call};",
        "  } catch (const tlx::Raised&) {",
        "    return -1;",
        "  }",
        "}",
        "",
    ]


def _allocating_function(plan: LaunchPlan) -> list[str]:
    """``allocate_and_launch``: the call with the inputs alone. It runs the launcher's checks of
    the inputs and scalars (placement and workspace sizes included), then allocates the outputs through TVM-FFI's
    environment allocator (torch's caching allocator for torch callers), then launches and
    returns them: check first, allocate second, with no Python in between. Emitted only for
    kernels with outputs whose every shape (or stride) variable is bound by an input tensor."""
    outputs = [t for t in plan.tensors if t.is_output]
    inputs = [t for t in plan.tensors if not t.is_output]
    if not outputs or not inputs or any(tensor.is_output for _, tensor, _ in (*plan.shape_vars.values(), *plan.stride_vars.values())):
        return []
    positions = sorted([t.index for t in inputs] + [s.index for s in plan.scalars])
    c = _Emitter(plan, "", "", inputs_only=True)
    c.lines = ["", "// The call with the inputs alone: check them, allocate the outputs, launch, return the outputs.",
               "int allocate_and_launch(const TVMFFIAny* inputs, int32_t num_inputs, TVMFFIAny* result) {"]
    c.out(f"tlx::check_num_args(kKernel, num_inputs, {len(positions)}, {_cstr(_signature(plan, outputs=False))});")
    c.out(f"TVMFFIAny args[{plan.num_args}] = {{}};")
    for j, i in enumerate(positions):
        c.out(f"args[{i}] = inputs[{j}];")
    c.tensors()
    c.scalars()
    c.preconditions()
    c.grid_limits()
    c.workspace_sizes()
    c.out(f"const DLDevice device = t_{inputs[0].c_id}->device;")
    for t in inputs:
        c.out(f"tlx::check_cuda_device(kKernel, {_cstr(t.name)}, t_{t.c_id}, device.device_id);")
    c.out(f"tlx::Outputs<{len(outputs)}> outputs;")
    for k, t in enumerate(outputs):
        c.out(f"int64_t shape_{t.c_id}[] = {{{', '.join(c.expr(d) for d in t.storage_shape)}}};")
        c.out(f"args[{t.index}] = outputs.allocate({k}, DLDataType{{{t.dl_code}, {t.dl_bits}, {t.dl_lanes}}}, device, "
              f"{len(t.shape)}, shape_{t.c_id});")
    c.out(f"call(args, {plan.num_args});")
    c.out("outputs.release(result);")
    c.out("return 0;")
    c.lines.append("}")
    return c.lines


def _unique(vs):
    seen, out = set(), []
    for v in vs:
        if v.name not in seen:
            seen.add(v.name)
            out.append(v)
    return out


def _uses_tma(plan: LaunchPlan, t: TensorArg) -> bool:
    return any(s.kind == "desc" and s.desc.tensor_index == t.index for s in walk_steps(plan.steps))


def emit_launcher(plan: LaunchPlan, cubin_path: str, cubin_symbol: str = "tlx_cubin") -> str:
    """C++ source of the launcher; ``cubin_path`` is embedded with ``.incbin`` at build time."""
    e = _Emitter(plan, cubin_path, cubin_symbol)
    e.header()
    e.tensors()
    e.scalars()
    e.preconditions()
    e.grid_limits()
    e.workspace_sizes()
    e.placement()
    e.steps(plan.steps)
    e.footer()
    return "\n".join(e.lines)
