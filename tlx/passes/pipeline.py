"""The order tlx's passes run in, between TileLang's lowering and CUDA code generation.

Read top to bottom: the pin's decisions are checked first (on the kernel as lowered); the
warpgroups' cross-warp reductions get barriers of their own (a fix the analyses after it see);
the layout analyses only read the kernel; the bounds verifier then derives the preconditions
the launcher enforces, which guard elimination may use as facts; a parameter that a view is
made from loses its ``const`` (TileLang's read-only marking, tlx/passes/viewed_params.py); the numerics checks look
at the final device code; the ``tlx.ieee`` prelude is injected last because it only adds
source text. ``tlx check`` runs the same list with ``report_only`` set: its bounds verdict
(with source lines) replaces the compile-time bounds pass and no guard is removed.

Only the device passes' modules load with this one; each analysis is imported when it first
runs (:class:`_Lazy`), so a compile that starts nvcc after the device passes (tlx/compiler.py)
does not wait for the analyses' imports first: they load beside nvcc.
"""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Callable
from dataclasses import dataclass

from tlx.lowering import LoweredKernel
from tlx.numerics import determinism, prelude, strict
from tlx.passes import PassContext, TlxError, verifying, verifying_exhaustively, viewed_params

__all__ = ["PASSES", "Pass", "pass_names", "run_passes"]

TlxPass = Callable[[LoweredKernel, PassContext], LoweredKernel]


@dataclass(frozen=True)
class Pass:
    name: str
    run: TlxPass | _Lazy
    enabled: Callable[[PassContext], bool] = lambda ctx: True


def _pinned(ctx: PassContext) -> bool:
    return bool(ctx.options.pin)


def _checking(ctx: PassContext) -> bool:
    return ctx.options.report_only


def _compile_time_bounds(ctx: PassContext) -> bool:
    return verifying(ctx) and not _checking(ctx)


def _removing_guards(ctx: PassContext) -> bool:
    return ctx.options.eliminate_guards and not _checking(ctx)


@dataclass(frozen=True)
class _Lazy:
    """The pass ``module.function``, imported when it first runs. An import that fails is a
    broken installation, not a pass that failed: :func:`run_passes` imports outside its guard."""

    module: str
    function: str

    def resolve(self) -> TlxPass:
        return getattr(importlib.import_module(self.module), self.function)


PASSES: tuple[Pass, ...] = (
    Pass("numerics_pin", _Lazy("tlx.numerics.pin", "pin_pass"), _pinned),
    Pass("reduce_barriers", _Lazy("tlx.passes.reduce_barriers", "reduce_barriers_pass")),
    Pass("layouts", _Lazy("tlx.passes.layouts", "layouts_pass"), verifying),
    Pass("banks", _Lazy("tlx.passes.banks", "banks_pass"), verifying_exhaustively),
    Pass("vectors", _Lazy("tlx.passes.vectors", "vectors_pass"), verifying),
    Pass("races", _Lazy("tlx.passes.races", "races_pass"), verifying_exhaustively),
    Pass("progress", _Lazy("tlx.passes.progress", "progress_pass"), verifying_exhaustively),
    Pass("registers", _Lazy("tlx.passes.progress", "register_budget_pass"), verifying),
    Pass("unchecked_assumes", _Lazy("tlx.passes.unchecked_assumes", "unchecked_assumes_pass"), verifying),
    Pass("bounds", _Lazy("tlx.passes.bounds", "bounds_pass"), _compile_time_bounds),
    Pass("check", _Lazy("tlx.passes.check", "check_pass"), _checking),
    Pass("eliminate_guards", _Lazy("tlx.passes.guards", "eliminate_guards_pass"), _removing_guards),
    Pass("viewed_params", viewed_params.viewed_params_pass),
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
            run = p.run.resolve() if isinstance(p.run, _Lazy) else p.run
            try:
                kernel = run(kernel, ctx)
            except Exception as e:
                # A pass that fails proves nothing and changes nothing: its report says so and the
                # compile goes on with the kernel as it was, unless the user asked for verify="error".
                if ctx.options.verify == "error" or isinstance(e, TlxError):
                    raise
                ctx.reports[p.name] = {"status": "failed", "error": f"{type(e).__name__}: {e}"}
                warnings.warn(f"tlx pass {p.name} failed on {kernel.name} ({type(e).__name__}: {e}); its result is unknown",
                              RuntimeWarning, stacklevel=2)
    return kernel
