"""Generated TVM-FFI host launchers: plan from lowered IR, emit C++, build, load."""

from __future__ import annotations

from pathlib import Path

from tlx.hostgen.cexpr import pyexpr
from tlx.hostgen.emit import ALLOCATING_NAME, EXPORT_NAME, emit_launcher
from tlx.hostgen.image import SharedMemoryError, check_shared_memory
from tlx.hostgen.plan import HostgenError, LaunchPlan, plan_launcher, walk_steps

__all__ = ["HostgenError", "LaunchPlan", "SharedMemoryError", "build_launcher", "check_shared_memory", "EXPORT_NAME",
           "generate_launcher", "plan_launcher", "RUNTIME_DIR"]

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


def build_launcher(workdir: Path) -> str:
    """Build ``workdir/launcher.cc`` (which embeds ``workdir/kernel.cubin``) into a shared library."""
    import tvm_ffi.cpp

    from tlx.lowering import cuda_include_dir

    return tvm_ffi.cpp.build(
        name="launcher",
        cpp_files=[str(workdir / "launcher.cc")],
        extra_cflags=["-O2", f"-Wa,-I{workdir}", "-fvisibility=hidden"],
        extra_ldflags=["-ldl"],
        extra_include_paths=[str(RUNTIME_DIR), cuda_include_dir()],
        build_directory=str(workdir),
    )
