"""A pinned GEMM recompiled after an unrelated change of defaults gives the same bits and SASS."""

import shutil
import subprocess

import pytest

torch = pytest.importorskip("torch")

from tests.numerics import determinism_kernels as D  # noqa: E402
from tlx.compiler import compile_kernel  # noqa: E402
from tlx.options import Options  # noqa: E402
from tlx.numerics import pin  # noqa: E402
from tlx.numerics.parity import assert_bitwise  # noqa: E402

pytestmark = pytest.mark.gpu


def sass(kernel) -> str:
    tool = shutil.which("cuobjdump")
    assert tool, "cuobjdump is needed to compare SASS"
    return subprocess.run([tool, "-sass", str(kernel.directory / "kernel.cubin")], check=True, capture_output=True, text=True).stdout


def test_pinned_gemm_keeps_bits_and_sass(tmp_path):
    path = pin.pin_kernel_file(D.gemm(), Options.make(), name="plain_gemm", kernel_file=tmp_path / "k.py")
    free = compile_kernel(D.gemm(), Options.make(out_idx=[2]), name="plain_gemm")
    pinned = compile_kernel(D.gemm(), Options.make(out_idx=[2], pin=str(path), pass_configs={"tl.disable_out_of_bound_warning": True}),
                            name="plain_gemm")  # fmt: skip
    assert pinned.directory != free.directory  # really two compiles
    assert sass(pinned) == sass(free) and "HGMMA" in sass(free)
    g = torch.Generator(device="cuda").manual_seed(5)
    for m in (64, 1000):
        a = torch.randn(m, 256, device="cuda", generator=g).half()
        b = torch.randn(256, 256, device="cuda", generator=g).half()
        assert_bitwise(pinned(a, b), free(a, b), name=f"pinned vs free GEMM, M={m}")
