"""The compile pipeline on the CPU: one set of pass configs from lowering to nvcc, and no work
directory left behind."""

import pytest

from tests.numerics import determinism_kernels as D
from tlx.compiler import compile_artifacts
from tlx.numerics import pin
from tlx.options import Options
from tlx.passes.verification import VerificationError

TARGET = {"kind": "cuda", "arch": "sm_90a"}
PROBE = "-DTLX_PINNED_PROBE=1"


def test_pinned_pass_config_reaches_nvcc(tmp_path):
    """A pin's ``tl.device_compile_flags`` is in the nvcc command of a compile that only names the pin."""
    path = pin.pin_kernel_file(D.row_sum(), Options.make(target=TARGET, pass_configs={"tl.device_compile_flags": [PROBE]}),
                               name="row_sum", kernel_file=tmp_path / "k.py")  # fmt: skip
    cubin, build = compile_artifacts(D.row_sum(), Options.make(target=TARGET, verify="off", pin=str(path)), stop_after="cubin")
    assert len(cubin) > 0
    assert build.reports["pin"]["reapplied_pass_configs"] == ["tl.device_compile_flags"]
    assert build.pass_configs["tl.device_compile_flags"] == [PROBE]
    assert PROBE in build.nvcc_command
    unpinned = compile_artifacts(D.row_sum(), Options.make(target=TARGET, verify="off"), stop_after="cubin")[1]
    assert PROBE not in unpinned.nvcc_command


def _work_dirs(cache):
    return sorted((cache / "tmp").glob("tlx-build-*")) if (cache / "tmp").exists() else []


def test_work_directories_are_removed(tmp_path, monkeypatch):
    monkeypatch.setenv("TLX_CACHE_DIR", str(tmp_path))
    compile_artifacts(D.row_sum(), Options.make(target=TARGET, verify="off"), stop_after="cubin")
    assert _work_dirs(tmp_path) == []
    from tests.passes.corpus.bugs import off_by_one_tail

    with pytest.raises(VerificationError):
        compile_artifacts(off_by_one_tail.get_tir(), off_by_one_tail.options.replace(verify="error"), stop_after="cuda")
    assert _work_dirs(tmp_path) == []


def test_stop_after_names_a_stage():
    with pytest.raises(ValueError, match=r"stop_after: expected one of \['lower', 'passes'.*got 'pass'"):
        compile_artifacts(D.row_sum(), Options.make(target=TARGET), stop_after="pass")


def test_launcher_compiles_while_nvcc_runs_and_nothing_is_left_running(tmp_path, monkeypatch):
    """The launcher stage starts the launcher's compile before it joins nvcc (both recorded in
    the Build); a compile stopped there ends that compile instead of leaving it behind."""
    monkeypatch.setenv("TLX_CACHE_DIR", str(tmp_path))
    source, build = compile_artifacts(D.row_sum(), Options.make(target=TARGET, verify="off"), stop_after="launcher")
    # a fresh cache: the launchers' runtime object and precompiled header build beside this first launcher
    assert "tlx_cubin" in source and set(build.background) == {"nvcc", "launcher", "runtime", "header"}
    nvcc, launcher = build.background["nvcc"], build.background["launcher"]
    assert nvcc.process.returncode == 0 and launcher.started < build.background_seconds["nvcc"] + nvcc.started
    assert all(b.process.returncode is not None for b in build.background.values())  # ended, joined or not
    assert "-S" in launcher.command and "nvcc" in build.background_seconds
    assert _work_dirs(tmp_path) == []
    assert not list((tmp_path / "runtime").glob("*/*.partial*"))  # the cancelled runtime builds left no file


