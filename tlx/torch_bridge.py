"""torch's bridge into the generated launchers: one small library per machine and torch build
(hostgen/runtime/tlx_torch_outputs.cc and tlx_torch_call.cc).

- **The output factory**: bound to a launcher, it makes each output of ``kernel(*inputs)`` one
  torch tensor from torch's caching allocator (``at::detail::empty_cuda``, without the
  dispatcher's round trip), handed back to Python as that tensor, instead of a TVM-FFI
  environment-allocator tensor (``at::empty`` through the dispatcher) that the return path
  converts into a second torch tensor.
- **The call path** (:func:`torch_call`): a launcher entry called with torch tensors passed in
  place, instead of through TVM-FFI's Python binding, which makes two heap objects per tensor
  and call. Same arguments, results and errors.

The library is compiled against torch's headers into the runtime cache the first time a kernel
loads in a process that has imported torch (a few seconds, once per machine; ``python3 -m
tlx.torch_bridge`` builds it ahead). ``TLX_TORCH_BRIDGE=0`` leaves it unused: the entries are
then called through TVM-FFI alone. This module imports nothing of the code generator, so a cache
hit stays cheap.
"""

from __future__ import annotations

import functools
import hashlib
import os
import subprocess
import sys
import warnings
from pathlib import Path

__all__ = ["build", "factory_address", "library_path", "torch_call"]

_RUNTIME = Path(__file__).parent / "hostgen" / "runtime"
SOURCES = [_RUNTIME / "tlx_torch_outputs.cc", _RUNTIME / "tlx_torch_call.cc"]
_HEADERS = [_RUNTIME / "tlx_launcher.h", _RUNTIME / "tlx_torch_bridge.h"]
_loaded: dict = {}  # library path -> the loaded library (ctypes.PyDLL), or None when its build failed in this process


@functools.cache
def _build_key() -> str:
    """A hash of the sources, torch's version and location, TVM-FFI's version and the Python
    version (once per process: every kernel load asks)."""
    import torch
    import tvm_ffi

    material = [*(p.read_bytes() for p in SOURCES + _HEADERS), torch.__version__.encode(), torch.__file__.encode(),
                tvm_ffi.__version__.encode(), sys.version.encode()]
    return hashlib.sha256(b"\0".join(material)).hexdigest()[:16]


def library_path() -> Path:
    """Where this machine's build for the imported torch lives, named by :func:`_build_key`."""
    from tlx.options import cache_dir

    key = _build_key()
    root = Path(os.environ["TLX_RUNTIME_CACHE_DIR"]) if os.environ.get("TLX_RUNTIME_CACHE_DIR") else cache_dir() / "runtime"
    return root / f"torch-bridge-{key}" / "libtlx_torch_bridge.so"


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
            f"-DTLX_TORCH_CUDA={int(cuda)}", *include_flags(), *includes, *map(str, SOURCES), f"-L{torch_lib}", "-ltorch", "-ltorch_cpu",
            *(["-ltorch_cuda"] if cuda else []), "-lc10", "-ltorch_python", f"-L{ffi_lib}", "-ltvm_ffi", f"-Wl,-rpath,{torch_lib}",
            f"-Wl,-rpath,{ffi_lib}", "-o", str(output)]  # fmt: skip


def build() -> Path:
    """Build the library for the imported torch unless it is built; returns its path. One
    process builds at a time (a file lock); the others then find it built."""
    import fcntl

    path = library_path()
    if path.is_file():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name("build.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not path.is_file():
            partial = path.with_name(f"{path.name}.partial{os.getpid()}")
            cmd = build_command(partial)
            proc = subprocess.run(cmd, capture_output=True, text=True)
            if proc.returncode != 0:
                raise RuntimeError(f"building torch's bridge library failed ({' '.join(cmd)}):\n{proc.stderr[-4000:]}")
            import ctypes

            ctypes.CDLL(str(partial)).tlx_torch_output_factory  # a symbol this torch lacks fails here, not in Kernel.load
            os.replace(partial, path)
    return path


def _library():
    """This machine's library for the imported torch, loaded once per process (ctypes.PyDLL:
    its calls keep the GIL) and built first when it is not; None when torch is not imported,
    ``TLX_TORCH_BRIDGE=0``, or its build failed (warned once)."""
    if "torch" not in sys.modules or os.environ.get("TLX_TORCH_BRIDGE") == "0":
        return None
    path = library_path()
    if path not in _loaded:
        import ctypes

        try:
            lib = ctypes.PyDLL(str(build()))
        except Exception as e:  # noqa: BLE001 - the TVM-FFI paths still work: say why they are taken
            warnings.warn(f"tlx: torch's bridge library is unavailable, kernels are called through TVM-FFI alone: {e}",
                          RuntimeWarning, stacklevel=3)
            _loaded[path] = None
            return None
        lib.tlx_torch_output_factory.restype = ctypes.c_void_p
        lib.tlx_torch_call_new.restype = ctypes.py_object
        lib.tlx_torch_call_new.argtypes = [ctypes.c_void_p, ctypes.py_object, ctypes.py_object, ctypes.c_void_p, ctypes.c_int]
        _loaded[path] = lib
    return _loaded[path]


def factory_address() -> int | None:
    """The factory table's address in this process, or None without the library (the
    launchers then allocate through TVM-FFI's environment allocator)."""
    lib = _library()
    return lib.tlx_torch_output_factory() if lib is not None else None


@functools.cache
def _torch_exchange_api() -> int | None:
    """The address of torch's DLPack exchange API table (TVM-FFI's import sets the attribute
    on older torch), or None; read once per process, through a private ctypes prototype
    (``ctypes.pythonapi``'s own is shared with other code)."""
    import ctypes

    import torch

    capsule = getattr(torch.Tensor, "__dlpack_c_exchange_api__", None)
    if capsule is None:
        return None
    get_pointer = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.py_object, ctypes.c_char_p)(("PyCapsule_GetPointer", ctypes.pythonapi))
    return get_pointer(capsule, b"dlpack_exchange_api")


def torch_call(library: Path, name: str, function):
    """``function`` (the tvm_ffi.Function of the entry ``name`` of the launcher ``library``) as
    torch's call path (runtime/tlx_torch_call.cc): the same arguments, results and errors, the
    tensors passed in place. ``function`` itself where that path is unavailable: no library (see
    :func:`_library`), torch lacks the DLPack exchange API's in-place tensors, or CPython has no GIL."""
    import ctypes
    import sysconfig

    lib = _library()
    if lib is None or sysconfig.get_config_var("Py_GIL_DISABLED"):
        return function
    api = _torch_exchange_api()
    if api is None:
        return function
    import torch

    symbol = ctypes.cast(ctypes.CDLL(str(library))[f"__tvm_ffi_{name}"], ctypes.c_void_p).value
    call = lib.tlx_torch_call_new(symbol, function, torch.Tensor, api, int(function.release_gil))
    return function if call is None else call


if __name__ == "__main__":  # python3 -m tlx.torch_bridge: build it for this machine's torch
    print(build())
