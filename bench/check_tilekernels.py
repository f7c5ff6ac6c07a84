"""Run tlx over DeepSeek's TileKernels (TileLang kernels nobody here wrote), on the CPU.

    python bench/check_tilekernels.py /path/to/TileKernels [--per-test 4] [--per-factory 2]
        [--only 'quant/*'] [--jobs 2] [--out results.json]

TileKernels' own pytest suite picks the kernels and their arguments; nothing is copied from it.

1. Capture: one process runs the suite's test items (of each test function the first and a
   seeded sample, ``--per-test`` in all; benchmark items left out) with TileLang's compile entry
   replaced by ``bench/check_examples.py``'s trap: each item stops at its first compile, which
   is recorded as the ``tilelang.jit`` factory, its arguments and the item's node id. Tensors the
   tests create on the GPU stay on the CPU; device queries answer as an H200 (132 SMs, 228 KB of
   shared memory a SM): only shapes, dtypes and those numbers reach a kernel's TIR.
2. Every distinct (factory, arguments), up to ``--per-factory`` of each factory, goes to a fresh
   process that reruns its item to the same capture and
   a. checks it as a user would, ``tlx check FILE::kernel --json`` on a stub that replays the
      capture (the factory's source gives the report's lines);
   b. builds it through tlx to a linked launcher (the factory's pass configs and ``out_idx``),
      counting the guards tlx removed as proven redundant, and lowers it with TileLang's own
      ``tilelang.lower`` under the same pass configs: with guard removal off, the two CUDA
      sources must be the same program (equal up to TileLang's numbering of reduction
      workspaces, which varies from process to process).

TileKernels is written against a newer TileLang: ``bench/foreign_suites.py`` serves the one
import 0.1.15 lacks, with "auto" meaning sm_90a here (no device to probe).
"""

# cpu-only bench: scripts/gpu-check skips it (it needs a TileKernels checkout, not a GPU)
from __future__ import annotations

import argparse
import contextlib
import fnmatch
import io
import json
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve()
sys.path.insert(0, str(HERE.parent))

import check_examples  # noqa: E402  (the trap, the rows and the table are shared)
from foreign_suites import sample_per_test, serve_newer_imports  # noqa: E402

TARGET = check_examples.TARGET


class _H200Properties:
    """What ``torch.cuda.get_device_properties`` answers here: the numbers kernels size by."""

    name = "NVIDIA H200"
    major, minor = 9, 0
    multi_processor_count = 132
    shared_memory_per_multiprocessor = 233472
    shared_memory_per_block_optin = 232448
    total_memory = 141 << 30


def _no_device_needed() -> None:
    import torch

    check_examples._tensors_stay_on_the_cpu()
    torch.cuda.get_device_properties = lambda *a, **k: _H200Properties()
    torch.cuda.current_device = lambda: 0
    torch.cuda.synchronize = lambda *a, **k: None


def _factory_name(jit) -> str:
    fn = getattr(jit, "func", None)
    fn = getattr(fn, "orig_func", None) or getattr(fn, "func", None) or fn
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"


class _Capture:
    """A pytest plugin: the trap in place, each item's first compile recorded, items sampled."""

    def __init__(self, per_test: int | None = None, only: str | None = None):
        self.per_test, self.only = per_test, only
        self.records: list[dict] = []
        self._item = None

    def install(self) -> None:
        import tilelang.jit  # noqa: F401

        def trap(func=None, *args, **kwargs):
            jit, call_args, call_kwargs = check_examples.calling_jit()
            self.records.append({"nodeid": self._item, "prim": func, "jit": jit, "compile": kwargs,
                                 "factory": _factory_name(jit),
                                 "key": f"{_factory_name(jit)}{call_args!r}{sorted(call_kwargs.items())!r}"})
            raise check_examples._Captured

        sys.modules["tilelang.jit"].cached = trap
        _no_device_needed()

    def pytest_collection_modifyitems(self, session, config, items):
        if self.per_test is None:
            return
        by_id = {item.nodeid: item for item in items
                 if not self.only or fnmatch.fnmatch(item.nodeid.split("::")[0].removeprefix("tests/"), self.only)}
        items[:] = [by_id[n] for n in sample_per_test(list(by_id), self.per_test)]

    def pytest_runtest_setup(self, item):
        self._item = item.nodeid


