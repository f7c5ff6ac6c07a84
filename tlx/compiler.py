"""Compile a TileLang program into a tlx kernel.

The pipeline is an ordered dict of stages, each ``(module, build) -> module``:

    tir  --lower-->  LoweredKernel  --passes-->  LoweredKernel  --cuda-->  CUDA source
         --cubin-->  nvcc under way  --launcher-->  C++ launcher source  --library-->  .so path

Two stages start work that a later stage joins, so that the launcher builds while nvcc runs:
the cubin stage starts nvcc and returns it as a :class:`Background`; the launcher stage starts
the compile of the launcher to assembly (which needs no cubin), then joins nvcc; the library
stage joins that compile, then assembles (embedding the cubin) and links it with the
launchers' runtime object (built once per cache with the launchers' precompiled header,
:func:`tlx.hostgen.runtime_support`).
``build.background`` records each; a compile that stops early or fails ends what is still
running.

nvcc starts as early as the CUDA can be known: a compile that goes on to the cubin runs only
the device passes before it, on the kernel as lowered, and the analyses (bounds, guard
elimination, layouts, ...) beside nvcc. When they leave the kernel unchanged, as they do
unless guard elimination removes a guard, nvcc is compiling the pipeline's CUDA; otherwise it
is restarted on the rewritten kernel (:func:`_confirm_speculation`).

``build`` (a :class:`Build`) is the one record a compile keeps besides the module: the
options, the pass configs (a pin's merged in before lowering, so TileLang, code generation
and nvcc see the same set), the passes' reports and preconditions, and the work directory.
Its :meth:`Build.metadata` is saved beside the artifacts. The whole result is cached on disk
under one hash of everything that decides it (the program text, options, target, flags and
tool versions); a hit loads the library without lowering.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import tempfile
import time
import warnings
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tlx.options import Options, cache_dir

__all__ = ["STAGES", "Build", "cache_key", "compile_artifacts", "compile_kernel", "nvcc_command", "ptxas_performance_losses",
           "pass_options", "tlx_source_files", "tool_versions"]

_ARTIFACTS = ("kernel.cu", "kernel.cubin", "launcher.cc", "metadata.json")


@dataclass
class Background:
    """A tool a stage started and a later stage joins: its command, process and start time;
    ``output``, a file it writes outside the work directory (removed if it is cancelled);
    ``errors``, its stderr, a file rather than a pipe: nobody reads until the join, and a tool
    with more to say than a pipe holds (nvcc's warnings) would wait for it."""

    what: str
    command: list[str]
    process: subprocess.Popen
    started: float
    errors: Any
    output: Path | None = None

    @classmethod
    def start(cls, what: str, command: list[str], output: Path | None = None) -> Background:
        errors = tempfile.TemporaryFile()
        proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=errors)
        return cls(what, command, proc, time.perf_counter(), errors, output)

    def join(self, build: Build) -> None:
        """Wait for the tool; record its wall time in ``build``; raise with its errors if it failed."""
        self.process.wait()
        build.background_seconds.setdefault(self.what, round(time.perf_counter() - self.started, 4))
        if self.process.returncode != 0:
            self.errors.seek(0)
            stderr = self.errors.read().decode(errors="replace")
            raise RuntimeError(f"{build.name}: {self.what} failed ({' '.join(self.command)}):\n{stderr[-4000:]}")

    def cancel(self) -> None:
        """End the tool if nobody joined it (a compile that stopped early or failed), and remove
        its ``output`` if nobody took it."""
        if self.process.returncode is None:
            self.process.kill()
            self.process.wait()
        if self.output:
            self.output.unlink(missing_ok=True)


