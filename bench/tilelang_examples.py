"""TileLang's own example tests, run under ``tilelang.jit`` and again with ``tlx.jit`` patched in.

    python3 bench/tilelang_examples.py EXAMPLES_DIR [TARGET ...] [--out DIR] [--jobs N] [--exclude TEXT]
        [--timeout S] [--deadline S] [--stop S] [--costs OLD_RESULTS.json] [--collect-only]
        [--timing-rounds R] [--timing-jobs N] [--timing-deadline S] [--merge RESULTS.json] [--longest-first]
        [--paired-rounds R] [--per-test N]

EXAMPLES_DIR is a TileLang checkout's ``examples/`` (or the checkout itself); its files are used
in place, never copied into this repository. A TARGET is a path under it: a ``test_*.py`` file,
optionally ``::test_name``. Without targets, every ``examples/**/test_*.py``. ``--exclude TEXT``
leaves out the files and items whose id contains TEXT. Another project's TileLang suite runs
the same way: DeepSeek's TileKernels with EXAMPLES_DIR its ``tests/`` and ``--per-test N`` (each
test function's first item and a seeded sample; ``bench/foreign_suites.py`` serves the import
its newer TileLang has, in both arms).

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
   run's results.json) where given, else by a static estimate (``_estimated_cost``);
   ``--longest-first`` reverses that (the shortest run when every item must finish).
3. Each process loads this module as a pytest plugin. It records the outcome of the item; for
   the first calls of every compiled kernel outside benchmark loops a checksum of the bytes of
   each tensor returned or passed, read after the call (outputs written in place included; a
   ``T.ptr`` table of addresses is replaced by the tensors it points to); for every compiled
   kernel the SHA-256 of its CUDA source (``get_kernel_source()``) and its nvcc flags without
   paths (tlx: the command saved with the build; tilelang: what its compile passed to
   ``CUDABinaryCache.make_key``, unknown when its kernel cache served the kernel); and the
   value of every ``tilelang.profiler.do_bench`` that ran a compiled kernel (the examples' own
   timings; a torch reference's are left out). Inputs come from torch's generator, seeded
   before each item.
4. Self-replay: the first ``_REPLAYED_CALLS`` calls of each kernel run again, up to
   ``_REPLAY_TRIES`` times, each from the same inputs (copied back in place before each run,
   so a pointer table still points at the right tensors): a kernel whose bytes change from run
   to run (atomics whose order varies) does not reproduce itself. A call that differs between
   the arms at or after the first call of a kernel the tilelang arm could not reproduce is
   reported as "DIFFER ... (tilelang not reproducible itself: N/M replayed calls ...)"; one
   that differs while every kernel so far reproduced itself is a real divergence
   ("... before any nondeterminism"). Each row also says "same CUDA, same flags" or what
   differs, and which differing sources differ only in how TileLang numbered the kernel's
   reduction workspaces (``_cuda_hashes``: its own builds vary so from process to process).
   The summary counts both kinds.
5. Paired kernel timing (``--paired-rounds R``, default 9; 0 turns it off), in the tlx arm: the
   first recorded call of each kernel (up to ``_PAIRED_KERNELS`` per item) is timed against
   TileLang's own build of the same program (tlx's ``compile_kernel`` hooked to remember the
   program and options; ``tilelang.compile`` with the same outputs, target and pass configs,
   served by the kernel cache the tilelang arm just filled) with the same arguments, in the
   same process, under the GPU lock held exclusively: CUDA events around back-to-back calls
   (about 2 ms a sample), R rounds of one sample per arm in alternating order, the median
   per arm. The arguments' state after the call is restored afterwards. The row's "kernel
   time" is the ratio of the summed medians, with the largest spread (interquartile range
   over median) of any arm's samples and whether both builds have the same CUDA source. It
   is the figure for the 2% target: the two arms run the same arguments on one GPU in one
   state, and differ only in the build and the launcher. A kernel shorter than its launch is
   timed at the host's launch rate (TileLang's tvm_ffi call against tlx's launcher), where
   the CPU load of other items' compiles shows in the spread.
6. Timing phase (``--timing-rounds``, default 3; 0 turns it off), after every item finished or
   ``--deadline`` passed: each item with benchmark times in both arms runs again, rounds of
   tilelang then tlx, ``--timing-jobs`` processes at once whose tests each hold the GPU lock
   exclusively for the whole test (so only their start-up, on the CPU, overlaps), kernels from
   the caches step 2 filled, no checksums or replays. The ratio column is the median over
   rounds of the ratio of summed benchmark times, with the first phase's (beside other items)
   kept beside it; an item the timing phase did not reach keeps that figure and is listed.
   Each arm's own rounds also give the measurement's noise (the largest ratio of one arm's
   summed times between rounds): the summary counts the 2% target only over items whose arms
   each repeat within 2%, since a finer ratio than that is not measured.
   ``--merge RESULTS.json`` starts from an earlier run's table: the TARGETs given (if any) run
   their first phase, then this phase covers every timed row not yet timed alone.

Timing in the first phase. Processes share one GPU, so a benchmark must not overlap another
process's GPU work. Every ``do_bench`` holds an exclusive lock on one file for its whole run,
and every kernel call made outside a benchmark holds the same lock shared. Unhooked torch work
of another item (a reference computed with torch) and the CPU load of a dozen compiles still
disturb those figures (on 2026-12-02 ratios of 0.50 and 2.9 for unchanged kernels): they are
labelled "beside other items" and replaced by the timing phase's.

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

Acceptance on an H200 machine (16 cores): two device calls of at most 595 s each (each
command stops itself at 575 s and writes its table). block_causal_attention's two items
compile 28 kernels per arm (over 200 s per arm under load), so they get the second call. The
ordering costs are an earlier run's results.json, copied into the carried ignored directory
(e.g. ``cp /work/.device/3/results.json .tilelang-examples/costs.json``).

    # call 1: everything else, costliest first, then the timing phase in the time left
    python3 bench/tilelang_examples.py .tilelang-examples/checkout/examples --out $OUT/te \\
        --exclude block_causal_attention --costs .tilelang-examples/costs.json --longest-first \\
        --jobs 12 --timeout 200 --deadline 360 --timing-rounds 3 --timing-jobs 2 --timing-deadline 545 --stop 575
    # between the calls, here: cp FILES_AT/te/results.json .tilelang-examples/first.json
    # call 2: block_causal_attention, then the timing phase of the timed items call 1 left
    python3 bench/tilelang_examples.py .tilelang-examples/checkout/examples \\
        block_causal_attention/test_block_causal_attention.py --merge .tilelang-examples/first.json \\
        --out $OUT/te --jobs 2 --timeout 270 --timing-rounds 3 --timing-jobs 2 --timing-deadline 545 --stop 575

Call 2's results.md is the whole table. On the machine call 1 left warm the kernel caches
(``~/.tilelang/cache``, ``~/.cache/tlx``) are still there; on a fresh one the timing phase
compiles again inside its serialized tests (slower; the figures as valid). Timed items neither
call reached are listed ("Timing phase not reached"); a third call, ``--merge`` of call 2's
results.json with no target, times them.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import hashlib
import json
import math
import os
import re
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

ARMS = ("tilelang", "tlx")
_ENV_ARM, _ENV_LOG, _ENV_LOCK, _ENV_COLLECT = "TLX_DROPIN_ARM", "TLX_DROPIN_LOG", "TLX_DROPIN_GPU_LOCK", "TLX_DROPIN_COLLECT"
_ENV_TIMING = "TLX_DROPIN_TIMING"  # set: the timing phase (the test body holds the GPU lock whole, no checks)
_ENV_PAIRED = "TLX_DROPIN_PAIRED"  # rounds of the tlx arm's paired timing of each kernel against TileLang's build (0: none)
_MAX_RECORDED_CALLS = 64  # per process: enough to compare every correctness check's outputs
_PAIRED_KERNELS = 8  # per process: the kernels of an item that get a paired timing (autotuners build dozens)
_PAIRED_SAMPLE_MS = 2.0  # a paired timing's sample runs back-to-back calls for about this long
_PAIRED_MAX_CALLS = 200  # ... and at most this many calls
_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))  # this folder's modules, however this one was imported
from foreign_suites import sample_per_test, serve_newer_imports  # noqa: E402


# ---- inside a test process ------------------------------------------------------------------
class _GpuLock:
    """The file lock that keeps benchmarks apart from each other and from other items' kernels."""

    def __init__(self, path: str | None):
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644) if path else None
        self.wait_s = 0.0

    def hold(self, exclusive: bool):
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
    """Outcomes, checksums of kernel outputs, self-replays and benchmark times of one test process."""

    def __init__(self, log: str, lock: _GpuLock, checks: bool = True):
        self.log = log
        self.lock = lock
        self.checks = checks  # off in the timing phase: checksums and replays were phase 1's
        self.calls: list[dict] = []  # per recorded call: kernel index, output checksums, replay verdict
        self.kernels: list[dict] = []  # per compiled kernel, in order of first call: name, CUDA hash, nvcc flags
        self.kernel_index: dict[int, tuple] = {}  # id(kernel) -> (kernel, index): the reference keeps the id unique
        self.flags_by_source: dict[str, list] = {}  # sha256 of CUDA source -> nvcc flags (tilelang arm's compiles)
        self.bench_ms: list[float] = []
        self.outcomes: list[dict] = []
        self.in_bench = 0
        self.kernel_calls = 0
        # paired timing (tlx arm): kernel -> TileLang's build of the same program, a clock, rounds
        self.twin = None
        self.clock = None
        self.paired_rounds = 0
        self.paired: list[dict] = []  # per timed kernel: kernel index, same CUDA, ms per call of each arm

    def kernel_call(self, fn):
        recorder = self

        def call(kernel, *args, **kwargs):
            recording = not recorder.in_bench and recorder.checks and len(recorder.calls) < _MAX_RECORDED_CALLS
            # the tensors a recorded call touches, found once (a pointer table is a walk of the heap)
            touched = _touched_tensors([*args, *kwargs.values()]) if recording else None
            with contextlib.nullcontext() if recorder.in_bench else recorder.lock.hold(exclusive=False):
                out = recorder.record(fn, kernel, args, kwargs, touched) if recording else fn(kernel, *args, **kwargs)
            recorder.kernel_calls += 1
            if recording and recorder.wants_pair(kernel):
                recorder.paired.append(recorder.time_pair(fn, kernel, args, kwargs, touched))
            return out

        return call

    def record(self, fn, kernel, args, kwargs, touched: list):
        """Run one call and record checksums of what it returned and of every tensor it was
        given (``touched``: tensors reached through a pointer table included) afterwards. The first
        ``_REPLAYED_CALLS`` calls of each kernel are then run again up to ``_REPLAY_TRIES``
        times, each time from the same inputs (restored in place, so pointer tables stay
        valid): whether the kernel reproduces its own output bytes."""
        index = self.kernel_of(kernel)
        replays = sum(c["kernel"] == index for c in self.calls) < _REPLAYED_CALLS
        snapshot = _snapshot(touched) if replays else None
        out = fn(kernel, *args, **kwargs)
        checksums = [_checksum(t) for t in (*_tensors(out), *touched)]
        entry = {"kernel": index, "checksums": checksums}
        if isinstance(snapshot, list):
            entry["replay"] = _replay(lambda: fn(kernel, *args, **kwargs), touched, snapshot, checksums)
        elif snapshot:
            entry["replay"] = snapshot
        self.calls.append(entry)
        return out

    def wants_pair(self, kernel) -> bool:
        """A kernel's first recorded call gets a paired timing (tlx arm, up to ``_PAIRED_KERNELS``)."""
        return (self.twin is not None and self.paired_rounds > 0 and len(self.paired) < _PAIRED_KERNELS
                and self.kernel_of(kernel) not in {p["kernel"] for p in self.paired})

    def time_pair(self, fn, kernel, args, kwargs, touched: list) -> dict:
        """The call just made, timed against TileLang's own build of the same program with the
        same arguments, interleaved in this process (``paired_times``) while holding the GPU
        lock exclusively. The arguments' state after the call is restored afterwards, so the
        test goes on from what one call left (in-place and accumulating kernels included)."""
        index = self.kernel_of(kernel)
        entry = {"kernel": index}
        try:
            twin = self.twin(kernel)
            sha, renamed = _cuda_hashes(twin.get_kernel_source())
            known = self.kernels[index]
            entry["same CUDA"] = True if sha == known["cuda_sha256"] else _WORKSPACES if renamed == known.get("cuda_sha256_renamed") else False
        except Exception as e:  # noqa: BLE001 - recorded; the test goes on
            entry["not timed"] = f"no TileLang build: {type(e).__name__}: {str(e)[:200]}"
            return entry
        saved = _snapshot(touched)
        if isinstance(saved, str):
            entry["not timed"] = saved.replace("not replayed", "not timed")
            return entry
        runs = {"tilelang": lambda: twin(*args, **kwargs), "tlx": lambda: fn(kernel, *args, **kwargs)}
        try:
            with self.lock.hold(exclusive=True):
                entry.update(paired_times(runs, self.clock, self.paired_rounds))
        except Exception as e:  # noqa: BLE001 - recorded; the test goes on
            entry["not timed"] = f"{type(e).__name__}: {str(e)[:200]}"
        finally:
            for t, s in zip(touched, saved):
                _write_back(t, s)
        return entry

    def kernel_of(self, kernel) -> int:
        """The kernel's index in ``self.kernels``, recording its CUDA source hash and nvcc flags on first sight."""
        known = self.kernel_index.get(id(kernel))
        if known:
            return known[1]
        try:
            source = kernel.get_kernel_source()
        except Exception as e:  # noqa: BLE001 - a kernel without source is recorded as such, the test goes on
            source, error = None, f"{type(e).__name__}: {e}"
        sha, renamed = _cuda_hashes(source) if isinstance(source, str) else (None, None)
        metadata = getattr(kernel, "metadata", None)
        if isinstance(metadata, dict) and metadata.get("nvcc_command"):  # tlx: the command it ran, saved with the build
            flags = _nvcc_flags(metadata["nvcc_command"][1:])
        else:  # tilelang: the flags its compile of this source used (none seen when its cache served the kernel)
            flags = self.flags_by_source.get(sha)
        info = {"name": _kernel_name(kernel), "cuda_sha256": sha, "cuda_sha256_renamed": renamed, "nvcc_flags": flags}
        if sha is None:
            info["source_error"] = error if source is None else f"get_kernel_source returned {type(source).__name__}"
        self.kernels.append(info)
        self.kernel_index[id(kernel)] = (kernel, len(self.kernels) - 1)
        return len(self.kernels) - 1

    def compile_key(self, make_key):
        """Wraps TileLang's ``CUDABinaryCache.make_key``, which every device compile of the
        tilelang arm calls with the CUDA source and the nvcc options (a cache hit or not)."""
        recorder = self

        def key(*args, **kw):
            flags = [f"--{kw['compile_format']}", "-O3", "-lineinfo", f"-arch=sm_{kw['target_arch']}", *(kw.get("options") or [])]
            recorder.flags_by_source[hashlib.sha256(kw["code"].encode()).hexdigest()] = _nvcc_flags(flags)
            return make_key(*args, **kw)

        return key

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
        record = {"outcomes": self.outcomes, "calls": self.calls, "kernels": self.kernels, "bench_ms": self.bench_ms,
                  "paired": self.paired, "lock_wait_s": round(self.lock.wait_s, 2)}
        Path(self.log).write_text(json.dumps(record))