def _run_pytest(checkout: Path, args: list[str], plugin: _Capture) -> None:
    """TileKernels' pytest in this process (its conftest imports TileLang through the shim)."""
    import pytest

    serve_newer_imports(auto_target=TARGET)
    plugin.install()
    sys.path.insert(0, str(checkout))
    os.chdir(checkout)
    with contextlib.redirect_stdout(io.StringIO()):
        pytest.main(["-q", "-p", "no:cacheprovider", "-p", "no:randomly", *args], plugins=[plugin])


def capture_item(checkout: str, nodeid: str):
    """(the PrimFunc with the compile's pass configs and flags merged in (what ``tlx check`` is to
    analyse), the ``tilelang.jit`` object, the compile keywords) of ``nodeid``'s first compile."""
    plugin = _Capture()
    _run_pytest(Path(checkout), [nodeid], plugin)
    if not plugin.records:
        raise LookupError(f"{nodeid}: no kernel compiled")
    rec = plugin.records[0]
    kw = rec["compile"]
    return (check_examples.with_callers_configs(rec["prim"], kw.get("pass_configs"), kw.get("compile_flags")),
            rec["jit"], kw)


def _capture_all(checkout: Path, per_test: int, only: str | None) -> list[dict]:
    plugin = _Capture(per_test, only)
    _run_pytest(checkout, ["tests"], plugin)
    return [{k: r[k] for k in ("nodeid", "factory", "key")} for r in plugin.records]


def _build_and_compare(prim, compile_kwargs: dict, name: str) -> dict:
    """tlx's build of the capture (to a linked launcher, default options) and TileLang's own
    lowering: the same CUDA, once tlx's one deliberate change (removing the guards it proved
    redundant) is turned off?"""
    import shutil

    import tilelang
    from tilelang import tvm
    from tilelang_examples import _cuda_hashes

    from tlx.compiler import compile_artifacts
    from tlx.options import Options

    pass_configs = dict(compile_kwargs.get("pass_configs") or {})
    options = Options.make(out_idx=compile_kwargs.get("out_idx"), target=TARGET, pass_configs=pass_configs)
    t0 = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()):
        _, build = compile_artifacts(prim, options, name=name, keep_workdir=True)
        kept, _ = compile_artifacts(prim, options.replace(eliminate_guards=False), name=name, stop_after="cuda")
    try:
        linked = (build.workdir / "launcher.so").is_file()
    finally:
        shutil.rmtree(build.workdir, ignore_errors=True)
    tlx_seconds = time.perf_counter() - t0
    target = tvm.target.Target(TARGET)
    with tvm.transform.PassContext(opt_level=3, config=pass_configs), target:
        artifact = tilelang.lower(prim, target=target)
    tl_hashes, tx_hashes = _cuda_hashes(artifact.kernel_source), _cuda_hashes(kept)
    same = "same CUDA" if tl_hashes[0] == tx_hashes[0] else (
        "same up to workspace numbering" if tl_hashes[1] == tx_hashes[1] else "CUDA DIFFERS")
    return {"build": "linked" if linked else "no launcher", "cuda": same, "build_seconds": round(tlx_seconds, 1),
            "guards_removed": build.reports.get("eliminate_guards", {}).get("removed", 0)}


def _child(checkout: str, nodeid: str) -> None:
    """Check and build one item's kernel; print one JSON line."""
    from tlx.cli import main as tlx_main

    rec: dict = {"nodeid": nodeid}
    with tempfile.TemporaryDirectory() as tmp:
        stub = Path(tmp) / "captured.py"
        stub.write_text(
            f"import sys\nsys.path.insert(0, {str(HERE.parent)!r})\n"
            f"from check_tilekernels import capture_item\n_prim, _jit, _kw = capture_item({checkout!r}, {nodeid!r})\n\n\n"
            "def kernel():\n    return _prim\n\n\nkernel.factory = _jit\n")
        out, err = io.StringIO(), io.StringIO()
        t0 = time.perf_counter()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = tlx_main(["check", f"{stub}::kernel", "--json"])
        rec.update(exit=code, seconds=time.perf_counter() - t0, stderr=err.getvalue()[-300:],
                   result=json.loads(out.getvalue()) if out.getvalue().strip() else None)
        stub_module = sys.modules.get("captured")
    if stub_module is not None:
        try:
            rec["dropin"] = _build_and_compare(stub_module._prim, stub_module._kw, "kernel")
        except Exception as e:  # noqa: BLE001  (reported in the row: a build tlx could not do)
            rec["dropin"] = {"build": f"FAILED: {type(e).__name__}: {str(e).strip().splitlines()[0][:240] if str(e).strip() else ''}"}
    print(json.dumps({"tilekernels": rec}, default=str))