@dataclass
class Build:
    """One compile: what the stages read, and what each leaves for the ones after it."""

    name: str
    target: dict
    options: dict  # what every pass sees (:func:`pass_options`)
    pass_configs: dict  # TileLang's pass configs; the lower stage merges a pin's in
    workdir: Path
    source: Any = None  # the kernel factory, for source lines in ``tlx check``
    lowered: Any = None  # the LoweredKernel after the passes (the launcher is planned from it)
    passes: Any = None  # the PassContext the passes filled: reports, preconditions, nvcc flags
    launcher_info: dict = field(default_factory=dict)
    nvcc_command: list[str] = field(default_factory=list)
    stage_seconds: dict[str, float] = field(default_factory=dict)
    background: dict[str, Background] = field(default_factory=dict)  # work a stage started, by what it makes
    background_seconds: dict[str, float] = field(default_factory=dict)  # each one's wall time, start to join
    runtime: Path | None = None  # the launchers' runtime object (tlx.hostgen.runtime_support)
    runtime_builds: list = field(default_factory=list)  # the runtime support this compile builds (tlx.hostgen.SupportBuild)
    speculate: bool = False  # start nvcc before the analyses (the compile goes on to the cubin)
    speculation: Speculation | None = None  # a started speculation, until the analyses confirm it
    cache_key: str | None = None

    @property
    def reports(self) -> dict:
        return self.passes.reports if self.passes else {}

    @property
    def preconditions(self) -> list:
        return self.passes.preconditions if self.passes else []

    def metadata(self) -> dict:
        """What is saved as ``metadata.json`` and shown as ``kernel.metadata``."""
        md: dict[str, Any] = {"name": self.name, "target": self.target, "pass_configs": self.pass_configs,
                              "options": self.options, "stage_seconds": self.stage_seconds,
                              "background_seconds": self.background_seconds}
        if self.passes:
            md["reports"] = self.passes.reports
            md["extra_nvcc_flags"] = list(self.passes.nvcc_flags)
            md["preconditions"] = [{"text": p.text, "origin": p.origin} for p in self.passes.preconditions]
        if self.nvcc_command:
            md["nvcc_command"] = self.nvcc_command
        md.update(self.launcher_info)
        if self.cache_key:
            md["cache_key"] = self.cache_key
        return md


# ---- stages ---------------------------------------------------------------------------
def _stage_lower(prim_func, build: Build):
    """TileLang's lowering, once; under a pin, with the pin's pass configs and fragment layouts."""
    from tlx.lowering import lower

    if build.options.get("pin"):
        from tlx.numerics.pin import lower_pinned

        kernel = lower_pinned(prim_func, build.target, build.pass_configs, str(build.options["pin"]), build.name)
    else:
        kernel = lower(prim_func, build.target, build.pass_configs, name=build.name)
    build.pass_configs = dict(kernel.pass_configs)
    return kernel


# The passes that follow guard elimination in the pipeline (tlx/passes/pipeline.py) and read
# nothing but the kernel and the options; the device compile can start once they have run.
_DEVICE_PASSES = ("viewed_params", "numerics_strict", "numerics_determinism", "numerics_ieee_prelude")


@dataclass
class Speculation:
    """The device compile started before the analyses (see :func:`_stage_passes`): the kernel
    as lowered, and the warnings the device passes raised on it, shown once it stands."""

    lowered: Any
    warnings: list


def _stage_passes(kernel, build: Build):
    """tlx's passes. When the compile goes on to the cubin and the pipeline ends with the
    device passes, only those run here, on the kernel as lowered: the CUDA of that kernel is
    the pipeline's whenever no other pass changes the kernel (the analyses only read it, and
    guard elimination returns it unchanged when it proves no guard redundant). nvcc then
    starts on it, and the other passes run beside nvcc (:func:`_confirm_speculation`)."""
    from tlx.passes import PassContext
    from tlx.passes.pipeline import pass_names, run_passes

    build.passes = PassContext(options=build.options, source=build.source)
    names = pass_names()
    if not build.speculate or tuple(names[-len(_DEVICE_PASSES):]) != _DEVICE_PASSES:
        build.lowered = run_passes(kernel, build.passes)
        return build.lowered
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        build.lowered = run_passes(kernel, build.passes, skip=tuple(n for n in names if n not in _DEVICE_PASSES))
    build.speculation = Speculation(kernel, caught)
    return build.lowered


def _confirm_speculation(build: Build) -> None:
    """Run the passes that the speculative device compile skipped, beside nvcc. If none of them
    changed the kernel (nor the nvcc command), nvcc is compiling the pipeline's own CUDA: the
    device passes' warnings are shown and nvcc goes on. Otherwise nvcc is ended and the device
    passes, the CUDA and nvcc run again on the changed kernel."""
    from tlx.passes.pipeline import pass_names, run_passes

    spec, build.speculation = build.speculation, None
    t0 = time.perf_counter()
    analysed = run_passes(spec.lowered, build.passes, skip=_DEVICE_PASSES)
    build.stage_seconds["passes beside nvcc"] = round(time.perf_counter() - t0, 4)
    same_command = nvcc_command(build, str(build.workdir / "kernel.cu"), str(build.workdir / "kernel.cubin")) == build.nvcc_command
    if analysed is spec.lowered and same_command:
        for w in spec.warnings:
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
        return
    build.background.pop("nvcc").cancel()
    build.lowered = run_passes(analysed, build.passes, skip=tuple(n for n in pass_names() if n not in _DEVICE_PASSES))
    _start_nvcc(_stage_cuda(build.lowered, build), build)


