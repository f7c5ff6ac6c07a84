"""The compiled kernel a user calls with torch tensors."""

from __future__ import annotations

import json
import operator
from pathlib import Path

__all__ = ["Kernel", "output_extent", "torch_dtype"]


class Kernel:
    """A kernel loaded from a tlx build directory (a disk-cache entry).

    ``kernel(*inputs)`` launches on the current torch stream; with ``out_idx`` it takes the
    inputs alone and returns the outputs, which the generated launcher allocates itself (its
    ``allocate_and_launch`` entry: inputs checked first, outputs from torch's caching
    allocator second, no Python in between; through torch's output factory where the bridge
    library is available, see :mod:`tlx.torch_bridge`). Otherwise every argument is passed by the caller.
    ``kernel.launch`` takes every argument and runs the generated launcher's entry. Both are
    the entries' ``tvm_ffi.Function`` objects, or, where torch is imported and the bridge
    library is available, torch's call path into the same entries (tensors passed in place; same
    arguments, results and errors).
    """

    def __init__(self, directory: Path, metadata: dict, module):
        self.directory = directory
        self.metadata = metadata
        self.name = metadata["name"]
        self._module = module
        params = sorted(metadata["params"], key=lambda p: p["index"])
        self._outputs = [p for p in params if p.get("output")]
        if self._outputs:
            self._inputs = [p["index"] for p in params if not p.get("output")]
            self._dims = metadata["symbolic_dims"]
            self._index_of = {p["name"]: p["index"] for p in params}
            self._out_specs = [(p["index"], p["name"], [output_extent(d, self.name, p["name"]) for d in p["storage_shape"]],
                                torch_dtype(p["storage_dtype"])) for p in self._outputs]  # fmt: skip
        self.use_torch_outputs()

    @classmethod
    def load(cls, directory: Path) -> Kernel:
        """The artifact alone (metadata.json names the entry points), so a cache hit imports no code generator."""
        import tvm_ffi

        metadata = json.loads((directory / "metadata.json").read_text())
        return cls(directory, metadata, tvm_ffi.load_module(str(directory / "launcher.so")))

    def use_torch_outputs(self, use: bool = True) -> bool:
        """Choose the call paths: with ``use`` (the default on load), torch's output factory is
        bound to the launcher (where torch's bridge library is available, see
        :mod:`tlx.torch_bridge`), so the allocating call returns the tensors torch allocated;
        without, the outputs come from TVM-FFI's environment allocator. ``launch`` takes torch's
        call path either way. Returns whether the factory is bound."""
        from tlx.torch_bridge import torch_call

        library = self.directory / "launcher.so"
        launch = self._module[self.metadata["entry"]]
        self.launch = torch_call(library, self.metadata["entry"], launch)
        name = self.metadata.get("allocating_entry")
        if not self._outputs:
            self._call, factory = self.launch, False
        elif name is None:
            self._call, factory = self._unsized_outputs, False
        else:
            allocating = self._module[name]
            factory = bind_output_factory(self._module, allocating, use)
            if factory:  # the torch output itself, or a tuple of them
                self._call = torch_call(library, name, allocating)
            elif len(self._outputs) == 1:
                self._call = allocating  # the output tensor itself
            else:
                self._call = lambda *inputs: tuple(allocating(*inputs))  # an ffi.Array of the outputs
        return factory

    # ``kernel(*args)`` calls ``self._call`` (the launcher's entry point itself, for a kernel
    # with at most one output or with torch's output factory bound) with no Python frame in between: Python looks ``__call__`` up on
    # the type, and a property hands back the instance's function, which is then called with
    # the arguments as they are. A ``def __call__(self, *args)`` would add a frame and repack
    # the arguments (about 0.1 us per call on this machine's CPU).
    __call__ = property(operator.attrgetter("_call"))

    def _unsized_outputs(self, *inputs):
        bound_by_outputs = sorted(v for v, w in self._dims.items() if self._index_of[w["tensor"]] not in self._inputs)
        raise TypeError(f"{self.name}: the inputs do not determine the output shapes ({', '.join(bound_by_outputs)} bound by "
                        "an output only); call kernel.launch with every argument")

    def as_torch_op(self, qualname: str | None = None):
        """Register this kernel as a ``torch.library`` custom op (so it works under ``torch.compile``).

        Only kernels with ``out_idx`` qualify: the op is functional (inputs in, new outputs
        out) and its fake implementation sizes the outputs the way ``__call__`` does.
        """
        import torch

        if not self._outputs:
            raise ValueError(f"{self.name}: as_torch_op needs a kernel compiled with out_idx (a functional kernel)")
        if any(p["kind"] == "scalar" for p in self.metadata["params"]):
            raise ValueError(f"{self.name}: as_torch_op supports tensor-only kernels")
        qualname = qualname or f"tlx::{self.name}_{self.directory.name[:8]}"
        n_in = len(self._inputs)
        schema_args = ", ".join(f"Tensor x{i}" for i in range(n_in))
        ret = "Tensor" if len(self._outputs) == 1 else "(" + ", ".join("Tensor" for _ in self._outputs) + ")"
        lib_name, op_name = qualname.split("::")
        lib = torch.library.Library(lib_name, "FRAGMENT")
        lib.define(f"{op_name}({schema_args}) -> {ret}")
        lib.impl(op_name, lambda *xs: self._call(*xs), "CUDA")

        def fake(*xs):
            env = {}
            for var, where in self._dims.items():
                env[var] = xs[self._inputs.index(self._index_of[where["tensor"]])].shape[where["dim"]]
            outs = [xs[0].new_empty([extent(env) for extent in extents], dtype=dtype) for _, _, extents, dtype in self._out_specs]
            return outs[0] if len(outs) == 1 else tuple(outs)

        torch.library.register_fake(qualname, fake, lib=lib)
        self._torch_library = lib  # keep the registration alive with the kernel
        return getattr(getattr(torch.ops, lib_name), op_name).default

    @property
    def device_source(self) -> str:
        return (self.directory / "kernel.cu").read_text()

    @property
    def host_source(self) -> str:
        return (self.directory / "launcher.cc").read_text()

    # ---- TileLang's JITKernel surface, backed by tlx's artifacts ------------------------
    execution_backend = "tlx"
    prim_func = None  # set when the kernel was built in this process (a cache hit builds no TIR)
    latency = config = ref_latency = None  # set by an autotuner through update_tuner_result

    @property
    def kernel_source(self) -> str:
        return self.device_source

    def get_kernel_source(self, kernel_only: bool = True) -> str:
        """The CUDA source tlx compiled (it holds only the device code, so ``kernel_only`` changes nothing)."""
        return self.device_source

    def get_host_source(self) -> str:
        """The generated C++ launcher."""
        return self.host_source

    @property
    def out_idx(self) -> list[int]:
        return [p["index"] for p in self._outputs]

    @property
    def params(self) -> list:
        """Each parameter as a TileLang ``KernelParam`` (dtype, shape with symbolic dims as
        ``tir.Var``), what TileLang's profiler and autotuner read to make inputs."""
        if getattr(self, "_kernel_params", None) is None:
            self._kernel_params = _kernel_params(self.metadata["params"])
        return self._kernel_params

    def get_profiler(self, tensor_supply_type=None):
        """A TileLang ``Profiler`` over this kernel (``assert_allclose``, ``do_bench``, ``run_once``)."""
        from tilelang.profiler import Profiler
        from tilelang.utils.tensor import TensorSupplyType

        supply = TensorSupplyType.Auto if tensor_supply_type is None else tensor_supply_type
        return Profiler(self.params, self.out_idx, supply).with_default_adapter(self)

    def run_once(self, func=None):
        return self.get_profiler().run_once(func)

    def show_source(self, which: str = "kernel") -> None:
        print(self._sources(which))

    def print_source_code(self, which: str = "kernel", file: str | None = None) -> None:
        if file is None:
            self.show_source(which)
        else:
            Path(file).write_text(self._sources(which))

    def export_sources(self, kernel_path: str | None = None, host_path: str | None = None) -> None:
        if kernel_path:
            Path(kernel_path).write_text(self.device_source)
        if host_path:
            Path(host_path).write_text(self.host_source)

    def _sources(self, which: str) -> str:
        parts = {"kernel": [self.device_source], "host": [self.host_source], "both": [self.device_source, self.host_source]}
        if which not in parts:
            raise ValueError(f"which: expected 'kernel', 'host' or 'both', got {which!r}")
        return "\n".join(parts[which])

    def update_tuner_result(self, latency: float, config: dict, ref_latency: float) -> Kernel:
        self.latency, self.config, self.ref_latency = latency, config, ref_latency
        return self

    def get_tuner_result(self) -> dict:
        if self.latency is None:
            raise ValueError(f"{self.name}: no tuning result (the kernel was not tuned)")
        return {"latency": self.latency, "config": self.config, "ref_latency": self.ref_latency}

    def __repr__(self) -> str:
        return f"<tlx.Kernel {self.name} ({self.directory.name})>"


