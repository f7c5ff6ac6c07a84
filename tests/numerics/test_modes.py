"""The device compile's flags: in numerics="default" exactly TileLang's (same flags, same order,
nothing added); strict mode adds its own and refuses a kernel that asks for fast math."""

import re
from pathlib import Path

import pytest

from tests.numerics import strict_kernels as S
from tlx.compiler import Build, compile_artifacts, nvcc_command
from tlx.jit import Options
from tlx.numerics.modes import device_flags, strict_conflicts
from tlx.numerics.strict import ApproximateIntrinsicError

TARGET = {"kind": "cuda", "arch": "sm_90a"}

PASS_CONFIGS = [
    {},
    {"tl.enable_fast_math": True},
    {"tl.device_compile_flags": "--use_fast_math -DFOO=1"},
    {"tl.device_compile_flags": ["-Xptxas -v", "--ftz=true"], "tl.enable_fast_math": True},
    {"tl.ptxas_register_usage_level": 5, "tl.enable_fast_math": False},
]


def tilelang_command(pass_configs: dict) -> list[str]:
    """The nvcc command TileLang 0.1.15's CUDA backend runs, captured at ``nvcc.compile_cuda``."""
    import tilelang  # noqa: F401  (registers the backend)
    from tilelang.cache.cuda_binary_cache import CUDABinaryCache
    from tilelang.contrib import nvcc
    from tilelang.cuda import backend
    from tvm.target import Target

    seen = {}

    def capture(code, target_format, arch, options=None, **_):
        seen["cmd"] = [f"--{target_format}", "-O3", "-lineinfo", *arch, *options]
        return b""

    saved = nvcc.compile_cuda, CUDABinaryCache.load, CUDABinaryCache.save
    nvcc.compile_cuda, CUDABinaryCache.load, CUDABinaryCache.save = capture, lambda *a: None, lambda *a: None
    try:
        backend.tilelang_callback_cuda_compile("", Target(TARGET), pass_configs)
    finally:
        nvcc.compile_cuda, CUDABinaryCache.load, CUDABinaryCache.save = saved
    return seen["cmd"]


def tlx_command(pass_configs: dict, numerics: str = "default") -> list[str]:
    build = Build(name="k", target=TARGET, options={"numerics": numerics}, pass_configs=pass_configs, workdir=Path("."))
    return nvcc_command(build, "k.cu", "k.cubin")


def without_includes(cmd: list[str]) -> list[str]:
    return [f for f in cmd if not f.startswith("-I")]


@pytest.mark.parametrize("pass_configs", PASS_CONFIGS)
def test_default_mode_is_tilelangs_command(pass_configs):
    ours = tlx_command(pass_configs)
    assert ours[0] == "nvcc" and ours[-3:] == ["-o", "k.cubin", "k.cu"]
    assert without_includes(ours[1:-3]) == without_includes(tilelang_command(pass_configs))
    assert not any(f.startswith(("--fmad", "--prec-div", "--prec-sqrt", "--ftz")) for f in tlx_command({}))


def test_strict_adds_its_flags_after_the_kernels():
    cmd = tlx_command({"tl.ptxas_register_usage_level": 5}, "strict")
    tail = ["--ptxas-options=--register-usage-level=5", "--fmad=false", "--prec-div=true", "--prec-sqrt=true", "--ftz=false"]
    assert cmd[-3 - len(tail) : -3] == tail


@pytest.mark.parametrize(
    "pass_configs, named",
    [
        ({"tl.enable_fast_math": True}, "tl.enable_fast_math=True"),
        ({"tl.device_compile_flags": "-DX --use_fast_math"}, "tl.device_compile_flags contains '--use_fast_math'"),
        ({"tl.device_compile_flags": ["-use_fast_math"]}, "tl.device_compile_flags contains '-use_fast_math'"),
        ({"tl.device_compile_flags": "--fmad=true"}, "tl.device_compile_flags contains '--fmad=true'"),
        ({"tl.device_compile_flags": "--prec-div=false"}, "tl.device_compile_flags contains '--prec-div=false'"),
    ],
)
def test_strict_refuses_fast_math_naming_the_config(pass_configs, named):
    assert strict_conflicts(pass_configs)
    with pytest.raises(ValueError, match="numerics=.strict. conflicts with the kernel.s pass config " + re.escape(named)):
        device_flags("strict", pass_configs)
    assert device_flags("default", pass_configs) == without_includes(tilelang_command(pass_configs))[5:]


def test_strict_allows_harmless_flags():
    assert strict_conflicts({"tl.device_compile_flags": "-DFOO --ftz=false", "tl.enable_fast_math": False}) == []


def test_strict_compile_with_fast_math_flag_is_refused_by_the_pass():
    options = Options.make(target=TARGET, verify="off", numerics="strict", pass_configs={"tl.device_compile_flags": ["--use_fast_math"]})
    with pytest.raises(ApproximateIntrinsicError, match="tl.device_compile_flags contains '--use_fast_math'"):
        compile_artifacts(S.exact(), options, stop_after="passes")
