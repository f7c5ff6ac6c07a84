"""``Options``: everything besides the program that decides a compiled kernel.

Its own module because both the decorator (``tlx.jit``) and the compiler (``tlx.compiler``)
need it, and neither should import the other for it.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tlx.numerics.modes import NUMERICS_MODES

__all__ = ["Options", "VERIFY_MODES", "cache_dir", "freeze"]

VERIFY_MODES = ("error", "warn", "off")


@dataclass(frozen=True)
class Options:
    """Everything besides the program that decides the compiled artifact."""

    out_idx: tuple[int, ...] = ()
    target: Any = None
    pass_configs: tuple[tuple[str, Any], ...] = ()
    verify: str = "warn"
    assume: tuple[str, ...] = ()
    numerics: str = "default"
    eliminate_guards: bool = True
    allow_approx: tuple[str, ...] = ()
    pin: str | None = None
    extra: tuple[tuple[str, Any], ...] = field(default=())

    @staticmethod
    def make(
        out_idx: int | Sequence[int] | None = None,
        target: Any = None,
        pass_configs: dict | None = None,
        verify: str = "warn",
        assume: Sequence[str] = (),
        numerics: str = "default",
        eliminate_guards: bool = True,
        allow_approx: Sequence[str] = (),
        pin: str | None = None,
        **extra: Any,
    ) -> Options:
        if verify not in VERIFY_MODES:
            raise ValueError(f"verify: expected one of {VERIFY_MODES}, got {verify!r}")
        if numerics not in NUMERICS_MODES:
            raise ValueError(f"numerics: expected one of {sorted(NUMERICS_MODES)}, got {numerics!r}")
        if isinstance(assume, str):
            assume = (assume,)
        if out_idx is None:
            out = ()
        elif isinstance(out_idx, int):
            out = (out_idx,)
        else:
            out = tuple(int(i) for i in out_idx)
        return Options(
            out_idx=out,
            target=freeze(target),
            pass_configs=tuple(sorted((k, freeze(v)) for k, v in (pass_configs or {}).items())),
            verify=verify,
            assume=tuple(assume),
            numerics=numerics,
            eliminate_guards=bool(eliminate_guards),
            allow_approx=tuple(allow_approx),
            pin=pin,
            extra=tuple(sorted((k, freeze(v)) for k, v in extra.items())),
        )

    def replace(self, **changes: Any) -> Options:
        """These options with ``changes`` (any argument of :meth:`make`), validated as ``make`` does."""
        current = dict(out_idx=self.out_idx, target=self.target, pass_configs=dict(self.pass_configs), verify=self.verify,
                       assume=self.assume, numerics=self.numerics, eliminate_guards=self.eliminate_guards,
                       allow_approx=self.allow_approx, pin=self.pin, **dict(self.extra))
        return Options.make(**{**current, **changes})

    def target_dict(self):
        return dict(self.target) if isinstance(self.target, tuple) else self.target

    def pass_config_dict(self) -> dict:
        return {k: _thaw(v) for k, v in self.pass_configs}


def freeze(v):
    """A hashable form of an option value (dicts and lists become sorted tuples)."""
    if isinstance(v, dict):
        return tuple(sorted((k, freeze(x)) for k, x in v.items()))
    if isinstance(v, list):
        return tuple(freeze(x) for x in v)
    return v


def _thaw(v):
    return list(v) if isinstance(v, tuple) else v


def cache_dir() -> Path:
    """Where tlx keeps its builds (``$TLX_CACHE_DIR``, else ``~/.cache/tlx``)."""
    return Path(os.environ.get("TLX_CACHE_DIR", Path.home() / ".cache" / "tlx"))
