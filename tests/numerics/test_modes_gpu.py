"""Numerics modes on the GPU: a tlx kernel is bitwise equal to the same expression in a CUDA
baseline built with the same mode's flags, and the two modes really differ (contraction)."""

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from tests.numerics import modes_kernels as MK  # noqa: E402
from tlx.compiler import compile_kernel  # noqa: E402
from tlx.options import Options  # noqa: E402
from tlx.numerics.parity import assert_bitwise, build_baseline  # noqa: E402
from tlx.numerics.sweep import poisoned  # noqa: E402

pytestmark = pytest.mark.gpu

HERE = Path(__file__).parent
N = 1 << 22


def test_each_mode_matches_its_baseline_and_modes_differ():
    g = torch.Generator(device="cuda").manual_seed(11)
    a, b, c = (torch.randn(N, device="cuda", generator=g) * 10 for _ in range(3))
    outs = {}
    for mode in ("default", "strict"):
        kernel = compile_kernel(MK.mix(), Options.make(numerics=mode), name="mix")
        ref = build_baseline(HERE / "modes_ref.cu", numerics=mode)
        got, want = poisoned(N, torch.float32), poisoned(N, torch.float32)
        kernel(a, b, c, got)
        ref.mix(a, b, c, want)
        assert_bitwise(got, want, name=f"mix, numerics={mode}")
        outs[mode] = got
    assert not torch.equal(outs["default"].view(torch.int32), outs["strict"].view(torch.int32))
