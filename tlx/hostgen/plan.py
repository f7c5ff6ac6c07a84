"""What a generated launcher must do, read off TileLang's lowered host and device IR.

The plan is plain data: the arguments with their checks, where each symbolic shape
variable is bound, the global workspaces to allocate, the TMA descriptors to encode, and the
launches in order. The C++ emitter turns it into source; nothing here knows C++.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tilelang import tvm
from tvm import tirx

from tlx.ir.facts import stride_vars as stride_vars_of
from tlx.ir.tir import device_functions, elem_bytes, free_vars, nodes, op_name
from tlx.ir.walk import is_access_ptr, is_cp_async, pointer_alias
from tlx.lowering import LoweredKernel

__all__ = ["walk_steps", "HostgenError", "LaunchPlan", "TensorArg", "ScalarArg", "Descriptor", "Launch", "Step", "Workspace",
           "plan_launcher"]


class HostgenError(Exception):
    """The lowered host IR uses a construct the launcher generator does not handle."""


@dataclass
class TensorArg:
    index: int
    name: str
    data_var: Any  # tirx.Var of the data pointer in host/device IR
    dtype: str
    dl_code: int
    dl_bits: int
    dl_lanes: int
    shape: list  # int or PrimExpr per dim
    strides: list  # int or PrimExpr per dim (row-major if the program declared none)
    align: int  # bytes the kernel's accesses need the data pointer aligned to
    is_output: bool = False
    # what the caller's tensor holds (see _storage): the dtype and the extents and strides in its
    # elements, which the launcher checks and allocates; equal to dtype/shape/strides except for
    # tfloat32 (stored as float32) and sub-byte types (packed into bytes along the last dim)
    storage_dtype: str = ""
    storage_shape: list = field(default_factory=list)
    storage_strides: list = field(default_factory=list)
    per_element: int = 1  # program elements per stored element: 2 for a packed sub-byte type
    # what the launcher's C++ identifiers of this argument are built from (t_<c_id>): the name, or,
    # where two arguments share a name (a kernel that renames its buffers: ``for src, dst in
    # ((Q, Q_s), ...)``), the position; messages keep the name
    c_id: str = ""


@dataclass
class ScalarArg:
    index: int
    name: str
    var: Any
    dtype: str


@dataclass
class Descriptor:
    """A TMA descriptor: ``cuTensorMapEncodeTiled`` arguments as expressions."""

    var: Any
    tensor: str  # name of the tensor argument or workspace whose data it maps
    tensor_index: int  # the tensor argument's position among the parameters (names may repeat); -1 for a workspace
    data_type: int
    rank: int
    address: Any
    global_dim: list
    global_stride: list  # bytes, rank entries, the first the element size
    box_dim: list
    element_strides: list
    interleave: int
    swizzle: int
    l2_promotion: int
    oob_fill: int


@dataclass
class Launch:
    kernel: str
    args: list  # PrimExpr per kernel parameter (data vars, descriptor vars, scalars)
    arg_types: list  # "ptr" | "desc" | C type of a scalar
    grid: list  # 3 PrimExprs
    block: list  # 3 PrimExprs
    dyn_smem: Any  # PrimExpr
    cluster: list | None = None
    cooperative: bool = False
    # the kernel waits on the grid before it (``T.pdl_sync()``): it is launched as a programmatic
    # dependent, so it may start while that grid drains (TileLang's own wrapper does the same)
    pdl: bool = False


@dataclass
class Workspace:
    """Global memory the program allocates in host code (``T.alloc_global``): scratch that its
    kernels pass between them within one call (split-K partial results, for instance). TileLang
    takes it from TVM's workspace pool per call; the launcher allocates it per call too."""

    name: str
    data_var: Any  # tirx.Var of its data pointer, which the launches pass
    dtype: str
    bits: int  # per element, lanes included
    elements: Any  # int or PrimExpr (the buffer is flat by then)


@dataclass
class Step:
    """One statement of the launch sequence: a let binding, a workspace, a descriptor, a launch,
    a guarded block, or a check (a ``T.assume`` of the program, with its text in ``value``)."""

    kind: str  # "let" | "workspace" | "desc" | "launch" | "if" | "check"
    var: Any = None
    value: Any = None
    workspace: Workspace | None = None
    desc: Descriptor | None = None
    launch: Launch | None = None
    cond: Any = None
    then: list = field(default_factory=list)
    otherwise: list = field(default_factory=list)


