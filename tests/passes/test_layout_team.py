"""Every layout of the project's own kernels (``kernels/``) is proven bijective (or injective onto padding)."""

import pytest

from tests.passes.corpus.team import TEAM
from tlx.lowering import lower
from tlx.passes.layouts import layouts_report


@pytest.mark.parametrize("name", [t[0] for t in TEAM])
def test_team_kernel_layouts(name):
    _, fn, params, _ = next(e for e in TEAM if e[0] == name)
    kernel = lower(fn.get_tir(**params), fn.options.target_dict() or {"kind": "cuda", "arch": "sm_90a"}, fn.options.pass_config_dict())
    report = layouts_report(kernel)
    for entry in report["layouts"]:
        assert entry["verdict"] in ("bijective", "injective"), entry
        if entry["gf2"]["applicable"]:
            assert entry["gf2"]["agrees"], entry
    if "grouped_gemm" in name:
        assert report["checked"] >= 3  # swizzled A/B tiles and the accumulator fragment at least
