"""TileLang's own example tests, run under ``tilelang.jit`` and again with ``tlx.jit`` patched in.

    python3 bench/tilelang_examples.py EXAMPLES_DIR [TARGET ...] [--out DIR] [--jobs N]
        [--timeout S] [--deadline S] [--stop S] [--costs OLD_RESULTS.json] [--collect-only]

EXAMPLES_DIR is a TileLang checkout's ``examples/`` (or the checkout itself); its files are used
in place, never copied into this repository. A TARGET is a path under it: a ``test_*.py`` file,
optionally ``::test_name``. Without targets, every ``examples/**/test_*.py``.

Steps:
1. Collection: ``pytest --collect-only`` of each file in a fresh process (``--jobs`` at a time),
   in the tilelang arm. pytest's own skip marks are evaluated there, on this machine: an item
   the test itself would skip here (``requires_cuda_compute_version_ge(10, 0)`` on an H200, an
   AMD-only test) is listed as "not applicable here" with the mark's reason and not run;
   nothing else is left out. A file that fails to collect is listed with its error in each arm
   (collected again in the tlx arm for that).
2. Every other test item runs in two fresh processes, back to back on one worker: the
   "tilelang" arm unchanged, then the "tlx" arm with ``tilelang.jit``, ``tilelang.compile``,
   ``tilelang.autotune`` and ``tilelang.autotuner.autotune`` replaced by tlx's before the
   example is imported. ``--jobs`` items run at once (their compiles, on the CPU, dominate).
   Items are ordered cheapest first: by the wall seconds measured in ``--costs`` (an earlier
   run's results.json) where given, else by a static estimate (``_estimated_cost``).
3. Each process loads this module as a pytest plugin. It records the outcome of the item, for
   the first calls of every compiled kernel a checksum of the bytes of each tensor returned or
   passed (outputs written in place included) outside benchmark loops, and the value of every
   ``tilelang.profiler.do_bench`` that ran a compiled kernel (the examples' own timings; a torch
   reference's are left out). Inputs come from torch's generator, seeded before each item.

Timing on a shared GPU. Processes share one GPU, so a benchmark must not overlap another
process's GPU work. Every ``do_bench`` holds an exclusive lock on one file for its whole run,
and every kernel call made outside a benchmark holds the same lock shared: benchmarks are
serialized against each other and against the compiled kernels of every other item, while
compiles (CPU) keep running in parallel. Unhooked torch work of another item (a reference
computed with torch) can still overlap a benchmark; that is the price of running in parallel
at all, and the reason the time ratio is the ratio of summed benchmark times of the two arms
of one item, run minutes apart on the same worker under the same load, not a single figure.
The wait for the lock is recorded per process (``lock_wait_s``).

Results go to ``--out`` (default ``tilelang-examples-out``), rewritten atomically after every
process: ``results.json`` (rows, items not applicable, items running, items not reached),
``results.md`` (the table plus those lists), one log per item and arm. A run stopped at any
point (``--deadline`` stops starting items, ``--stop`` kills those still running, SIGTERM or
SIGINT from an outer ``timeout`` do both) leaves a complete table of what finished.
TileLang's autotune result cache is off in both arms, so neither reuses the other's tuning.

A GPU machine that receives only this repository's tree gets the examples as an ignored path it
carries (git-ignored through .git/info/exclude; the pruned copy is about 3 MB):

    mkdir -p .tilelang-examples/checkout && cp -r CHECKOUT/examples .tilelang-examples/checkout/
    find .tilelang-examples/checkout/examples -type f -regex '.*\\.\\(png\\|jpg\\|svg\\|ipynb\\|md\\)' -delete
    python3 bench/tilelang_examples.py .tilelang-examples/checkout/examples --out /tmp/te --jobs 12 --timeout 200 --deadline 400 --stop 480
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

ARMS = ("tilelang", "tlx")
_ENV_ARM, _ENV_LOG, _ENV_LOCK, _ENV_COLLECT = "TLX_DROPIN_ARM", "TLX_DROPIN_LOG", "TLX_DROPIN_GPU_LOCK", "TLX_DROPIN_COLLECT"
_MAX_RECORDED_CALLS = 64  # per process: enough to compare every correctness check's outputs
_ROOT = Path(__file__).resolve().parents[1]


# ---- inside a test process ------------------------------------------------------------------
class _GpuLock:
    """The file lock that keeps benchmarks apart from each other and from other items' kernels."""

    def __init__(self, path: str | None):
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644) if path else None
        self.wait_s = 0.0

    def hold(self, exclusive: bool):
        import contextlib
        import fcntl

        @contextlib.contextmanager
        def held():
            if self.fd is None:
                yield
                return
            t0 = time.perf_counter()
            fcntl.flock(self.fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
            self.wait_s += time.perf_counter() - t0
            try:
                yield
            finally:
                fcntl.flock(self.fd, fcntl.LOCK_UN)

        return held()


class _Recorder:
    """Outcomes, checksums of kernel outputs and benchmark times of one test process."""

    def __init__(self, log: str, lock: _GpuLock):
        self.log = log
        self.lock = lock
        self.checksums: list[list[str]] = []
        self.bench_ms: list[float] = []
        self.outcomes: list[dict] = []
        self.in_bench = 0
        self.kernel_calls = 0

    def kernel_call(self, fn):
        recorder = self

        def call(kernel, *args, **kwargs):
            if recorder.in_bench:
                out = fn(kernel, *args, **kwargs)
            else:
                with recorder.lock.hold(exclusive=False):
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
                with recorder.lock.hold(exclusive=True):
                    result = fn(*args, **kwargs)
            finally:
                recorder.in_bench -= 1
            if isinstance(result, (int, float)) and recorder.kernel_calls > calls:  # a kernel's time, not a reference's
                recorder.bench_ms.append(float(result))
            return result

        return timed

    def save(self) -> None:
        record = {"outcomes": self.outcomes, "checksums": self.checksums, "bench_ms": self.bench_ms, "lock_wait_s": round(self.lock.wait_s, 2)}
        Path(self.log).write_text(json.dumps(record))


_recorder: _Recorder | None = None


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

    global _recorder
    arm, log = os.environ[_ENV_ARM], os.environ[_ENV_LOG]
    _recorder = recorder = _Recorder(log, _GpuLock(os.environ.get(_ENV_LOCK)))
    atexit.register(recorder.save)
    if arm == "tlx":
        import tlx
        from tlx.kernel import Kernel

        tilelang.jit, tilelang.compile = tlx.jit, tlx.compile
        tilelang.autotune = tilelang.autotuner.autotune = tlx.autotune
        Kernel.__call__ = recorder.kernel_call(_call_of(Kernel))
    elif arm == "tilelang":
        from tilelang.jit.adapter.base import BaseKernelAdapter
        from tilelang.jit.kernel import JITKernel

        # kernel(...) goes through JITKernel, a profiler's calls through the adapter (never both)
        JITKernel.__call__ = recorder.kernel_call(_call_of(JITKernel))
        BaseKernelAdapter.__call__ = recorder.kernel_call(_call_of(BaseKernelAdapter))
    else:
        raise ValueError(f"${_ENV_ARM}: expected one of {ARMS}, got {arm!r}")
    tilelang.profiler.do_bench = tilelang.profiler.bench.do_bench = recorder.bench(tilelang.profiler.bench.do_bench)
    torch.manual_seed(0)


def _call_of(cls):
    """What ``instance(...)`` runs for ``cls``, as a function of (instance, *args): a plain
    ``__call__`` or a property handing back the instance's callable (tlx's ``Kernel``)."""
    import inspect

    attribute = inspect.getattr_static(cls, "__call__")
    return lambda instance, *args, **kwargs: attribute.__get__(instance, cls)(*args, **kwargs)


def pytest_runtest_setup(item):
    import torch

    torch.manual_seed(0)  # the same inputs in both arms


def pytest_runtest_logreport(report):
    if _recorder is not None and (report.when == "call" or report.outcome != "passed"):
        reason = report.longrepr[2] if report.skipped and isinstance(report.longrepr, tuple) else ""
        _recorder.outcomes.append({"nodeid": report.nodeid, "when": report.when, "outcome": report.outcome, "reason": reason})


def pytest_collection_modifyitems(session, config, items):
    """In a collect-only run: each item with the reason it would be skipped here (pytest's own
    evaluation of its skip marks), and which decorator wrapped the examples it imported."""
    path = os.environ.get(_ENV_COLLECT)
    if not path:
        return
    from _pytest.skipping import evaluate_skip_marks

    listed = []
    for item in items:
        skip = evaluate_skip_marks(item)
        listed.append({"nodeid": item.nodeid, "skip": skip.reason if skip else None})
    Path(path).write_text(json.dumps({"items": listed, "decorated": _decorated_kernels(Path(str(config.rootpath)))}))


def _decorated_kernels(directory: Path) -> dict:
    """How many module-level kernels of the examples under ``directory`` each decorator made:
    under the tlx arm every one must be tlx's (the patch reached them all)."""
    from tilelang.autotuner.tuner import AutoTuneImpl
    from tilelang.jit import JITImpl

    counts = collections.Counter()
    for module in list(sys.modules.values()):
        file = getattr(module, "__file__", None) or ""
        if not file.startswith(str(directory)):
            continue
        for value in vars(module).values():
            if isinstance(value, (JITImpl, AutoTuneImpl)):
                counts[f"{type(value).__module__}.{type(value).__name__}"] += 1
    return dict(counts)


if os.environ.get(_ENV_ARM) and os.environ.get(_ENV_LOG):
    install()


# ---- the driver -----------------------------------------------------------------------------
def _env(arm: str, log: Path, file: Path, lock: Path | None, collect: Path | None = None) -> dict:
    env = {**os.environ, _ENV_ARM: arm, _ENV_LOG: str(log), "TILELANG_AUTO_TUNING_DISABLE_CACHE": "1",
           "PYTHONPATH": os.pathsep.join(p for p in (str(_ROOT), str(file.parent), os.environ.get("PYTHONPATH", "")) if p)}
    if lock:
        env[_ENV_LOCK] = str(lock)
    if collect:
        env[_ENV_COLLECT] = str(collect)
    return env


def _pytest(*args: str) -> list[str]:
    # run from the test file's directory, as TileLang's CI does; pytest still finds the checkout's
    # examples/pytest.ini and conftest.py (seeds; exit 5 when every test skipped)
    return [sys.executable, "-m", "pytest", "-q", "-p", "bench.tilelang_examples", "-p", "no:cacheprovider", *args]


class Runner:
    """Starts test processes in their own process groups so that a stop kills them whole."""

    def __init__(self, out: Path, lock: Path | None):
        self.out, self.lock = out, lock
        self.procs: set[subprocess.Popen] = set()
        self.guard = threading.Lock()
        self.stopped = False

    def run(self, cmd, cwd: Path, env: dict, timeout: float) -> tuple[object, str]:
        with self.guard:
            if self.stopped:
                return "not run (stopped)", ""
            proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                    errors="replace", start_new_session=True)
            self.procs.add(proc)
        try:
            text, _ = proc.communicate(timeout=max(timeout, 1))
            rc = proc.returncode
        except subprocess.TimeoutExpired:
            _kill(proc)
            text, _ = proc.communicate()
            rc = "timeout"
        finally:
            with self.guard:
                self.procs.discard(proc)
        if self.stopped and rc != 0:
            rc = "stopped"
        return rc, text

    def stop(self) -> None:
        with self.guard:
            self.stopped = True
            procs = list(self.procs)
        for proc in procs:
            _kill(proc)


