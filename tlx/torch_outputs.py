"""torch's output factory for the launchers' allocating calls (hostgen/runtime/tlx_torch_outputs.cc).

Bound to a launcher, it makes each output of ``kernel(*inputs)`` one torch tensor from torch's
caching allocator (``at::detail::empty_cuda``, without the dispatcher's round trip), handed back
to Python as that tensor, instead of a TVM-FFI environment-allocator tensor (``at::empty``
through the dispatcher) that the return path converts into a second torch tensor. It is a small
library compiled against torch's headers, once per machine and torch build (:func:`build`,
``python3 -m tlx.torch_outputs``, about 20 s on two cores), into the runtime cache;
:func:`factory_address` loads it when it is there, and ``Kernel.load`` binds it. This module
imports nothing of the code generator, so a cache hit stays cheap.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

__all__ = ["build", "factory_address", "library_path"]

SOURCE = Path(__file__).parent / "hostgen" / "runtime" / "tlx_torch_outputs.cc"
_HEADER = SOURCE.with_name("tlx_launcher.h")
_loaded: dict[Path, int] = {}  # library -> the factory table's address, once loaded in this process


def library_path() -> Path:
    """Where this machine's build for the imported torch lives: named by a hash of the sources,
    torch's version and location, TVM-FFI's version and the Python version."""
    import torch
    import tvm_ffi

    from tlx.options import cache_dir

    material = [SOURCE.read_bytes(), _HEADER.read_bytes(), torch.__version__.encode(), torch.__file__.encode(),
                tvm_ffi.__version__.encode(), sys.version.encode()]
    key = hashlib.sha256(b"\0".join(material)).hexdigest()[:16]
    root = Path(os.environ["TLX_RUNTIME_CACHE_DIR"]) if os.environ.get("TLX_RUNTIME_CACHE_DIR") else cache_dir() / "runtime"
    return root / f"torch-outputs-{key}" / "libtlx_torch_outputs.so"


def build_command(output: Path) -> list[str]:
    """The compile-and-link command: C++20 with torch's C++ ABI, torch's, TVM-FFI's and the
    launcher runtime's headers (no Python headers); linked with libtorch (libtorch_cuda too
    for a CUDA build), libtorch_python and libtvm_ffi (CPython's symbols come from the process
    that loads it)."""
    import torch
    from tvm_ffi.libinfo import find_libtvm_ffi

    from tlx.hostgen import include_flags

    torch_dir = Path(torch.__file__).parent
    torch_lib, ffi_lib = torch_dir / "lib", Path(find_libtvm_ffi()).parent
    includes = [f"-I{torch_dir / 'include'}", f"-I{torch_dir / 'include' / 'torch' / 'csrc' / 'api' / 'include'}"]
    cuda = (torch_lib / "libtorch_cuda.so").is_file()  # a CUDA build of torch: CUDA outputs without the dispatcher
    return ["c++", "-std=c++20", "-O2", "-fPIC", "-shared", "-fvisibility=hidden", f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}",
            f"-DTLX_TORCH_CUDA={int(cuda)}", *include_flags(), *includes, str(SOURCE), f"-L{torch_lib}", "-ltorch", "-ltorch_cpu",
            *(["-ltorch_cuda"] if cuda else []), "-lc10", "-ltorch_python", f"-L{ffi_lib}", "-ltvm_ffi", f"-Wl,-rpath,{torch_lib}",
            f"-Wl,-rpath,{ffi_lib}", "-o", str(output)]  # fmt: skip


def build() -> Path:
    """Build the library for the imported torch unless it is built; returns its path. Two
    processes building at once both succeed (each writes its own file, then renames it)."""
    path = library_path()
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(f"{path.name}.partial{os.getpid()}")
        cmd = build_command(partial)
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"building torch's output factory failed ({' '.join(cmd)}):\n{proc.stderr[-4000:]}")
        import ctypes

        ctypes.CDLL(str(partial)).tlx_torch_output_factory  # a symbol this torch lacks fails here, not in Kernel.load
        os.replace(partial, path)
    return path


def factory_address() -> int | None:
    """The factory table's address in this process, or None when the library is not built for
    the imported torch (the launchers then allocate through TVM-FFI's environment allocator)."""
    try:
        path = library_path()
    except ImportError:  # no torch here
        return None
    if path not in _loaded:
        if not path.is_file():
            return None
        import ctypes

        lib = ctypes.CDLL(str(path))
        lib.tlx_torch_output_factory.restype = ctypes.c_void_p
        _loaded[path] = lib.tlx_torch_output_factory()
    return _loaded[path]


if __name__ == "__main__":  # python3 -m tlx.torch_outputs: build it for this machine's torch
    print(build())
