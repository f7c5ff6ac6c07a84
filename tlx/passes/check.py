"""``tlx check``: the verifier's result as one JSON object, human text, and an exit status.

Exit status: 0 when every access is proven (possibly under derived preconditions, which
are listed), 1 when a violation is found, 3 when only unknowns remain. The JSON object
has the bounds verdict's keys (``kernel, accesses, proven, violations, unknown,
preconditions, seconds``); the other passes' reports become top-level sections through
:meth:`CheckResult.add_section` (e.g. ``"layouts"``, ``"bank_conflicts"``, ``"vectors"``,
``"races"``), and a section may raise the exit status. ``tlx check`` runs the compile
pipeline with ``report_only`` set, where :func:`check_pass` takes the bounds pass's place.
"""

from __future__ import annotations

import inspect
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tlx.lowering import LoweredKernel
from tlx.passes import EXIT_OK, EXIT_UNKNOWN, EXIT_VIOLATION, PassContext
from tlx.passes.preconditions import derive_preconditions
from tlx.passes.verification import CheckedAccess, BoundsReport, verify_kernel

__all__ = ["CheckResult", "KernelSource", "check_kernel", "check_pass", "source_locator"]

_IDENT = re.compile(r"[A-Za-z_]\w*")


@dataclass
class CheckResult:
    """Everything ``tlx check`` reports about one kernel."""

    kernel: str
    report: BoundsReport
    final: BoundsReport
    preconditions: list = field(default_factory=list)
    seconds: float = 0.0
    sections: dict[str, Any] = field(default_factory=dict)
    section_exit: dict[str, int] = field(default_factory=dict)
    source_lines: dict[str, str] = field(default_factory=dict)  # "file:line" -> text of that line

    def add_section(self, name: str, payload: Any, exit_code: int = EXIT_OK) -> None:
        """Attach another analysis' JSON-able findings; ``exit_code`` 1 or 3 marks problems."""
        if name in _CORE_KEYS:
            raise ValueError(f"add_section: name {name!r} is reserved for the bounds verifier")
        if exit_code not in (EXIT_OK, EXIT_VIOLATION, EXIT_UNKNOWN):
            raise ValueError(f"add_section: exit_code must be 0, 1 or 3, got {exit_code!r}")
        self.sections[name] = payload
        self.section_exit[name] = exit_code

    @property
    def violations(self) -> list[CheckedAccess]:
        return self.final.violations()

    @property
    def unknown(self) -> list[CheckedAccess]:
        return self.final.unknowns()

    @property
    def exit_code(self) -> int:
        codes = [EXIT_VIOLATION if self.violations else EXIT_UNKNOWN if self.unknown else EXIT_OK]
        codes += list(self.section_exit.values())
        return EXIT_VIOLATION if EXIT_VIOLATION in codes else EXIT_UNKNOWN if EXIT_UNKNOWN in codes else EXIT_OK

    def to_json(self) -> dict:
        out = {
            "kernel": self.kernel,
            "accesses": self.final.checked,
            "proven": self.final.proven,
            "violations": [_access_json(a) for a in self.violations],
            "unknown": [_access_json(a) for a in self.unknown],
            "preconditions": [
                {"condition": p.text, "origin": p.origin, "needed_by": [_access_json(a) for a in self._needed_by()]}
                for p in self.preconditions
            ],
            "seconds": round(self.seconds, 4),
            "proven_without_preconditions": self.report.proven,
            "guards": dict(self.report.guards),
            "solver": {"queries": self.report.queries, "rlimit": self.report.rlimit_used},
        }
        out.update(self.sections)
        return out

    def _needed_by(self) -> list[CheckedAccess]:
        """The accesses that failed before the preconditions (with their counterexamples)."""
        if not self.preconditions:
            return []
        still = {a.key() for a in self.final.violations() + self.final.unknowns()}
        return [a for a in self.report.violations() + self.report.unknowns() if a.key() not in still]

    def human(self) -> str:
        lines = [f"kernel {self.kernel}: {self.final.proven}/{self.final.checked} accesses proven in bounds ({self.seconds:.2f} s)"]
        if self.preconditions:
            lines.append("safe only when " + " and ".join(p.text for p in self.preconditions) + " (the launcher checks this on every call); without them:")
            for a in self._needed_by():
                lines += ["  " + line for line in self._describe(a)]
        for title, items in (("violation", self.violations), ("unknown", self.unknown)):
            for a in items:
                lines.append(f"{title}:")
                lines += ["  " + line for line in self._describe(a)]
        for name, payload in self.sections.items():
            summary = payload.get("summary") if isinstance(payload, dict) else None
            if summary:
                lines.append(f"{name}: " + summary[0])
                lines += ["  " + line for line in summary[1:]]
            else:
                lines.append(f"{name}: see --json")
        verdict = {EXIT_OK: "OK", EXIT_VIOLATION: "VIOLATION", EXIT_UNKNOWN: "UNKNOWN"}[self.exit_code]
        lines.append(verdict)
        return "\n".join(lines)

    def _describe(self, a: CheckedAccess) -> list[str]:
        if a.kind == "overflow":
            out = [f"{a.source}: {a.extent} overflow computing {a.index}" + (f" (for {a.buffer})" if a.buffer else "")]
        else:
            out = [f"{a.source}: {a.kind} of {a.scope} buffer {a.buffer}[{a.index}] (extent {a.extent})"]
        text = self.source_lines.get(a.source)
        if text:
            out.append(f"    {text.strip()}")
        out.append(f"    {a.detail}")
        if a.counterexample:
            out.append("    counterexample: " + ", ".join(f"{k}={v}" for k, v in a.counterexample.items()))
        return out


