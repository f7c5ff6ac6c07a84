"""Operand generators and bit comparisons for GPU parity sweeps (tests and benchmarks).

- ``all_fp32_chunks(chunk)``: every fp32 bit pattern, ``chunk`` at a time, made on the GPU.
- ``random_operands(n, dtype, gen, count)``: random bit patterns with a quarter replaced by
  specials (±0, smallest/largest denormal, smallest normal, largest finite, ±inf, quiet and
  signalling NaNs, 1, 1+ulp, 2); for two or more operands, 15% of the second operand get an
  exponent within ±30 of the first's and 10% are exactly half an ulp of it (add/sub ties).
- ``poisoned(shape, dtype)``: an output filled with 0xA5 bytes, so unwritten elements show.
- ``same_bits`` / ``assert_same_bits``: bitwise comparison on the device; a failure is
  reported through :func:`tlx.numerics.parity.assert_bitwise` with the inputs' bits.
"""

from __future__ import annotations

__all__ = ["all_fp32_chunks", "assert_same_bits", "bits", "chunk_offsets", "poisoned", "random_operands", "same_bits", "specials"]

POISON = 0xA5


def bits(t):
    """``t`` viewed as integers of its element size."""
    import torch

    return t.view({1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])


def poisoned(shape, dtype, device="cuda"):
    import torch

    t = torch.empty(shape, dtype=dtype, device=device)
    t.view(torch.uint8).fill_(POISON)
    return t


def same_bits(actual, expected) -> bool:
    """Same shape, element size and bits (the dtypes may differ: bf16 vs its int16 bits)."""
    import torch

    return (
        actual.shape == expected.shape
        and actual.element_size() == expected.element_size()
        and torch.equal(bits(actual), bits(expected))
    )


def assert_same_bits(actual, expected, name: str, inputs=()) -> None:
    """Raise AssertionError at the first differing element, naming the inputs' bit patterns
    (inputs are indexed modulo their length, so a (4, n) output over n inputs works)."""
    import torch

    from tlx.numerics.parity import assert_bitwise

    if actual.shape != expected.shape or actual.element_size() != expected.element_size():
        assert_bitwise(actual, expected, name=name)
    if same_bits(actual, expected):
        return
    flat = int(torch.nonzero((bits(actual) != bits(expected)).reshape(-1))[0])
    where = []
    for k, x in enumerate(inputs):
        mask = (1 << (8 * x.element_size())) - 1
        where.append(f"input{k}=0x{int(bits(x).reshape(-1)[flat % x.numel()]) & mask:x}")
    a = actual.reshape(-1)[flat : flat + 1]
    e = expected.reshape(-1)[flat : flat + 1].view(a.dtype)
    assert_bitwise(a, e, name=f"{name} at flat index {flat} ({', '.join(where)})")


def chunk_offsets(chunk: int) -> list[int]:
    """The int32 start of each chunk: chunk k covers bit patterns [k*chunk, (k+1)*chunk)."""
    if chunk <= 0 or (1 << 32) % chunk:
        raise ValueError(f"chunk: expected a positive divisor of 2^32, got {chunk}")
    return [start - (1 << 32) if start >= (1 << 31) else start for start in range(0, 1 << 32, chunk)]


def all_fp32_chunks(chunk: int = 1 << 28, device="cuda"):
    """Yield float32 tensors that together hold every one of the 2^32 bit patterns once."""
    import torch

    offsets = chunk_offsets(chunk)
    base = torch.arange(chunk, dtype=torch.int32, device=device)
    for offset in offsets:
        yield (base + offset).view(torch.float32)


_LAYOUT = {"float32": (23, 0xFF), "float64": (52, 0x7FF)}


def _layout(dtype):
    name = str(dtype).removeprefix("torch.")
    if name not in _LAYOUT:
        raise ValueError(f"dtype: expected float32 or float64, got {dtype}")
    return _LAYOUT[name]


def _int_type(dtype):
    import torch

    return torch.int32 if _layout(dtype)[0] == 23 else torch.int64


def specials(dtype, device="cuda"):
    """Bit patterns (as signed integers) of the special values of ``dtype``, both signs."""
    import torch

    m, e = _layout(dtype)
    sign = 1 << (m + e.bit_length())
    one = (e >> 1) << m
    pos = [0, 1, (1 << m) - 1, 1 << m, ((e - 1) << m) | ((1 << m) - 1), e << m, (e << m) | 1,
           (e << m) | (1 << (m - 1)), (e << m) | ((1 << m) - 1), one, one | 1, one + (1 << m)]  # fmt: skip
    signed = [v for p in pos for v in (p, (p | sign) - (sign << 1))]
    return torch.tensor(signed, dtype=_int_type(dtype), device=device)


def random_operands(n: int, dtype, gen, count: int, device="cuda") -> list:
    """``count`` operand tensors of ``n`` elements (see the module docstring)."""
    import torch

    m, exp_mask = _layout(dtype)
    ib = _int_type(dtype)
    info = torch.iinfo(ib)
    ops = [torch.randint(info.min, info.max, (n,), dtype=ib, device=device, generator=gen) for _ in range(count)]
    sp = specials(dtype, device)
    for t in ops:
        pick = torch.rand(n, device=device, generator=gen) < 0.25
        t.copy_(torch.where(pick, sp[torch.randint(len(sp), (n,), device=device, generator=gen)], t))
    if count >= 2:
        x, y = ops[0], ops[1]
        ex = (x >> m) & exp_mask
        sign_bit = torch.tensor(info.min, dtype=ib, device=device)
        near = torch.rand(n, device=device, generator=gen) < 0.15
        shift = torch.randint(-30, 31, (n,), dtype=ib, device=device, generator=gen)
        y_near = (y & ~torch.tensor(exp_mask << m, dtype=ib, device=device)) | ((ex + shift).clamp(1, exp_mask - 1) << m)
        y.copy_(torch.where(near, y_near, y))
        tie = (torch.rand(n, device=device, generator=gen) < 0.10) & (ex > m + 1) & (ex < exp_mask)
        y.copy_(torch.where(tie, ((ex - (m + 1)) << m) | (y & sign_bit), y))
    return [t.view(dtype) for t in ops]
