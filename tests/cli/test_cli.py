"""The `tlx` command line, run as a user would (no GPU needed)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SAMPLES = ROOT / "tests" / "hostgen" / "sample_kernels.py"
OOB = ROOT / "tests" / "passes" / "corpus" / "bugs.py"  # planted bugs of the verifier corpus


def tlx(*args, cache):
    env = {**os.environ, "TLX_CACHE_DIR": str(cache), "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "tlx", *args], capture_output=True, text=True, env=env, timeout=900)


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("cli-cache")


def test_help_lists_every_command(cache):
    out = tlx("--help", cache=cache)
    assert out.returncode == 0
    for cmd in ("host", "device", "check", "pin", "bench"):
        assert cmd in out.stdout
    sub = tlx("check", "--help", cache=cache)
    assert sub.returncode == 0 and "--assume" in sub.stdout and "--json" in sub.stdout


def test_host_prints_the_generated_launcher(cache):
    out = tlx("host", f"{SAMPLES}::add", "--param", "M=dynamic", "--param", "N=1024", cache=cache)
    assert out.returncode == 0, out.stderr
    assert "Launcher for the TileLang kernel `add`" in out.stdout
    assert 'tlx::bind_dim(kKernel, "A", t_A, 0, "M")' in out.stdout


def test_device_prints_cuda(cache):
    out = tlx("device", f"{SAMPLES}::add", "--param", "M=dynamic", "--param", "N=1024", cache=cache)
    assert out.returncode == 0, out.stderr
    assert '__global__ void' in out.stdout and "float4" in out.stdout


def test_check_proves_a_safe_kernel(cache):
    out = tlx("check", f"{SAMPLES}::add", "--param", "M=dynamic", "--param", "N=1024", "--json", "--bounds-only", cache=cache)
    assert out.returncode == 0, out.stdout + out.stderr
    result = json.loads(out.stdout)
    assert result["kernel"] == "add" and result["violations"] == [] and result["accesses"] == result["proven"] > 0


def test_check_reports_a_counterexample_with_exit_1(cache):
    out = tlx("check", f"{OOB}::off_by_one_tail", "--param", "N=dynamic", "--json", "--bounds-only", cache=cache)
    assert out.returncode == 1, out.stdout + out.stderr
    v = json.loads(out.stdout)["violations"]
    assert v and v[0]["buffer"] == "S" and v[0]["scope"].startswith("shared")
    cex = v[0]["counterexample"]
    assert cex["tx"] == 127 and cex["index"] == 128 and cex["extent"] == 128


def test_bad_kernel_spec_is_a_clear_error(cache):
    out = tlx("host", f"{SAMPLES}::nope", cache=cache)
    assert out.returncode != 0 and "has no attribute 'nope'" in out.stderr


@pytest.mark.parametrize("spec, params, signature", [
    ("scale", ["--param", "N=dynamic"], "scale(X: float32[N], Y: float32[N])"),
    ("copy256", [], "copy256(X: float32[256], Y: float32[256])"),
])
def test_host_accepts_tilelang_factories_and_prim_funcs(cache, spec, params, signature):
    out = tlx("host", f"{ROOT / 'tests' / 'cli' / 'tilelang_kernels.py'}::{spec}", *params, cache=cache)
    assert out.returncode == 0, out.stderr
    assert f"// Signature: {signature}" in out.stdout


def test_check_applies_the_kernels_pin(cache, tmp_path):
    """``tlx check`` compiles as ``@tlx.jit`` does: a factory's pin is applied and its decisions checked."""
    from tests.numerics import determinism_kernels as D
    from tlx.numerics import pin
    from tlx.options import Options

    target = {"kind": "cuda", "arch": "sm_90a"}
    own = pin.pin_kernel_file(D.row_sum(), Options.make(target=target, pass_configs={"tl.disable_out_of_bound_warning": True}),
                              name="row_sum", kernel_file=tmp_path / "k.py")  # fmt: skip
    other = pin.pin_kernel_file(D.gemm(), Options.make(target=target), name="gemm", kernel_file=tmp_path / "k.py")
    module = tmp_path / "pinned_kernels.py"
    module.write_text(
        "import tlx\nfrom tests.numerics.determinism_kernels import row_sum\n\n"
        f"@tlx.jit(target={target!r}, pin={str(own)!r})\ndef pinned():\n    return row_sum()\n\n"
        f"@tlx.jit(target={target!r}, pin={str(other)!r})\ndef mispinned():\n    return row_sum()\n"
    )
    out = tlx("check", f"{module}::pinned", "--json", cache=cache)
    assert out.returncode in (0, 3), out.stdout + out.stderr
    report = json.loads(out.stdout)["pin"]
    assert report["file"] == str(own) and report["reapplied_pass_configs"] == ["tl.disable_out_of_bound_warning"]
    out = tlx("check", f"{module}::mispinned", "--json", cache=cache)
    assert out.returncode != 0 and "PinMismatchError" in out.stderr and "no longer exist" in out.stderr