def _kill(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name.replace("/", "__").replace("::", "--"))[:180]


def test_files(examples: Path, given: list[str]) -> list[tuple[str, str | None]]:
    """(file relative to ``examples``, test name or None for all) for each target."""
    if not given:
        return [(str(p.relative_to(examples)), None) for p in sorted(examples.rglob("test_*.py"))]
    out = []
    for target in given:
        path, _, node = target.partition("::")
        if not (examples / path).is_file():
            raise SystemExit(f"target {target!r}: {examples / path} is not a file")
        out.append((path, node or None))
    return out


def collect(runner: Runner, examples: Path, file: str, arm: str, timeout: float) -> dict:
    """One file's items, each with the reason its own marks skip it here; or the error."""
    path = examples / file
    log = runner.out / "collect" / f"{_safe(file)}.{arm}.json"
    log.parent.mkdir(parents=True, exist_ok=True)
    log.unlink(missing_ok=True)
    cmd = _pytest("--collect-only", path.name)
    rc, text = runner.run(cmd, path.parent, _env(arm, runner.out / "collect" / "recorder.json", path, None, collect=log), timeout)
    (log.with_suffix(".log")).write_text(text)
    if rc in (0, 5) and log.is_file():  # 5: the checkout's conftest when nothing ran, as in a collect-only run
        listed = json.loads(log.read_text())
        items = [{**i, "nodeid": f"{file}::{i['nodeid'].split('::', 1)[1]}"} for i in listed["items"]]
        return {"ok": True, "items": items, "decorated": listed["decorated"]}
    return {"ok": False, "rc": rc, "error": _last_error(text)}


