"""Run ``tlx check`` over the kernels of a TileLang checkout's examples (code nobody here wrote).

    python bench/check_examples.py /path/to/tilelang [--only 'gemm/*'] [--out results.json]

Each example file runs in its own process: its ``main()`` is called with TileLang's compile
entry (``tilelang.jit``'s ``cached``) replaced by a trap that records the first ``PrimFunc``
it is asked to build and stops the example there, so no GPU is needed. The recorded kernel is
then checked exactly as a user would check it, through ``tlx check FILE::NAME --json`` on a
stub module that replays the capture (its ``factory`` is the example's, for source lines).
Each row gives the overall exit status, every analysis' own verdict, the accesses proven,
violations, unknowns (and how many hang on input data), preconditions, how many reported
items name a line of the example, and seconds; nothing is copied from the checkout.
"""

# cpu-only bench: scripts/gpu-check skips it (it needs a TileLang checkout, not a GPU)
from __future__ import annotations

import argparse
import contextlib
import fnmatch
import importlib.util
import io
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve()
sys.path.insert(0, str(HERE.parents[1]))  # tlx, for the progress analysis' wording

from tlx.passes.progress import LATE  # noqa: E402


TARGET = {"kind": "cuda", "arch": "sm_90a"}


class _Captured(Exception):
    """Raised by the trap to stop an example at its first compile."""


_FACTORIES = ("empty", "zeros", "ones", "full", "rand", "randn", "randint", "randperm", "arange", "tensor",
              "empty_like", "zeros_like", "ones_like", "rand_like", "randn_like", "full_like", "randint_like")


def _tensors_stay_on_the_cpu() -> None:
    """Eager-mode examples build their inputs on the GPU before the first compile; on a machine
    without one, keep them on the CPU (only their shapes and dtypes reach the kernel's TIR)."""
    import torch

    def cpu_only(fn):
        def wrapper(*args, **kwargs):
            if "device" in kwargs and "cuda" in str(kwargs["device"]):
                kwargs["device"] = "cpu"
            return fn(*args, **kwargs)

        return wrapper

    for name in _FACTORIES:
        setattr(torch, name, cpu_only(getattr(torch, name)))
    torch.Tensor.cuda = lambda self, *a, **k: self
    to = torch.Tensor.to

    def to_cpu(self, *args, **kwargs):
        args = tuple("cpu" if "cuda" in str(a) and not isinstance(a, torch.dtype) else a for a in args)
        if "cuda" in str(kwargs.get("device", "")):
            kwargs["device"] = "cpu"
        return to(self, *args, **kwargs)

    torch.Tensor.to = to_cpu


def calling_jit():
    """(the ``tilelang.jit`` object whose compile called the trap, that call's args, its kwargs),
    or (None, (), {}): its factory gives tlx check the example's source lines, its arguments name
    the kernel (bench/check_tilekernels.py)."""
    from tilelang.jit import JITImpl

    frame = sys._getframe(2)
    while frame is not None:
        if isinstance(frame.f_locals.get("self"), JITImpl):
            return frame.f_locals["self"], frame.f_locals.get("args", ()), frame.f_locals.get("kwargs", {})
        frame = frame.f_back
    return None, (), {}


def with_callers_configs(func, pass_configs=None, compile_flags=None):
    """``func`` with the pass configs and compile flags its caller gave TileLang's compile merged
    into the program's own attributes (the caller's configs win, as in TileLang), so that ``tlx
    check`` analyses the build TileLang would compile."""
    if pass_configs:
        own = dict(func.attrs["tilelang_pass_configs"]) if func.attrs and "tilelang_pass_configs" in func.attrs else {}
        func = func.with_attr("tilelang_pass_configs", {**own, **pass_configs})
    if compile_flags:
        own = list(func.attrs["tilelang_compile_flags"]) if func.attrs and "tilelang_compile_flags" in func.attrs else []
        flags = [compile_flags] if isinstance(compile_flags, str) else list(compile_flags)
        func = func.with_attr("tilelang_compile_flags", [str(f) for f in own] + flags)
    return func


