"""``tlx check``: the verifier's result as one JSON object, human text, and an exit status.

Each analysis gives its own verdict: ``ok``, ``violation``, ``unknown``, ``error`` (the
analysis itself failed: a bug in tlx or a construct it cannot read) or ``not run``. The
analyses that *decide* (by default bounds, races, layouts, vectors and numerics; the
command line's ``--only`` chooses others) combine into the exit status: 1 when one of them
found a violation, else 2 when one of them failed, else 3 when one of them is unknown, else
0. Bank conflicts (performance), progress (a barrier protocol simulated: no thread waits
forever) and determinism (atomics, split reductions) are reported and decide only when named. Exit status 2 is also what the command line returns for an
internal error or bad usage, with a one-line message.

The JSON object has the bounds verdict's keys (``kernel, accesses, proven, violations,
unknown, preconditions, seconds``), ``verdicts`` (analysis -> verdict, exit code, whether
it decides, a one-line summary), ``exit_code`` and ``decided_by``; the other passes'
reports are top-level sections added through :meth:`CheckResult.add_section` (e.g.
``"layouts"``, ``"bank_conflicts"``, ``"vectors"``, ``"races"``). ``tlx check`` runs the
compile pipeline with ``report_only`` set, where :func:`check_pass` takes the bounds
pass's place.
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
from tlx.passes.preconditions import accesses_needing, derive_preconditions
from tlx.passes.verification import CheckedAccess, BoundsReport, verify_kernel

__all__ = ["ANALYSES", "DECIDING_BY_DEFAULT", "EXIT_ERROR", "CheckResult", "KernelSource", "check_kernel", "check_pass",
           "source_locator"]

_IDENT = re.compile(r"[A-Za-z_]\w*")

EXIT_ERROR = 2
"""Exit status when no verdict could be given: an analysis or tlx itself failed, or bad usage."""

# analysis -> (the pass that runs it, the section its report goes to)
ANALYSES: dict[str, tuple[str, str]] = {
    "bounds": ("check", "bounds"),
    "races": ("races", "races"),
    "progress": ("progress", "progress"),
    "layouts": ("layouts", "layouts"),
    "vectors": ("vectors", "vectors"),
    "banks": ("banks", "bank_conflicts"),
    "numerics": ("numerics_strict", "numerics"),
    "determinism": ("numerics_determinism", "determinism"),
}
DECIDING_BY_DEFAULT = ("bounds", "races", "layouts", "vectors", "numerics")
_VERDICT_EXIT = {"ok": EXIT_OK, "violation": EXIT_VIOLATION, "unknown": EXIT_UNKNOWN, "error": EXIT_ERROR, "not run": EXIT_OK}


def combine_exit(codes) -> int:
    """1 if any violation, else 2 if any error, else 3 if any unknown, else 0."""
    codes = set(codes)
    for code in (EXIT_VIOLATION, EXIT_ERROR, EXIT_UNKNOWN):
        if code in codes:
            return code
    return EXIT_OK


def section_verdict(analysis: str, payload: Any) -> tuple[str, str]:
    """(verdict, one-line summary) of an analysis' report section."""
    if not isinstance(payload, dict):
        return "error", f"unreadable report {payload!r:.80}"
    if payload.get("status") == "failed":
        return "error", str(payload.get("error", "the analysis failed"))
    summary = (payload.get("summary") or [""])[0]
    if analysis == "banks":
        worst = payload.get("max_degree", 0)
        verdict = "violation" if payload.get("conflicted") else "unknown" if payload.get("unknown") else "ok"
        return verdict, summary or f"worst conflict degree {worst}"
    if analysis == "determinism":
        flags = (payload.get("deterministic"), payload.get("batch_invariant"))
        failed = any(str(u).startswith("analysis failed") for u in payload.get("unresolved", []))
        verdict = "error" if failed else "unknown" if "unknown" in flags else "ok" if all(flags) else "violation"
        assumed = "".join(f", assuming {a}" for a in payload.get("assumptions", []))
        return verdict, f"deterministic: {flags[0]}, batch-invariant: {flags[1]}, {len(payload.get('findings', []))} findings{assumed}"
    code = payload.get("exit_code", EXIT_OK)
    verdict = {EXIT_OK: "ok", EXIT_VIOLATION: "violation", EXIT_UNKNOWN: "unknown"}.get(code, "error")
    if analysis == "numerics" and not summary:
        summary = f"mode {payload.get('mode')}, {len(payload.get('violations', []))} violations"
    return verdict, summary


