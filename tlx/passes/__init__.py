"""tlx's own passes over TileLang's lowered IR.

A pass is a function ``(kernel: LoweredKernel, ctx: PassContext) -> LoweredKernel``.
Passes are registered in a fixed order; analyses put their findings into
``ctx.reports[name]`` and may add host-checked ``ctx.preconditions``; transforms
return a kernel with a rewritten ``device_mod``. The compiler runs them between
TileLang's lowering and device code generation.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tlx.lowering import LoweredKernel

__all__ = ["PassContext", "Precondition", "TlxPass", "register_pass", "registered_passes", "run_passes"]


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
            kernel = entry.fn(kernel, ctx)
    return kernel


def _load_builtin_passes() -> None:
    """Import the modules whose ``register_pass`` decorators fill the registry."""
    import importlib
    import pkgutil

    import tlx.passes as pkg

    for info in pkgutil.iter_modules(pkg.__path__):
        importlib.import_module(f"tlx.passes.{info.name}")
    import tlx.numerics  # noqa: F401  (numerics registers its checks too)