def _last_error(text: str) -> str:
    """The line of a pytest output that says what went wrong."""
    lines = [l.strip() for l in text.strip().splitlines() if l.strip()]
    for pattern in (r"^E\s+[\w.]*(Error|Exception|Interrupt|Exit)\b", r"^E\s+\S", r"^(FAILED|ERROR) ", r"(Error|Exception)\b"):
        hits = [l for l in lines if re.search(pattern, l)]
        if hits:
            return hits[0][:300]
    return (lines[-1] if lines else "no output")[:300]


def run_item(runner: Runner, examples: Path, nodeid: str, arm: str, timeout: float) -> dict:
    file, _, name = nodeid.partition("::")
    path = examples / file
    stem = f"{_safe(nodeid)}.{arm}"
    log = runner.out / "items" / f"{stem}.json"
    log.parent.mkdir(parents=True, exist_ok=True)
    log.unlink(missing_ok=True)
    t0 = time.perf_counter()
    rc, text = runner.run(_pytest("-x", f"{path.name}::{name}"), path.parent, _env(arm, log, path, runner.lock), timeout)
    seconds = round(time.perf_counter() - t0, 1)
    (runner.out / "items" / f"{stem}.log").write_text(text)
    recorded = json.loads(log.read_text()) if log.is_file() else {}
    outcomes = recorded.get("outcomes", [])
    if rc in (0, 5) and outcomes and all(o["outcome"] == "skipped" for o in outcomes):
        status = "skipped"
    elif rc == 0 and outcomes:
        status = "pass"
    elif rc in ("timeout", "stopped", "not run (stopped)"):
        status = str(rc)
    else:
        status = "FAIL"
    return {"status": status, "rc": rc, "seconds": seconds, "error": "" if status in ("pass", "skipped") else _last_error(text),
            "skip_reason": "; ".join(o["reason"] for o in outcomes if o["outcome"] == "skipped"),
            "oom": "out of memory" in text.lower() or "OutOfMemoryError" in text,
            **{k: recorded.get(k, []) for k in ("checksums", "bench_ms")}, "lock_wait_s": recorded.get("lock_wait_s")}