_CORE_KEYS = {"kernel", "accesses", "proven", "violations", "unknown", "preconditions", "seconds"}


def _access_json(a: CheckedAccess) -> dict:
    return {
        "buffer": a.buffer,
        "scope": a.scope,
        "kind": a.kind,
        "index": a.index,
        "extent": a.extent,
        "counterexample": dict(a.counterexample),
        "source": a.source,
        "detail": a.detail,
        "data_dependent": a.data_dependent,
    }


@dataclass(frozen=True)
class KernelSource:
    """Lines of Python that hold a kernel's statements: ``lines`` start at line ``first`` of ``path``."""

    path: str
    first: int
    lines: tuple[str, ...]

    @staticmethod
    def of(obj: Any) -> KernelSource | None:
        """The source of the kernel factory underneath ``obj``: a ``@tlx.jit`` object (its
        ``factory``), a ``@tilelang.jit`` one (``func.orig_func``), a wrapper (``__wrapped__``),
        or a plain function (or one whose ``factory`` attribute names where its kernel was
        written); None when Python cannot read it (``python -c``, stdin)."""
        if isinstance(obj, KernelSource) or obj is None:
            return obj
        seen = set()
        while id(obj) not in seen:
            seen.add(id(obj))
            inner = next((getattr(obj, a) for a in ("factory", "orig_func", "func") if getattr(obj, a, None) is not None), None)
            if inner is None and not inspect.isfunction(obj):
                inner = getattr(obj, "__wrapped__", None)
            if inner is None:
                break
            obj = inner
        if not inspect.isfunction(obj):
            return None
        try:
            lines, first = inspect.getsourcelines(obj)
            path = inspect.getsourcefile(obj) or inspect.getfile(obj)
        except (OSError, TypeError):
            return None
        return KernelSource(path, first, tuple(lines))

    @staticmethod
    def named(path: str, name: str) -> KernelSource | None:
        """The top-level definition ``name`` in the file ``path`` (a bare ``@T.prim_func``)."""
        import ast

        text = Path(path).read_text()
        for node in ast.parse(text).body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
                first = min([node.lineno] + [d.lineno for d in node.decorator_list])
                lines = text.splitlines(keepends=True)[first - 1:node.end_lineno]
                return KernelSource(str(path), first, tuple(lines))
        return None


