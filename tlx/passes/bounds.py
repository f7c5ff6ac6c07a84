"""The compile-time bounds pass: verify every access, add the derived preconditions (and the
user's assumptions) for the launcher to check, and raise or warn on what stays unproven."""

from __future__ import annotations

import warnings

from tlx.lowering import LoweredKernel
from tlx.passes import PassContext, Precondition, raise_or_warn
from tlx.passes.assume import parse_assumption, shape_vars
from tlx.passes.preconditions import derive_preconditions
from tlx.passes.verification import VerificationError, format_violation, verify_kernel

__all__ = ["bounds_pass"]


def bounds_pass(kernel: LoweredKernel, ctx: PassContext) -> LoweredKernel:
    """Verify all accesses; add derived preconditions; raise or warn on the rest."""
    assume = ctx.options.assume
    report = verify_kernel(kernel, assume)
    pre, final = derive_preconditions(kernel, report, assume) if (report.violations() or report.unknowns()) else ([], report)
    # The proofs rely on the user's assumptions, so the launcher enforces them as well.
    variables = shape_vars(kernel.prim_func)
    ctx.preconditions.extend(Precondition(parse_assumption(text, variables), text, "assume") for text in assume)
    ctx.preconditions.extend(pre)
    out = report.to_json()
    out["preconditions"] = [p.text for p in pre]
    out["guards"] = report.guards
    ctx.reports["bounds"] = out
    problems = final.violations()
    if problems:
        msg = f"kernel {kernel.name}: {len(problems)} access(es) may be out of bounds:\n" + "\n".join(format_violation(a) for a in problems)
        raise_or_warn(ctx, VerificationError(msg))
    elif final.unknowns():
        # Derived preconditions are not warned about: the launcher enforces them (metadata lists them).
        warnings.warn(f"kernel {kernel.name}: {len(final.unknowns())} access(es) could not be proven in bounds (see `tlx check`)",
                      stacklevel=2)
    return kernel