_recorder: _Recorder | None = None
_REPLAYED_CALLS = 2  # per kernel: the first calls, run again to see whether the kernel reproduces itself
_REPLAY_TRIES = 3  # runs of each replayed call (stopping at the first that differs): atomics' order varies run to run


def paired_times(runs: dict, clock, rounds: int) -> dict:
    """Each arm's milliseconds per call, measured side by side: ``runs`` maps an arm to a
    zero-argument call, ``clock(run, n)`` gives the ms per call of n back-to-back calls. Two
    warm-up calls each (a call one arm refuses raises here), then ``rounds`` rounds of one
    sample per arm, the order alternating, n calls a sample (about ``_PAIRED_SAMPLE_MS``);
    the median per arm and the spread of its samples (interquartile range over the median)."""
    for run in runs.values():
        clock(run, 2)
    single = max(clock(run, 1) for run in runs.values())
    n = max(1, min(_PAIRED_MAX_CALLS, int(_PAIRED_SAMPLE_MS / max(single, 1e-4))))
    arms = list(runs)
    samples = {arm: [] for arm in arms}
    for r in range(rounds):
        for arm in arms if r % 2 == 0 else arms[::-1]:
            samples[arm].append(clock(runs[arm], n))
    median = {arm: statistics.median(v) for arm, v in samples.items()}
    spread = {}
    for arm, v in samples.items():
        q1, _, q3 = statistics.quantiles(v, n=4)
        spread[arm] = (q3 - q1) / median[arm] if median[arm] > 0 else math.inf
    return {"calls per sample": n, "rounds": rounds, "ms": median, "spread": spread}


