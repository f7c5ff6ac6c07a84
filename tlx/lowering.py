"""TileLang lowering, stopped where tlx takes over: split host and device IR, before codegen."""

from __future__ import annotations

import functools
import hashlib
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import tilelang  # noqa: F401  (sets up the bundled TVM)
from tilelang import tvm
from tilelang.backend.module import create_backend_context
from tilelang.engine.lower import lower_to_host_device_ir

__all__ = ["LoweredKernel", "cuda_toolkit_version", "lower", "normalize_target"]


@dataclass(frozen=True)
class LoweredKernel:
    """One kernel between TileLang's lowering and code generation.

    ``prim_func`` is the user's program as written (its ``buffer_map`` has the declared
    shapes, strides and symbolic variables); ``host_mod`` holds the packed host function
    (argument checks, TMA descriptor set-up, launches); ``device_mod`` the device kernels.
    """

    name: str
    prim_func: Any
    host_mod: Any
    device_mod: Any
    target: Any
    pass_configs: dict
    layout_mod: Any = None  # the module right after TileLang's LayoutInference (layout_map annotations)

    def with_device_mod(self, device_mod) -> LoweredKernel:
        return replace(self, device_mod=device_mod)


def normalize_target(target) -> dict:
    """Accept ``{"kind": "cuda", "arch": "sm_90a"}``, ``"sm_90a"``, ``"auto"`` / ``"cuda"`` (the
    visible GPU) or ``None``, which, as in TileLang, is ``$TILELANG_DEFAULT_TARGET`` (how a machine
    without a GPU compiles code that leaves the target out; unset, the visible GPU)."""
    if target is None:
        from tilelang.env import env

        return normalize_target(env.get_default_target())
    if isinstance(target, str) and target in ("auto", "cuda"):
        import torch

        if not torch.cuda.is_available():
            raise ValueError("target: no GPU is visible; pass target={'kind': 'cuda', 'arch': 'sm_90a'} (or set "
                             "TILELANG_DEFAULT_TARGET to that, for code that leaves the target out) to compile without one")
        major, minor = torch.cuda.get_device_capability()
        suffix = "a" if major >= 9 else ""
        return {"kind": "cuda", "arch": f"sm_{major}{minor}{suffix}"}
    if type(target).__name__ == "Target" and str(getattr(target.kind, "name", "")) == "cuda" and "arch" in target.attrs:
        return {"kind": "cuda", "arch": str(target.attrs["arch"])}
    if isinstance(target, str):
        if target.startswith("sm_"):
            return {"kind": "cuda", "arch": target}
        raise ValueError(f"target: expected a dict such as {{'kind': 'cuda', 'arch': 'sm_90a'}} or 'sm_90a', got {target!r}")
    if isinstance(target, dict) and target.get("kind") == "cuda" and "arch" in target:
        return dict(target)
    raise ValueError(f"target: expected {{'kind': 'cuda', 'arch': 'sm_XX'}}, got {target!r}")


def lower(prim_func, target: dict, pass_configs: dict | None = None, name: str | None = None) -> LoweredKernel:
    """Run TileLang's CUDA pass pipeline up to the host/device split; ``name`` is the kernel's display name."""
    pass_configs = dict(pass_configs or {})
    context = create_backend_context(target, None, "auto")
    capture = _CaptureAfter("tl.LayoutInference")
    with tvm.transform.PassContext(opt_level=3, config=pass_configs, instruments=[capture]), context.target:
        host_mod, device_mod, _params, tgt, _host = lower_to_host_device_ir(prim_func, context)
    if name is None:
        name = str(prim_func.attrs["global_symbol"]) if prim_func.attrs and "global_symbol" in prim_func.attrs else "main"
    return LoweredKernel(name, prim_func, host_mod, device_mod, tgt, pass_configs, capture.module)


@tvm.instrument.pass_instrument
class _CaptureAfter:
    """Keep the module as it leaves one named pass (layouts are only annotated there)."""

    def __init__(self, pass_name: str):
        self.pass_name = pass_name
        self.module = None

    def run_after_pass(self, mod, info):
        if info.name == self.pass_name:
            self.module = mod


def codegen_cuda(kernel: LoweredKernel) -> str:
    """CUDA C++ source of ``kernel.device_mod`` from TileLang's own CUDA code generator."""
    from tilelang.engine.lower import device_codegen_without_compile

    target = {"kind": "cuda", "arch": str(kernel.target.attrs["arch"])}
    context = create_backend_context(target, None, "auto")
    with tvm.transform.PassContext(opt_level=3, config=kernel.pass_configs), context.target:
        mod = device_codegen_without_compile(kernel.device_mod, context)
    return mod.inspect_source()


def device_include_dirs() -> list[str]:
    """Header directories the generated CUDA needs: TileLang's templates and CUTLASS/CuTe."""
    from tilelang.env import CUTLASS_INCLUDE_DIR, TILELANG_TEMPLATE_PATH

    return [str(TILELANG_TEMPLATE_PATH), str(CUTLASS_INCLUDE_DIR)]


def cuda_include_dir() -> str:
    """The CUDA toolkit's include directory (for ``cuda.h`` types in host launchers)."""
    import os
    import shutil

    candidates = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH")]
    nvcc = shutil.which("nvcc")
    if nvcc:
        candidates.append(str(Path(nvcc).resolve().parent.parent))
    candidates += ["/usr/local/cuda", *sorted(map(str, Path("/usr/local").glob("cuda-*")), reverse=True)]
    for home in candidates:
        if home and (Path(home) / "include" / "cuda.h").is_file():
            return str(Path(home) / "include")
    raise RuntimeError(f"cuda.h not found under any of {[c for c in candidates if c]}: set CUDA_HOME to the CUDA toolkit")


@functools.cache
def cuda_toolkit_version() -> str:
    """The CUDA toolkit in use, by its release (``cuda 13.0``, ``CUDA_VERSION`` of its ``cuda.h``):
    every install of one release names the same kernels, so a cache built on the development
    machine (pip wheels) hits on the GPU machine (an installer's toolkit, another patch level;
    cubins of one release's patches are interchangeable). With the install's path, size and
    mtime or its patch level in the key, every kernel compiled again there. No subprocess on
    the hit path."""
    try:
        header = Path(cuda_include_dir()) / "cuda.h"
        found = re.search(r"^#define CUDA_VERSION (\d+)$", header.read_text(), re.M)
        if found is None:
            return "cuda.h:" + hashlib.sha256(header.read_bytes()).hexdigest()[:16]
        version = int(found.group(1))
        return f"cuda {version // 1000}.{version % 1000 // 10}"
    except (RuntimeError, OSError, ValueError):
        return "missing"