def _check_one(checkout: Path, item: dict, timeout: int) -> dict:
    env = {**os.environ, "TILELANG_DEFAULT_TARGET": json.dumps(TARGET), "TILELANG_PRINT_ON_COMPILATION": "0"}
    try:
        proc = subprocess.run([sys.executable, str(HERE), str(checkout), "--child", item["nodeid"]],
                              capture_output=True, text=True, timeout=timeout, env=env)
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith('{"tilekernels"')]
        if lines:
            rec = json.loads(lines[-1])["tilekernels"]
        else:
            rec = {"status": "error", "detail": (proc.stderr.strip().splitlines() or ["no output"])[-1][:200]}
    except subprocess.TimeoutExpired:
        rec = {"status": "timeout", "detail": f"over {timeout} s"}
    row = check_examples._row(item["factory"], rec)
    row.update(nodeid=item["nodeid"], **{f"dropin_{k}": v for k, v in (rec.get("dropin") or {}).items()})
    return row


def _distinct(records: list[dict], per_factory: int) -> list[dict]:
    seen, count, chosen = set(), {}, []
    for r in records:
        if r["key"] in seen or count.get(r["factory"], 0) >= per_factory:
            continue
        seen.add(r["key"])
        count[r["factory"]] = count.get(r["factory"], 0) + 1
        chosen.append(r)
    return chosen


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("checkout", help="a TileKernels source checkout (its tests/ drive the kernels)")
    ap.add_argument("--per-test", type=int, default=4, help="items sampled per test function")
    ap.add_argument("--per-factory", type=int, default=2, help="distinct kernels checked per factory")
    ap.add_argument("--only", help="glob over test files under tests/, e.g. 'quant/*'")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--timeout", type=int, default=600, help="seconds per kernel")
    ap.add_argument("--out", help="write every row as JSON here")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--capture-only", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    checkout = Path(args.checkout).resolve()
    if args.child:
        _child(str(checkout), args.child)
        return 0
    if args.capture_only:
        print(json.dumps(_capture_all(checkout, args.per_test, args.only)))
        return 0
    env = {**os.environ, "TILELANG_DEFAULT_TARGET": json.dumps(TARGET), "TILELANG_PRINT_ON_COMPILATION": "0"}
    cmd = [sys.executable, str(HERE), str(checkout), "--capture-only", "--per-test", str(args.per_test)]
    proc = subprocess.run(cmd + (["--only", args.only] if args.only else []), capture_output=True, text=True, env=env)
    if proc.returncode:
        raise SystemExit(f"capture failed: {proc.stderr.strip()[-500:]}")
    records = json.loads(proc.stdout.strip().splitlines()[-1])
    chosen = _distinct(records, args.per_factory)
    print(f"{len(records)} items captured, {len({r['key'] for r in records})} distinct kernels of "
          f"{len({r['factory'] for r in records})} factories; checking {len(chosen)}", flush=True)
    with ThreadPoolExecutor(args.jobs) as pool:
        rows = []
        for row in pool.map(lambda it: _check_one(checkout, it, args.timeout), chosen):
            rows.append(row)
            print(json.dumps({k: v for k, v in row.items() if not k.endswith("_detail")}), flush=True)
    print()
    print(check_examples._table(rows))
    built = [r for r in rows if "dropin_build" in r]
    print(f"\ntlx builds linked: {sum(r['dropin_build'] == 'linked' for r in built)} of {len(built)}; "
          f"CUDA as TileLang's (guard removal off): {sum(r.get('dropin_cuda', '').startswith('same') for r in built)} of "
          f"{len(built)}; guards removed by the default build: {sum(r.get('dropin_guards_removed', 0) for r in built)} in "
          f"{sum(bool(r.get('dropin_guards_removed')) for r in built)} kernels")
    for r in rows:
        if r.get("violations") or r.get("unknown") or r["status"] not in ("ok", "violation", "unknown") \
                or (r.get("dropin_build") and (r["dropin_build"] != "linked" or not r.get("dropin_cuda", "").startswith("same"))):
            print(f"- {r['example']} ({r['nodeid']}): {r['status']} (bounds {r.get('bounds', '-')}) {r.get('detail', '')} "
                  f"build {r.get('dropin_build', '-')} {r.get('dropin_cuda', '')}")
            for v in r.get("violation_detail", []) + r.get("unknown_detail", []):
                print(f"    {json.dumps(v)[:400]}")
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