def test_a_failing_nvcc_names_itself_and_leaves_nothing(tmp_path, monkeypatch):
    import tlx.compiler as compiler

    monkeypatch.setenv("TLX_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(compiler, "nvcc_command", lambda build, src, out: ["nvcc", "--no-such-flag", "-o", out, src])
    with pytest.raises(RuntimeError, match=r"row_sum.*: nvcc failed \(nvcc --no-such-flag"):
        compile_artifacts(D.row_sum(), Options.make(target=TARGET, verify="off"), name="row_sum")
    assert _work_dirs(tmp_path) == []


def test_a_background_tool_with_much_to_say_runs_to_its_end_before_the_join():
    """A tool's stderr goes to a file, not a pipe that nobody reads until the join: one that
    writes more than a pipe holds still finishes beside the stages, and a failure shows the
    end of what it wrote."""
    import sys
    import time

    from tlx.compiler import Background, Build

    say = "import sys; sys.stderr.write('x' * 200000 + 'the last words'); sys.exit(3)"
    tool = Background.start("tool", [sys.executable, "-c", say])
    deadline = time.monotonic() + 60
    while tool.process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert tool.process.returncode == 3  # exited on its own, before anyone joined it
    build = Build(name="k", target=TARGET, options={}, pass_configs={}, workdir=None)
    with pytest.raises(RuntimeError, match=r"k: tool failed \(.*\):\nx+the last words$"):
        tool.join(build)


def _nvcc_starts(monkeypatch):
    """Record every nvcc the compile starts (its CUDA source as it was when started)."""
    import tlx.compiler as compiler

    started = []
    start = compiler.Background.start

    def record(what, command, output=None):
        if what == "nvcc":
            started.append(open(command[-1]).read())
        return start(what, command, output)

    monkeypatch.setattr(compiler.Background, "start", staticmethod(record))
    return started


@pytest.mark.parametrize("assume, removed", [((), 0), (("N % 128 == 0",), 1)])
def test_nvcc_starts_before_the_analyses_and_compiles_the_pipelines_cuda(tmp_path, monkeypatch, assume, removed):
    """Without ``assume``, nvcc starts on the kernel as the device passes leave it, before the
    analyses and guard elimination, which run beside it; they change nothing here, so that is
    the pipeline's CUDA and nvcc runs once. With ``assume`` (callers' facts, which let guard
    elimination remove a guard) the passes all run first. Either way the compiled CUDA is the
    serial pipeline's (stop_after="cuda" runs every pass first)."""
    from tests.passes.corpus.correct import add_dynamic

    monkeypatch.setenv("TLX_CACHE_DIR", str(tmp_path))
    options = Options.make(target=TARGET, assume=assume)
    serial, serial_build = compile_artifacts(add_dynamic.get_tir(), options, stop_after="cuda")
    assert serial_build.reports["eliminate_guards"]["removed"] == removed
    started = _nvcc_starts(monkeypatch)
    cubin, build = compile_artifacts(add_dynamic.get_tir(), options, stop_after="cubin")
    assert len(cubin) > 0 and started == [serial]
    assert ("passes beside nvcc" in build.stage_seconds) == (not assume)
    assert build.reports["eliminate_guards"] == serial_build.reports["eliminate_guards"]
    assert [p.text for p in build.preconditions] == [p.text for p in serial_build.preconditions]


def test_a_speculation_the_analyses_refute_restarts_nvcc_on_the_rewritten_kernel(tmp_path, monkeypatch):
    """Should guard elimination remove a guard after nvcc started (the kernel's own facts
    suffice; here the facts are handed to the pass directly), nvcc is ended and started again
    on the rewritten kernel: the compiled CUDA is the serial pipeline's."""
    import tlx.passes.pipeline as pipeline
    from tests.passes.corpus.correct import add_dynamic
    from tlx.passes.assume import parse_assumption, shape_vars
    from tlx.passes.guards import eliminate_guards

    def with_divisibility(kernel, ctx):
        fact = parse_assumption("N % 128 == 0", shape_vars(kernel.prim_func))
        new, ctx.reports["eliminate_guards"] = eliminate_guards(kernel, (), [fact])
        return new

    monkeypatch.setenv("TLX_CACHE_DIR", str(tmp_path))
    passes = tuple(pipeline.Pass(p.name, with_divisibility, p.enabled) if p.name == "eliminate_guards" else p for p in pipeline.PASSES)
    monkeypatch.setattr(pipeline, "PASSES", passes)
    options = Options.make(target=TARGET)
    serial, serial_build = compile_artifacts(add_dynamic.get_tir(), options, stop_after="cuda")
    assert serial_build.reports["eliminate_guards"]["removed"] == 1
    started = _nvcc_starts(monkeypatch)
    cubin, build = compile_artifacts(add_dynamic.get_tir(), options, stop_after="cubin")
    assert len(cubin) > 0 and len(started) == 2 and started[0] != serial and started[1] == serial


_RACE_SCRIPT = """
import sys, time
import tlx.compiler as compiler
real = compiler.compile_artifacts

def slow(*args, **kwargs):  # a build long enough that the two processes overlap
    print("BUILT", flush=True)
    time.sleep(3)
    return real(*args, **kwargs)

compiler.compile_artifacts = slow
from tests.jit_kernels import scale
print("ENTRY", scale(1024, factor=float(sys.argv[1])).metadata["cache_key"], flush=True)
"""


def test_processes_needing_one_kernel_build_it_once(tmp_path):
    """Two processes that start the same cold compile together: one builds, the other waits for
    it and loads the published entry (parallel test workers and precompile jobs used to build
    the same kernel once each)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    env = {**os.environ, "TLX_CACHE_DIR": str(tmp_path), "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    procs = [subprocess.Popen([sys.executable, "-c", _RACE_SCRIPT, "3.0"], env=env, stdout=subprocess.PIPE, text=True)
             for _ in range(2)]
    outs = [p.communicate(timeout=600)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    assert sum(o.count("BUILT") for o in outs) == 1, outs
    entries = {line.split()[1] for o in outs for line in o.splitlines() if line.startswith("ENTRY")}
    assert len(entries) == 1 and (tmp_path / "kernels" / entries.pop() / "MANIFEST").is_file()


def alternating_accumulators(full_waits: bool):
    """Two accumulators over 9 K tiles, each tile's products summed into ``out`` while the next
    tile's wgmma runs. ``full_waits``: every issue follows ``wait_wgmma(0)``; else an issue
    follows ``wait_wgmma(1)`` right after the other accumulator was read, which makes ptxas
    serialize every wgmma of the kernel (the pattern the indexer's first version had). The sums
    go through ``max``: a plain ``out += acc``, which TileLang turns into float4 reads of the
    accumulator array, is serialized by ptxas even with full waits (nvcc 13.0)."""
    import tilelang.language as T

    @T.prim_func
    def alternating(A: T.Tensor((64, 64), "float16"), B: T.Tensor((9, 64, 64), "float16"), C: T.Tensor((64, 64), "float32")):
        with T.Kernel(1, threads=128):
            A_s = T.alloc_shared((64, 64), "float16")
            B_s = T.alloc_shared((9, 64, 64), "float16")
            acc_a = T.alloc_fragment((64, 64), "float32")
            acc_b = T.alloc_fragment((64, 64), "float32")
            out = T.alloc_fragment((64, 64), "float32")
            T.clear(out)
            T.copy(A, A_s)
            T.copy(B, B_s)
            T.wgmma_gemm(A_s, B_s[0, :, :], acc_a, transpose_B=True, clear_accum=True)
            for j in T.serial(4):
                if full_waits:
                    T.wait_wgmma(0)
                T.wgmma_gemm(A_s, B_s[2 * j + 1, :, :], acc_b, transpose_B=True, clear_accum=True)
                if not full_waits:
                    T.wait_wgmma(1)
                for i, k in T.Parallel(64, 64):
                    out[i, k] += T.max(acc_a[i, k], T.float32(0))
                T.wait_wgmma(0 if full_waits else 1)
                T.wgmma_gemm(A_s, B_s[2 * j + 2, :, :], acc_a, transpose_B=True, clear_accum=True)
                for i, k in T.Parallel(64, 64):
                    out[i, k] += T.max(acc_b[i, k], T.float32(0))
            T.wait_wgmma(0)
            T.copy(out, C)

    return alternating


def test_ptxas_performance_losses_are_reported_and_warned():
    """ptxas says when it serializes every wgmma of a kernel (no extra nvcc flag needed): the
    compile reports it (``reports["ptxas"]``) and warns, and says nothing for the same pipeline
    written with full waits."""
    options = Options.make(target=TARGET, verify="off")
    with pytest.warns(RuntimeWarning, match="Potential Performance Loss: wgmma.mma_async instructions are serialized"):
        serialized = compile_artifacts(alternating_accumulators(False), options, stop_after="launcher")[1]
    assert any("serialized" in loss for loss in serialized.reports["ptxas"]["performance_loss"])
    clean = compile_artifacts(alternating_accumulators(True), options, stop_after="launcher")[1]
    assert clean.reports["ptxas"] == {"performance_loss": []}


def test_ptxas_performance_loss_lines_are_picked_out_of_nvcc_output():
    from tlx.compiler import ptxas_performance_losses

    stderr = ("kernel.cu(3): warning #1444-D: type was declared deprecated\n"
              "ptxas info    : (C7517) warpgroup.wait is injected in around line 9 by compiler\n"
              "ptxas info    : (C7515) Potential Performance Loss: wgmma.mma_async instructions are serialized due to x\n"
              "ptxas info    : (C7515) Potential Performance Loss: wgmma.mma_async instructions are serialized due to x\n")
    assert ptxas_performance_losses(stderr) == ["(C7515) Potential Performance Loss: wgmma.mma_async instructions are serialized due to x"]
    assert ptxas_performance_losses("") == []


def test_an_entry_is_found_by_its_tir_under_another_fingerprint(tmp_path, monkeypatch):
    """The fingerprint holds the interpreter's bytecode, so a cache built by another Python
    (the development machine's, for the GPU machine) or before a factory edit that leaves the TIR
    as it was misses it: the entry is then found by its TIR text, with no lowering, and the new
    fingerprint becomes an alias of it. A corrupt alias is replaced, never loaded."""
    import os

    import tlx.compiler as compiler
    from tests.jit_kernels import scale

    monkeypatch.setenv("TLX_CACHE_DIR", str(tmp_path))
    options = Options.make(target=TARGET, out_idx=[-1])
    program = lambda: scale.get_tir(1024)  # noqa: E731
    first = compiler.compile_kernel(program, options, name="scale", program_key="python A")
    kernels = tmp_path / "kernels"
    (entry,) = [p for p in kernels.iterdir() if not p.is_symlink()]
    assert first.metadata["cache_key"] == entry.name

    def no_build(*args, **kwargs):
        raise AssertionError("lowered again: the entry of the same TIR was not found")

    monkeypatch.setattr(compiler, "compile_artifacts", no_build)
    second = compiler.compile_kernel(program, options, name="scale", program_key="python B")
    assert second.metadata["cache_key"] == entry.name
    aliases = {p.name: os.readlink(p) for p in kernels.iterdir() if p.is_symlink()}
    assert sorted(aliases.values()) == [entry.name, entry.name]
    # a hit through an alias does not build the TIR at all
    assert compiler.compile_kernel(lambda: pytest.fail("TIR built on an alias hit"), options, name="scale",
                                   program_key="python B").metadata["cache_key"] == entry.name
    # an alias that is a directory without a whole entry (an interrupted older build) is replaced
    stale = kernels / compiler.entry_key("python C", options, "scale")
    stale.mkdir()
    assert compiler.compile_kernel(program, options, name="scale", program_key="python C").metadata["cache_key"] == entry.name
    assert stale.is_symlink() and os.readlink(stale) == entry.name
    # and another TIR is another entry
    monkeypatch.setattr(compiler, "compile_artifacts", compile_artifacts)
    other = compiler.compile_kernel(lambda: scale.get_tir(2048), options, name="scale", program_key="python A, 2048")
    assert other.metadata["cache_key"] != entry.name


def test_an_entry_whose_launcher_does_not_load_here_is_built_again(tmp_path, monkeypatch):
    """An entry carried from another machine passes its manifest check, but its launcher may not
    load here (built against other system libraries): it is built again, with a warning, not
    raised to the caller."""
    import hashlib
    import json

    import tlx.compiler as compiler
    from tests.jit_kernels import scale

    import shutil

    monkeypatch.setenv("TLX_CACHE_DIR", str(tmp_path / "elsewhere"))
    options = Options.make(target=TARGET, out_idx=[-1])
    program = lambda: scale.get_tir(1024)  # noqa: E731
    first = compiler.compile_kernel(program, options, name="scale")
    # carried here, its launcher replaced (a path this process never loaded: dlopen reuses a loaded one)
    entry = tmp_path / "here" / "kernels" / first.metadata["cache_key"]
    shutil.copytree(tmp_path / "elsewhere" / "kernels" / entry.name, entry)
    (entry / "launcher.so").write_bytes(b"not a shared library")
    manifest = json.loads((entry / "MANIFEST").read_text())
    manifest["launcher.so"] = hashlib.sha256(b"not a shared library").hexdigest()
    (entry / "MANIFEST").write_text(json.dumps(manifest))
    monkeypatch.setenv("TLX_CACHE_DIR", str(tmp_path / "here"))
    with pytest.warns(RuntimeWarning, match="does not load here; rebuilding it"):
        again = compiler.compile_kernel(program, options, name="scale")
    assert again.metadata["cache_key"] == entry.name
    assert (entry / "launcher.so").read_bytes() != b"not a shared library"


def test_two_installs_of_one_cuda_release_share_cache_keys(tmp_path, monkeypatch):
    """The toolkit enters the key by its release (``CUDA_VERSION`` of its cuda.h), not by its path,
    mtime or patch level: the development machine's cache (pip wheels, 13.0.88) hits on the GPU
    machine's installer toolkit (its path, size and mtime in the key missed there every time),
    and another release misses."""
    from tlx.lowering import cuda_toolkit_version

    def toolkit(name, cuda_h):
        home = tmp_path / name
        (home / "include").mkdir(parents=True)
        (home / "include" / "cuda.h").write_text(cuda_h)
        (home / "bin").mkdir()
        (home / "bin" / "nvcc").write_text(name)  # another size and mtime in each install
        return home

    def identity(home):
        monkeypatch.setenv("CUDA_HOME", str(home))
        cuda_toolkit_version.cache_clear()
        try:
            return cuda_toolkit_version()
        finally:
            cuda_toolkit_version.cache_clear()

    release = "#ifndef __cuda_cuda_h__\n#define CUDA_VERSION 13000\n#endif\n"
    assert identity(toolkit("wheels", release)) == "cuda 13.0" == identity(toolkit("installer", release))
    assert identity(toolkit("next", release.replace("13000", "13010"))) == "cuda 13.1"
    unnamed = identity(toolkit("unnamed", "/* no version */\n"))
    assert unnamed.startswith("cuda.h:") and unnamed != identity(toolkit("other", "/* another */\n"))
