"""Generated TVM-FFI host launchers: plan from lowered IR, emit C++, build, load."""

from __future__ import annotations

from pathlib import Path

from tlx.hostgen.cexpr import pyexpr
from tlx.hostgen.emit import ALLOCATING_NAME, EXPORT_NAME, emit_launcher
from tlx.hostgen.image import SharedMemoryError, check_shared_memory
from tlx.hostgen.plan import HostgenError, LaunchPlan, plan_launcher, walk_steps

__all__ = ["HostgenError", "LaunchPlan", "SharedMemoryError", "check_shared_memory", "EXPORT_NAME", "generate_launcher",
           "launcher_compile_command", "launcher_link_command", "plan_launcher", "RUNTIME_DIR"]

RUNTIME_DIR = Path(__file__).parent / "runtime"


def generate_launcher(kernel, out_idx=(), preconditions=(), cubin_file: str = "kernel.cubin") -> tuple[str, dict]:
    """C++ launcher source for a lowered kernel, and the launch facts the kernel object needs."""
    plan = plan_launcher(kernel, out_idx, preconditions)
    source = emit_launcher(plan, cubin_file, cubin_symbol="tlx_cubin")
    return source, describe(plan, source)


def describe(plan: LaunchPlan, source: str) -> dict:
    """JSON-able launch metadata: the library's entry point, parameters, symbolic dims, launches."""
    return {
        "entry": EXPORT_NAME,
        "allocating_entry": ALLOCATING_NAME if f"__tvm_ffi_{ALLOCATING_NAME}" in source else None,
        "params": [
            {"index": t.index, "name": t.name, "kind": "tensor", "dtype": t.dtype, "shape": [pyexpr(d) for d in t.shape],
             "strides": [pyexpr(s) for s in t.strides], "align": t.align, "output": t.is_output}
            for t in plan.tensors
        ]
        + [{"index": s.index, "name": s.name, "kind": "scalar", "dtype": s.dtype} for s in plan.scalars],
        "symbolic_dims": {n: {"tensor": t, "dim": d} for n, (_, t, d) in plan.shape_vars.items()},
        "launches": [
            {"kernel": lc.kernel, "grid": [pyexpr(g) for g in lc.grid], "block": [pyexpr(b) for b in lc.block],
             "dynamic_shared_memory": pyexpr(lc.dyn_smem), "cluster": lc.cluster, "cooperative": lc.cooperative}
            for lc in (s.launch for s in walk_steps(plan.steps) if s.kind == "launch")
        ],
    }


def launcher_compile_command(workdir: Path) -> list[str]:
    """Compile ``workdir/launcher.cc`` to assembly (``launcher.s``). This is the expensive half of
    the build, and it does not need the cubin (the ``.incbin`` directive is resolved only when
    the assembly is assembled), so it can run while nvcc builds the cubin."""
    from tvm_ffi.libinfo import find_dlpack_include_path, find_include_path

    from tlx.lowering import cuda_include_dir

    includes = dict.fromkeys([find_include_path(), find_dlpack_include_path(), str(RUNTIME_DIR), cuda_include_dir()])
    return [_CXX, *_CXXFLAGS, *(f"-I{d}" for d in includes), "-S", str(workdir / "launcher.cc"), "-o", str(workdir / "launcher.s")]


def launcher_link_command(workdir: Path) -> list[str]:
    """Assemble ``workdir/launcher.s`` (embedding ``workdir/kernel.cubin``) and link the library."""
    from tvm_ffi.libinfo import find_libtvm_ffi

    lib = Path(find_libtvm_ffi())
    return [_CXX, "-shared", "-fPIC", f"-Wa,-I{workdir}", str(workdir / "launcher.s"), f"-L{lib.parent}", "-ltvm_ffi", "-ldl",
            "-o", str(workdir / "launcher.so")]


_CXX = "c++"
# TVM-FFI's own extension flags (tvm_ffi.cpp.build), with the launcher's exported symbols alone visible.
_CXXFLAGS = ("-std=c++17", "-fPIC", "-O2", "-fvisibility=hidden")