def _cuda_clock(run, n: int) -> float:
    """ms per call of n back-to-back calls, between CUDA events on the current stream (where
    both arms' launchers launch)."""
    import torch

    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(n):
        run()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / n


def _tilelang_twins(tilelang_compile):
    """Hook tlx's ``compile_kernel`` to remember each kernel's program and options, and return
    kernel -> TileLang's build of that program (``tilelang_compile``, TileLang's own compile:
    the same outputs, target and pass configs, nvcc flags among them), built on first use."""
    import tlx.compiler

    compile_kernel, programs, twins = tlx.compiler.compile_kernel, {}, {}

    def remembered(program, options, **keys):  # compile_kernel's keywords (name, program_key, label) passed on
        kernel = compile_kernel(program, options, **keys)
        programs[id(kernel)] = (kernel, program, options)  # the kernel held: its id stays unique
        return kernel

    def twin(kernel):
        if id(kernel) not in twins:
            if id(kernel) not in programs:
                raise LookupError("the kernel was not built through tlx.compiler.compile_kernel")
            prim_func, options = tlx.compiler.build_program(*programs[id(kernel)][1:])
            twins[id(kernel)] = tilelang_compile(prim_func, target=options.target_dict(), **_caller_options(prim_func, options))
        return twins[id(kernel)]

    tlx.compiler.compile_kernel = remembered
    return twin