def capture_first_kernel(example: str):
    """(the first PrimFunc that ``example``'s ``main()`` asks TileLang to compile, with the
    caller's pass configs and compile flags merged in, the ``tilelang.jit`` object that asked, or
    None)."""
    import tilelang.jit  # noqa: F401  (the package's ``jit`` attribute is the decorator, not this module)

    tj = sys.modules["tilelang.jit"]
    seen = []

    def trap(func=None, *args, **kwargs):
        seen.append((with_callers_configs(func, kwargs.get("pass_configs"), kwargs.get("compile_flags")),
                     calling_jit()[0]))
        raise _Captured

    tj.cached = trap
    _tensors_stay_on_the_cpu()
    path = Path(example)
    sys.path.insert(0, str(path.parent))
    spec = importlib.util.spec_from_file_location(f"example_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    argv, sys.argv = sys.argv, [str(path)]
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            spec.loader.exec_module(module)
            if not hasattr(module, "main"):
                raise LookupError(f"{path.name} has no main()")
            module.main()
    except _Captured:
        pass
    finally:
        sys.argv = argv
    if not seen:
        raise LookupError(f"{path.name}: main() returned without compiling a kernel")
    return seen[0]


def _child(example: str) -> None:
    """Check one example's kernel and print the JSON verdict (one line)."""
    from tlx.cli import main as tlx_main

    with tempfile.TemporaryDirectory() as tmp:
        stub = Path(tmp) / "captured.py"
        # The stub's ``kernel`` is a factory returning the capture; its ``factory`` attribute
        # points tlx check at the example's own source for line numbers.
        stub.write_text(
            f"import sys\nsys.path.insert(0, {str(HERE.parent)!r})\n"
            f"from check_examples import capture_first_kernel\n_prim, _jit = capture_first_kernel({example!r})\n\n\n"
            "def kernel():\n    return _prim\n\n\nkernel.factory = _jit\n"
        )
        out, err = io.StringIO(), io.StringIO()
        t0 = time.perf_counter()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = tlx_main(["check", f"{stub}::kernel", "--json"])
        seconds = time.perf_counter() - t0
    result = json.loads(out.getvalue()) if out.getvalue().strip() else None
    print(json.dumps({"example": example, "exit": code, "seconds": seconds, "result": result, "stderr": err.getvalue()[-300:]}))


def _examples(root: Path, only: str | None) -> list[Path]:
    files = []
    for p in sorted((root / "examples").rglob("*.py")):
        rel = p.relative_to(root / "examples").as_posix()
        if p.name.startswith(("test_", "conftest")) or (only and not fnmatch.fnmatch(rel, only)):
            continue
        text = p.read_text(errors="replace")
        if "def main(" in text and ("tilelang.jit" in text or "@jit" in text or "tilelang.compile" in text):
            files.append(p)
    return files


ANALYSES = ("bounds", "races", "progress", "layouts", "vectors", "banks", "numerics", "determinism")
_EXIT = {0: "ok", 1: "violation", 2: "error", 3: "unknown"}


def _items(res: dict) -> list[dict]:
    """Every item the bounds report shows a user: violations, unknowns, and each access a
    precondition is needed by."""
    return res.get("violations", []) + res.get("unknown", []) + [a for p in res.get("preconditions", []) for a in p["needed_by"]]


def _row(example: str, rec: dict) -> dict:
    if "result" not in rec:
        return {"example": example, "status": rec["status"], "detail": rec.get("detail", "")}
    res = rec["result"]
    if res is None:
        message = rec.get("stderr", "").strip()
        # The example's own module or main() failed here (a missing package, no GPU): not tlx's verdict.
        status = "not captured" if "cannot import" in message or "cannot build" in message else f"exit {rec['exit']}"
        return {"example": example, "status": status, "detail": message[-200:]}
    verdicts = res.get("verdicts", {})
    items = _items(res)
    return {
        "example": example,
        "status": _EXIT.get(rec["exit"], f"exit {rec['exit']}"),  # the overall exit status (default deciding set)
        **{a: verdicts.get(a, {}).get("verdict", "?") for a in ANALYSES},
        "accesses": res.get("accesses", 0),
        "proven": res.get("proven", 0),
        "violations": len(res.get("violations", [])),
        "unknown": len(res.get("unknown", [])),
        "data_dependent": sum(a.get("data_dependent", False) for a in res.get("violations", []) + res.get("unknown", [])),
        "preconditions": [p["condition"] for p in res.get("preconditions", [])],
        "items": len(items),
        "items_with_line": sum(bool(re.match(r"[^:\s]+\.py:\d+$", a["source"])) for a in items),
        # the vectors analysis' performance note: selects that are an if/else per vector in a loop
        "branching_selects": len((res.get("vectors") or {}).get("branches", [])),
        "branching_selects_unconditional": sum(not b["conditional"] for b in (res.get("vectors") or {}).get("branches", [])),
        "unchecked_assumes": [a["condition"] for a in res.get("unchecked_assumes", [])],  # tlx/passes/unchecked_assumes.py
        # progress unknown only for threads that poll a barrier and fell behind it (tlx/passes/progress.py's LATE)
        "progress_late": any(LATE in k.get("detail", "") for k in (res.get("progress") or {}).get("kernels", [])),
        "seconds": round(rec["seconds"], 2),
        "verify_seconds": res.get("seconds", 0.0),  # the bounds verdict alone (with preconditions)
        "violation_detail": res.get("violations", []),
        "unknown_detail": res.get("unknown", []),
    }


def _table(rows: list[dict]) -> str:
    checked = [r for r in rows if "accesses" in r]
    accesses = sum(r["accesses"] for r in checked)
    proven = sum(r["proven"] for r in checked)
    items = sum(r["items"] for r in checked)
    lines = [
        "| examples | checked | accesses | proven | proof rate | violations | unknown | data-dependent | items with a source line "
        "| median s (bounds) | median s (whole tlx check) |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
        f"| {len(rows)} | {len(checked)} | {accesses} | {proven} | {proven / max(accesses, 1):.2%} | "
        f"{sum(r['violations'] for r in checked)} | {sum(r['unknown'] for r in checked)} | {sum(r['data_dependent'] for r in checked)} | "
        f"{sum(r['items_with_line'] for r in checked)}/{items} | "
        f"{statistics.median([r['verify_seconds'] for r in checked]) if checked else 0:.2f} | "
        f"{statistics.median([r['seconds'] for r in checked]) if checked else 0:.2f} |",
        "",
        "| analysis | ok | violation | unknown | error | not run |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for a in ANALYSES + ("status",):
        counts = [sum(r.get(a) == v for r in checked) for v in ("ok", "violation", "unknown", "error", "not run")]
        lines.append(f"| {a if a != 'status' else 'exit status (default deciding set)'} | " + " | ".join(map(str, counts)) + " |")
    branchy = [r for r in checked if r.get("branching_selects")]
    lines += ["", f"branching selects (vectors' note): {sum(r['branching_selects'] for r in branchy)} in {len(branchy)} examples "
              f"({sum(r['branching_selects_unconditional'] for r in branchy)} not on a conditional path)"
              + "".join(f"; {r['example']} {r['branching_selects']}" for r in branchy)]
    late = [r["example"] for r in checked if r.get("progress_late")]
    lines.append(f"progress unknown because a polling thread fell two phases behind (a fair schedule finishes): {len(late)} examples")
    assumed = [r for r in checked if r.get("unchecked_assumes")]
    lines.append(f"unchecked T.assume (kept on the device, checked nowhere): {sum(len(r['unchecked_assumes']) for r in assumed)} "
                 f"in {len(assumed)} examples" + "".join(f"; {r['example']}: " + ", ".join(r["unchecked_assumes"]) for r in assumed))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("checkout", nargs="?", help="a TileLang source checkout (its examples/ folder is read)")
    ap.add_argument("--only", help="glob over paths under examples/, e.g. 'gemm/*'")
    ap.add_argument("--timeout", type=int, default=180, help="seconds per example")
    ap.add_argument("--out", help="write every row as JSON here")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        _child(args.child)
        return 0
    if not args.checkout:
        ap.error("the path of a TileLang checkout is required")
    root = Path(args.checkout)
    rows = []
    for ex in _examples(root, args.only):
        rel = ex.relative_to(root / "examples").as_posix()
        # No GPU is needed: TileLang resolves its target from this variable instead of probing a device.
        env = {**os.environ, "TILELANG_DEFAULT_TARGET": json.dumps(TARGET)}
        try:
            proc = subprocess.run([sys.executable, str(HERE), "--child", str(ex)], capture_output=True, text=True,
                                  timeout=args.timeout, env=env)
            lines = [ln for ln in proc.stdout.splitlines() if ln.startswith('{"example"')]
            if lines:
                rec = json.loads(lines[-1])
            else:
                tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
                status = "not captured" if "LookupError" in proc.stderr or "_Captured" not in proc.stderr else "error"
                rec = {"status": "not captured" if "LookupError" in tail else status, "detail": tail[:200]}
        except subprocess.TimeoutExpired:
            rec = {"status": "timeout", "detail": f"over {args.timeout} s"}
        rows.append(_row(rel, rec))
        print(json.dumps({k: v for k, v in rows[-1].items() if not k.endswith("_detail")}), flush=True)
    print()
    print(_table(rows))
    for r in rows:
        if r.get("violations") or r.get("unknown") or r["status"] not in ("ok", "violation", "unknown"):
            print(f"- {r['example']}: {r['status']} (bounds {r.get('bounds', '-')}) {r.get('detail', '')}")
            for v in r.get("violation_detail", []) + r.get("unknown_detail", []):
                print(f"    {json.dumps(v)[:400]}")
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