@dataclass
class CheckResult:
    """Everything ``tlx check`` reports about one kernel; ``exit_code`` combines the verdicts of
    the ``deciding`` analyses."""

    kernel: str
    report: BoundsReport
    final: BoundsReport
    preconditions: list = field(default_factory=list)
    seconds: float = 0.0
    sections: dict[str, Any] = field(default_factory=dict)
    section_exit: dict[str, int] = field(default_factory=dict)
    source_lines: dict[str, str] = field(default_factory=dict)  # "file:line" -> text of that line
    needed_by: list = field(default_factory=list)  # per precondition: the accesses failing without it
    deciding: tuple[str, ...] = DECIDING_BY_DEFAULT  # the analyses whose verdicts make the exit status
    errors: dict[str, str] = field(default_factory=dict)  # analysis -> why it failed (no report)

    def add_section(self, name: str, payload: Any, exit_code: int | None = None) -> None:
        """Attach another pass's JSON-able report. An analysis' section (``ANALYSES``) gets its
        verdict from the report, or from ``exit_code`` (0, 1 or 3) when given."""
        if name in _CORE_KEYS or name == "bounds":
            raise ValueError(f"add_section: name {name!r} is reserved for the bounds verifier")
        if exit_code is not None and exit_code not in (EXIT_OK, EXIT_VIOLATION, EXIT_UNKNOWN):
            raise ValueError(f"add_section: exit_code must be 0, 1 or 3, got {exit_code!r}")
        self.sections[name] = payload
        if exit_code is not None:
            self.section_exit[name] = exit_code

    def verdicts(self) -> dict[str, dict]:
        """Analysis -> {verdict, exit_code, decides, summary}, one per analysis of ``ANALYSES``."""
        out = {}
        bounds = "violation" if self.violations else "unknown" if self.unknown else "ok"
        pre = f" under {len(self.preconditions)} preconditions" if self.preconditions else ""
        out["bounds"] = (bounds, f"{self.final.proven}/{self.final.checked} accesses proven{pre}, "
                                 f"{len(self.violations)} violations, {len(self.unknown)} unknown")
        by_section = {section: analysis for analysis, (_, section) in ANALYSES.items()}
        for section, payload in self.sections.items():
            analysis = by_section.get(section)
            if analysis is None:
                continue
            verdict, summary = section_verdict(analysis, payload)
            if section in self.section_exit:
                verdict = {EXIT_OK: "ok", EXIT_VIOLATION: "violation", EXIT_UNKNOWN: "unknown"}[self.section_exit[section]]
            out[analysis] = (verdict, summary)
        for analysis, why in self.errors.items():
            out[analysis] = ("error", why)
        return {a: {"verdict": out[a][0] if a in out else "not run", "exit_code": _VERDICT_EXIT[out[a][0] if a in out else "not run"],
                    "decides": a in self.deciding, "summary": out[a][1] if a in out else ""} for a in ANALYSES}

    @property
    def violations(self) -> list[CheckedAccess]:
        return self.final.violations()

    @property
    def unknown(self) -> list[CheckedAccess]:
        return self.final.unknowns()

    @property
    def exit_code(self) -> int:
        """The deciding analyses' verdicts combined (:func:`combine_exit`)."""
        return combine_exit(v["exit_code"] for v in self.verdicts().values() if v["decides"])

    def to_json(self) -> dict:
        out = {
            "kernel": self.kernel,
            "accesses": self.final.checked,
            "proven": self.final.proven,
            "violations": [_access_json(a) for a in self.violations],
            "unknown": [_access_json(a) for a in self.unknown],
            "preconditions": [
                {"condition": p.text, "origin": p.origin, "needed_by": [_access_json(a) for a in needs]}
                for p, needs in zip(self.preconditions, self.needed_by)
            ],
            "seconds": round(self.seconds, 4),
            "proven_without_preconditions": self.report.proven,
            "guards": dict(self.report.guards),
            "solver": {"queries": self.report.queries, "rlimit": self.report.rlimit_used},
        }
        out.update(self.sections)
        out["verdicts"] = self.verdicts()
        out["exit_code"] = self.exit_code
        out["decided_by"] = list(self.deciding)
        return out

    def human(self) -> str:
        lines = [f"kernel {self.kernel}: {self.final.proven}/{self.final.checked} accesses proven in bounds ({self.seconds:.2f} s)"]
        if self.preconditions:
            lines.append("safe only when " + " and ".join(p.text for p in self.preconditions) + " (the launcher checks this on every call)")
            for p, needs in zip(self.preconditions, self.needed_by):
                lines.append(f"without {p.text}:")
                lines += ["  " + line for a in needs for line in self._describe(a)]
        for title, items in (("violation", self.violations), ("unknown", self.unknown)):
            for a in items:
                lines.append(f"{title}:")
                lines += ["  " + line for line in self._describe(a)]
        analysis_sections = {section: analysis for analysis, (_, section) in ANALYSES.items()}
        for name, payload in self.sections.items():
            if name == "unchecked_assumes":  # tlx/passes/unchecked_assumes.py: a list, empty when none
                lines += [f"unchecked: T.assume({a['condition']}) names {', '.join(a['names']) or 'no bound parameter'}: "
                          "the launcher cannot check it and the proofs do not use it" for a in payload]
            elif name not in analysis_sections:
                lines.append(f"{name}: see --json")
        lines.append("verdicts:")
        for analysis, v in self.verdicts().items():
            role = "" if v["decides"] else "  (does not decide the exit status)"
            lines.append(f"  {analysis:<12} {v['verdict'].upper():<10} {v['summary'][:100]}{role}")
            payload = self.sections.get(ANALYSES[analysis][1])
            details = payload.get("summary", [])[1:] if isinstance(payload, dict) else []
            lines += [" " * 16 + line for line in details]
        code = self.exit_code
        verdict = {EXIT_OK: "OK", EXIT_VIOLATION: "VIOLATION", EXIT_UNKNOWN: "UNKNOWN", EXIT_ERROR: "ERROR"}[code]
        lines.append(f"exit {code}: {verdict}")
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
    report = verify_kernel(kernel, tuple(assume), source_map=locate, **kwargs)
    pre, final, needs = [], report, []
    if options.get("derive_preconditions", True) and (report.violations() or report.unknowns()):
        pre, final = derive_preconditions(kernel, report, tuple(assume), source_map=locate, **kwargs)
        needs = accesses_needing(kernel, pre, report, final, tuple(assume), source_map=locate, **kwargs) if pre else []
    return CheckResult(kernel.name, report, final, pre, time.perf_counter() - t0, source_lines=texts, needed_by=needs)


def check_pass(kernel: LoweredKernel, ctx: PassContext) -> LoweredKernel:
    """``tlx check``'s bounds verdict, with source lines, into ``ctx.check``."""
    ctx.check = check_kernel(kernel, {"assume": ctx.options.assume, "source": ctx.source})
    return kernel
