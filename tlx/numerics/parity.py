"""NVCC parity harness: build a CUDA C++ baseline into a TVM-FFI module, compare bits.

A baseline ``.cu`` file exports functions with ``TVM_FFI_DLL_EXPORT_TYPED_FUNC`` taking
``tvm::ffi::TensorView`` arguments and launching on ``TVMFFIEnvGetStream``; the module it
builds into is called with torch tensors. Building needs only nvcc, so CI builds every
baseline; calling needs a GPU.
"""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path

from tlx.numerics.modes import nvcc_flags

__all__ = ["assert_bitwise", "baseline_flags", "build_baseline"]


def _cutlass_include() -> str:
    import tilelang

    return str(Path(tilelang.__file__).parent / "3rdparty" / "cutlass" / "include")


def baseline_flags(arch: str = "sm_90a", numerics: str = "default") -> list[str]:
    """The nvcc flags of a baseline: the same arch and floating-point flags as the tlx kernel."""
    digits = arch.removeprefix("sm_")
    return ["-O3", "-std=c++17", f"-gencode=arch=compute_{digits},code=sm_{digits}", *nvcc_flags(numerics)]


def build_baseline(
    source: str | os.PathLike,
    *,
    arch: str = "sm_90a",
    numerics: str = "default",
    extra_cuda_cflags: tuple[str, ...] = (),
    with_cutlass: bool = False,
    build_directory: str | None = None,
    compile_only: bool = False,
):
    """Compile ``source`` with nvcc and load it as a ``tvm_ffi.Module``.

    The module name hashes the source and flags, so an edited baseline is rebuilt. With
    ``compile_only=True`` the source is only compiled (``nvcc -c``, same flags) and the object
    path is returned: linking and loading need the CUDA driver library, compiling does not, so
    CPU-only CI checks every baseline this way.
    """
    import tvm_ffi.cpp

    path = Path(source)
    flags = [*baseline_flags(arch, numerics), *extra_cuda_cflags]
    includes = [_cutlass_include()] if with_cutlass else []
    headers = "".join(h.read_text() for h in local_headers(path))
    digest = hashlib.sha256((path.read_text() + headers + "\0".join(flags) + "\0".join(includes)).encode()).hexdigest()[:12]
    name = f"{path.stem}_{digest}"
    if build_directory is None:
        build_directory = str(Path(os.environ.get("TLX_CACHE_DIR", Path.home() / ".cache" / "tlx")) / "baselines" / name)
    if compile_only:
        return _compile_object(path, [*flags, *(f"-I{i}" for i in includes)], Path(build_directory) / f"{name}.o")
    saved = os.environ.get("TVM_FFI_CUDA_ARCH_LIST")
    digits = arch.removeprefix("sm_")  # "90a" -> "9.0a", the form tvm_ffi expects
    os.environ["TVM_FFI_CUDA_ARCH_LIST"] = f"{digits[:-2] if digits.endswith('a') else digits[:-1]}.{digits[-2:] if digits.endswith('a') else digits[-1]}"
    try:
        lib = tvm_ffi.cpp.build(
            name=name,
            cuda_files=[str(path)],
            extra_cuda_cflags=flags,
            extra_include_paths=includes,
            extra_ldflags=["-lcuda"],
            build_directory=build_directory,
        )
    finally:
        if saved is None:
            os.environ.pop("TVM_FFI_CUDA_ARCH_LIST", None)
        else:
            os.environ["TVM_FFI_CUDA_ARCH_LIST"] = saved
    return tvm_ffi.load_module(lib)


_QUOTED_INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.MULTILINE)


def local_headers(source: Path) -> list[Path]:
    """The headers ``source`` includes with quotes, found beside the including file, and theirs in
    turn (a family's shared .cuh, the project's ``kernels/sm90.cuh``): part of what is built, so
    an edit to one rebuilds every baseline that includes it."""
    found: list[Path] = []
    todo = [Path(source)]
    while todo:
        including = todo.pop()
        for name in _QUOTED_INCLUDE.findall(including.read_text()):
            header = (including.parent / name).resolve()
            if header.is_file() and header not in found:
                found.append(header)
                todo.append(header)
    return found


def _compile_object(source: Path, flags: list[str], output: Path) -> str:
    import subprocess

    import tvm_ffi.libinfo

    if output.exists():  # the name hashes source and flags
        return str(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    cmd = ["nvcc", "-c", "-Xcompiler", "-fPIC", *flags, f"-I{tvm_ffi.libinfo.find_include_path()}", str(source), "-o", str(output)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"nvcc failed on {source} (exit {done.returncode}):\n{' '.join(cmd)}\n{done.stderr[-4000:]}")
    return str(output)


def assert_bitwise(actual, expected, *, name: str = "output") -> None:
    """Assert that two tensors have identical dtype, shape and bits (NaN payloads included).

    On failure the message gives the number of differing elements, the first differing
    index, both values, both bit patterns and, for floating types, the ULP distance.
    """
    import torch

    if actual.dtype != expected.dtype:
        raise AssertionError(f"{name}: dtype {actual.dtype} != expected {expected.dtype}")
    if tuple(actual.shape) != tuple(expected.shape):
        raise AssertionError(f"{name}: shape {tuple(actual.shape)} != expected {tuple(expected.shape)}")
    a = actual.detach().contiguous().cpu()
    e = expected.detach().contiguous().cpu()
    if a.numel() == 0:
        return
    bits_dtype = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
    ab, eb = a.view(bits_dtype), e.view(bits_dtype)
    diff = ab != eb
    count = int(diff.sum())
    if count == 0:
        return
    flat = int(torch.nonzero(diff.reshape(-1))[0])
    index = tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), a.shape))
    av, ev = a.reshape(-1)[flat], e.reshape(-1)[flat]
    width = 2 * a.element_size()
    ab_i = int(ab.reshape(-1)[flat]) & ((1 << (8 * a.element_size())) - 1)
    eb_i = int(eb.reshape(-1)[flat]) & ((1 << (8 * a.element_size())) - 1)
    msg = (
        f"{name}: {count} of {a.numel()} elements differ; first at index {index}: "
        f"actual {av.item()!r} (0x{ab_i:0{width}x}) vs expected {ev.item()!r} (0x{eb_i:0{width}x})"
    )
    if a.is_floating_point():
        ulps = abs(_ulp_key(ab_i, a.element_size()) - _ulp_key(eb_i, a.element_size()))
        msg += f", {ulps} ULP apart"
    raise AssertionError(msg)


def _ulp_key(bits: int, size: int) -> int:
    """A float's bit pattern as an integer on a line where adjacent floats differ by one."""
    sign = 1 << (8 * size - 1)
    return -(bits - sign) if bits & sign else bits
