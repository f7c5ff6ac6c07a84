"""Numerics modes: nvcc flags, strict-mode rejection of approximate intrinsics, the allow-list,
and the report every compile records."""

import pytest

from tests.numerics import strict_kernels as S
from tlx.compiler import compile_artifacts
from tlx.options import Options
from tlx.numerics.modes import nvcc_flags
from tlx.numerics.strict import ApproximateIntrinsicError

TARGET = {"kind": "cuda", "arch": "sm_90a"}


def passes(prim_func, **options):
    _, build = compile_artifacts(prim_func, Options.make(target=TARGET, verify="off", **options), stop_after="passes")
    return build


def test_mode_flags():
    assert nvcc_flags("strict") == ["--fmad=false", "--prec-div=true", "--prec-sqrt=true", "--ftz=false"]
    assert nvcc_flags("default") == []  # TileLang's own flags only (tests/numerics/test_modes.py)
    with pytest.raises(ValueError, match=r"numerics: expected one of \['default', 'strict'\], got 'fast'"):
        nvcc_flags("fast")


def test_strict_rejects_fast_exp_naming_intrinsic_and_allow_list():
    with pytest.raises(ApproximateIntrinsicError) as e:
        passes(S.fast_exp(), numerics="strict")
    msg = str(e.value)
    assert "T.__exp" in msg and "__expf" in msg and "allow_approx=['__exp']" in msg and "strict_probe" in msg


@pytest.mark.parametrize("factory,name", [(S.fast_sin_and_log, "T.__"), (S.fast_rcp, "T.fast_rcp"), (S.extern_fdividef, "__fdividef")])
def test_strict_rejects_every_route(factory, name):
    with pytest.raises(ApproximateIntrinsicError, match=name):
        passes(factory(), numerics="strict")


@pytest.mark.parametrize("allow", [["__exp"], ["T.__exp"], ["__expf"]])
def test_allow_list_accepts_tilelang_or_cuda_names(allow):
    report = passes(S.fast_exp(), numerics="strict", allow_approx=allow).reports["numerics"]
    assert report["violations"] == [] and report["approximate"][0]["cuda"] == "__expf"


@pytest.mark.parametrize("helper", ["probe_ex2", "probe_through"])
def test_strict_sees_approximate_ptx_in_prelude_helpers(helper):
    """A helper of the kernel's own prelude whose inline PTX (its own, or a helper's it calls) is
    an approximate instruction: named in strict mode with the instruction, accepted once the
    instruction is allowed; a helper with exact PTX only is not reported."""
    with pytest.raises(ApproximateIntrinsicError, match=rf"{helper} \(CUDA ex2.approx.ftz.f32, prelude\)"):
        passes(S.prelude_helper(helper), numerics="strict")
    report = passes(S.prelude_helper(helper), numerics="strict", allow_approx=["ex2.approx.ftz.f32"]).reports["numerics"]
    assert report["violations"] == [] and [h["intrinsic"] for h in report["approximate"]] == [helper]
    exact = passes(S.prelude_helper("probe_exact"), numerics="strict").reports["numerics"]
    assert exact["approximate"] == [] and exact["violations"] == []


def test_allow_list_rejects_unknown_names():
    with pytest.raises(ValueError, match=r"allow_approx: expected names from .* got 'expf'"):
        passes(S.fast_exp(), numerics="strict", allow_approx=["expf"])


def test_strict_rejects_fast_math_config():
    with pytest.raises(ApproximateIntrinsicError, match="tl.enable_fast_math"):
        passes(S.exact(), numerics="strict", pass_configs={"tl.enable_fast_math": True})


def test_default_mode_reports_without_rejecting():
    report = passes(S.fast_sin_and_log()).reports["numerics"]
    assert report["mode"] == "default" and report["flags"] == nvcc_flags("default")
    assert sorted(h["intrinsic"] for h in report["approximate"]) == ["T.__log", "T.__sin"]
    assert report["exit_code"] == 0


def test_report_only_lists_violations():
    """``tlx check`` runs the passes with report_only: violations become a failing report."""
    from tlx.lowering import lower
    from tlx.passes import PassContext
    from tlx.passes.pipeline import run_passes

    ctx = PassContext(options={"numerics": "strict", "report_only": True, "target": TARGET, "verify": "off"})
    run_passes(lower(S.fast_exp(), TARGET), ctx)
    assert ctx.reports["numerics"]["exit_code"] == 1 and "T.__exp" in ctx.reports["numerics"]["violations"][0]


def test_strict_exact_kernel_compiles_with_strict_flags():
    cubin, build = compile_artifacts(S.exact(), Options.make(target=TARGET, numerics="strict"), stop_after="cubin")
    assert len(cubin) > 0
    assert build.reports["numerics"]["approximate"] == [] and build.reports["numerics"]["flags"][0] == "--fmad=false"
    assert "--fmad=false" in build.nvcc_command and "--fmad=true" not in build.nvcc_command


def test_mode_baseline_builds():
    """The parity baseline of the modes test compiles (with the strict flags; the GPU test
    builds both modes, under names that hash each mode's flags)."""
    from pathlib import Path

    from tlx.numerics.parity import build_baseline

    obj = build_baseline(Path(__file__).parent / "modes_ref.cu", numerics="strict", compile_only=True)
    assert Path(obj).stat().st_size > 0
