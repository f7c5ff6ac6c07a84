"""tlx.ieee on the CPU: API checks, generated CUDA calls the intended intrinsics, the prelude
is injected and compiles, the CUDA baseline builds, and the conversion specification agrees
with CUDA's own (host) implementation of the intrinsics."""

import re
import subprocess
from pathlib import Path

import pytest
from tilelang import tvm

from tests.numerics import ieee_kernels as K
from tlx import ieee
from tlx.compiler import compile_artifacts
from tlx.options import Options
from tlx.numerics.parity import baseline_flags, build_baseline

HERE = Path(__file__).parent
ROUNDINGS = ("rn", "rz", "ru", "rd")
CUDA_NAMES = {
    "float32": {"add": "__fadd_", "sub": "__fsub_", "mul": "__fmul_", "div": "__fdiv_", "fma": "__fmaf_", "sqrt": "__fsqrt_", "rcp": "__frcp_"},
    "float64": {"add": "__dadd_", "sub": "__dsub_", "mul": "__dmul_", "div": "__ddiv_", "fma": "__fma_", "sqrt": "__dsqrt_", "rcp": "__drcp_"},
}


def cuda_source(prim_func, cpu_target, stop_after="cuda", **options):
    out, build = compile_artifacts(prim_func, Options.make(target=cpu_target, verify="off", **options), stop_after=stop_after)
    return out, build


def test_arith_rejects_mixed_or_unsupported_dtypes():
    f16, f32, f64 = (tvm.tirx.Var(n, d) for n, d in (("h", "float16"), ("s", "float32"), ("d", "float64")))
    with pytest.raises(TypeError, match=r"tlx.ieee.add: expected operands all float32 or all float64, got \(float16, float16\)"):
        ieee.add(f16, f16)
    with pytest.raises(TypeError, match=r"tlx.ieee.fma: .*got \(float32, float64, float32\)"):
        ieee.fma(f32, f64, f32)
    with pytest.raises(ValueError, match=r"tlx.ieee.div: rounding expected one of .*got 'rx'"):
        ieee.div(f32, f32, "rx")
    with pytest.raises(TypeError, match=r"tlx.ieee.cast_fp8_e4m3: expected a float32 operand, got float64"):
        ieee.cast_fp8_e4m3(f64)
    with pytest.raises(TypeError, match=r"tlx.ieee.ue8m0_decode: expected a uint8 code, got float32"):
        ieee.ue8m0_decode(f32)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_arith_kernels_call_the_rounded_intrinsics(dtype, cpu_target):
    for op in K.ARITH_OPS:
        src, _ = cuda_source(K.arith(op, dtype), cpu_target)
        body = src[src.index("__global__ void __launch_bounds__") :]
        called = set(re.findall(r"(__[a-z]+_r[nzud])\(", body))
        assert called == {CUDA_NAMES[dtype][op] + rm for rm in ROUNDINGS}, (op, called)
        assert "TLX_IEEE_PRELUDE_" not in src  # no conversion used: nothing injected


def test_conversions_call_prelude_helpers_and_prelude_is_injected(cpu_target):
    src, _ = cuda_source(K.convert(), cpu_target)
    body = src[src.index("__global__ void __launch_bounds__") :]
    for helper in ("bf16_bits", "fp8_e4m3_bits", "fp8_e5m2_bits", "fp4_e2m1_bits", "ue8m0_code", "ue8m0_scale"):
        assert f"tlx_ieee_{helper}(" in body, helper
    assert src.count("#define TLX_IEEE_PRELUDE_") == 1
    assert src.index("#define TLX_IEEE_PRELUDE_") < src.index("__global__")
    assert "__nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3)" in src


def test_explicit_prelude_and_injected_prelude_compile_together(cpu_target):
    """A kernel that passes T.Kernel(prelude=tlx.ieee.PRELUDE) itself still compiles under
    tlx (the pass injects a second copy; the include guard keeps one)."""
    cubin, _ = cuda_source(K.convert(with_prelude=True), cpu_target, stop_after="cubin")
    assert len(cubin) > 0
    src, _ = cuda_source(K.convert(with_prelude=True), cpu_target)
    assert src.count("#ifndef TLX_IEEE_PRELUDE_") == 2


def test_reference_baseline_builds():
    obj = build_baseline(HERE / "intrinsics_ref.cu", compile_only=True)
    assert Path(obj).stat().st_size > 0


def test_conversion_spec_matches_cuda_host_intrinsics(tmp_path):
    """The independent specification in intrinsics_ref.cu agrees with CUDA's host
    implementation of the conversion intrinsics on ~1M spread fp32 patterns plus every
    format boundary and bf16 tie (the GPU test sweeps all 2^32 against the device ones)."""
    exe = tmp_path / "spec_host"
    flags = [f for f in baseline_flags() if not f.startswith("-gencode")]
    subprocess.run(["nvcc", *flags, "-DTLX_SPEC_HOST_TEST", "-x", "cu", str(HERE / "intrinsics_ref.cu"), "-o", str(exe)], check=True)
    done = subprocess.run([str(exe), "4099"], capture_output=True, text=True)
    assert done.returncode == 0 and "mismatches 0" in done.stdout, done.stdout