def _stage_cuda(kernel, build: Build) -> str:
    from tlx.lowering import codegen_cuda

    return codegen_cuda(kernel)


def nvcc_command(build: Build, src: str, out: str) -> list[str]:
    """The device compile: TileLang's own command (same flags, same order), then the flags of
    the numerics mode (none in "default"), of the pass configs and of the passes."""
    from tlx.lowering import device_include_dirs
    from tlx.numerics.modes import device_flags

    cmd = ["nvcc", "--cubin", "-O3", "-lineinfo", f"-arch={build.target['arch']}", "-std=c++20"]
    cmd += [f"-I{d}" for d in device_include_dirs()]
    cmd += device_flags(build.options["numerics"], build.pass_configs) + (list(build.passes.nvcc_flags) if build.passes else [])
    return [*cmd, "-o", out, src]


def _stage_cubin(cuda_source: str, build: Build) -> Background:
    """Start nvcc (and, after a speculative start, run the remaining passes beside it); the
    launcher stage joins it (``kernel.cubin``) once the launcher compiles."""
    _start_nvcc(cuda_source, build)
    if build.speculation:
        _confirm_speculation(build)
    return build.background["nvcc"]


def _start_nvcc(cuda_source: str, build: Build) -> None:
    work = build.workdir
    (work / "kernel.cu").write_text(cuda_source)
    build.nvcc_command = nvcc_command(build, str(work / "kernel.cu"), str(work / "kernel.cubin"))
    build.background["nvcc"] = Background.start("nvcc", build.nvcc_command)


def _stage_launcher(nvcc: Background, build: Build) -> str:
    """Generate the launcher and start compiling it to assembly, then join nvcc and check the
    launches' shared memory against the cubin (the library stage joins the compile)."""
    from tlx.hostgen import check_shared_memory, generate_launcher, launcher_compile_command, runtime_support

    preconditions = [(p.expr, p.text) for p in build.preconditions]
    source, info = generate_launcher(build.lowered, build.options["out_idx"], preconditions, cubin_file="kernel.cubin")
    (build.workdir / "launcher.cc").write_text(source)
    build.runtime, build.runtime_builds = runtime_support()
    for piece in build.runtime_builds:  # the first launcher built with this cache: the runtime support builds beside it, once
        build.background[piece.what] = Background.start(f"c++ {piece.what}", piece.command, output=piece.partial)
    build.background["launcher"] = Background.start("c++ launcher", launcher_compile_command(build.workdir, build.runtime))
    nvcc.join(build)
    _report_performance_losses(nvcc, build)
    _report_deferred_work(build)
    check_shared_memory(build.name, info["launches"], (build.workdir / "kernel.cubin").read_bytes(), build.target["arch"])
    build.launcher_info = info
    return source


def ptxas_performance_losses(stderr: str) -> list[str]:
    """ptxas's "Potential Performance Loss" remarks in nvcc's output (e.g. every wgmma of the
    kernel serialized, because another instruction touches an accumulator while one is in
    flight): printed without any extra flag, and easy to miss in a kernel that compiles, runs
    and gives the right bits at a fraction of its speed."""
    return sorted({line.split(":", 1)[1].strip() for line in stderr.splitlines()
                   if line.startswith("ptxas") and "Potential Performance Loss" in line})


def _report_performance_losses(nvcc: Background, build: Build) -> None:
    """``reports["ptxas"]`` (``performance_loss``: the remarks) and a warning per remark."""
    nvcc.errors.seek(0)
    losses = ptxas_performance_losses(nvcc.errors.read().decode(errors="replace"))
    if build.passes is not None:
        build.passes.reports["ptxas"] = {"performance_loss": losses}
    for loss in losses:
        warnings.warn(f"{build.name}: ptxas: {loss}", RuntimeWarning, stacklevel=2)