def _caller_options(prim_func, options) -> dict:
    """``out_idx`` and ``pass_configs`` as the caller gave them to tlx: without what tlx merged
    in from the program itself (``T.empty`` outputs, its compile flags appended to the device
    flags, jit.program_options), which ``tilelang.compile`` merges in again from the same
    attributes."""
    from tlx.numerics.modes import DEVICE_FLAGS_CONFIG

    attrs = prim_func.attrs or {}
    pass_configs = options.pass_config_dict()
    if "tilelang_compile_flags" in attrs:
        own = [str(f) for f in attrs["tilelang_compile_flags"]]
        flags = list(pass_configs.get(DEVICE_FLAGS_CONFIG) or [])
        if own and flags[-len(own):] == own:
            pass_configs[DEVICE_FLAGS_CONFIG] = flags[:-len(own)]
            if not pass_configs[DEVICE_FLAGS_CONFIG]:
                del pass_configs[DEVICE_FLAGS_CONFIG]
    out_idx = None if "tilelang_out_idx" in attrs else list(options.out_idx) or None
    return {"out_idx": out_idx, "pass_configs": pass_configs or None}


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


_WORKSPACES = "up to workspace numbering"
_WORKSPACE = re.compile(r"\bworkspace_\d+\b")


def _cuda_hashes(source: str) -> tuple[str, str]:
    """SHA-256 of a CUDA source, and of it with its reduction workspaces' names made one
    (``workspace``, ``workspace_1``, ...): TileLang's codegen hands a kernel's equal-sized
    cross-warp reduction workspaces to its reductions in an order that varies from process to
    process (three fresh processes gave three different sources for its own build of the
    sparse_mla_fwd example, 2026-12-03), so two builds that differ only there compiled the
    same program."""
    return hashlib.sha256(source.encode()).hexdigest(), hashlib.sha256(_WORKSPACE.sub("workspace", source).encode()).hexdigest()


def _kernel_name(kernel) -> str:
    """tlx's ``Kernel.name``, else the global symbol of TileLang's prim_func, else the type."""
    name = getattr(kernel, "name", None)
    if not name:
        try:
            name = kernel.prim_func.attrs["global_symbol"]
        except Exception:  # noqa: BLE001 - a name is a convenience; the hash identifies the kernel
            name = type(kernel).__name__
    return str(name)


def _nvcc_flags(command: list) -> list[str]:
    """nvcc flags without paths (include directories, output, source), sorted: comparable across arms."""
    flags, skip = [], False
    for arg in map(str, command):
        if skip:
            skip = False
        elif arg == "-o":
            skip = True
        elif not (arg.startswith(("-I", "-ccbin")) or arg.endswith((".cu", ".cubin", ".fatbin"))):
            flags.append(arg)
    return sorted(flags)


def _touched_tensors(values: list) -> list:
    """The distinct tensors among ``values``, a pointer table replaced by the tensors it points to
    (its own bytes are addresses, which differ between processes; the bytes behind them do not)."""
    seen, out = set(), []
    for t in _tensors(values):
        for target in _pointer_targets(t) or [t]:
            if id(target) not in seen:
                seen.add(id(target))
                out.append(target)
    return out


def _pointer_targets(t) -> list | None:
    """The live tensors whose addresses make up ``t`` when ``t`` is a small int64 vector of
    such addresses (a kernel's ``T.ptr`` table), else None."""
    import gc
    import warnings

    import torch

    if t.dtype != torch.int64 or t.dim() != 1 or not 0 < t.numel() <= 4096 or int(t.min()) < (1 << 20):
        return None
    addresses = set(t.tolist())
    by_address = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for o in gc.get_objects():
            try:
                found = isinstance(o, torch.Tensor) and o.device == t.device and o.data_ptr() in addresses
            except Exception:  # noqa: BLE001 - an object that fails isinstance or a tensor without storage: not a target
                continue
            if found:
                # of the tensors starting there (a view ``c[:n]`` and ``c``), the largest, whatever order gc lists them in
                extent = (o.numel() * o.element_size(), o.is_contiguous(), str(o.dtype), tuple(o.shape))
                if o.data_ptr() not in by_address or extent > by_address[o.data_ptr()][0]:
                    by_address[o.data_ptr()] = (extent, o)
    if set(by_address) != addresses:
        return None
    return [by_address[a][1] for a in dict.fromkeys(t.tolist())]


def _snapshot(tensors: list) -> list | str:
    """Copies of ``tensors`` to restore them from, or why there are none."""
    import torch

    if any(torch._debug_has_internal_overlap(t) != 0 for t in tensors):  # an expanded view cannot be written back
        return "not replayed: an argument's elements share memory"
    try:
        with torch.no_grad():
            return [t.detach().clone() for t in tensors]
    except torch.OutOfMemoryError:
        return "not replayed: no memory for a copy of the inputs"


def _write_back(t, saved) -> None:
    """Copy ``saved`` into ``t``'s memory through an alias with a version counter of its own:
    ``t.copy_`` would advance ``t``'s, and autograd refuses a backward through a tensor saved for
    it whose version moved (the examples' backward tests failed so in both arms)."""
    import torch

    alias = torch.empty(0, dtype=t.dtype, device=t.device)
    with torch.no_grad():
        alias.set_(t.untyped_storage(), t.storage_offset(), t.size(), t.stride()).copy_(saved)


def _replay(run, touched: list, snapshot: list, first: list) -> str:
    """Run a call again from the inputs in ``snapshot`` (copied back into ``touched``) up to
    ``_REPLAY_TRIES`` times: "same" when every run's checksums equal ``first``'s."""
    import torch

    for attempt in range(1, _REPLAY_TRIES + 1):
        try:
            for t, saved in zip(touched, snapshot):
                _write_back(t, saved)
            again = [_checksum(t) for t in (*_tensors(run()), *touched)]
        except Exception as e:  # noqa: BLE001 - recorded; the test goes on with the state it has
            return f"replay failed: {type(e).__name__}: {str(e)[:200]}"
        if again != first:
            return f"differs (run {attempt + 1})"
    return "same"