def compare(results: dict) -> dict:
    """One table row from the two arms' results of one item."""
    tl, tx = results["tilelang"], results["tlx"]
    row = {arm: r["status"] for arm, r in results.items()}
    a, b = tl["checksums"], tx["checksums"]
    if tl["status"] != "pass" or tx["status"] != "pass":
        row["outputs"] = "n/a (not both passed)"
    elif not a and not b:
        row["outputs"] = "n/a (no kernel output recorded)"
    elif len(a) != len(b):
        row["outputs"] = f"n/a ({len(a)} vs {len(b)} calls recorded)"
    else:
        differ = sum(x != y for x, y in zip(a, b))
        row["outputs"] = "bitwise equal" if differ == 0 else f"DIFFER in {differ}/{len(a)} calls"
    ta, tb = sum(tl["bench_ms"]), sum(tx["bench_ms"])
    if len(tl["bench_ms"]) == len(tx["bench_ms"]) and ta > 0 and tl["status"] == tx["status"] == "pass":
        row["time tlx/tilelang"] = f"{tb / ta:.3f} ({len(tx['bench_ms'])} timings)"
        row["ratio"] = tb / ta
    else:
        row["time tlx/tilelang"] = "n/a" if not (tl["bench_ms"] or tx["bench_ms"]) else f"n/a ({len(tl['bench_ms'])} vs {len(tx['bench_ms'])} timings)"
    row["wall s"] = f"{tl['seconds']} / {tx['seconds']}"
    return row


