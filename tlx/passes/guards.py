"""Guard elimination: drop the bound-check guards that the verifier proves always true.

TileLang's ``LegalizeSafeMemoryAccess`` wraps every global access it cannot prove safe
in an ``if`` or ``if_then_else``. Under the kernel's facts (launch extents, loop ranges,
enclosing conditions, assumptions and the preconditions that the launcher enforces),
many of those conditions are always true. This pass walks the device kernels with the
bounds verifier's context and replaces an ``if (c) S`` by ``S`` and
``if_then_else(c, a, b)`` by ``a`` only when Z3 proves ``c`` (an unknown keeps the
guard). Conditions that read memory or call intrinsics (e.g. warp-role tests) are
never touched.
"""

from __future__ import annotations

import re

from tlx.lowering import LoweredKernel
from tlx.passes import PassContext, register_pass
from tlx.passes.bounds import verify_kernel

__all__ = ["count_predicates", "cuda_source", "eliminate_guards"]


def eliminate_guards(kernel: LoweredKernel, assume=(), conditions=()) -> tuple[LoweredKernel, dict]:
    """``kernel`` with proven guards removed, and ``{"seen", "removed"}`` counts.

    ``conditions`` are TIR preconditions the launcher checks on every call; they may be
    used as facts because no launch violates them.
    """
    report, new_mod = verify_kernel(kernel, tuple(assume), list(conditions), rewrite=True)
    stats = dict(report.guards)
    if new_mod is None or stats["removed"] == 0:
        return kernel, stats
    return kernel.with_device_mod(new_mod), stats


def cuda_source(kernel: LoweredKernel) -> str:
    """The CUDA C++ that TileLang generates for ``kernel.device_mod`` (no nvcc run)."""
    from tilelang import tvm
    from tilelang.backend.module import create_backend_context
    from tilelang.engine.lower import device_codegen_without_compile

    context = create_backend_context(_target_dict(kernel), None, "auto")
    with tvm.transform.PassContext(opt_level=3, config=dict(kernel.pass_configs)), context.target:
        return device_codegen_without_compile(kernel.device_mod, context).inspect_source()


def _target_dict(kernel: LoweredKernel) -> dict:
    t = kernel.target
    return {"kind": str(t.kind.name), "arch": str(t.attrs["arch"])}


_PREDICATE = re.compile(r"\bif\s*\(|\?")


def count_predicates(source: str) -> int:
    """Conditional branches and selects (``if (`` and ``?``) in generated CUDA source."""
    code = "\n".join(line.split("//", 1)[0] for line in source.splitlines())
    return len(_PREDICATE.findall(code))


@register_pass("eliminate_guards", order=110, enabled=lambda ctx: bool(ctx.options.get("eliminate_guards", True)))
def eliminate_guards_pass(kernel: LoweredKernel, ctx: PassContext) -> LoweredKernel:
    """Remove proven guards using the assumptions and the preconditions of earlier passes."""
    assume = tuple(ctx.options.get("assume", ()))
    new, stats = eliminate_guards(kernel, assume, [p.expr for p in ctx.preconditions])
    ctx.reports["eliminate_guards"] = stats
    return new
