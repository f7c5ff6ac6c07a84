"""Generated TVM-FFI host launchers: plan from lowered IR, emit C++, build, load."""

from __future__ import annotations

import os
from pathlib import Path

from tlx.hostgen.cexpr import pyexpr
from tlx.hostgen.emit import ALLOCATING_NAME, EXPORT_NAME, emit_launcher
from tlx.hostgen.image import SharedMemoryError, check_shared_memory
from tlx.hostgen.plan import HostgenError, LaunchPlan, plan_launcher, walk_steps

__all__ = ["HostgenError", "LaunchPlan", "SharedMemoryError", "check_shared_memory", "EXPORT_NAME", "generate_launcher",
           "launcher_compile_command", "launcher_link_command", "plan_launcher", "publish_runtime_support", "RUNTIME_DIR",
           "runtime_cache_dir", "runtime_support"]

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


def launcher_compile_command(workdir: Path, runtime: Path | None = None) -> list[str]:
    """Compile ``workdir/launcher.cc`` to assembly (``launcher.s``). This is the expensive half of
    the build, and it does not need the cubin (the ``.incbin`` directive is resolved only when
    the assembly is assembled), so it can run while nvcc builds the cubin. ``runtime`` is the
    directory of the precompiled runtime header (:func:`runtime_support`), searched first."""
    first = [f"-I{runtime}"] if runtime else []
    return [_CXX, *_CXXFLAGS, *first, *_include_flags(), "-S", str(workdir / "launcher.cc"), "-o", str(workdir / "launcher.s")]


def launcher_link_command(workdir: Path) -> list[str]:
    """Assemble ``workdir/launcher.s`` (embedding ``workdir/kernel.cubin``) and link the library."""
    from tvm_ffi.libinfo import find_libtvm_ffi

    lib = Path(find_libtvm_ffi())
    return [_CXX, "-shared", "-fPIC", f"-Wa,-I{workdir}", str(workdir / "launcher.s"), f"-L{lib.parent}", "-ltvm_ffi", "-ldl",
            "-o", str(workdir / "launcher.so")]


def runtime_support() -> tuple[Path, list[str] | None]:
    """The launchers' runtime header, precompiled once per machine (a GCC precompiled header:
    parsing it is a third of a launcher's compile). Returns its directory and, when it is not
    built yet, the command that builds it there (as ``tlx_launcher.h.gch.partial``, which
    :func:`publish_runtime_support` then moves into place). The directory is named by the hash
    of the header, the flags, the include paths and the compiler, and GCC itself ignores a
    precompiled header that does not match a compile (the header beside it is used then)."""
    import hashlib
    import shutil

    header = RUNTIME_DIR / "tlx_launcher.h"
    cxx = Path(shutil.which(_CXX) or _CXX).resolve()
    stat = cxx.stat()
    key = hashlib.sha256(b"\0".join([header.read_bytes(), *(f.encode() for f in (*_CXXFLAGS, *_include_flags())),
                                      f"{cxx}:{stat.st_size}:{stat.st_mtime_ns}".encode()])).hexdigest()[:16]
    where = runtime_cache_dir() / key
    if (where / "tlx_launcher.h.gch").is_file():
        return where, None
    where.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(header, where / "tlx_launcher.h")
    out = where / f"tlx_launcher.h.gch.partial{os.getpid()}"
    return where, [_CXX, *_CXXFLAGS, *_include_flags(), "-x", "c++-header", str(where / "tlx_launcher.h"), "-o", str(out)]


def publish_runtime_support(command: list[str]) -> None:
    """Move a finished precompiled header (built by ``command``) into place; the last one wins."""
    partial = Path(command[-1])
    os.replace(partial, partial.parent / "tlx_launcher.h.gch")


def runtime_cache_dir() -> Path:
    """Per-machine build products shared by every kernel cache (``TLX_RUNTIME_CACHE_DIR``)."""
    return Path(os.environ.get("TLX_RUNTIME_CACHE_DIR", Path.home() / ".cache" / "tlx-runtime"))


def _include_flags() -> list[str]:
    from tvm_ffi.libinfo import find_dlpack_include_path, find_include_path

    from tlx.lowering import cuda_include_dir

    return [f"-I{d}" for d in dict.fromkeys([find_include_path(), find_dlpack_include_path(), str(RUNTIME_DIR), cuda_include_dir()])]


_CXX = "c++"
# TVM-FFI's own extension flags (tvm_ffi.cpp.build), with the launcher's exported symbols alone visible.
_CXXFLAGS = ("-std=c++17", "-fPIC", "-O2", "-fvisibility=hidden")