def install() -> None:
    """Patch the arm named by ``$TLX_DROPIN_ARM`` in and hook the recorder (pytest plugin entry)."""
    import atexit

    import tilelang
    import tilelang.autotuner
    import tilelang.profiler
    import tilelang.profiler.bench
    import torch

    global _recorder, _test_lock
    serve_newer_imports()  # a suite written for a newer TileLang (DeepSeek's TileKernels), in both arms
    arm, log = os.environ[_ENV_ARM], os.environ[_ENV_LOG]
    if os.environ.get(_ENV_TIMING):  # each test body holds the lock exclusively, the recorder none
        _test_lock = _GpuLock(os.environ.get(_ENV_LOCK))
        _recorder = recorder = _Recorder(log, _GpuLock(None), checks=False)
    else:
        _recorder = recorder = _Recorder(log, _GpuLock(os.environ.get(_ENV_LOCK)))
    atexit.register(recorder.save)
    if arm == "tlx":
        import tlx
        from tlx.kernel import Kernel

        recorder.paired_rounds = int(os.environ.get(_ENV_PAIRED) or 0)
        if recorder.paired_rounds and recorder.checks:
            recorder.twin, recorder.clock = _tilelang_twins(tilelang.compile), _cuda_clock
        tilelang.jit, tilelang.compile = tlx.jit, tlx.compile
        tilelang.autotune = tilelang.autotuner.autotune = tlx.autotune
        Kernel.__call__ = recorder.kernel_call(_call_of(Kernel))
    elif arm == "tilelang":
        from tilelang.cache.cuda_binary_cache import CUDABinaryCache
        from tilelang.jit.adapter.base import BaseKernelAdapter
        from tilelang.jit.kernel import JITKernel

        CUDABinaryCache.make_key = staticmethod(recorder.compile_key(CUDABinaryCache.make_key))

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


_test_lock: _GpuLock | None = None


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """In the timing phase the whole test (setup, body, teardown) holds the GPU lock
    exclusively: its benchmarks share the GPU with nothing; other processes only start up."""
    with _test_lock.hold(exclusive=True) if _test_lock else contextlib.nullcontext():
        yield


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
def _env(arm: str, log: Path, file: Path, lock: Path | None, collect: Path | None = None, timing: bool = False,
         paired_rounds: int = 0) -> dict:
    env = {**os.environ, _ENV_ARM: arm, _ENV_LOG: str(log), "TILELANG_AUTO_TUNING_DISABLE_CACHE": "1",
           "PYTHONPATH": os.pathsep.join(p for p in (str(_ROOT), str(file.parent), os.environ.get("PYTHONPATH", "")) if p)}
    if timing:
        env[_ENV_TIMING] = "1"
    if paired_rounds:
        env[_ENV_PAIRED] = str(paired_rounds)
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

    def __init__(self, out: Path, lock: Path | None, paired_rounds: int = 0):
        self.out, self.lock, self.paired_rounds = out, lock, paired_rounds
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


def run_item(runner: Runner, examples: Path, nodeid: str, arm: str, timeout: float, timing_round: int | None = None) -> dict:
    """One arm of one item in a fresh process; ``timing_round``: a run of the timing phase."""
    file, _, name = nodeid.partition("::")
    path = examples / file
    stem = f"{_safe(nodeid)}.{arm}" + (f".timing{timing_round}" if timing_round is not None else "")
    log = runner.out / "items" / f"{stem}.json"
    log.parent.mkdir(parents=True, exist_ok=True)
    log.unlink(missing_ok=True)
    t0 = time.perf_counter()
    env = _env(arm, log, path, runner.lock, timing=timing_round is not None, paired_rounds=runner.paired_rounds)
    rc, text = runner.run(_pytest("-x", f"{path.name}::{name}"), path.parent, env, timeout)
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
            **{k: recorded.get(k, []) for k in ("calls", "kernels", "bench_ms", "paired")}, "lock_wait_s": recorded.get("lock_wait_s")}


def compare(results: dict) -> dict:
    """One table row from the two arms' results of one item."""
    tl, tx = results["tilelang"], results["tlx"]
    row = {arm: r["status"] for arm, r in results.items()}
    a, b = tl["calls"], tx["calls"]
    if tl["status"] != "pass" or tx["status"] != "pass":
        row["outputs"] = "n/a (not both passed)"
    elif not a and not b:
        row["outputs"] = "n/a (no kernel output recorded)"
    elif len(a) != len(b):
        row["outputs"] = f"n/a ({len(a)} vs {len(b)} calls recorded)"
    else:
        row.update(classify_outputs(tl, tx))
    ta, tb = sum(tl["bench_ms"]), sum(tx["bench_ms"])
    if len(tl["bench_ms"]) == len(tx["bench_ms"]) and ta > 0 and tl["status"] == tx["status"] == "pass":
        row["time tlx/tilelang"] = f"{tb / ta:.3f} ({len(tx['bench_ms'])} timings, beside other items)"
        row["ratio"] = tb / ta
    else:
        row["time tlx/tilelang"] = "n/a" if not (tl["bench_ms"] or tx["bench_ms"]) else f"n/a ({len(tl['bench_ms'])} vs {len(tx['bench_ms'])} timings)"
    row.update(paired_row(tl, tx))
    row["wall s"] = f"{tl['seconds']} / {tx['seconds']}"
    return row


