"""tlx's own passes over TileLang's lowered IR: what every pass shares.

A pass is a function ``(kernel: LoweredKernel, ctx: PassContext) -> LoweredKernel``; the
order they run in is the list in :mod:`tlx.passes.pipeline`. Analyses put their findings
into ``ctx.reports[name]`` (a dict whose ``exit_code`` follows ``tlx check``: 0 fine, 1 a
proven problem, 3 unknowns) and may add host-checked ``ctx.preconditions``; transforms
return a kernel with a rewritten ``device_mod``. A verdict about the user's kernel or
options is a :class:`TlxError`; :func:`raise_or_warn` turns one into an exception or a
warning according to ``verify``.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field, fields
from typing import Any

__all__ = ["EXIT_OK", "EXIT_UNKNOWN", "EXIT_VIOLATION", "GuardProofs", "PassContext", "PassOptions", "Precondition", "TlxError", "exit_status",
           "raise_or_warn", "verifying", "verifying_exhaustively"]

EXIT_OK, EXIT_VIOLATION, EXIT_UNKNOWN = 0, 1, 3


class TlxError(Exception):
    """A verdict about the user's kernel or options (never a crash of a pass): it always
    reaches the user, whatever ``verify`` says."""


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


@dataclass(frozen=True)
class GuardProofs:
    """The bound-check guards that the bounds pass proved always true of ``kernel`` (its walk
    proves them beside the accesses) under exactly ``preconditions`` as facts: guard
    elimination uses them instead of walking the kernel a second time, while the kernel and
    the launcher's preconditions are still those."""

    kernel: Any
    preconditions: tuple[Precondition, ...]
    proven: frozenset
    stats: dict


@dataclass(frozen=True)
class PassOptions:
    """The options the passes read, typed. Built from the compile's option dict
    (:func:`tlx.compiler.pass_options`), whose other keys (the cache key's) they do not read.

    ``report_only``: ``tlx check``'s mode (report every finding, raise none); ``skip_passes``:
    passes not to run; ``race_budget`` / ``bank_budget``: Z3 resource units for the race and
    bank-conflict proofs per kernel (None: the pass's own default).
    """

    verify: str = "warn"
    assume: tuple[str, ...] = ()
    numerics: str = "default"
    allow_approx: tuple[str, ...] = ()
    eliminate_guards: bool = True
    pin: str | None = None
    report_only: bool = False
    skip_passes: tuple[str, ...] = ()
    race_budget: int | None = None
    bank_budget: int | None = None

    @staticmethod
    def from_dict(options: dict) -> PassOptions:
        names = {f.name for f in fields(PassOptions)}
        given = {k: v for k, v in options.items() if k in names}
        for key in ("assume", "allow_approx", "skip_passes"):
            if key in given:
                value = given[key]
                given[key] = (value,) if isinstance(value, str) else tuple(value)
        return PassOptions(**given)


@dataclass
class PassContext:
    """What every pass sees: the tlx options of this compile and where results go.

    ``options`` may be given as a dict and is kept as :class:`PassOptions`. ``source`` is the
    kernel factory (for source lines in ``tlx check``); ``check`` receives ``tlx check``'s
    bounds verdict when the options ask for a check (``report_only``); ``guard_proofs`` the
    bounds pass's proven guards, for guard elimination.
    """

    options: PassOptions = field(default_factory=PassOptions)
    reports: dict[str, Any] = field(default_factory=dict)
    preconditions: list[Precondition] = field(default_factory=list)
    nvcc_flags: list[str] = field(default_factory=list)
    source: Any = None
    check: Any = None
    guard_proofs: GuardProofs | None = None

    def __post_init__(self):
        if isinstance(self.options, dict):
            self.options = PassOptions.from_dict(self.options)


def verifying(ctx: PassContext) -> bool:
    """Cheap analyses run whenever ``verify`` is not "off"."""
    return ctx.options.verify != "off"


def verifying_exhaustively(ctx: PassContext) -> bool:
    """Costly analyses (bank conflicts, races: seconds of Z3 per kernel) run under ``verify="error"``
    and in ``tlx check``, not in every default compile."""
    return ctx.options.verify == "error" or ctx.options.report_only


def raise_or_warn(ctx: PassContext, error: TlxError) -> None:
    """Raise ``error`` under ``verify="error"``, else show it as a warning and go on."""
    if ctx.options.verify == "error":
        raise error
    warnings.warn(str(error), stacklevel=3)


def exit_status(problems: int, unknown: int) -> int:
    """``tlx check``'s exit status for a report: 1 with proven problems, else 3 with unknowns, else 0."""
    return EXIT_VIOLATION if problems else EXIT_UNKNOWN if unknown else EXIT_OK
