"""The compile-time bounds pass: verify every access, add the derived preconditions (and the
user's assumptions) for the launcher to check, and raise or warn on what stays unproven. When
guard elimination follows, the same walks prove the guards too (one walk, not two)."""

from __future__ import annotations

import warnings

from tlx.lowering import LoweredKernel
from tlx.passes import GuardProofs, PassContext, Precondition, raise_or_warn
from tlx.passes.assume import parse_assumption, shape_vars
from tlx.passes.preconditions import derive_preconditions
from tlx.passes.verification import VerificationError, format_violation, verify_kernel

__all__ = ["bounds_pass"]


def bounds_pass(kernel: LoweredKernel, ctx: PassContext) -> LoweredKernel:
    """Verify all accesses; add derived preconditions; raise or warn on the rest."""
    assume = ctx.options.assume
    prove_guards = ctx.options.eliminate_guards
    report = verify_kernel(kernel, assume, prove_guards=prove_guards)
    pre, final = (derive_preconditions(kernel, report, assume, prove_guards=prove_guards)
                  if (report.violations() or report.unknowns()) else ([], report))
    # The proofs rely on the user's assumptions, so the launcher enforces them as well.
    variables = shape_vars(kernel.prim_func)
    ctx.preconditions.extend(Precondition(parse_assumption(text, variables), text, "assume") for text in assume)
    ctx.preconditions.extend(pre)
    if prove_guards and _proved_under(final, pre):
        ctx.guard_proofs = GuardProofs(kernel, tuple(ctx.preconditions), frozenset(final.proven_guards), dict(final.guards))
    out = report.to_json()
    out["preconditions"] = [p.text for p in pre]
    # the verdict the launcher's checks make true: the accesses proven once the derived
    # preconditions hold (the fields above are the walk under the user's assumptions alone)
    out["under_preconditions"] = {k: v for k, v in final.to_json().items() if k in ("proven", "unknown", "violations")}
    out["guards"] = {"seen": report.guards["seen"]}
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


def _proved_under(report, pre: list[Precondition]) -> bool:
    """``report``'s walk had the facts that guard elimination's own walk would have: the
    user's assumptions, then exactly ``pre`` (derivation verifies under all the conditions it
    chose, of which the launcher may keep fewer), and the hulls a fresh walk would collect."""
    return (report.own_hulls and len(report.conditions) == len(pre)
            and all(c.same_as(p.expr) for c, p in zip(report.conditions, pre)))