def bind_output_factory(module, allocating, use: bool = True) -> bool:
    """Bind torch's output factory (tlx.torch_bridge) to a launcher library when it is built
    for this torch, so that its allocating call hands back the tensors torch allocated themselves;
    with ``use=False`` (or when it is not built) unbind it: outputs then come from TVM-FFI's
    environment allocator. The bound call keeps the GIL: it creates Python objects, and
    releasing and retaking the GIL around a launch only costs time. Returns whether it is bound."""
    from tlx.torch_bridge import factory_address

    address = factory_address() if use else None
    module["tlx_bind_output_factory"](address or 0)
    allocating.release_gil = not address
    return bool(address)


def _kernel_params(params: list[dict]) -> list:
    """TileLang ``KernelParam``s from the launcher metadata: extents are integers, symbolic
    dims (one ``tir.Var`` per name, shared across tensors) or expressions of them."""
    from tilelang import tvm
    from tilelang.engine.param import KernelParam

    dims: dict = {}

    def var(name):
        return dims.setdefault(name, tvm.tirx.Var(name, "int32"))

    out = []
    for p in sorted(params, key=lambda p: p["index"]):
        dtype = tvm.DataType(p["dtype"])
        if p["kind"] != "tensor":
            out.append(KernelParam(dtype, []))
            continue
        shape = []
        for text in p["shape"]:
            if text.lstrip("-").isdigit():
                shape.append(int(text))
            else:
                import ast

                try:
                    tree = ast.parse(text, mode="eval").body
                    names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
                    shape.append(_eval_ast(tree, {n: var(n) for n in names}))
                except (SyntaxError, ValueError, TypeError):
                    shape.append(var(text))  # an extent the profiler can only treat as symbolic
        out.append(KernelParam(dtype, shape))
    return out