def _report_deferred_work(build: Build) -> None:
    """``reports["sass"]`` (:func:`tlx.sass.report`: arithmetic that ptxas put behind a wgmma wait it
    does not depend on) and a warning per such wait inside a loop, where the cost recurs; a
    disassembler that fails is reported, not raised (the kernel itself is fine)."""
    from tlx import sass

    try:
        found = sass.report(build.workdir / "kernel.cubin")
    except (OSError, subprocess.CalledProcessError) as e:
        found = {"error": f"{type(e).__name__}: {e}"}
    if build.passes is not None:
        build.passes.reports["sass"] = found
    for function, waits in found.get("waits", {}).items():
        for wait in waits:
            if wait["in_loop"]:
                work = ", ".join(f"{n} {op}" for op, n in wait["free"].items())
                warnings.warn(f"{build.name}: {function}: ptxas issues {work} after the wgmma wait at {wait['offset']} "
                              "(in a loop) although they do not depend on it: they no longer overlap the wgmma",
                              RuntimeWarning, stacklevel=2)


def _stage_library(launcher_source: str, build: Build) -> str:
    """Join the launcher's compile (and the runtime support's, when this compile builds it),
    then assemble the launcher (the assembly embeds ``kernel.cubin``) and link it with the
    runtime."""
    from tlx.hostgen import launcher_link_command

    build.background["launcher"].join(build)
    for piece in build.runtime_builds:
        build.background[piece.what].join(build)
        piece.publish()
    link = launcher_link_command(build.workdir, build.runtime)
    proc = subprocess.run(link, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{build.name}: linking the launcher failed ({' '.join(link)}):\n{proc.stderr[-4000:]}")
    return str(build.workdir / "launcher.so")


STAGES: OrderedDict[str, Any] = OrderedDict(
    lower=_stage_lower,
    passes=_stage_passes,
    cuda=_stage_cuda,
    cubin=_stage_cubin,
    launcher=_stage_launcher,
    library=_stage_library,
)


# ---- cache key ------------------------------------------------------------------------
def tool_versions() -> dict:
    """The tools a build depends on, by version: part of every cache key."""
    import importlib.metadata as im

    versions = {p: im.version(p) for p in ("tilelang", "apache-tvm-ffi")}
    versions["tlx"] = _tlx_source_hash()
    from tlx.lowering import cuda_toolkit_version  # imports TileLang: not on the cache-hit path

    versions["nvcc"] = cuda_toolkit_version()
    return versions


_VERSION_CACHE: dict[str, str] = {}


def _tlx_source_hash() -> str:
    """Identity of tlx's own sources (relative path and content of each): any edit to a pass or
    generator invalidates the cache, while a fresh checkout of the same commit (new mtimes,
    another directory, another machine) still hits it. Reading the ~60 files costs about a
    millisecond, once per process."""
    if "tlx" not in _VERSION_CACHE:
        root = Path(__file__).parent
        h = hashlib.sha256()
        for p in tlx_source_files():
            h.update(f"{p.relative_to(root).as_posix()}:".encode())
            h.update(hashlib.sha256(p.read_bytes()).digest())
        _VERSION_CACHE["tlx"] = h.hexdigest()[:16]
    return _VERSION_CACHE["tlx"]


def tlx_source_files() -> list[Path]:
    """tlx's own sources, whose contents are part of every cache key (``scripts/device-cache``
    also reads their mtimes: an entry built before the last edit cannot hit)."""
    return sorted(p for p in Path(__file__).parent.rglob("*")
                  if p.suffix in (".py", ".h", ".cc", ".cu", ".cuh") and "__pycache__" not in p.parts)


def cache_key(program_text: str, options: dict, target: dict) -> str:
    material = json.dumps(
        {"program": program_text, "options": options, "target": target, "versions": tool_versions()},
        sort_keys=True,
        default=str,
    )
    return hashlib.sha256(material.encode()).hexdigest()[:32]


# ---- driver ---------------------------------------------------------------------------
def pass_options(options: Options, target: dict) -> dict:
    """The options every pass sees (``PassContext.options``), also part of the cache key."""
    return {
        "out_idx": list(options.out_idx),
        "verify": options.verify,
        "assume": list(options.assume),
        "numerics": options.numerics,
        "eliminate_guards": options.eliminate_guards,
        "allow_approx": list(options.allow_approx),
        "pin": options.pin,
        "pin_sha256": hashlib.sha256(Path(options.pin).read_bytes()).hexdigest() if options.pin and Path(options.pin).is_file() else None,
        "target": target,
        **{k: v for k, v in options.extra},
    }


def compile_artifacts(prim_func, options: Options, *, name: str | None = None, stop_after: str | None = None,
                      source: Any = None, keep_workdir: bool = False) -> tuple[Any, Build]:
    """Run the stages without the cache; returns the last stage's output and the :class:`Build`.

    ``stop_after`` names a stage to stop at (``tlx host`` uses ``"launcher"``, ``tlx device``
    ``"cuda"``, ``tlx check`` ``"passes"``); ``source`` is the kernel factory, for source lines
    in check reports. The work directory is removed at the end (and when a stage fails) unless
    ``keep_workdir`` is set; then the caller owns ``build.workdir``.
    """
    from tlx.lowering import normalize_target

    if stop_after is not None and stop_after not in STAGES:
        raise ValueError(f"stop_after: expected one of {list(STAGES)}, got {stop_after!r}")
    target = normalize_target(options.target_dict())
    if name is None:
        name = str(prim_func.attrs["global_symbol"]) if prim_func.attrs and "global_symbol" in prim_func.attrs else "main"
    build = Build(name=name, target=target, options=pass_options(options, target), pass_configs=options.pass_config_dict(),
                  workdir=Path(tempfile.mkdtemp(prefix="tlx-build-", dir=_tmp_root())), source=source,
                  speculate=_speculates(options, stop_after))
    module: Any = prim_func
    try:
        for stage, fn in STAGES.items():
            t0 = time.perf_counter()
            module = fn(module, build)
            build.stage_seconds[stage] = round(time.perf_counter() - t0, 4)
            if stage == stop_after:
                break
        if isinstance(module, Background):  # stopped at the cubin stage: its result is the cubin
            module.join(build)
            module = (build.workdir / "kernel.cubin").read_bytes()
    except BaseException:
        _cancel_background(build)
        shutil.rmtree(build.workdir, ignore_errors=True)
        raise
    _cancel_background(build)  # what a stop before the library stage left running
    if not keep_workdir:
        shutil.rmtree(build.workdir, ignore_errors=True)
    return module, build


def _speculates(options: Options, stop_after: str | None) -> bool:
    """Whether nvcc starts before the analyses: when the compile goes on to the cubin, and no
    ``assume`` is given (the callers' facts that let guard elimination remove guards, which
    would make nvcc start over)."""
    return not options.assume and (stop_after is None or list(STAGES).index(stop_after) >= list(STAGES).index("cubin"))


def _cancel_background(build: Build) -> None:
    for work in build.background.values():
        work.cancel()


def _tmp_root() -> str:
    root = cache_dir() / "tmp"
    root.mkdir(parents=True, exist_ok=True)
    return str(root)


def _manifest(entry: Path) -> dict:
    files = sorted(p.name for p in entry.iterdir() if p.is_file() and p.name != "MANIFEST")
    return {f: hashlib.sha256((entry / f).read_bytes()).hexdigest() for f in files}


def _valid_entry(entry: Path) -> bool:
    try:
        recorded = json.loads((entry / "MANIFEST").read_text())
        return bool(recorded) and recorded == {f: hashlib.sha256((entry / f).read_bytes()).hexdigest() for f in recorded}
    except (OSError, ValueError):
        return False


def _publish(build: Build, entry: Path) -> None:
    """Move a finished build into the cache atomically; the first process to finish wins."""
    work = build.workdir
    (work / "metadata.json").write_text(json.dumps(build.metadata(), indent=1, sort_keys=True, default=str))
    for junk in ("build.ninja", ".ninja_log", ".ninja_deps", "lock"):
        (work / junk).unlink(missing_ok=True)
    for p in list(work.iterdir()):
        if p.is_dir():
            shutil.rmtree(p, ignore_errors=True)
        elif p.suffix in (".o", ".s"):
            p.unlink()
    (work / "MANIFEST").write_text(json.dumps(_manifest(work), sort_keys=True))
    entry.parent.mkdir(parents=True, exist_ok=True)
    if entry.exists() and not _valid_entry(entry):
        shutil.rmtree(entry, ignore_errors=True)
    try:
        os.rename(work, entry)
    except OSError:
        shutil.rmtree(work, ignore_errors=True)  # another process published the same key first


def entry_key(program_text: str, options: Options, name: str | None) -> str:
    """The cache key of a program (its TIR text, or a factory's fingerprint) built with
    ``options`` as the kernel ``name``."""
    from tlx.lowering import normalize_target

    target = normalize_target(options.target_dict())
    # pass_configs steer TileLang's lowering: two builds differing only there are two kernels
    return cache_key(program_text, {**pass_options(options, target), "name": name,
                                    "pass_configs": options.pass_config_dict()}, target)


def compile_kernel(program, options: Options, name: str | None = None, program_key: str | None = None,
                   label: str | None = None):
    """Compile (or load from the disk cache) a program and return a :class:`tlx.kernel.Kernel`.

    ``program`` is a ``PrimFunc``, or a zero-argument callable building one (or returning
    ``(prim_func, options)`` when the program itself refines the options).

    An entry is stored under the key of its TIR text, which names the program whatever Python
    built it. With a ``program_key`` (a fingerprint of the factory's code and arguments, which
    holds the interpreter's bytecode) the entry is also reached through an alias under that key,
    so a hit in a fresh process never builds the TIR and loads in milliseconds; where the alias
    misses (another Python, a factory edit that leaves the TIR as it was) the TIR is built
    (about 0.1 s) and its entry loaded without lowering, and the alias is added.

    ``label`` names the call (default: ``name``) in the line each build appends to the file
    ``$TLX_BUILD_LOG`` when that is set: which kernels a run compiled instead of loading (a
    carried cache that misses shows there), across processes.
    """
    from tlx.kernel import Kernel

    kernels = cache_dir() / "kernels"
    alias = kernels / entry_key(program_key, options, name) if program_key is not None else None
    if alias is not None:
        kernel = _loaded(alias.resolve())  # the entry itself: one kernel, one directory
        if kernel is not None:
            return kernel
    prim_func, options = build_program(program, options)
    key = entry_key(prim_func.script(), options, name)
    entry = kernels / key
    kernel = _loaded(entry)
    if kernel is None:
        with _build_lock(key):
            kernel = _loaded(entry)  # another process may have built it while this one waited
            if kernel is None:
                if entry.exists():
                    warnings.warn(f"tlx: cache entry {entry} is corrupted or does not load here; rebuilding it", RuntimeWarning,
                                  stacklevel=3)
                    shutil.rmtree(entry, ignore_errors=True)
                started = time.perf_counter()
                _, build = compile_artifacts(prim_func, options, name=name, keep_workdir=True)
                _log_build(label or name or build.name, key, time.perf_counter() - started)
                build.cache_key = key
                try:
                    _publish(build, entry)
                finally:
                    shutil.rmtree(build.workdir, ignore_errors=True)  # gone already once published
                if not _valid_entry(entry):
                    raise RuntimeError(f"tlx: could not publish the build of {build.name} to {entry}")
                kernel = Kernel.load(entry)
    if alias is not None:
        _link_alias(alias, entry)
    return kernel


def _log_build(label: str, key: str, seconds: float) -> None:
    """One line for a build in ``$TLX_BUILD_LOG`` (if set): one ``O_APPEND`` write, whole lines
    from parallel processes."""
    path = os.environ.get("TLX_BUILD_LOG")
    if path:
        line = f"{time.strftime('%H:%M:%S')} built {label} in {seconds:.1f} s (entry {key[:16]})\n"
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line.encode())
        finally:
            os.close(fd)


