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
from tlx.passes import PassContext
from tlx.passes.verification import verify_kernel

__all__ = ["count_predicates", "eliminate_guards"]


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


_PREDICATE = re.compile(r"\bif\s*\(|\?")


def count_predicates(source: str) -> int:
    """Conditional branches and selects (``if (`` and ``?``) in generated CUDA source."""
    code = "\n".join(line.split("//", 1)[0] for line in source.splitlines())
    return len(_PREDICATE.findall(code))


def eliminate_guards_pass(kernel: LoweredKernel, ctx: PassContext) -> LoweredKernel:
    """Remove proven guards, using as facts only the preconditions the launcher enforces.

    The user's ``assume`` strings reach this pass as preconditions of the ``bounds`` pass
    (so they are checked on every call); with ``verify="off"`` there are none and only
    the kernel's own facts are used.
    """
    new, stats = eliminate_guards(kernel, (), [p.expr for p in ctx.preconditions])
    ctx.reports["eliminate_guards"] = stats
    return new
