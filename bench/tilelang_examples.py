"""TileLang's own example tests, run under ``tilelang.jit`` and again with ``tlx.jit`` patched in.

    python3 bench/tilelang_examples.py TILELANG_CHECKOUT [TARGET ...] [--out DIR] [--timeout S]

A TARGET is a path relative to the checkout's ``examples/``: a ``test_*.py`` file (optionally
``::test_name``), or an example ``.py`` whose ``main()`` is run (for examples without a test
file). Without targets, every ``examples/**/test_*.py``. The checkout's files are used in place,
never copied.

Each target runs twice in a fresh process, in its own directory (the examples import their
siblings by name): the "tilelang" arm unchanged, the "tlx" arm with ``tilelang.jit``,
``tilelang.compile``, ``tilelang.autotune`` and ``tilelang.autotuner.autotune`` replaced by
tlx's before the example is imported. In both arms this module, loaded as a pytest plugin,
records for the first calls of every compiled kernel a checksum of the bytes of each tensor it
returned or was passed (outputs written in place included), outside benchmark loops, and the
value of every ``tilelang.profiler.do_bench`` that ran a compiled kernel (the examples' own
timings; those of torch references are left out). The table compares:
pass/fail in each arm, whether the recorded output bytes are equal (the examples draw their
inputs from torch's seeded generator, seeded here before each test), and the ratio of the
summed benchmark times (tlx / tilelang). TileLang's autotune result cache is off in both arms,
so neither arm reuses the other's tuning.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ARMS = ("tilelang", "tlx")
_ENV_ARM, _ENV_LOG = "TLX_DROPIN_ARM", "TLX_DROPIN_LOG"
_MAX_RECORDED_CALLS = 64  # per process: enough to compare every correctness check's outputs
_ROOT = Path(__file__).resolve().parents[1]


# ---- inside a test process ------------------------------------------------------------------
class _Recorder:
    """Checksums of kernel outputs and benchmark times of one test process."""

    def __init__(self, log: str):
        self.log = log
        self.checksums: list[list[str]] = []
        self.bench_ms: list[float] = []
        self.in_bench = 0
        self.kernel_calls = 0

    def kernel_call(self, fn):
        recorder = self

        def call(kernel, *args, **kwargs):
            out = fn(kernel, *args, **kwargs)
            recorder.kernel_calls += 1
            if not recorder.in_bench and len(recorder.checksums) < _MAX_RECORDED_CALLS:
                recorder.checksums.append([_checksum(t) for t in (*_tensors(out), *_tensors(args))])
            return out

        return call

    def bench(self, fn):
        recorder = self

        def timed(*args, **kwargs):
            recorder.in_bench += 1
            calls = recorder.kernel_calls
            try:
                result = fn(*args, **kwargs)
            finally:
                recorder.in_bench -= 1
            if isinstance(result, (int, float)) and recorder.kernel_calls > calls:  # a kernel's time, not a reference's
                recorder.bench_ms.append(float(result))
            return result

        return timed

    def save(self) -> None:
        Path(self.log).write_text(json.dumps({"checksums": self.checksums, "bench_ms": self.bench_ms}))


def _tensors(value) -> list:
    import torch

    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _tensors(v)]
    return []


def _checksum(t) -> str:
    """dtype, shape and two sums over the tensor's bytes (one position-weighted): equal bytes give
    equal checksums, and a change of any byte changes them (barring a collision)."""
    import torch

    flat = t.detach().contiguous().view(-1).view(torch.uint8)
    plain = weighted = 0
    for chunk in flat.split(1 << 26):
        values = chunk.to(torch.int64)
        weights = torch.arange(values.numel(), device=values.device, dtype=torch.int64) % 65521 + 1
        plain += int(values.sum())
        weighted += int((values * weights).sum())
    return f"{t.dtype}{list(t.shape)}:{plain}:{weighted}"


def install() -> None:
    """Patch the arm named by ``$TLX_DROPIN_ARM`` in and hook the recorder (pytest plugin entry)."""
    import atexit

    import tilelang
    import tilelang.autotuner
    import tilelang.profiler
    import tilelang.profiler.bench
    import torch

    arm, log = os.environ[_ENV_ARM], os.environ[_ENV_LOG]
    recorder = _Recorder(log)
    atexit.register(recorder.save)
    if arm == "tlx":
        import tlx
        from tlx.kernel import Kernel

        tilelang.jit, tilelang.compile = tlx.jit, tlx.compile
        tilelang.autotune = tilelang.autotuner.autotune = tlx.autotune
        Kernel.__call__ = recorder.kernel_call(Kernel.__call__)
    else:
        from tilelang.jit.adapter.base import BaseKernelAdapter
        from tilelang.jit.kernel import JITKernel

        # kernel(...) goes through JITKernel, a profiler's calls through the adapter (never both)
        JITKernel.__call__ = recorder.kernel_call(JITKernel.__call__)
        BaseKernelAdapter.__call__ = recorder.kernel_call(BaseKernelAdapter.__call__)
    tilelang.profiler.do_bench = tilelang.profiler.bench.do_bench = recorder.bench(tilelang.profiler.bench.do_bench)
    torch.manual_seed(0)


def pytest_runtest_setup(item):
    import torch

    torch.manual_seed(0)  # the same inputs in both arms


if os.environ.get(_ENV_ARM) and os.environ.get(_ENV_LOG):
    install()


# ---- the driver -----------------------------------------------------------------------------
def targets_of(examples: Path, given: list[str]) -> list[str]:
    if given:
        return given
    return sorted(str(p.relative_to(examples)) for p in examples.rglob("test_*.py"))


def run_target(examples: Path, target: str, arm: str, out: Path, timeout: int) -> dict:
    path, _, node = target.partition("::")
    file = examples / path
    log = out / f"{target.replace('/', '__').replace('::', '--')}.{arm}.json"
    env = {**os.environ, _ENV_ARM: arm, _ENV_LOG: str(log), "TILELANG_AUTO_TUNING_DISABLE_CACHE": "1",
           "PYTHONPATH": os.pathsep.join([str(_ROOT), str(file.parent), os.environ.get("PYTHONPATH", "")])}
    if file.name.startswith("test_"):
        cmd = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "bench.tilelang_examples", "-p", "no:cacheprovider", f"{file.name}{'::' + node if node else ''}"]
    else:
        code = f"import bench.tilelang_examples, torch; torch.manual_seed(0); import {file.stem} as m; m.main()"
        cmd = [sys.executable, "-c", code]
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, cwd=file.parent, env=env, capture_output=True, text=True, timeout=timeout)
        rc, text = proc.returncode, proc.stdout + proc.stderr
    except subprocess.TimeoutExpired as e:
        rc, text = "timeout", (e.stdout or b"").decode(errors="replace") + (e.stderr or b"").decode(errors="replace")
    seconds = time.perf_counter() - t0
    (out / f"{log.stem}.log").write_text(text)
    recorded = json.loads(log.read_text()) if log.is_file() else {"checksums": [], "bench_ms": []}
    return {"passed": rc == 0, "rc": rc, "seconds": round(seconds, 1), **recorded, "tail": text.strip().splitlines()[-1:] }


def compare(results: dict) -> dict:
    tl, tx = results["tilelang"], results["tlx"]
    row = {"tilelang": "pass" if tl["passed"] else "FAIL", "tlx": "pass" if tx["passed"] else "FAIL"}
    a, b = tl["checksums"], tx["checksums"]
    if not a and not b:
        row["bitwise"] = "n/a (no output recorded)"
    elif len(a) != len(b):
        row["bitwise"] = f"n/a ({len(a)} vs {len(b)} calls recorded)"
    else:
        differ = sum(x != y for x, y in zip(a, b))
        row["bitwise"] = "equal" if differ == 0 else f"DIFFER in {differ}/{len(a)} calls"
    ta, tb = sum(tl["bench_ms"]), sum(tx["bench_ms"])
    same = len(tl["bench_ms"]) == len(tx["bench_ms"]) and ta > 0
    row["time tlx/tilelang"] = f"{tb / ta:.3f} ({len(tx['bench_ms'])} timings)" if same else "n/a"
    row["wall s"] = f"{tl['seconds']} / {tx['seconds']}"
    return row


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkout", type=Path, help="a TileLang checkout (its examples/ directory is used)")
    parser.add_argument("targets", nargs="*", help="paths under examples/ (default: every test_*.py)")
    parser.add_argument("--out", type=Path, default=Path("tilelang-examples-out"), help="logs and the JSON results")
    parser.add_argument("--timeout", type=int, default=900, help="seconds per target and arm")
    args = parser.parse_args(argv)
    examples = args.checkout / "examples"
    if not examples.is_dir():
        parser.error(f"checkout: {examples} is not a directory")
    args.out.mkdir(parents=True, exist_ok=True)
    rows = {}
    for target in targets_of(examples, args.targets):
        results = {arm: run_target(examples, target, arm, args.out, args.timeout) for arm in ARMS}
        rows[target] = {**compare(results), "detail": results}
        print(target, {k: v for k, v in rows[target].items() if k != "detail"}, flush=True)
    (args.out / "results.json").write_text(json.dumps(rows, indent=1, default=str))
    columns = ["tilelang", "tlx", "bitwise", "time tlx/tilelang", "wall s"]
    print("\n| example | " + " | ".join(columns) + " |\n|" + "---|" * (len(columns) + 1))
    for target, row in rows.items():
        print(f"| {target} | " + " | ".join(str(row[c]) for c in columns) + " |")
    both = [r for r in rows.values() if r["tilelang"] == "pass"]
    print(f"\npass under tilelang.jit: {len(both)}/{len(rows)}; of those, pass under tlx.jit: "
          f"{sum(r['tlx'] == 'pass' for r in both)}; bitwise equal: {sum(r['bitwise'] == 'equal' for r in both)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