def _loaded(entry: Path):
    """The kernel of a whole entry; None where there is none, or its launcher does not load on
    this machine (an entry carried from another machine, built against other system libraries):
    then it is built again here."""
    from tlx.kernel import Kernel

    if not _valid_entry(entry):
        return None
    try:
        return Kernel.load(entry)
    except RuntimeError:  # tvm_ffi: the shared library failed to load
        return None


def _link_alias(alias: Path, entry: Path) -> None:
    """``alias`` made a relative symbolic link to the entry beside it, atomically (a stale or
    corrupt alias, a link or a directory, is replaced; a link another process made is kept)."""
    if alias.is_symlink() and os.readlink(alias) == entry.name:
        return
    if alias.is_dir() and not alias.is_symlink():
        shutil.rmtree(alias, ignore_errors=True)  # an invalid entry of an older layout
    tmp = alias.with_name(f".{alias.name}.{os.getpid()}")
    tmp.unlink(missing_ok=True)
    os.symlink(entry.name, tmp)
    os.replace(tmp, alias)


@contextlib.contextmanager
def _build_lock(key: str):
    """One build per cache key at a time across processes: parallel test workers, precompile
    jobs and autotuners that need the same kernel wait for the first build instead of
    repeating it. An exclusive ``flock`` on a per-key file, released by the kernel even when
    the holder dies (no stale locks)."""
    locks = cache_dir() / "locks"
    locks.mkdir(parents=True, exist_ok=True)
    fd = os.open(locks / key, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the lock


def build_program(program, options: Options):
    """``compile_kernel``'s program as ``(prim_func, options)``: a factory's thunk is run, and
    a thunk that refines the options returns them with its PrimFunc."""
    built = program() if callable(program) else program
    return built if isinstance(built, tuple) else (built, options)
