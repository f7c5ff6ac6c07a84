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
from dataclasses import dataclass, field
from typing import Any

__all__ = ["EXIT_OK", "EXIT_UNKNOWN", "EXIT_VIOLATION", "PassContext", "Precondition", "TlxError", "exit_status",
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


@dataclass
class PassContext:
    """What every pass sees: the tlx options of this compile and where results go.

    ``source`` is the kernel factory (for source lines in ``tlx check``); ``check`` receives
    ``tlx check``'s bounds verdict when the options ask for a check (``report_only``).
    """

    options: dict[str, Any] = field(default_factory=dict)
    reports: dict[str, Any] = field(default_factory=dict)
    preconditions: list[Precondition] = field(default_factory=list)
    nvcc_flags: list[str] = field(default_factory=list)
    source: Any = None
    check: Any = None


def verifying(ctx: PassContext) -> bool:
    """Cheap analyses run whenever ``verify`` is not "off"."""
    return ctx.options.get("verify", "warn") != "off"


def verifying_exhaustively(ctx: PassContext) -> bool:
    """Costly analyses (bank conflicts, races: seconds of Z3 per kernel) run under ``verify="error"``
    and in ``tlx check``, not in every default compile."""
    return ctx.options.get("verify") == "error" or bool(ctx.options.get("report_only"))


def raise_or_warn(ctx: PassContext, error: TlxError) -> None:
    """Raise ``error`` under ``verify="error"``, else show it as a warning and go on."""
    if ctx.options.get("verify", "warn") == "error":
        raise error
    warnings.warn(str(error), stacklevel=3)


def exit_status(problems: int, unknown: int) -> int:
    """``tlx check``'s exit status for a report: 1 with proven problems, else 3 with unknowns, else 0."""
    return EXIT_VIOLATION if problems else EXIT_UNKNOWN if unknown else EXIT_OK