def _check_in_process(capsys, *args):
    from tlx.cli import main

    code = main(["check", f"{SAMPLES}::add", "--param", "M=dynamic", "--param", "N=1024", *args])
    out = capsys.readouterr()
    return code, out


def test_check_reports_each_verdict_and_only_chooses_what_decides(capsys):
    code, out = _check_in_process(capsys, "--json", "--only", "bounds,vectors")
    result = json.loads(out.out)
    verdicts = result["verdicts"]
    assert set(verdicts) == {"bounds", "races", "progress", "layouts", "vectors", "banks", "numerics", "determinism"}
    assert verdicts["bounds"]["verdict"] == "ok" and verdicts["bounds"]["decides"]
    assert verdicts["races"] == {"verdict": "not run", "exit_code": 0, "decides": False, "summary": ""}
    assert result["decided_by"] == ["bounds", "vectors"] and code == result["exit_code"] == verdicts["vectors"]["exit_code"]
    code, out = _check_in_process(capsys)
    lines = out.out.splitlines()
    assert lines[-1] == f"exit {code}: " + {0: "OK", 1: "VIOLATION", 2: "ERROR", 3: "UNKNOWN"}[code]
    assert any(line.split()[:2] == ["races", "OK"] or line.split()[:2] == ["races", "UNKNOWN"] for line in lines)
    assert any(line.split()[:2] == ["progress", "OK"] and "does not decide" in line for line in lines)  # no barrier at all


def test_a_failing_analysis_is_an_error_verdict_with_exit_2(capsys, monkeypatch):
    from tlx.passes import pipeline

    def broken(kernel, ctx):
        raise ValueError("a construct the race model cannot read")

    passes = tuple(pipeline.Pass(p.name, broken, p.enabled) if p.name == "races" else p for p in pipeline.PASSES)
    monkeypatch.setattr(pipeline, "PASSES", passes)
    code, out = _check_in_process(capsys, "--json", "--only", "bounds,races")
    races = json.loads(out.out)["verdicts"]["races"]
    assert races["verdict"] == "error" and "race model cannot read" in races["summary"]
    assert code == 2
    code, out = _check_in_process(capsys, "--json", "--only", "bounds")
    assert code == 0, "an analysis that does not decide cannot fail the check"


def test_an_internal_error_exits_2_with_one_line(capsys, monkeypatch):
    import tlx.compiler

    def crash(*args, **kwargs):
        raise KeyError("lowered")

    monkeypatch.setattr(tlx.compiler, "compile_artifacts", crash)
    code, out = _check_in_process(capsys)
    assert code == 2 and out.out == ""
    (line,) = out.err.strip().splitlines()
    assert line.startswith("tlx check: internal error on ") and "KeyError: 'lowered'" in line


def test_check_usage_errors_exit_2(cache):
    out = tlx("check", f"{SAMPLES}::add", "--only", "bounds,race", cache=cache)
    assert out.returncode == 2 and "--only: expected a comma-separated list among bounds, races" in out.stderr
    out = tlx("check", f"{SAMPLES}::nope", cache=cache)
    assert out.returncode == 2 and "has no attribute 'nope'" in out.stderr
    help_text = tlx("check", "--help", cache=cache).stdout
    assert "Exit status" in help_text and "--only" in help_text


def test_check_and_device_take_the_programs_own_pass_configs(cache):
    """A program that turns TileLang's safe-memory legalization off (function-level
    ``tilelang_pass_configs``) is compiled without the guard on its data-dependent load; ``tlx
    check`` must analyse that build (the load is not proven: exit 3), not one with the guard
    (which it called safe before the CLI merged the program's configs in), and ``tlx device``
    must print it. The guarded build of the same program is proven."""
    spec = f"{ROOT / 'tests' / 'cli' / 'program_configs.py'}::gather"
    unguarded = tlx("check", spec, "--bounds-only", "--json", cache=cache)
    assert unguarded.returncode == 3, unguarded.stdout + unguarded.stderr
    assert [u["buffer"] for u in json.loads(unguarded.stdout)["unknown"]] == ["X"]
    guarded = tlx("check", spec, "--param", "unguarded=False", "--bounds-only", cache=cache)
    assert guarded.returncode == 0, guarded.stdout + guarded.stderr
    cuda = {g: tlx("device", spec, "--param", f"unguarded={g}", cache=cache) for g in (True, False)}
    assert all(out.returncode == 0 for out in cuda.values())
    assert "< 1024)" in cuda[False].stdout and "< 1024)" not in cuda[True].stdout


def test_check_takes_a_tilelang_factorys_pass_configs(cache):
    """A ``@tilelang.jit(pass_configs=...)`` factory is checked as TileLang compiles it: with its
    decorator's pass configs (here: no safe-memory guard, so the gather's load is unproven)."""
    spec = f"{ROOT / 'tests' / 'cli' / 'tilelang_kernels.py'}::unguarded_gather"
    out = tlx("check", spec, "--bounds-only", "--json", cache=cache)
    assert out.returncode == 3, out.stdout + out.stderr
    assert [u["buffer"] for u in json.loads(out.stdout)["unknown"]] == ["X"]
    assert "< 1024)" not in tlx("device", spec, cache=cache).stdout
