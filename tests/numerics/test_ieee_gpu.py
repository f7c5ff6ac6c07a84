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
from tlx.numerics.parity import assert_bitwise, build_baseline  # noqa: E402

pytestmark = pytest.mark.gpu

HERE = Path(__file__).parent
CHUNK_ALL = 1 << 28
RANDOM_TOTAL = 100_000_000
RANDOM_CHUNK = 1 << 25
BITS = {torch.float32: torch.int32, torch.float64: torch.int64}
MANT = {torch.float32: 23, torch.float64: 52}
EXP_MASK = {torch.float32: 0xFF, torch.float64: 0x7FF}
POISON = 0xA5
DEVICE = "cuda"


@pytest.fixture(scope="module")
def ref():
    return build_baseline(HERE / "intrinsics_ref.cu")


_compiled: dict = {}


def arith_kernel(op, dtype):
    key = (op, dtype)
    if key not in _compiled:
        _compiled[key] = tlx.jit(K.arith)(op, str(dtype).removeprefix("torch."))
    return _compiled[key]


def poisoned(shape, dtype):
    t = torch.empty(shape, dtype=dtype, device=DEVICE)
    t.view(torch.uint8).fill_(POISON)
    return t


def bits(t):
    return t.view({1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])


def assert_same_bits(actual, expected, name, inputs=()):
    """torch.equal on the GPU; on a difference, report through assert_bitwise with the inputs."""
    if torch.equal(bits(actual), bits(expected)):
        return
    flat = int(torch.nonzero((bits(actual) != bits(expected)).reshape(-1))[0])
    n = inputs[0].numel() if inputs else actual.numel()
    where = ", ".join(f"input{k}=0x{int(bits(x).reshape(-1)[flat % n]) & ((1 << (8 * x.element_size())) - 1):x}" for k, x in enumerate(inputs))
    assert_bitwise(actual.reshape(-1)[flat : flat + 1], expected.reshape(-1)[flat : flat + 1], name=f"{name} at flat index {flat} ({where})")


def all_fp32_chunks():
    base = torch.arange(CHUNK_ALL, dtype=torch.int32, device=DEVICE)
    for start in range(0, 1 << 32, CHUNK_ALL):
        offset = start - (1 << 32) if start >= (1 << 31) else start
        yield (base + offset).view(torch.float32)


def specials(dtype):
    m, e = MANT[dtype], EXP_MASK[dtype]
    sign = 1 << (m + len(bin(e)) - 2)
    exp1 = 1 << m
    pos = [0, 1, exp1 - 1, exp1, (e - 1) << m | (exp1 - 1), e << m, e << m | 1, e << m | (exp1 >> 1),
           e << m | (exp1 - 1), (e >> 1) << m, (e >> 1) << m | 1, ((e >> 1) + 1) << m]  # fmt: skip
    vals = pos + [p | sign for p in pos]
    signed = [v - (sign << 1) if v & sign else v for v in vals]
    return torch.tensor(signed, dtype=BITS[dtype], device=DEVICE)


def random_operands(n, dtype, gen, count):
    """``count`` operand tensors of length n: random bits, specials, near exponents and ties."""
    ib = BITS[dtype]
    m = MANT[dtype]
    info = torch.iinfo(ib)
    ops = [torch.randint(info.min, info.max, (n,), dtype=ib, device=DEVICE, generator=gen) for _ in range(count)]
    sp = specials(dtype)
    for t in ops:
        pick = torch.rand(n, device=DEVICE, generator=gen) < 0.25
        t[pick] = sp[torch.randint(len(sp), (n,), device=DEVICE, generator=gen)][pick]
    if count >= 2:
        x, y = ops[0], ops[1]
        exp_mask = EXP_MASK[dtype]
        ex = (x >> m) & exp_mask
        # nearby exponents: y keeps its mantissa and sign, takes x's exponent +- 30
        near = torch.rand(n, device=DEVICE, generator=gen) < 0.15
        shift = torch.randint(-30, 31, (n,), device=DEVICE, generator=gen, dtype=ib)
        e2 = (ex + shift).clamp(1, exp_mask - 1)
        y_near = (y & ~(torch.tensor(exp_mask, dtype=ib, device=DEVICE) << m)) | (e2 << m)
        y.copy_(torch.where(near, y_near, y))
        # exact ties for add/sub: y = half an ulp of x (sign random)
        tie = (torch.rand(n, device=DEVICE, generator=gen) < 0.10) & (ex > m + 1) & (ex < exp_mask)
        y_tie = ((ex - (m + 1)) << m) | (y & torch.tensor(info.min, dtype=ib, device=DEVICE))
        y.copy_(torch.where(tie, y_tie, y))
    return [t.view(dtype) for t in ops]


def test_unary_fp32_arith_exhaustive(ref):
    for op in K.UNARY_OPS:
        kernel = arith_kernel(op, torch.float32)
        code = K.ARITH_OPS.index(op)
        for x in all_fp32_chunks():
            out, want = poisoned((4, CHUNK_ALL), torch.float32), poisoned((4, CHUNK_ALL), torch.float32)
            kernel(x, x, x, out)
            ref.arith(code, x, x, x, want)
            assert_same_bits(out, want, f"{op} fp32", (x,))


def test_conversions_exhaustive(ref):
    kernel = tlx.jit(K.convert)()
    dtypes = [getattr(torch, d) for _, d in K.CONVERSIONS]
    bit_dtypes = [torch.int16, torch.uint8, torch.uint8, torch.uint8, torch.uint8, torch.float32]
    for x in all_fp32_chunks():
        got = [poisoned(CHUNK_ALL, d) for d in dtypes]
        cuda = [poisoned(CHUNK_ALL, d) for d in bit_dtypes]
        spec = [poisoned(CHUNK_ALL, d) for d in bit_dtypes]
        kernel(x, *got)
        ref.convert_cuda(x, *cuda)
        ref.convert_spec(x, *spec)
        for (name, _), g, c, s in zip(K.CONVERSIONS, got, cuda, spec):
            assert_same_bits(bits(g), bits(c), f"{name} vs CUDA intrinsic", (x,))
            assert_same_bits(bits(s), bits(c), f"{name} spec vs CUDA intrinsic", (x,))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["fp32", "fp64"])
@pytest.mark.parametrize("op", [*K.BINARY_OPS, "fma"])
def test_binary_random(ref, op, dtype):
    kernel = arith_kernel(op, dtype)
    code = K.ARITH_OPS.index(op)
    gen = torch.Generator(device=DEVICE).manual_seed(1000 + code)
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
    gen = torch.Generator(device=DEVICE).manual_seed(2000 + code)
    done = 0
    while done < RANDOM_TOTAL:
        (x,) = random_operands(RANDOM_CHUNK, torch.float64, gen, 1)
        out, want = poisoned((4, RANDOM_CHUNK), torch.float64), poisoned((4, RANDOM_CHUNK), torch.float64)
        kernel(x, x, x, out)
        ref.arith(code, x, x, x, want)
        assert_same_bits(out, want, f"{op} fp64", (x,))
        done += RANDOM_CHUNK


def test_ties_are_exercised():
    """The operand generator really produces add ties (|y| exactly half an ulp of x), so the
    rounding-mode comparisons above see them."""
    gen = torch.Generator(device=DEVICE).manual_seed(7)
    x, y = random_operands(1 << 20, torch.float32, gen, 2)
    ax = x.abs()
    ulp = (torch.nextafter(ax, torch.full_like(ax, float("inf"))) - ax).double()
    ties = torch.isfinite(x) & (y.double().abs() * 2 == ulp)
    assert int(ties.sum()) > 10_000