# Relative cost guesses for ordering when no earlier run's times are given: families whose tests
# tune or compile many large kernels go last. Only the order depends on these.
_COSTLY_WORDS = {"autotune": 6, "tune": 4, "bwd": 4, "backward": 4, "mla": 3, "nsa": 3, "deepseek": 2, "moe": 3,
                 "sparse": 2, "attention": 2, "attn": 2, "mha": 2, "gqa": 2, "flash": 2, "varlen": 2, "fp8": 1,
                 "dequantize": 2, "conv": 2, "gdn": 3, "kda": 3, "mhc": 2, "pipeline": 1, "warp_specialize": 1}


def _estimated_cost(nodeid: str, measured: dict, tuned: bool = False) -> float:
    """Seconds measured for the item in an earlier run, else a guess from its name (and whether
    its file's examples define an autotuned kernel)."""
    if nodeid in measured:
        return measured[nodeid]
    lower = nodeid.lower()
    return 30.0 + 40.0 * tuned + sum(10.0 * w for word, w in _COSTLY_WORDS.items() if word in lower)


def _measured_costs(path: Path | None) -> dict:
    if not path:
        return {}
    rows = json.loads(path.read_text()).get("rows", {})
    return {nodeid: sum(r["detail"][arm]["seconds"] for arm in ARMS if arm in r.get("detail", {})) for nodeid, r in rows.items()}


class Table:
    """The results so far, rewritten (atomically) after every change."""

    def __init__(self, out: Path, meta: dict):
        self.out, self.meta = out, meta
        self.rows: dict[str, dict] = {}
        self.not_applicable: dict[str, str] = {}
        self.collect_errors: dict[str, dict] = {}
        self.decorated: dict[str, dict] = {}
        self.pending: list[str] = []
        self.running: dict[str, str] = {}
        self.guard = threading.RLock()  # re-entered by the final write when a signal lands inside one

    def write(self) -> None:
        with self.guard:
            state = {"meta": {**self.meta, "written": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())}, "summary": self.summary(),
                     "rows": self.rows, "not_applicable": self.not_applicable, "collect_errors": self.collect_errors,
                     "decorated": self.decorated, "running": self.running, "not_reached": self.pending}
            _write_atomic(self.out / "results.json", json.dumps(state, indent=1, default=str))
            _write_atomic(self.out / "results.md", self.markdown(state))

    def summary(self) -> dict:
        rows = [r for r in self.rows.values() if "tlx" in r]
        base = [r for r in rows if r["tilelang"] == "pass"]
        ratios = [r["ratio"] for r in base if "ratio" in r]
        geomean = float(__import__("math").exp(sum(map(__import__("math").log, ratios)) / len(ratios))) if ratios else None
        return {"items finished": len(rows), "pass under tilelang.jit": len(base),
                "of those, pass under tlx.jit": sum(r["tlx"] == "pass" for r in base),
                "of those, outputs bitwise equal": sum(r["outputs"] == "bitwise equal" for r in base),
                "pass only under tlx.jit": sum(r["tlx"] == "pass" and r["tilelang"] != "pass" for r in rows),
                "timed": len(ratios), "time within 2%": sum(abs(x - 1) <= 0.02 for x in ratios),
                "time ratio geomean": round(geomean, 4) if geomean else None,
                "not applicable here": len(self.not_applicable), "files failing collection": len(self.collect_errors),
                "running when written": len(self.running), "not reached": len(self.pending)}

    @staticmethod
    def markdown(state: dict) -> str:
        columns = ["tilelang", "tlx", "outputs", "time tlx/tilelang", "wall s"]
        lines = [f"TileLang example tests, tilelang.jit vs tlx.jit ({state['meta']['written']}; {state['meta']['command']})", "",
                 "| test | " + " | ".join(columns) + " |", "|" + " --- |" * (len(columns) + 1)]
        for nodeid, row in state["rows"].items():
            cells = [str(row.get(c, "")) for c in columns]
            for i, arm in enumerate(ARMS):
                error = row.get("detail", {}).get(arm, {}).get("error")
                if row.get(arm) not in ("pass", None) and error:
                    cells[i] += f": {error[:120]}".replace("|", "\\|")
            if row.get("note"):
                cells[-1] += f" ({row['note']})"
            lines.append(f"| `{nodeid}` | " + " | ".join(cells) + " |")
        lines += ["", "Summary: " + "; ".join(f"{k} {v}" for k, v in state["summary"].items())]
        for title, entries in (("Not applicable here: skipped by the test's own marks or by itself (reason given)", state["not_applicable"]),
                               ("Files that failed to collect", {f: f"tilelang: {e['tilelang']}; tlx: {e.get('tlx', '?')}" for f, e in state["collect_errors"].items()}),
                               ("Running when written (cut)", state["running"]), ("Not reached", {n: "" for n in state["not_reached"]})):
            if entries:
                lines += ["", f"{title}: {len(entries)}", *(f"- `{k}`{': ' + v if v else ''}" for k, v in entries.items())]
        return "\n".join(lines) + "\n"


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def _parallel(jobs: int, work: list, fn) -> None:
    """``fn(entry)`` for each entry, ``jobs`` threads pulling from the shared queue ``work``
    (a deque; ``fn`` may append to it)."""
    threads = [threading.Thread(target=_drain, args=(work, fn), daemon=True) for _ in range(max(1, jobs))]
    for t in threads:
        t.start()
    for t in threads:
        while t.is_alive():
            t.join(0.5)  # wakes for signals