def paired_row(tl: dict, tx: dict) -> dict:
    """The tlx arm's paired timings as row cells: the ratio of the summed ms per call of the
    kernels timed against TileLang's builds (each kernel weighted by its time), the largest
    spread of any arm's samples, and how many of the pairs compiled the same CUDA."""
    paired = tx.get("paired", [])
    timed = [p for p in paired if "ms" in p]
    if tl["status"] != "pass" or tx["status"] != "pass" or not timed:
        reasons = sorted({p["not timed"] for p in paired if "not timed" in p})
        return {"kernel time tlx/tilelang": "n/a" + (f" ({'; '.join(reasons)[:200]})" if reasons else "")}
    a, b = (sum(p["ms"][arm] for p in timed) for arm in ARMS)
    spread = max(max(p["spread"].values()) for p in timed)
    same = sum(p.get("same CUDA") is True for p in timed)
    renamed = sum(p.get("same CUDA") == _WORKSPACES for p in timed)
    untimed = f", {len(paired) - len(timed)} not timed" if len(timed) < len(paired) else ""
    return {"paired ratio": b / a, "paired spread": spread,
            "kernel time tlx/tilelang": f"{b / a:.3f} ({len(timed)} kernels{untimed}, {a * 1e3:.1f} us a call set under "
                                        f"TileLang; spread {spread:.1%}; same CUDA {same}/{len(timed)}"
                                        + (f", {renamed} more {_WORKSPACES}" if renamed else "") + ")"}


def classify_outputs(tl: dict, tx: dict) -> dict:
    """Equal, or why not: a call that differs after (or at) a call of a kernel that did not
    reproduce its own output bytes in the tilelang arm is explained by that nondeterminism
    (its outputs feed what follows); a call that differs with every kernel so far
    reproducing itself in both arms is a real divergence. The CUDA source and nvcc flags
    of the kernels involved say whether the two arms even compiled the same thing."""
    a, b = tl["calls"], tx["calls"]
    differ = [i for i, (x, y) in enumerate(zip(a, b)) if x["checksums"] != y["checksums"]]
    code = _same_code(tl["kernels"], tx["kernels"], {c["kernel"] for c in a} | {c["kernel"] for c in b})
    replay = {arm: _replays(r["calls"]) for arm, r in (("tilelang", tl), ("tlx", tx))}
    if not differ:
        return {"outputs": "bitwise equal", "outputs class": "equal", "code": code, "replays": replay}
    unstable = {c["kernel"] for c in a if c.get("replay", "").startswith("differs")}
    unstable_from = next((i for i, c in enumerate(a) if c["kernel"] in unstable), None)
    real = [i for i in differ if unstable_from is None or i < unstable_from]
    selves = "; ".join(f"{arm} {'not reproducible itself' if r['differs'] else 'reproduces itself'}: "
                       f"{r['differs'] or r['same']}/{r['replayed']} replayed calls" for arm, r in replay.items())
    if real:
        verdict = f"DIFFER in {len(differ)}/{len(a)} calls, {len(real)} of them before any nondeterminism ({selves}; {code})"
        kind = "real"
    else:
        verdict = f"DIFFER in {len(differ)}/{len(a)} calls (tilelang not reproducible itself: {replay['tilelang']['differs']}/" \
                  f"{replay['tilelang']['replayed']} replayed calls; tlx {replay['tlx']['differs']}/{replay['tlx']['replayed']}; {code})"
        kind = "tilelang nondeterministic"
    return {"outputs": verdict, "outputs class": kind, "first differing call": differ[0], "code": code, "replays": replay}


def _replays(calls: list) -> dict:
    verdicts = [c["replay"] for c in calls if "replay" in c]
    return {"replayed": len(verdicts), "same": verdicts.count("same"), "differs": sum(v.startswith("differs") for v in verdicts),
            "not compared": [v for v in verdicts if v != "same" and not v.startswith("differs")]}


