"""Numerics mode pass: records the floating-point contract of a compile and, in strict mode,
rejects approximate intrinsics.

Approximate means "trades accuracy for speed beyond what nvcc's default libdevice gives":
TileLang's fast-math builtins (``T.__exp``, ``T.__log``, ``T.__sin``… which CUDA codegen prints
as ``__expf``, ``__logf``, ``__sinf``… for fp32) and ``T.fast_rcp`` (``rcp.approx.ftz``),
plus the same CUDA intrinsics reached through ``T.call_extern``, and the
``tl.enable_fast_math`` pass config (nvcc ``--use_fast_math``). Libdevice functions such as
``expf`` are not approximate in this sense: they are bit-reproducible against a CUDA baseline
built with the same flags.
"""

from __future__ import annotations

from tlx.ir.tir import calls, device_functions, extern_name, op_name
from tlx.numerics.modes import FAST_MATH_CONFIG, nvcc_flags, strict_conflicts
from tlx.passes import PassOptions, TlxError, exit_status

__all__ = ["APPROX_EXTERNS", "APPROX_TL_OPS", "ApproximateIntrinsicError", "check_numerics", "find_approximate"]


# TileLang builtin -> the CUDA function its fp32 form prints as.
APPROX_TL_OPS: dict[str, str] = {
    "__exp": "__expf",
    "__exp10": "__exp10f",
    "__log": "__logf",
    "__log2": "__log2f",
    "__log10": "__log10f",
    "__tan": "tanf",
    "__cos": "__cosf",
    "__sin": "__sinf",
    "fast_rcp": "tl::fast_rcp",
}

# CUDA fast-math intrinsics a kernel can reach with T.call_extern.
APPROX_EXTERNS = frozenset(
    {
        "__expf", "__exp10f", "__logf", "__log2f", "__log10f", "__sinf", "__cosf", "__tanf",
        "__sincosf", "__powf", "__fdividef", "tl::fast_rcp", "fast_rcp",
    }
)  # fmt: skip



class ApproximateIntrinsicError(TlxError, ValueError):
    """A strict-mode kernel uses an approximate intrinsic that is not in ``allow_approx``, or
    ``allow_approx`` names something that is not an approximate intrinsic."""


def _normalize(name: str) -> str:
    for prefix in ("T.", "tl.", "tilelang.language."):
        if name.startswith(prefix):
            return name[len(prefix) :]
    return name


def _allow_set(allow_approx) -> set[str]:
    if isinstance(allow_approx, str):
        allow_approx = (allow_approx,)
    known = set(APPROX_TL_OPS) | set(APPROX_EXTERNS)
    allowed = set()
    for entry in allow_approx:
        name = _normalize(str(entry))
        if name not in known:  # an ApproximateIntrinsicError (a ValueError) so the compile stops
            raise ApproximateIntrinsicError(f"allow_approx: expected names from {sorted(known)}, got {entry!r}")
        allowed.add(name)
    return allowed


def find_approximate(device_mod) -> list[dict]:
    """Every approximate intrinsic call in ``device_mod``: name, what CUDA sees, where, dtype."""
    found = []
    for fname, func in device_functions(device_mod):
        for call in calls(func):
            op = op_name(call)
            if op.startswith("tl.") and op[3:] in APPROX_TL_OPS:
                name = op[3:]
                cuda = APPROX_TL_OPS[name] if str(call.dtype) == "float32" else f"{name} ({call.dtype})"
                found.append({"intrinsic": f"T.{name}", "name": name, "cuda": cuda, "function": fname, "dtype": str(call.dtype)})
                continue
            ext = extern_name(call)
            if ext in APPROX_EXTERNS:
                found.append({"intrinsic": ext, "name": ext, "cuda": ext, "function": fname, "dtype": str(call.dtype)})
    return found


def _is_allowed(hit: dict, allowed: set[str]) -> bool:
    return hit["name"] in allowed or hit["cuda"] in allowed


def check_numerics(kernel, options: PassOptions) -> dict:
    """The numerics report of one kernel. In strict mode a violation raises
    ApproximateIntrinsicError, or with ``options.report_only`` (``tlx check``) is listed
    under ``violations`` with ``exit_code`` 1."""
    mode = options.numerics
    flags = nvcc_flags(mode)
    allowed = _allow_set(options.allow_approx)
    hits = find_approximate(kernel.device_mod)
    pass_configs = kernel.pass_configs or {}
    fast_math = bool(pass_configs.get(FAST_MATH_CONFIG, False))
    violations = []
    if mode == "strict":
        violations += [
            f"numerics='strict': kernel {kernel.name!r} sets pass config {conflict} "
            f"(fast math, which no allow-list can make exact); drop it or use numerics='default'"
            for conflict in strict_conflicts(pass_configs)
        ]
        violations += [
            f"numerics='strict': kernel {kernel.name!r} calls approximate intrinsic {hit['intrinsic']} "
            f"(CUDA {hit['cuda']}, {hit['dtype']}) in device function {hit['function']!r}; use the exact "
            f"form (e.g. T.exp, T.log, tlx.ieee.rcp) or allow it with @tlx.jit(allow_approx=[{hit['name']!r}])"
            for hit in hits
            if not _is_allowed(hit, allowed)
        ]
    if violations and not options.report_only:
        raise ApproximateIntrinsicError(violations[0])
    return {
        "mode": mode,
        "flags": flags,
        "fast_math": fast_math,
        "approximate": [{k: h[k] for k in ("intrinsic", "cuda", "function", "dtype")} for h in hits],
        "allowed": sorted(allowed),
        "violations": violations,
        "exit_code": exit_status(len(violations), 0),
    }


def numerics_mode_pass(kernel, ctx):
    """Record the floating-point contract in every mode; enforce it in strict mode."""
    ctx.reports["numerics"] = check_numerics(kernel, ctx.options)
    return kernel
