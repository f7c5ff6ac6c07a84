"""tlx's own passes over TileLang's lowered IR.

A pass is a function ``(kernel: LoweredKernel, ctx: PassContext) -> LoweredKernel``.
Passes are registered in a fixed order; analyses put their findings into
``ctx.reports[name]`` and may add host-checked ``ctx.preconditions``; transforms
return a kernel with a rewritten ``device_mod``. The compiler runs them between
TileLang's lowering and device code generation.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tlx.lowering import LoweredKernel

__all__ = ["verifying", "verifying_exhaustively", "PassContext", "Precondition", "TlxPass", "register_pass", "registered_passes", "run_passes"]


@dataclass(frozen=True)
class Precondition:
    """A condition over symbolic shape variables that the launcher checks on every call.

    ``expr`` is a boolean TIR expression over the kernel's shape variables (``tvm.tirx.Var``);
    ``text`` is how it is shown to the user (``"K % 64 == 0"``); ``origin`` names the pass
    or access that needs it.
    """

    expr: Any
    text: str
    origin: str = ""


@dataclass
class PassContext:
    """What every pass sees: the tlx options of this compile and where results go."""

    options: dict[str, Any] = field(default_factory=dict)
    reports: dict[str, Any] = field(default_factory=dict)
    preconditions: list[Precondition] = field(default_factory=list)
    nvcc_flags: list[str] = field(default_factory=list)


TlxPass = Callable[[LoweredKernel, PassContext], LoweredKernel]


def verifying(ctx: PassContext) -> bool:
    """Cheap analyses run whenever ``verify`` is not "off"."""
    return ctx.options.get("verify", "warn") != "off"


def verifying_exhaustively(ctx: PassContext) -> bool:
    """Costly analyses (bank conflicts, races: seconds of Z3 per kernel) run under ``verify="error"``
    and in ``tlx check``, not in every default compile."""
    return ctx.options.get("verify") == "error" or bool(ctx.options.get("report_only"))


@dataclass(frozen=True)
class _Entry:
    name: str
    order: int
    fn: TlxPass
    enabled: Callable[[PassContext], bool]


_REGISTRY: dict[str, _Entry] = {}


def register_pass(name: str, order: int, enabled: Callable[[PassContext], bool] = lambda ctx: True):
    """Register ``fn`` as pass ``name``; passes run by ascending ``order``."""

    def wrap(fn: TlxPass) -> TlxPass:
        _REGISTRY[name] = _Entry(name, order, fn, enabled)
        return fn

    return wrap


def registered_passes() -> list[str]:
    _load_builtin_passes()
    return [e.name for e in sorted(_REGISTRY.values(), key=lambda e: e.order)]


def run_passes(kernel: LoweredKernel, ctx: PassContext, skip: tuple[str, ...] = ()) -> LoweredKernel:
    """Run every enabled registered pass in order, except those named in ``skip``."""
    _load_builtin_passes()
    for entry in sorted(_REGISTRY.values(), key=lambda e: e.order):
        if entry.name not in skip and entry.enabled(ctx):
            try:
                kernel = entry.fn(kernel, ctx)
            except Exception as e:
                # A pass that fails proves nothing and changes nothing: its report says so and the
                # compile goes on with the kernel as it was, unless the user asked for verify="error".
                if ctx.options.get("verify") == "error" or _is_user_error(e):
                    raise
                ctx.reports[entry.name] = {"status": "failed", "error": f"{type(e).__name__}: {e}"}
                warnings.warn(f"tlx pass {entry.name} failed on {kernel.name} ({type(e).__name__}: {e}); its result is unknown",
                              RuntimeWarning, stacklevel=2)
    return kernel


def _is_user_error(e: Exception) -> bool:
    """Errors that are verdicts about the user's kernel or options (not crashes of a pass) always propagate."""
    from tlx.numerics.pin import PinMismatchError
    from tlx.numerics.strict import ApproximateIntrinsicError
    from tlx.passes.assume import AssumptionError
    from tlx.passes.bounds import VerificationError
    from tlx.passes.layouts import LayoutError
    from tlx.passes.races import RaceError

    return isinstance(e, (VerificationError, ApproximateIntrinsicError, PinMismatchError, AssumptionError, LayoutError, RaceError))


def _load_builtin_passes() -> None:
    """Import the modules whose ``register_pass`` decorators fill the registry."""
    import importlib
    import pkgutil

    import tlx.passes as pkg

    for info in pkgutil.iter_modules(pkg.__path__):
        importlib.import_module(f"tlx.passes.{info.name}")
    import tlx.numerics  # noqa: F401  (numerics registers its checks too)
