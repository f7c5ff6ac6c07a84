"""The order tlx's passes run in, between TileLang's lowering and CUDA code generation.

Read top to bottom: the pin's decisions are checked first (on the kernel as lowered); the
layout analyses only read the kernel; the bounds verifier then derives the preconditions
the launcher enforces, which guard elimination may use as facts; the numerics checks look
at the final device code; the ``tlx.ieee`` prelude is injected last because it only adds
source text. ``tlx check`` runs the same list with ``report_only`` set: its bounds verdict
(with source lines) replaces the compile-time bounds pass and no guard is removed.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass

from tlx.lowering import LoweredKernel
from tlx.numerics import determinism, pin, prelude, strict
from tlx.passes import PassContext, TlxError, verifying, verifying_exhaustively
from tlx.passes import banks, bounds, check, guards, layouts, races, vectors

__all__ = ["PASSES", "Pass", "pass_names", "run_passes"]

TlxPass = Callable[[LoweredKernel, PassContext], LoweredKernel]


@dataclass(frozen=True)
class Pass:
    name: str
    run: TlxPass
    enabled: Callable[[PassContext], bool] = lambda ctx: True


def _pinned(ctx: PassContext) -> bool:
    return bool(ctx.options.pin)


def _checking(ctx: PassContext) -> bool:
    return ctx.options.report_only


def _compile_time_bounds(ctx: PassContext) -> bool:
    return verifying(ctx) and not _checking(ctx)


def _removing_guards(ctx: PassContext) -> bool:
    return ctx.options.eliminate_guards and not _checking(ctx)


PASSES: tuple[Pass, ...] = (
    Pass("numerics_pin", pin.pin_pass, _pinned),
    Pass("layouts", layouts.layouts_pass, verifying),
    Pass("banks", banks.banks_pass, verifying_exhaustively),
    Pass("vectors", vectors.vectors_pass, verifying),
    Pass("races", races.races_pass, verifying_exhaustively),
    Pass("bounds", bounds.bounds_pass, _compile_time_bounds),
    Pass("check", check.check_pass, _checking),
    Pass("eliminate_guards", guards.eliminate_guards_pass, _removing_guards),
    Pass("numerics_strict", strict.numerics_mode_pass),
    Pass("numerics_determinism", determinism.determinism_pass),
    Pass("numerics_ieee_prelude", prelude.inject_ieee_prelude),
)


def pass_names() -> list[str]:
    return [p.name for p in PASSES]


def run_passes(kernel: LoweredKernel, ctx: PassContext, skip: tuple[str, ...] = ()) -> LoweredKernel:
    """Run every enabled pass in order, except those named in ``skip`` or in ``ctx.options.skip_passes``."""
    skip = (*skip, *ctx.options.skip_passes)
    unknown = set(skip) - set(pass_names())
    if unknown:
        raise ValueError(f"skip: expected pass names among {pass_names()}, got {sorted(unknown)}")
    for p in PASSES:
        if p.name not in skip and p.enabled(ctx):
            try:
                kernel = p.run(kernel, ctx)
            except Exception as e:
                # A pass that fails proves nothing and changes nothing: its report says so and the
                # compile goes on with the kernel as it was, unless the user asked for verify="error".
                if ctx.options.verify == "error" or isinstance(e, TlxError):
                    raise
                ctx.reports[p.name] = {"status": "failed", "error": f"{type(e).__name__}: {e}"}
                warnings.warn(f"tlx pass {p.name} failed on {kernel.name} ({type(e).__name__}: {e}); its result is unknown",
                              RuntimeWarning, stacklevel=2)
    return kernel