def output_extent(text: str, kernel: str, output: str):
    """An output extent as a function of the symbolic dims bound by the inputs: an integer, a
    dim, or an expression of them (parsed once here, evaluated on every allocating call)."""
    if text.lstrip("-").isdigit():
        value = int(text)
        return lambda env: value
    import ast

    try:
        tree = ast.parse(text, mode="eval").body
    except SyntaxError as e:
        tree = e

    def extent(env):
        if text in env:
            return env[text]
        try:
            if isinstance(tree, SyntaxError):
                raise tree
            return int(_eval_ast(tree, env))
        except (KeyError, ValueError, SyntaxError) as e:
            raise ValueError(f"{kernel}: cannot size output {output} from extent {text!r}: {e}") from None

    return extent


def _eval_ast(node, env):
    import ast

    if isinstance(node, ast.Constant) and isinstance(node.value, int):
        return node.value
    if isinstance(node, ast.Name):
        return env[node.id]
    if isinstance(node, ast.BinOp):
        a, b = _eval_ast(node.left, env), _eval_ast(node.right, env)
        ops = {ast.Add: lambda: a + b, ast.Sub: lambda: a - b, ast.Mult: lambda: a * b, ast.FloorDiv: lambda: a // b, ast.Mod: lambda: a % b}
        if type(node.op) in ops:
            return ops[type(node.op)]()
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("min", "max") and len(node.args) == 2:
        a, b = (_eval_ast(x, env) for x in node.args)
        return min(a, b) if node.func.id == "min" else max(a, b)
    raise ValueError(f"unsupported extent expression {ast.dump(node)}")


# TVM dtype names whose torch dtype has another name: the candidates, the first this torch has
# (TileLang's choices; packed fp4 falls back to int8 storage on a torch without fp4).
_TORCH_DTYPES = {
    "float8_e4m3": ("float8_e4m3fn",),
    "float4_e2m1fnx2": ("float4_e2m1fn_x2", "int8"),
}


def torch_dtype(name: str):
    """The torch dtype of a tensor that holds TVM dtype ``name`` (a launcher's storage dtype)."""
    import torch

    for attr in _TORCH_DTYPES.get(name, (name,)):
        dtype = getattr(torch, attr, None)
        if isinstance(dtype, torch.dtype):
            return dtype
    raise TypeError(f"dtype {name!r} has no torch dtype in torch {torch.__version__}")