def source_locator(source: Any) -> tuple[Callable[..., str], dict[str, str]]:
    """Map (buffer name, access kind, device index text) to ``file:line`` in the kernel's source.

    ``source`` is anything :meth:`KernelSource.of` reads. TileLang keeps no spans through
    lowering, so this finds the line that stores to (``name[...] =`` or a ``T.copy`` into
    ``name``) or reads ``name``, preferring the line sharing most identifiers with the index;
    when nothing matches it says "unknown line" (and the verifier names the device statement).
    """
    found = KernelSource.of(source)
    if found is None:
        return (lambda name, kind, index="": "unknown line"), {}
    src, first = found.lines, found.first
    short = found.path.rsplit("/", 1)[-1]
    texts: dict[str, str] = {}

    def locate(name: str, kind: str, index: str = "") -> str:
        word = re.escape(name)
        store = re.compile(rf"(^|[^\w.]){word}\s*\[[^=]*\]\s*(\+|-|\*)?=(?!=)|T\.copy\(.*,\s*{word}\b")
        use = re.compile(rf"(^|[^\w.]){word}\s*[\[,)]")
        read = re.compile(rf"(?<![=!<>])=(?!=).*?(?<![\w.]){word}\s*\[|T\.copy\(\s*{word}\b")
        wanted = set(_IDENT.findall(index)) - {"T", "Cast", "int64", "int32", name}
        # where a variable gets its value: ``x = ...``, ``as (bx, x)``, ``for x in``
        define = re.compile(rf"(^|[^\w.]){word}\s*(:[^=]*)?=(?!=)|\bas\b[^:]*(?<![\w.]){word}\b|\bfor\b[^:]*(?<![\w.]){word}\b[^:]*\bin\b")
        patterns = [define, store, use] if kind == "overflow" else [store, use] if kind == "store" else [read, use, store]
        for pat in patterns:
            hits = []
            for i, line in enumerate(src):
                code = line.split("#", 1)[0]
                if pat.search(code) and "alloc_" not in code and "T.Tensor" not in code:
                    hits.append((-len(wanted & set(_IDENT.findall(code))), i, line))
            if hits:
                _, i, line = min(hits)
                loc = f"{short}:{first + i}"
                texts[loc] = line.rstrip("\n")
                return loc
        return "unknown line"

    return locate, texts


def check_kernel(kernel: LoweredKernel, options: dict | None = None) -> CheckResult:
    """Verify ``kernel`` as ``tlx check`` does.

    ``options``: ``assume`` (strings over shape variables), ``rlimit`` (per-query Z3
    budget), ``source`` (the kernel factory, ``@tlx.jit`` / ``@tilelang.jit`` object or
    :class:`KernelSource`, for source lines),
    ``derive_preconditions`` (default True).
    """
    options = dict(options or {})
    assume = options.get("assume", ())
    if isinstance(assume, str):
        assume = (assume,)
    rlimit = options.get("rlimit")
    kwargs = {"rlimit": int(rlimit)} if rlimit is not None else {}
    locate, texts = source_locator(options.get("source"))
    t0 = time.perf_counter()
    report, _ = verify_kernel(kernel, tuple(assume), source_map=locate, **kwargs)
    pre, final = [], report
    if options.get("derive_preconditions", True) and (report.violations() or report.unknowns()):
        pre, final = derive_preconditions(kernel, report, tuple(assume), source_map=locate, **kwargs)
    return CheckResult(kernel.name, report, final, pre, time.perf_counter() - t0, source_lines=texts)


def check_pass(kernel: LoweredKernel, ctx: PassContext) -> LoweredKernel:
    """``tlx check``'s bounds verdict, with source lines, into ``ctx.check``."""
    ctx.check = check_kernel(kernel, {"assume": ctx.options.assume, "source": ctx.source})
    return kernel
