"""Device-image facts without a GPU: static shared memory read from the cubin, and launches past
the per-block shared-memory limit refused at compile time with their sizes."""

import re
import shutil
import subprocess

import pytest

T = pytest.importorskip("tilelang.language")

from tests.hostgen import sample_kernels as sk  # noqa: E402
from tlx.hostgen.image import SHARED_PER_BLOCK, SharedMemoryError, static_shared_bytes  # noqa: E402


def _cuobjdump_shared(cubin_path) -> dict:
    """cuobjdump's own reading of each function's static shared memory (an independent oracle)."""
    tool = shutil.which("cuobjdump")
    if tool is None:
        pytest.skip("cuobjdump not on PATH")
    out = subprocess.run([tool, "--dump-resource-usage", str(cubin_path)], capture_output=True, text=True, check=True).stdout
    return {m.group(1): int(m.group(2)) for m in re.finditer(r"Function (\w+):\s*REG:\d+ STACK:\d+ SHARED:(\d+)", out)}


@pytest.mark.parametrize("build", [lambda: sk.staged(T.dynamic("N")), lambda: sk.gemm(T.dynamic("M"), 1024, 1024)],
                         ids=["mbarriers", "gemm"])
def test_static_shared_memory_matches_cuobjdump(build):
    kernel = build()
    cubin = kernel.directory / "kernel.cubin"
    assert static_shared_bytes(cubin.read_bytes()) == _cuobjdump_shared(cubin)
    [launch] = kernel.metadata["launches"]
    assert launch["static_shared_memory"] == _cuobjdump_shared(cubin)[launch["kernel"]]


def test_launch_past_the_shared_memory_limit_is_refused_at_compile_time():
    """Static shared memory counts: dynamic at exactly the limit less the static part compiles,
    16 bytes more per stage does not, and the error gives both parts and the limit."""
    static = sk.staged(T.dynamic("N")).metadata["launches"][0]["static_shared_memory"]
    assert static > 0  # the mbarriers
    limit = SHARED_PER_BLOCK["90"]
    fits = (limit - static) // 2
    assert 2 * fits + static == limit
    launch = sk.staged(T.dynamic("N"), stage_bytes=fits).metadata["launches"][0]
    assert int(launch["dynamic_shared_memory"]) + launch["static_shared_memory"] == limit
    with pytest.raises(SharedMemoryError, match=rf"staged: kernel main_kernel needs {2 * (fits + 16) + static} bytes of shared "
                                                rf"memory per block \({2 * (fits + 16)} dynamic \+ {static} static\); "
                                                rf"sm_90a allows at most {limit}"):
        sk.staged(T.dynamic("N"), stage_bytes=fits + 16)


def test_image_must_be_an_elf64_cubin():
    with pytest.raises(ValueError, match="ELF64"):
        static_shared_bytes(b"not a cubin")
