"""Generated TVM-FFI host launchers: plan from lowered IR, emit C++, build, load."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from tlx.hostgen.cexpr import pyexpr
from tlx.hostgen.emit import ALLOCATING_NAME, EXPORT_NAME, emit_launcher
from tlx.hostgen.image import SharedMemoryError, check_shared_memory
from tlx.hostgen.plan import HostgenError, LaunchPlan, plan_launcher, walk_steps

__all__ = ["HostgenError", "LaunchPlan", "SharedMemoryError", "check_shared_memory", "EXPORT_NAME", "generate_launcher",
           "include_flags", "launcher_compile_command", "launcher_link_command", "plan_launcher", "RUNTIME_DIR",
           "runtime_cache_dir", "runtime_support", "SupportBuild"]

RUNTIME_DIR = Path(__file__).parent / "runtime"


def generate_launcher(kernel, out_idx=(), preconditions=(), cubin_file: str = "kernel.cubin") -> tuple[str, dict]:
    """C++ launcher source for a lowered kernel, and the launch facts the kernel object needs."""
    plan = plan_launcher(kernel, out_idx, preconditions)
    source = emit_launcher(plan, cubin_file, cubin_symbol="tlx_cubin")
    return source, describe(plan, source)


def describe(plan: LaunchPlan, source: str) -> dict:
    """JSON-able launch metadata: the library's entry point, parameters, symbolic dims, the
    workspaces each call allocates, launches."""
    return {
        "entry": EXPORT_NAME,
        "allocating_entry": ALLOCATING_NAME if f"__tvm_ffi_{ALLOCATING_NAME}" in source else None,
        "params": [
            {"index": t.index, "name": t.name, "kind": "tensor", "dtype": t.dtype, "shape": [pyexpr(d) for d in t.shape],
             "strides": [pyexpr(s) for s in t.strides], "align": t.align, "output": t.is_output,
             "storage_dtype": t.storage_dtype, "storage_shape": [pyexpr(d) for d in t.storage_shape]}
            for t in plan.tensors
        ]
        + [{"index": s.index, "name": s.name, "kind": "scalar", "dtype": s.dtype} for s in plan.scalars],
        "symbolic_dims": {n: {"tensor": t.name, "dim": d} for n, (_, t, d) in plan.shape_vars.items()},
        "symbolic_strides": {n: {"tensor": t.name, "dim": d} for n, (_, t, d) in plan.stride_vars.items()},
        "workspaces": [{"name": w.name, "dtype": w.dtype, "elements": pyexpr(w.elements)}
                       for w in (s.workspace for s in walk_steps(plan.steps) if s.kind == "workspace")],
        "launches": [
            {"kernel": lc.kernel, "grid": [pyexpr(g) for g in lc.grid], "block": [pyexpr(b) for b in lc.block],
             "dynamic_shared_memory": pyexpr(lc.dyn_smem), "cluster": lc.cluster, "cooperative": lc.cooperative,
             "programmatic_dependent": lc.pdl}
            for lc in (s.launch for s in walk_steps(plan.steps) if s.kind == "launch")
        ],
    }


def launcher_compile_command(workdir: Path, runtime: Path) -> list[str]:
    """Compile ``workdir/launcher.cc`` to assembly (``launcher.s``). It does not need the cubin
    (the ``.incbin`` directive is resolved only when the assembly is assembled), so it runs
    while nvcc builds the cubin. The runtime's directory comes first on the include path:
    the compiler takes the precompiled ``tlx_launcher.h.gch`` there in place of the header
    when it is built (:func:`runtime_support`) and valid, and the header itself otherwise;
    the assembly is the same either way."""
    return [_CXX, *_CXXFLAGS, f"-I{runtime.parent}", *include_flags(), "-S", str(workdir / "launcher.cc"), "-o", str(workdir / "launcher.s")]


def launcher_link_command(workdir: Path, runtime: Path) -> list[str]:
    """Assemble ``workdir/launcher.s`` (embedding ``workdir/kernel.cubin``) and link it with the
    runtime object (:func:`runtime_support`) into the library."""
    from tvm_ffi.libinfo import find_libtvm_ffi

    lib = Path(find_libtvm_ffi())
    return [_CXX, "-shared", "-fPIC", *_fast_linker(), f"-Wa,-I{workdir}", str(workdir / "launcher.s"), str(runtime), f"-L{lib.parent}",
            "-ltvm_ffi", "-ldl", "-o", str(workdir / "launcher.so")]


def _fast_linker() -> list[str]:
    """gold where it is installed: it links a launcher in half the time of the default (bfd)
    linker, and the link is the one build step that waits for nvcc."""
    import shutil

    return ["-fuse-ld=gold"] if shutil.which("ld.gold") else []


@dataclass(frozen=True)
class SupportBuild:
    """A piece of the launchers' runtime support that is not built yet: ``command`` builds it
    into ``partial`` (a file of this process); :meth:`publish` then moves it into place
    atomically (two processes building it at once both succeed, the last one's identical
    file stays)."""

    what: str
    command: list[str]
    partial: Path
    final: Path

    def publish(self) -> None:
        os.replace(self.partial, self.final)


def runtime_support() -> tuple[Path, list[SupportBuild]]:
    """The launchers' runtime support, built once per machine: the runtime
    (``runtime/tlx_runtime.cc``, the out-of-line half of ``tlx_launcher.h``) as an object file
    linked into every launcher, and ``tlx_launcher.h`` precompiled with the launchers' flags,
    which spares every launcher's compile the parsing of the header and the TVM-FFI and CUDA
    headers it includes. Returns the object's path and what is still to build. Their
    directory is named by a hash of the runtime's sources, the flags, the compiler and the
    TVM-FFI and CUDA headers they are compiled against, so a change to any of them builds
    them anew."""
    import hashlib
    import importlib.metadata as im
    import shutil

    from tlx.lowering import cuda_toolkit_version

    cxx = Path(shutil.which(_CXX) or _CXX).resolve()
    stat = cxx.stat()
    material = [*(p.read_bytes() for p in _RUNTIME_SOURCES), *(f.encode() for f in (*_CXXFLAGS, *include_flags())),
                f"{cxx}:{stat.st_size}:{stat.st_mtime_ns}".encode(), im.version("apache-tvm-ffi").encode(), cuda_toolkit_version().encode()]
    key = hashlib.sha256(b"\0".join(material)).hexdigest()[:16]
    directory = runtime_cache_dir() / key
    runtime = directory / "tlx_runtime.o"
    pieces = [("runtime", runtime, ["-c", str(RUNTIME_DIR / "tlx_runtime.cc")]),
              ("header", directory / "tlx_launcher.h.gch", ["-x", "c++-header", str(RUNTIME_DIR / "tlx_launcher.h")])]
    missing = []
    for what, final, source in pieces:
        if not final.is_file():
            directory.mkdir(parents=True, exist_ok=True)
            partial = final.with_name(f"{final.name}.partial{os.getpid()}")
            missing.append(SupportBuild(what, [_CXX, *_CXXFLAGS, *include_flags(), *source, "-o", str(partial)], partial, final))
    return runtime, missing


def runtime_cache_dir() -> Path:
    """Where the runtime object is cached: ``$TLX_RUNTIME_CACHE_DIR``, else ``runtime/`` in the
    kernel cache (``$TLX_CACHE_DIR``)."""
    from tlx.options import cache_dir

    return Path(os.environ["TLX_RUNTIME_CACHE_DIR"]) if os.environ.get("TLX_RUNTIME_CACHE_DIR") else cache_dir() / "runtime"


def include_flags() -> list[str]:
    """The include path of code that includes ``tlx_launcher.h``: TVM-FFI's, DLPack's, the runtime's and CUDA's headers."""
    from tvm_ffi.libinfo import find_dlpack_include_path, find_include_path

    from tlx.lowering import cuda_include_dir

    return [f"-I{d}" for d in dict.fromkeys([find_include_path(), find_dlpack_include_path(), str(RUNTIME_DIR), cuda_include_dir()])]


_CXX = "c++"
# TVM-FFI's own extension flags (tvm_ffi.cpp.build), with the launcher's exported symbols alone visible.
_CXXFLAGS = ("-std=c++17", "-fPIC", "-O2", "-fvisibility=hidden")
_RUNTIME_SOURCES = (RUNTIME_DIR / "tlx_launcher.h", RUNTIME_DIR / "tlx_runtime.cc")
