"""Device-image facts without a GPU: static shared memory read from the cubin, and launches past
the per-block shared-memory limit refused at compile time with their sizes (and launches at the
limit, as TileLang sizes them, accepted)."""

import re
import shutil
import subprocess

import pytest

T = pytest.importorskip("tilelang.language")

from tests.hostgen import sample_kernels as sk  # noqa: E402
from tlx.hostgen.image import RESERVED_SHARED_PER_BLOCK, SHARED_PER_BLOCK, SharedMemoryError, static_shared_bytes  # noqa: E402


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
    """cuobjdump's figure for an sm_90a image includes the driver's reserved block; the kernel's own
    static shared memory is the rest."""
    kernel = build()
    cubin = kernel.directory / "kernel.cubin"
    own = {k: v - RESERVED_SHARED_PER_BLOCK for k, v in _cuobjdump_shared(cubin).items()}
    assert static_shared_bytes(cubin.read_bytes()) == own
    [launch] = kernel.metadata["launches"]
    assert launch["static_shared_memory"] == own[launch["kernel"]]


def _ten_words(aligned_dynamic: bool) -> str:
    """A kernel with 80 bytes of ``__shared__`` data, optionally followed by a 1024-aligned dynamic buffer."""
    declare, read = ("extern __shared__ __align__(1024) unsigned char dynamic[];", " + dynamic[threadIdx.x % 32]") if aligned_dynamic else ("", "")
    return f"""
extern "C" __global__ void ten_words(unsigned long long* out) {{
  __shared__ unsigned long long words[10];
  {declare}
  words[threadIdx.x % 10] = threadIdx.x;
  __syncthreads();
  out[threadIdx.x] = words[(threadIdx.x + 3) % 10]{read};
}}
"""


@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
@pytest.mark.parametrize("dynamic, own", [(False, 80), (True, 1024)], ids=["static-only", "aligned-dynamic-after"])
def test_reserved_block_is_not_the_kernels(tmp_path, arch, dynamic, own):
    """The same ``__shared__`` data reads alike from an sm_80 image (which leaves the driver's
    reserved block out) and from an sm_90a image (which lays it out inside the kernel's
    section): 80 bytes, or 1024 ahead of a 1024-aligned dynamic buffer, which starts past the
    padding."""
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("nvcc not on PATH")
    (tmp_path / "k.cu").write_text(_ten_words(dynamic))
    subprocess.run([nvcc, "-cubin", f"-arch={arch}", "-O3", str(tmp_path / "k.cu"), "-o", str(tmp_path / "k.cubin")], check=True)
    assert static_shared_bytes((tmp_path / "k.cubin").read_bytes()) == {"ten_words": own}


def test_launch_past_the_shared_memory_limit_is_refused_at_compile_time():
    """Static shared memory counts: dynamic at exactly the limit less the static part compiles,
    16 bytes more per stage does not, and the error gives both parts and the limit.

    The kernel has the shape of TileLang's MLA decode example (mbarriers in static shared memory
    ahead of a 1024-aligned dynamic buffer: a 2048-byte section, the reserved block included),
    and at the limit the same 231424 dynamic bytes, which TileLang launches on an H200."""
    static = sk.staged(T.dynamic("N")).metadata["launches"][0]["static_shared_memory"]
    assert static == 1024  # 16 bytes of mbarriers, padded to the dynamic buffer's 1024-byte alignment
    limit = SHARED_PER_BLOCK["90"]
    fits = (limit - static) // 2
    assert 2 * fits + static == limit
    launch = sk.staged(T.dynamic("N"), stage_bytes=fits).metadata["launches"][0]
    assert int(launch["dynamic_shared_memory"]) + launch["static_shared_memory"] == limit
    assert int(launch["dynamic_shared_memory"]) == 231424
    with pytest.raises(SharedMemoryError, match=rf"staged: kernel main_kernel needs {2 * (fits + 16) + static} bytes of shared "
                                                rf"memory per block \({2 * (fits + 16)} dynamic \+ {static} static\); "
                                                rf"sm_90a allows at most {limit}"):
        sk.staged(T.dynamic("N"), stage_bytes=fits + 16)


def test_image_must_be_an_elf64_cubin():
    with pytest.raises(ValueError, match="ELF64"):
        static_shared_bytes(b"not a cubin")


def test_dynamic_size_is_the_one_tilelang_launches_with():
    """tlx's dynamic figure for the kernel at the limit is the one TileLang's own host code passes
    to the launch when it compiles the same program."""
    import tilelang

    kernel = sk.staged(T.dynamic("N"), stage_bytes=115712)
    [launch] = kernel.metadata["launches"]
    theirs = tilelang.compile(sk.staged.get_tir(T.dynamic("N"), stage_bytes=115712), target=sk.SM90).get_host_source()
    assert f"((int64_t){launch['dynamic_shared_memory']})" in theirs


def test_section_smaller_than_the_reserved_block_is_refused():
    """An image that declares the reserved block but whose kernel section could not hold it is not
    read as a negative size (that would let oversized launches through)."""
    import struct

    cubin = bytearray((sk.staged(T.dynamic("N")).directory / "kernel.cubin").read_bytes())
    shoff, = struct.unpack_from("<Q", cubin, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", cubin, 0x3A)
    names_at = struct.unpack_from("<Q", cubin, shoff + shstrndx * shentsize + 0x18)[0]
    for i in range(shnum):
        header = shoff + i * shentsize
        name_offset = struct.unpack_from("<I", cubin, header)[0] + names_at
        if cubin[name_offset:cubin.index(b"\0", name_offset)] == b".nv.shared.main_kernel":
            struct.pack_into("<Q", cubin, header + 0x20, 512)
    with pytest.raises(ValueError, match=r"section \.nv\.shared\.main_kernel holds 512 bytes, less than the 1024 bytes"):
        static_shared_bytes(bytes(cubin))
