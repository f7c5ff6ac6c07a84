"""tlx.ieee bitwise against the nvcc-built CUDA reference, on the GPU.

Unary fp32 operations (sqrt, rcp in all rounding modes, every conversion) run over all 2^32
fp32 bit patterns in chunks of 2^28; the conversions are also checked against the
independent specification in intrinsics_ref.cu. Binary and ternary operations, and fp64
unary ones, run on >= 10^8 random operands per operation, a quarter of them replaced by
specials (±0, denormals, ±inf, NaNs, extremes) and a quarter built to land on rounding ties
or to have nearby exponents. Every output is poisoned before each launch.
"""

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

import tlx  # noqa: E402
from tests.numerics import ieee_kernels as K  # noqa: E402
from tlx.numerics.parity import build_baseline  # noqa: E402
from tlx.numerics.sweep import all_fp32_chunks, assert_same_bits, poisoned, random_operands  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.xdist_group("ieee_sweeps")]  # 1 GiB operands, a few GiB a test: the sweeps one at a time, beside the V4 layers' worker

HERE = Path(__file__).parent
CHUNK_ALL = 1 << 28
RANDOM_TOTAL = 100_000_000
RANDOM_CHUNK = 1 << 25


@pytest.fixture(scope="module")
def ref():
    return build_baseline(HERE / "intrinsics_ref.cu")


_compiled: dict = {}


def arith_kernel(op, dtype):
    key = (op, dtype)
    if key not in _compiled:
        _compiled[key] = tlx.jit(K.arith)(op, str(dtype).removeprefix("torch."))
    return _compiled[key]


def test_unary_fp32_arith_exhaustive(ref):
    for op in K.UNARY_OPS:
        kernel = arith_kernel(op, torch.float32)
        code = K.ARITH_OPS.index(op)
        for x in all_fp32_chunks(CHUNK_ALL):
            out, want = poisoned((4, CHUNK_ALL), torch.float32), poisoned((4, CHUNK_ALL), torch.float32)
            kernel(x, x, x, out)
            ref.arith(code, x, x, x, want)
            assert_same_bits(out, want, f"{op} fp32", (x,))


def test_conversions_exhaustive(ref):
    for x, name, got, cuda, spec in K.conversion_sweep(ref, CHUNK_ALL):
        assert_same_bits(got, cuda, f"{name} vs CUDA intrinsic", (x,))
        assert_same_bits(spec, cuda, f"{name} spec vs CUDA intrinsic", (x,))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["fp32", "fp64"])
@pytest.mark.parametrize("op", [*K.BINARY_OPS, "fma"])
def test_binary_random(ref, op, dtype):
    kernel = arith_kernel(op, dtype)
    code = K.ARITH_OPS.index(op)
    gen = torch.Generator(device="cuda").manual_seed(1000 + code)
    done = 0
    while done < RANDOM_TOTAL:
        x, y, z = random_operands(RANDOM_CHUNK, dtype, gen, 3)
        out, want = poisoned((4, RANDOM_CHUNK), dtype), poisoned((4, RANDOM_CHUNK), dtype)
        kernel(x, y, z, out)
        ref.arith(code, x, y, z, want)
        assert_same_bits(out, want, f"{op} {dtype}", (x, y, z))
        done += RANDOM_CHUNK


@pytest.mark.parametrize("op", K.UNARY_OPS)
def test_unary_fp64_random(ref, op):
    kernel = arith_kernel(op, torch.float64)
    code = K.ARITH_OPS.index(op)
    gen = torch.Generator(device="cuda").manual_seed(2000 + code)
    done = 0
    while done < RANDOM_TOTAL:
        (x,) = random_operands(RANDOM_CHUNK, torch.float64, gen, 1)
        out, want = poisoned((4, RANDOM_CHUNK), torch.float64), poisoned((4, RANDOM_CHUNK), torch.float64)
        kernel(x, x, x, out)
        ref.arith(code, x, x, x, want)
        assert_same_bits(out, want, f"{op} fp64", (x,))
        done += RANDOM_CHUNK