@dataclass
class LaunchPlan:
    name: str
    tensors: list[TensorArg]
    scalars: list[ScalarArg]
    num_args: int
    shape_vars: dict  # name -> (tirx.Var, TensorArg that binds it, dim)
    steps: list[Step]
    kernels: dict  # kernel name -> max dynamic shared memory (int or None when symbolic)
    preconditions: list = field(default_factory=list)  # (PrimExpr, text)
    stride_vars: dict = field(default_factory=dict)  # name -> (tirx.Var, TensorArg, dim): bound by no dimension, only a stride


_LAUNCH_TAGS = {
    "blockIdx.x": ("grid", 0),
    "blockIdx.y": ("grid", 1),
    "blockIdx.z": ("grid", 2),
    "threadIdx.x": ("block", 0),
    "threadIdx.y": ("block", 1),
    "threadIdx.z": ("block", 2),
}
# the device function attribute TileLang's MarkCudaSyncCalls sets when the kernel calls T.pdl_sync()
PDL_SYNC_ATTR = "has_cuda_pdl_sync"


# TVM's plain "float8_e4m3" is generated as CUDA's __nv_fp8_e4m3, whose encoding is
# e4m3fn (no infinities): the tensors that match it are torch.float8_e4m3fn (DLPack code 10).
_DL_CODE_OF_TVM_CODE = {8: 10}

# Program dtypes whose tensors hold another dtype, as TileLang 0.1.15 passes and allocates them
# (its dtype-to-torch mapping): tfloat32 (a TVM custom type, code 130) lives in float32 tensors;
# sub-byte types are packed along the last dimension, fp4 two per torch.float4_e2m1fn_x2
# element, int4/uint4 two per int8/uint8.
_STORAGE_DTYPE = {
    "custom[tfloat32]": "float32",
    "float4_e2m1fn": "float4_e2m1fnx2",
    "int4": "int8",
    "uint4": "uint8",
}


def _dl_type(dtype: str) -> tuple[int, int, int]:
    dt = tvm.DataType(dtype)
    if dtype == "bool":
        return 6, 8, 1
    code = int(dt.type_code)
    return _DL_CODE_OF_TVM_CODE.get(code, code), int(dt.bits), int(dt.lanes)