def _same_code(tl_kernels: list, tx_kernels: list, used: set) -> str:
    """"same CUDA, same flags" when every kernel called has the same source hash and nvcc
    flags in both arms (kernels matched by order of first call), else what differs."""
    if len(tl_kernels) != len(tx_kernels):
        return f"{len(tl_kernels)} vs {len(tx_kernels)} kernels"
    pairs = [(tl_kernels[k], tx_kernels[k]) for k in sorted(used)]
    cuda = sum(x["cuda_sha256"] != y["cuda_sha256"] or x["cuda_sha256"] is None for x, y in pairs)
    renamed = sum(x["cuda_sha256"] != y["cuda_sha256"] and x["cuda_sha256"] is not None
                  and x.get("cuda_sha256_renamed") == y.get("cuda_sha256_renamed") is not None for x, y in pairs)
    unknown = sum(x["nvcc_flags"] is None or y["nvcc_flags"] is None for x, y in pairs)
    flags = sum(x["nvcc_flags"] != y["nvcc_flags"] for x, y in pairs if x["nvcc_flags"] is not None and y["nvcc_flags"] is not None)
    parts = ["same CUDA" if not cuda else f"CUDA differs in {cuda}/{len(pairs)} kernels"
             + (f" ({'all' if renamed == cuda else renamed} {_WORKSPACES})" if renamed else ""),
             "same flags" if not (flags or unknown) else
             ", ".join(p for p in (f"flags differ in {flags}/{len(pairs)}" if flags else "", f"flags unknown for {unknown}/{len(pairs)} (tilelang cache hit)" if unknown else "") if p)]
    return ", ".join(parts)


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
        self.timing_pending: list[str] = []  # timed items the timing phase has not reached
        self.running: dict[str, str] = {}
        self.guard = threading.RLock()  # re-entered by the final write when a signal lands inside one

    def load(self, state: dict) -> None:
        """An earlier run's rows and lists (``--merge``); its meta kept under "merged"."""
        self.rows, self.not_applicable = state["rows"], state["not_applicable"]
        self.collect_errors, self.decorated = state["collect_errors"], state.get("decorated", {})
        self.running, self.pending = state["running"], state["not_reached"]
        self.timing_pending = state.get("timing_not_reached", [])
        self.meta["merged"] = [*state["meta"].pop("merged", []), state["meta"]]

    def write(self) -> None:
        with self.guard:
            state = {"meta": {**self.meta, "written": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())}, "summary": self.summary(),
                     "rows": self.rows, "not_applicable": self.not_applicable, "collect_errors": self.collect_errors,
                     "decorated": self.decorated, "running": self.running, "not_reached": self.pending,
                     "timing_not_reached": self.timing_pending}
            _write_atomic(self.out / "results.json", json.dumps(state, indent=1, default=str))
            _write_atomic(self.out / "results.md", self.markdown(state))

    def summary(self) -> dict:
        rows = [r for r in self.rows.values() if "tlx" in r]
        base = [r for r in rows if r["tilelang"] == "pass"]
        ratios = [r["ratio"] for r in base if "ratio" in r]
        geomean = math.exp(sum(map(math.log, ratios)) / len(ratios)) if ratios else None
        settled = [r for r in base if r.get("noise") is not None and r["noise"] <= 0.02]
        return {"items finished": len(rows), "pass under tilelang.jit": len(base),
                "of those, pass under tlx.jit": sum(r["tlx"] == "pass" for r in base),
                "of those, outputs bitwise equal": sum(r["outputs"] == "bitwise equal" for r in base),
                "outputs differ after tilelang's own nondeterminism": sum(r.get("outputs class") == "tilelang nondeterministic" for r in base),
                "of those, same CUDA source in both arms": sum(r.get("outputs class") == "tilelang nondeterministic"
                                                               and r["code"].startswith("same CUDA") for r in base),
                "outputs differ with both arms reproducing themselves (real)": sum(r.get("outputs class") == "real" for r in base),
                "pass only under tlx.jit": sum(r["tlx"] == "pass" and r["tilelang"] != "pass" for r in rows),
                "timed": len(ratios), "of those, timed alone": sum("ratio" in r and "ratio beside other items" in r for r in base),
                "time within 2%": sum(abs(x - 1) <= 0.02 for x in ratios),
                "of those timed alone, with each arm's rounds within 2% of each other": len(settled),
                "of those, time within 2%": sum(abs(r["ratio"] - 1) <= 0.02 for r in settled),
                "time ratio geomean": round(geomean, 4) if geomean else None,
                **paired_summary(base),
                "not applicable here": len(self.not_applicable), "files failing collection": len(self.collect_errors),
                "running when written": len(self.running), "not reached": len(self.pending)}

    @staticmethod
    def markdown(state: dict) -> str:
        columns = ["tilelang", "tlx", "outputs", "kernel time tlx/tilelang", "time tlx/tilelang", "wall s"]
        lines = [f"TileLang example tests, tilelang.jit vs tlx.jit ({state['meta']['written']}; {state['meta']['command']})",
                 *(f"Continues the table of {m.get('written')}; {m.get('command')}" for m in state["meta"].get("merged", [])), "",
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
                               ("Running when written (cut)", state["running"]), ("Not reached", {n: "" for n in state["not_reached"]}),
                               ("Timing phase not reached (the figure is the first phase's, beside other items)", {n: "" for n in state["timing_not_reached"]})):
            if entries:
                lines += ["", f"{title}: {len(entries)}", *(f"- `{k}`{': ' + v if v else ''}" for k, v in entries.items())]
        return "\n".join(lines) + "\n"