def _drain(work: collections.deque, fn) -> None:
    while True:
        try:
            entry = work.popleft()
        except IndexError:
            return
        fn(entry)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("examples", type=Path, help="a TileLang checkout's examples/ directory (or the checkout)")
    parser.add_argument("targets", nargs="*", help="test files under examples/, optionally ::test_name (default: every test_*.py)")
    parser.add_argument("--out", type=Path, default=Path("tilelang-examples-out"), help="logs, results.json and results.md")
    parser.add_argument("--jobs", type=int, default=max(1, (os.cpu_count() or 2) // 2), help="test processes at once (default: half the CPU cores)")
    parser.add_argument("--timeout", type=float, default=300, help="seconds per item and arm")
    parser.add_argument("--collect-timeout", type=float, default=120, help="seconds per file's collection")
    parser.add_argument("--deadline", type=float, help="seconds after the start after which no new item starts")
    parser.add_argument("--stop", type=float, help="seconds after the start at which running items are killed")
    parser.add_argument("--costs", type=Path, help="an earlier results.json: order items by their measured wall seconds")
    parser.add_argument("--collect-only", action="store_true", help="collect in both arms, compare and stop (needs no GPU)")
    args = parser.parse_args(argv)
    examples = args.examples / "examples" if (args.examples / "examples").is_dir() else args.examples
    if not examples.is_dir() or not any(examples.rglob("test_*.py")):
        parser.error(f"examples: {args.examples} holds no test_*.py (expected a TileLang checkout or its examples/)")
    if args.jobs < 1:
        parser.error(f"--jobs: expected at least 1, got {args.jobs}")
    start = time.monotonic()
    args.out.mkdir(parents=True, exist_ok=True)
    files = test_files(examples, args.targets)
    runner = Runner(args.out, args.out / "gpu.lock")
    table = Table(args.out, {"command": " ".join([Path(sys.argv[0]).name, *(argv if argv is not None else sys.argv[1:])]), "jobs": args.jobs,
                             "examples": str(examples)})

    def on_signal(signum, frame):
        runner.stop()
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    stopper = threading.Timer(args.stop, runner.stop) if args.stop else None
    if stopper:
        stopper.daemon = True
        stopper.start()
    try:
        if args.collect_only:
            return _collect_both(runner, examples, files, args, table)
        _run_all(runner, examples, files, args, table, start)
    except KeyboardInterrupt:
        runner.stop()
        print("interrupted: the table holds what finished", file=sys.stderr)
    finally:
        table.write()
    print((args.out / "results.md").read_text())
    return 0


def _collect_both(runner: Runner, examples: Path, files: list, args, table: Table) -> int:
    """Collection of every file in both arms; differences and errors are failures (exit 1)."""
    found = {}

    def one(entry):
        file, arm = entry
        found[(file, arm)] = collect(runner, examples, file, arm, args.collect_timeout)

    _parallel(args.jobs, collections.deque((f, arm) for f, _ in files for arm in ARMS), one)
    bad = 0
    for file, _ in files:
        tl, tx = found[(file, "tilelang")], found[(file, "tlx")]
        ids = {arm: [i["nodeid"] for i in r["items"]] if r["ok"] else r["error"] for arm, r in (("tilelang", tl), ("tlx", tx))}
        same = ids["tilelang"] == ids["tlx"]
        leaked = {k: v for k, v in tx.get("decorated", {}).items() if not k.startswith("tlx.")}
        bad += not (same and tl["ok"] and not leaked)
        print(f"{'ok  ' if same and tl['ok'] and not leaked else 'BAD '} {file}: "
              f"{len(ids['tilelang']) if tl['ok'] else 'ERROR ' + tl['error']} items | tlx: "
              f"{('same items' if same else ids['tlx'])}; kernels tilelang arm {tl.get('decorated')}, tlx arm {tx.get('decorated')}")
        table.decorated[file] = {"tilelang": tl.get("decorated"), "tlx": tx.get("decorated")}
        for arm, r in (("tilelang", tl), ("tlx", tx)):
            if not r["ok"]:
                table.collect_errors.setdefault(file, {})[arm] = r["error"]
    n = sum(len(found[(f, 'tilelang')].get('items', [])) for f, _ in files)
    print(f"{len(files)} files, {n} items; {bad} files with a collection error, differing items or a kernel tlx did not wrap")
    return 1 if bad else 0


def _run_all(runner: Runner, examples: Path, files: list, args, table: Table, start: float) -> None:
    collected = {}

    def collect_one(file):
        collected[file] = collect(runner, examples, file, "tilelang", args.collect_timeout)
        if not collected[file]["ok"]:
            table.collect_errors[file] = {"tilelang": collected[file]["error"],
                                          "tlx": (lambda r: "collects" if r["ok"] else r["error"])(collect(runner, examples, file, "tlx", args.collect_timeout))}

    _parallel(args.jobs, collections.deque(dict.fromkeys(f for f, _ in files)), collect_one)
    wanted = {}
    for file, name in files:
        for item in collected[file].get("items", []):
            rest = item["nodeid"].split("::", 1)[1]
            if name is None or name in (rest, rest.split("[")[0]):
                wanted[item["nodeid"]] = item
    for nodeid, item in wanted.items():
        if item["skip"]:
            table.not_applicable[nodeid] = item["skip"]
    measured = _measured_costs(args.costs)
    tuned = {f for f, c in collected.items() if any("AutoTune" in kind for kind in c.get("decorated", {}))}
    order = sorted((n for n, i in wanted.items() if not i["skip"]), key=lambda n: _estimated_cost(n, measured, n.split("::")[0] in tuned))
    table.pending = list(order)
    table.meta["collected s"] = round(time.monotonic() - start, 1)
    table.write()
    retried = set()
    work = collections.deque(order)

    def one(nodeid):
        if args.deadline is not None and time.monotonic() - start > args.deadline or runner.stopped:
            return
        with table.guard:
            if nodeid in table.pending:  # not for a second run after running out of memory
                table.pending.remove(nodeid)
            table.running[nodeid] = f"{ARMS[0]} arm running"
        table.write()
        results = {}
        for arm in ARMS:
            left = args.stop - (time.monotonic() - start) if args.stop else args.timeout
            results[arm] = run_item(runner, examples, nodeid, arm, min(args.timeout, left))
            with table.guard:
                table.running[nodeid] = "; ".join(f"{a} {r['status']} in {r['seconds']} s" for a, r in results.items())
                if arm != ARMS[-1]:
                    table.running[nodeid] += f"; {ARMS[ARMS.index(arm) + 1]} arm running"
            table.write()
        if any(r["status"] in ("stopped", "not run (stopped)") for r in results.values()):
            return  # cut by --stop or a signal: stays listed as running, with what each arm did
        row = {**compare(results), "detail": results}
        if nodeid in retried:
            row["note"] = "second run: the first ran out of GPU memory beside other items"
        elif any(r["oom"] and r["status"] == "FAIL" for r in results.values()):
            retried.add(nodeid)  # this row stands unless the run queued at the end finishes
            row["note"] = "ran out of GPU memory beside other items; queued once more at the end"
            work.append(nodeid)
        with table.guard:
            table.running.pop(nodeid)
            if all(r["status"] == "skipped" for r in results.values()):  # the test skipped itself at run time
                table.not_applicable[nodeid] = results["tilelang"]["skip_reason"]
            else:
                table.rows[nodeid] = row
        table.write()
        print(f"[{time.monotonic() - start:6.0f}s] {nodeid}: {row['tilelang']} / {row['tlx']}; {row['outputs']}; {row['time tlx/tilelang']}", flush=True)

    _parallel(args.jobs, work, one)


if __name__ == "__main__":
    sys.exit(main())