def _storage(kernel: str, name: str, dtype: str, shape: list, strides: list) -> tuple[str, list, list, int]:
    """The dtype, extents and strides of the tensor that holds a ``dtype[shape]`` argument, and
    how many program elements each of its elements holds."""
    storage = _STORAGE_DTYPE.get(dtype, dtype)
    logical_bits, stored_bits = (tvm.DataType(d).bits * tvm.DataType(d).lanes for d in (dtype, storage))
    if logical_bits == stored_bits:
        return storage, shape, strides, 1
    per_element = stored_bits // logical_bits
    last = shape[-1] if shape else None
    if not isinstance(last, int) or last % per_element or strides[-1] != 1:
        raise HostgenError(f"{kernel}: argument {name} ({dtype}, stored {per_element} per {storage} element) needs a "
                           f"contiguous last dimension of constant extent divisible by {per_element}; got extent {last}, "
                           f"stride {strides[-1] if strides else None}")

    def packed(e):
        return e // per_element if isinstance(e, int) else tirx.FloorDiv(_expr(e), _expr(per_element))

    return storage, [*shape[:-1], last // per_element], [*(packed(s) for s in strides[:-1]), 1], per_element


def _as_value(e):
    return int(e.value) if isinstance(e, tirx.IntImm) else e


def _vector_alignment(device_mod) -> dict:
    """Bytes of the widest vector access to each global buffer, keyed by data var name: vector
    loads and stores and cp.async sources; an access through a view the kernel makes of a buffer
    (``T.make_tensor_from_addr`` at ``address_of(B[...])``) counts for ``B``."""
    widest: dict[str, int] = {}

    def note(buffer, index, views):
        lanes = int(tvm.DataType(str(index.dtype)).lanes)
        elem = tvm.DataType(str(buffer.dtype))
        nbytes = max(1, lanes * elem.bits * elem.lanes // 8)  # sub-byte types: 16 fp4 lanes are 8 bytes
        name = views.get(buffer.data.name, buffer.data.name)
        widest[name] = max(widest.get(name, 1), nbytes)

    for _, func in device_functions(device_mod):
        views: dict[str, str] = {}  # a pointer's data var name -> the name of the buffer it points into
        for b in nodes(func.body, tirx.Bind):
            target = pointer_alias(b.value) if str(b.var.dtype) == "handle" else None
            if target is not None:
                views[b.var.name] = views.get(target[0].name, target[0].name)
        for access in nodes(func.body, (tirx.BufferLoad, tirx.BufferStore)):
            if access.indices:
                note(access.buffer, access.indices[-1], views)
        for call in nodes(func.body, tirx.Call):
            if is_cp_async(call) and is_access_ptr(call.args[1]) and isinstance(call.args[2], tirx.IntImm):
                # a cp.async source: its count is elements (TileLang's op) or bytes (TVM's)
                src = call.args[1]
                count = int(call.args[2])
                nbytes = count if op_name(call) == "tirx.ptx_cp_async" else count * elem_bytes(src.args[0].dtype)
                name = views.get(src.args[1].name, src.args[1].name)
                widest[name] = max(widest.get(name, 1), nbytes)
    return widest


def plan_launcher(kernel: LoweredKernel, out_idx=(), preconditions=()) -> LaunchPlan:
    """Build the launch plan of ``kernel``; raises :class:`HostgenError` for unsupported IR."""
    pf = kernel.prim_func
    vec_align = _vector_alignment(kernel.device_mod)
    n = len(pf.params)
    outs = {i % n for i in out_idx}
    tensors, scalars = [], []
    shape_vars: dict[str, tuple] = {}
    for i, p in enumerate(pf.params):
        buf = pf.buffer_map.get(p)
        if buf is None:
            scalars.append(ScalarArg(i, p.name, p, str(p.dtype)))
            continue
        dtype = str(buf.dtype)
        shape = [_as_value(s) for s in buf.shape]
        if buf.strides:
            strides = [_as_value(s) for s in buf.strides]
        else:
            strides, acc = [], 1
            for s in reversed(shape):
                strides.insert(0, acc)
                acc = acc * s if isinstance(acc, int) and isinstance(s, int) else tirx.Mul(_expr(acc), _expr(s))
        if not (isinstance(buf.elem_offset, tirx.IntImm) and int(buf.elem_offset) == 0):
            raise HostgenError(f"{kernel.name}: argument {buf.name} declares an element offset; only offset 0 is supported")
        storage, storage_shape, storage_strides, per_element = _storage(kernel.name, buf.name, dtype, shape, strides)
        tensors.append(
            TensorArg(i, buf.name, buf.data, dtype, *_dl_type(storage), shape, strides, vec_align.get(buf.data.name, 1), i in outs,
                      storage_dtype=storage, storage_shape=storage_shape, storage_strides=storage_strides, per_element=per_element)
        )
        for d, s in enumerate(shape):
            if isinstance(s, tirx.Var) and s.name not in shape_vars:
                shape_vars[s.name] = (s, tensors[-1], d)
    names = [t.name for t in tensors]
    for t in tensors:
        t.c_id = t.name if names.count(t.name) == 1 else f"arg{t.index}"
        if t.c_id in names and t.c_id != t.name:
            raise HostgenError(f"{kernel.name}: argument {t.index} ({t.name}) shares its name, and 'arg{t.index}' is taken too")
    # a variable no dimension gives but a stride does (TileLang's StridedTensor[shape, (s, 1)]): the
    # tensor's stride binds it, as TileLang's host code does
    stride_only = stride_vars_of(kernel.prim_func)
    stride_vars: dict[str, tuple] = {}
    for t in tensors:
        for d, s in enumerate(t.strides):
            if isinstance(s, tirx.Var) and t.per_element == 1 and s.name in stride_only and s.name not in stride_vars:
                stride_vars[s.name] = (s, t, d)
    for t in tensors:
        for s in t.shape + t.strides:
            if isinstance(s, tirx.PrimExpr) and not isinstance(s, tirx.IntImm):
                for v in free_vars(s):
                    if v.name not in shape_vars and v.name not in stride_vars and v.name not in {sc.name for sc in scalars}:
                        raise HostgenError(f"{kernel.name}: shape variable {v.name} of {t.name} is not bound by any dimension")
    host = _host_main(kernel)
    body = _compute_scope(host.body)
    if body is None:
        raise HostgenError(f"{kernel.name}: no compute_scope in the lowered host function")
    devices = {str(name): f for name, f in device_functions(kernel.device_mod)}
    tma_args = host.attrs.get("tma_descriptor_args", {}) if host.attrs else {}
    # the global memory a descriptor may map, by data variable (two arguments may share a name):
    # the tensor arguments, and the workspaces as their allocations are reached
    by_data: dict[Any, TensorArg | Workspace] = {t.data_var: t for t in tensors}
    kernels: dict[str, Any] = {}
    steps = _steps(body, devices, tma_args, by_data, kernels, kernel.name)
    # a T.assume over shape variables and scalars alone is checked with the other preconditions,
    # before the device is touched; one that needs host let-bindings stays where the program has it
    inputs = set(shape_vars) | set(stride_vars) | {sc.name for sc in scalars}
    hoisted = [s for s in steps if s.kind == "check" and {v.name for v in free_vars(s.cond)} <= inputs]
    steps = [s for s in steps if not any(s is h for h in hoisted)]
    preconditions = [*preconditions, *((s.cond, s.value) for s in hoisted)]
    for t in tensors:
        for step in walk_steps(steps):
            if step.kind == "desc" and step.desc.tensor_index == t.index:
                t.align = max(t.align, 16)
    return LaunchPlan(kernel.name, tensors, scalars, n, shape_vars, steps, kernels, list(preconditions), stride_vars)


def walk_steps(steps):
    """Every step, nested ones included, in program order."""
    for s in steps:
        yield s
        yield from walk_steps(s.then)
        yield from walk_steps(s.otherwise)


def _expr(v):
    return tirx.IntImm("int64", v) if isinstance(v, int) else v


def _host_main(kernel: LoweredKernel):
    for _, f in kernel.host_mod.functions.items():
        if isinstance(f, tirx.PrimFunc) and f.attrs and f.attrs.get("tirx.is_entry_func", False):
            return f
    raise HostgenError(f"{kernel.name}: no entry function in the lowered host module")


def _compute_scope(stmt):
    return next((a.body for a in nodes(stmt, tirx.AttrStmt) if a.attr_key == "compute_scope"), None)


def _flatten(stmt) -> list:
    if isinstance(stmt, tirx.SeqStmt):
        out = []
        for s in stmt.seq:
            out.extend(_flatten(s))
        return out
    return [stmt]


def _steps(stmt, devices, tma_args, by_data, kernels, name) -> list[Step]:
    steps: list[Step] = []
    for s in _flatten(stmt):
        steps.extend(_one_step(s, devices, tma_args, by_data, kernels, name))
    return steps


def _is_stack_alloca(e) -> bool:
    return isinstance(e, tirx.Call) and op_name(e) == "tirx.tvm_stack_alloca"


def _one_step(s, devices, tma_args, by_data, kernels, name) -> list[Step]:
    if isinstance(s, tirx.Bind):
        if _is_stack_alloca(s.value):
            return []  # descriptor storage: the launcher owns it
        return [Step("let", var=s.var, value=s.value)]
    if isinstance(s, tirx.SeqStmt):
        return _steps(s, devices, tma_args, by_data, kernels, name)
    if isinstance(s, tirx.AllocBuffer):
        workspace = by_data[s.buffer.data] = _workspace(s.buffer, name)
        return [Step("workspace", workspace=workspace)]
    if isinstance(s, tirx.DeclBuffer):
        return []  # a typed view of data declared before it; the launches pass the data variable
    if isinstance(s, tirx.AttrStmt):
        if s.attr_key in ("tl.assume", "pragma_import_c"):
            return _steps(s.body, devices, tma_args, by_data, kernels, name)
        raise HostgenError(f"{name}: unsupported host attribute {s.attr_key!r}")
    if isinstance(s, tirx.AssertStmt):
        # TileLang turns a program's T.assume(cond) into a host assert ("Assume: cond"): checked
        text = "".join(str(getattr(m, "value", m)) for m in s.message_parts)
        return [Step("check", cond=s.condition, value=f"T.assume({text[len('Assume: '):]})" if text.startswith("Assume: ") else text)]
    if isinstance(s, tirx.IfThenElse):
        then = _steps(s.then_case, devices, tma_args, by_data, kernels, name)
        other = _steps(s.else_case, devices, tma_args, by_data, kernels, name) if s.else_case is not None else []
        return [Step("if", cond=s.condition, then=then, otherwise=other)]
    if isinstance(s, tirx.Evaluate):
        v = s.value
        if isinstance(v, tirx.IntImm):
            return []
        if isinstance(v, tirx.Call) and op_name(v) in ("tirx.tvm_call_packed", "tirx.tvm_call_packed_lowered"):
            callee = str(v.args[0].value)
            args = list(v.args[1:])
            if callee == "__tvm_tensormap_create_tiled":
                return [Step("desc", desc=_descriptor(args, by_data, name))]
            if callee in devices:
                return [Step("launch", launch=_launch(callee, args, devices[callee], kernels, name))]
            raise HostgenError(f"{name}: unsupported host call {callee!r}")
    raise HostgenError(f"{name}: unsupported host statement {type(s).__name__}: {s}")


def _workspace(buf, name) -> Workspace:
    if buf.scope() != "global":
        raise HostgenError(f"{name}: host code allocates {buf.name} in {buf.scope()!r} memory; only global workspaces are supported")
    if len(buf.shape) != 1:
        raise HostgenError(f"{name}: workspace {buf.name} has shape {list(buf.shape)}; lowering leaves host buffers flat")
    dt = tvm.DataType(str(buf.dtype))
    return Workspace(buf.name, buf.data, str(buf.dtype), int(dt.bits) * int(dt.lanes), _as_value(buf.shape[0]))


def _descriptor(args, by_data, name) -> Descriptor:
    var, dtype, rank, address = args[0], int(args[1]), int(args[2]), args[3]
    if len(args) != 4 + 4 * rank + 4:
        raise HostgenError(f"{name}: tiled TMA descriptor with {len(args)} arguments for rank {rank}")
    rest = [_as_value(a) for a in args[4:]]
    gdim, gstride, box, estride = (rest[i * rank : (i + 1) * rank] for i in range(4))
    tail = rest[4 * rank :]
    if not isinstance(address, tirx.Var) or address not in by_data:
        raise HostgenError(f"{name}: TMA descriptor over {address}, which is neither a tensor argument's data pointer nor a workspace")
    t = by_data[address]
    return Descriptor(var, t.name, t.index if isinstance(t, TensorArg) else -1, dtype, rank, address, gdim, gstride, box, estride, *[int(x) for x in tail])


def _launch(callee, args, device_func, kernels, name) -> Launch:
    params = list(device_func.params)
    tags = [str(t) for t in device_func.attrs.get("tirx.kernel_launch_params", [])]
    if len(args) != len(params) + len(tags):
        raise HostgenError(f"{name}: launch of {callee} passes {len(args)} values for {len(params)} parameters and {len(tags)} launch dims")
    kargs, dims = args[: len(params)], args[len(params) :]
    grid = [tirx.IntImm("int64", 1)] * 3
    block = [tirx.IntImm("int64", 1)] * 3
    dyn = tirx.IntImm("int64", 0)
    cluster_dims = [1, 1, 1]
    for tag, value in zip(tags, dims):
        if tag in _LAUNCH_TAGS:
            which, i = _LAUNCH_TAGS[tag]
            (grid if which == "grid" else block)[i] = value
        elif tag == "tirx.use_dyn_shared_memory":
            dyn = value
        elif tag.startswith("tir.cluster_dim_"):
            cluster_dims["xyz".index(tag[-1])] = int(value)
        else:
            raise HostgenError(f"{name}: unsupported launch parameter {tag!r} of {callee}")
    arg_types = []
    for p in params:
        ann = getattr(p, "type_annotation", None)
        text = str(ann) if ann is not None else ""
        if "grid_constant" in text:
            arg_types.append("desc")
        elif str(p.dtype) == "handle":
            arg_types.append("ptr")
        else:
            arg_types.append(str(p.dtype))
    cluster = cluster_dims if cluster_dims != [1, 1, 1] else None
    cdims = device_func.attrs.get("cluster_dims", None) if device_func.attrs else None
    if cdims is not None:
        cluster = [int(c) for c in cdims]
    static_smem = int(dyn.value) if isinstance(dyn, tirx.IntImm) else None
    prev = kernels.get(callee, 0)
    kernels[callee] = None if (static_smem is None or prev is None) else max(prev, static_smem)
    attrs = device_func.attrs or {}
    cooperative = bool(attrs.get("use_cooperative_groups", False))
    return Launch(callee, kargs, arg_types, grid, block, dyn, cluster, cooperative, PDL_SYNC_ATTR in attrs)
