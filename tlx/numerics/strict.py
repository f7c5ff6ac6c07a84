"""Numerics mode pass: records the floating-point contract of a compile and, in strict mode,
rejects approximate intrinsics.

Approximate means "trades accuracy for speed beyond what nvcc's default libdevice gives":
TileLang's fast-math builtins (``T.__exp``, ``T.__log``, ``T.__sin``… which CUDA codegen prints
as ``__expf``, ``__logf``, ``__sinf``… for fp32) and ``T.fast_rcp`` (``rcp.approx.ftz``),
plus the same CUDA intrinsics reached through ``T.call_extern``, a kernel's own prelude helper
(``T.Kernel(prelude=...)``) whose inline PTX, or that of a helper it calls, holds an
approximate instruction (``ex2.approx.ftz.f32``, ``rcp.approx``…; the helper's name and the
instructions are reported, either may be allowed), and the
``tl.enable_fast_math`` pass config (nvcc ``--use_fast_math``). Libdevice functions such as
``expf`` are not approximate in this sense: they are bit-reproducible against a CUDA baseline
built with the same flags.
"""

from __future__ import annotations

import re

from tilelang import tvm

from tlx.ir.tir import calls, device_functions, extern_name, nodes, op_name
from tlx.numerics.modes import FAST_MATH_CONFIG, nvcc_flags, strict_conflicts
from tlx.passes import PassOptions, TlxError, exit_status

__all__ = ["APPROX_EXTERNS", "APPROX_PTX", "APPROX_TL_OPS", "ApproximateIntrinsicError", "check_numerics", "find_approximate"]


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
# an approximate PTX instruction in a prelude helper's inline assembly
APPROX_PTX = re.compile(r"\b(?:ex2|lg2|rcp|rsqrt|sqrt|sin|cos|tanh)\.approx(?:\.ftz)?\.(?:f16x2|bf16x2|f16|bf16|f32|f64)\b")


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
        # an ApproximateIntrinsicError (a ValueError) so the compile stops
        if name not in known and not APPROX_PTX.fullmatch(name):
            raise ApproximateIntrinsicError(f"allow_approx: expected names from {sorted(known)} or an approximate "
                                            f"PTX instruction (a prelude's, e.g. 'ex2.approx.ftz.f32'), got {entry!r}")
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
        bodies = _prelude_functions(func)
        for ext in dict.fromkeys(extern_name(c) for c in calls(func) if extern_name(c) in bodies):
            instructions = _prelude_approximations(ext, bodies)
            if instructions:
                found.append({"intrinsic": ext, "name": ext, "cuda": ", ".join(sorted(instructions)), "function": fname,
                              "dtype": "prelude"})
    return found


def _prelude_functions(func) -> dict[str, str]:
    """name -> body of every function the device function's preludes (``pragma_import_c``)
    define (braces matched; a loop or branch head is recorded too, under its keyword, which no
    call names)."""
    bodies = {}
    for attr in nodes(func.body, tvm.tirx.AttrStmt):
        if attr.attr_key != "pragma_import_c" or not isinstance(attr.value, tvm.tirx.StringImm):
            continue
        text = attr.value.value
        for m in re.finditer(r"\b([A-Za-z_]\w*)\s*\([^;{}]*\)\s*\{", text):
            depth, i = 1, m.end()
            while depth and i < len(text):
                depth += {"{": 1, "}": -1}.get(text[i], 0)
                i += 1
            bodies.setdefault(m.group(1), text[m.end():i])
    return bodies


def _prelude_approximations(name: str, bodies: dict[str, str]) -> set[str]:
    """The approximate PTX instructions helper ``name`` runs, itself or through the prelude
    helpers it calls."""
    found, todo, seen = set(), [name], set()
    while todo:
        current = todo.pop()
        if current in seen or current not in bodies:
            continue
        seen.add(current)
        found.update(APPROX_PTX.findall(bodies[current]))
        todo += [other for other in bodies if re.search(rf"\b{re.escape(other)}\s*\(", bodies[current])]
    return found


def _is_allowed(hit: dict, allowed: set[str]) -> bool:
    """A TileLang or CUDA name in ``allowed``, or (a prelude helper) every PTX instruction it runs."""
    return hit["name"] in allowed or hit["cuda"] in allowed or set(hit["cuda"].split(", ")) <= allowed


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