def paired_summary(rows: list[dict]) -> dict:
    """The summary's counts of the paired timings (rows that pass under tilelang.jit)."""
    ratios = [r["paired ratio"] for r in rows if "paired ratio" in r]
    settled = [r for r in rows if r.get("paired spread", math.inf) <= 0.02]
    return {"kernel-timed (paired, in one process)": len(ratios),
            "kernel time within 2%": sum(abs(x - 1) <= 0.02 for x in ratios),
            "kernel time ratio geomean": round(math.exp(sum(map(math.log, ratios)) / len(ratios)), 4) if ratios else None,
            "kernel time ratio range": [round(min(ratios), 4), round(max(ratios), 4)] if ratios else None,
            "of those kernel-timed, spread within 2%": len(settled),
            "of those, kernel time within 2%": sum(abs(r["paired ratio"] - 1) <= 0.02 for r in settled)}


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
    parser.add_argument("--exclude", action="append", default=[], metavar="TEXT", help="leave out test files and items whose id contains TEXT (repeatable)")
    parser.add_argument("--timing-rounds", type=int, default=3, help="rounds of the timing phase (0: none; each round runs both arms once)")
    parser.add_argument("--timing-jobs", type=int, default=2, help="timing-phase processes at once (their tests run one at a time)")
    parser.add_argument("--timing-deadline", type=float, help="seconds after the start after which no item starts its timing rounds")
    parser.add_argument("--paired-rounds", type=int, default=9,
                        help="rounds of the tlx arm's paired timing of each kernel against TileLang's build of it (0: none)")
    parser.add_argument("--merge", type=Path, metavar="RESULTS.json",
                        help="start from an earlier run's table: only the TARGETs given run (none: no first phase), then the timing phase")
    parser.add_argument("--per-test", type=int, metavar="N",
                        help="of each test function's items, the first and a seeded sample of N - 1 others (suites that "
                             "parametrize thousands, as TileKernels'); benchmark items left out")
    parser.add_argument("--longest-first", action="store_true", help="start the costliest items first (shortest run when all must finish)")
    args = parser.parse_args(argv)
    examples = args.examples / "examples" if (args.examples / "examples").is_dir() else args.examples
    if not examples.is_dir() or not any(examples.rglob("test_*.py")):
        parser.error(f"examples: {args.examples} holds no test_*.py (expected a TileLang checkout or its examples/)")
    for name in ("jobs", "timing_jobs"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')}: expected at least 1, got {getattr(args, name)}")
    if args.timing_rounds < 0:
        parser.error(f"--timing-rounds: expected 0 or more, got {args.timing_rounds}")
    if args.paired_rounds != 0 and args.paired_rounds < 3:
        parser.error(f"--paired-rounds: expected 0 or at least 3 (a spread needs quartiles), got {args.paired_rounds}")
    if args.merge and not args.merge.is_file():
        parser.error(f"--merge: {args.merge} is not a file")
    start = time.monotonic()
    args.out.mkdir(parents=True, exist_ok=True)
    files = [(f, n) for f, n in test_files(examples, args.targets) if not any(text in f for text in args.exclude)]
    runner = Runner(args.out, args.out / "gpu.lock", args.paired_rounds)
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
        if args.merge:
            table.load(json.loads(args.merge.read_text()))
        if args.targets or not args.merge:
            _run_all(runner, examples, files, args, table, start)
        _timing_phase(runner, examples, args, table, start)
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
            if (name is None or name in (rest, rest.split("[")[0])) and not any(text in item["nodeid"] for text in args.exclude):
                wanted[item["nodeid"]] = item
    if args.per_test:
        wanted = {n: wanted[n] for n in sample_per_test(list(wanted), args.per_test)}
    for nodeid, item in wanted.items():
        if item["skip"]:
            table.not_applicable[nodeid] = item["skip"]
    measured = _measured_costs(args.costs)
    tuned = {f for f, c in collected.items() if any("AutoTune" in kind for kind in c.get("decorated", {}))}
    order = sorted((n for n, i in wanted.items() if not i["skip"]), key=lambda n: _estimated_cost(n, measured, n.split("::")[0] in tuned),
                   reverse=args.longest_first)
    with table.guard:
        table.pending = [n for n in table.pending if n not in wanted] + order  # a merged table's items not reached stay listed
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
        print(f"[{time.monotonic() - start:6.0f}s] {nodeid}: {row['tilelang']} / {row['tlx']}; {row['outputs']}; kernels {row['kernel time tlx/tilelang']}; "
              f"do_bench {row['time tlx/tilelang']}", flush=True)

    _parallel(args.jobs, work, one)


def apply_timing(row: dict, rounds: list[dict]) -> None:
    """Put the timing phase's result into ``row``: each round (one run of each arm, tilelang
    first) gives the ratio of the arms' summed benchmark times; the row's ratio becomes the
    median of those, the loaded phase's figure kept beside it. A round where an arm failed or
    timed a different number of benchmarks gives no ratio (its reason is kept)."""
    ratios, problems, sums = [], [], {arm: [] for arm in ARMS}
    for i, pair in enumerate(rounds, 1):
        tl, tx = pair["tilelang"], pair["tlx"]
        if tl["status"] != "pass" or tx["status"] != "pass":
            problems.append(f"round {i}: tilelang {tl['status']}, tlx {tx['status']}")
        elif len(tl["bench_ms"]) != len(tx["bench_ms"]) or not sum(tl["bench_ms"]):
            problems.append(f"round {i}: {len(tl['bench_ms'])} vs {len(tx['bench_ms'])} timings")
        else:
            ratios.append(sum(tx["bench_ms"]) / sum(tl["bench_ms"]))
            for arm in ARMS:
                sums[arm].append(sum(pair[arm]["bench_ms"]))
    row["timing"] = {"ratios": ratios, "problems": problems,
                     **{f"{arm} ms": [pair[arm]["bench_ms"] for pair in rounds] for arm in ARMS},
                     "wall s": [[pair[arm]["seconds"] for arm in ARMS] for pair in rounds]}
    if not ratios:
        row["time tlx/tilelang"] += f" (timing phase gave none: {'; '.join(problems)})"
        return
    if "ratio" in row and "ratio beside other items" not in row:
        row["ratio beside other items"] = row["ratio"]
    row["ratio"] = statistics.median(ratios)
    # how far one arm's own rounds disagree: a ratio finer than that says nothing (one round: unknown)
    row["noise"] = max(max(t) / min(t) - 1 for t in sums.values()) if len(ratios) > 1 else None
    noise = "one round: noise unknown" if row["noise"] is None else f"an arm's own rounds differ by up to {100 * row['noise']:.1f}%"
    row["time tlx/tilelang"] = (f"{row['ratio']:.3f} (alone; median of {len(ratios)} rounds: {', '.join(f'{r:.3f}' for r in ratios)}; {noise}"
                                + (f"; {'; '.join(problems)}" if problems else "")
                                + (f"; beside other items {row['ratio beside other items']:.3f}" if "ratio beside other items" in row else "") + ")")


def _timing_phase(runner: Runner, examples: Path, args, table: Table, start: float) -> None:
    """Every item timed in both arms runs again ``--timing-rounds`` times per arm, arms
    alternating (tilelang, tlx, tilelang, tlx, ...), after everything else has finished: each
    test process holds the GPU lock exclusively for its whole test, so a benchmark shares the
    GPU with no other work; ``--timing-jobs`` processes at once only overlap their start-up
    (imports, collection: CPU). Kernels come from the caches the first phase filled."""
    if not args.timing_rounds:
        return
    chosen = [n for n, r in table.rows.items() if "ratio" in r and "timing" not in r]
    order = sorted(chosen, key=lambda n: sum(table.rows[n].get("detail", {}).get(arm, {}).get("seconds", 0) for arm in ARMS))
    table.meta["timing phase"] = {"items": len(order), "rounds": args.timing_rounds, "jobs": args.timing_jobs,
                                  "started s": round(time.monotonic() - start, 1)}
    table.timing_pending = list(order)
    table.write()

    def one(nodeid):
        if args.timing_deadline is not None and time.monotonic() - start > args.timing_deadline or runner.stopped:
            return
        with table.guard:
            table.timing_pending.remove(nodeid)
        rounds = []
        for r in range(1, args.timing_rounds + 1):
            pair = {}
            for arm in ARMS:
                with table.guard:
                    table.running[nodeid] = f"timing round {r}/{args.timing_rounds}, {arm} arm running"
                table.write()
                left = args.stop - (time.monotonic() - start) if args.stop else args.timeout
                pair[arm] = run_item(runner, examples, nodeid, arm, min(args.timeout, left), timing_round=r)
                if pair[arm]["status"] in ("stopped", "not run (stopped)"):
                    with table.guard:  # cut: the row keeps the first phase's figure
                        table.running[nodeid] = f"timing round {r}, {arm} arm stopped (row keeps the first phase's figure)"
                    table.write()
                    return
            rounds.append(pair)
        with table.guard:
            table.running.pop(nodeid)
            apply_timing(table.rows[nodeid], rounds)
        table.write()
        print(f"[{time.monotonic() - start:6.0f}s] timing {nodeid}: {table.rows[nodeid]['time tlx/tilelang']}", flush=True)

    _parallel(args.timing_jobs, collections.deque(order), one)


if __name__ == "__main__":
    sys.exit(main())
