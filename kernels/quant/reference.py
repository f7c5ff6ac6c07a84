"""Torch references for the quantization kernels: the rounding rules, written once.

Every kernel in ``kernels/quant`` and every CUDA baseline beside it implements exactly these
rules; the tests compare all three bit for bit.

1. ``amax`` is the largest ``|x|`` of a group, NaN ignored (CUDA ``fmaxf`` semantics; an
   all-NaN group has amax 0); bf16 inputs are widened to fp32 exactly first.
2. ``scale = max(amax, C) / F`` in fp32 with one IEEE division: e4m3 ``C = fp32(1e-4)``,
   ``F = 448``; e2m1 ``C = 6 * 2**-126``, ``F = 6``.
3. Power-of-two (UE8M0) scales round **up**: the smallest power of two >= scale, exponent
   clamped to 2**127 (code 254). The code byte is the biased exponent (2**(code - 127)).
   UE8M0 scales are returned as fp32 powers of two or packed four codes per int32 (group
   ``4j + k`` in byte ``k`` of word ``j``, little-endian; unused bytes are zero).
4. ``q = x * (1 / scale)``: one correctly rounded reciprocal, one fp32 multiply (never fused
   with anything), then round to nearest even with saturation: e4m3 ``|q| > 448 -> ±448``,
   NaN -> 0x7F; e2m1 ``|q| > 6 -> ±6``, NaN -> +6 (0x7), ties to the even code (0.25 -> 0,
   0.75 -> 1, 1.25 -> 1, 1.75 -> 2, 2.5 -> 2, 3.5 -> 4, 5 -> 4). The sign of zero is kept:
   ``-0`` and negative values that round to zero give 0x80 (e4m3) / 0x8 (e2m1).
5. Consequences (documented behaviour): a group holding ±inf has fp32 scale inf, so its finite
   values become ±0 and its infinities NaN (e4m3) / +6 (e2m1); with UE8M0 scales the scale
   saturates at 2**127 and ±inf becomes ±448 / ±6. A group below the clamp (all-zero
   included) gets scale ``C / F``. Denormal inputs are not flushed.

Scale layouts: row-major ``[T, H / G]``, or column-major and TMA-aligned: storage
``[H / G, TP]`` (``TP`` = T rounded up to 4, 16 bytes) returned as the ``[T, H / G]`` view
with strides ``(1, TP)``; padding columns are unspecified.
"""

from __future__ import annotations

import torch

E4M3_MAX = 448.0
E2M1_MAX = 6.0
E4M3_CLAMP = 1e-4
E2M1_CLAMP = 6.0 * 2.0**-126
SCALE_FORMATS = ("fp32", "ue8m0", "ue8m0_packed")
TMA_ALIGN = 4  # scale entries (4 bytes each) per 16 bytes


def _div(a: torch.Tensor, b) -> torch.Tensor:
    """IEEE ``a / b`` elementwise; torch turns a division by a scalar into a multiply by its reciprocal."""
    return a / torch.as_tensor(b, dtype=a.dtype, device=a.device).expand_as(a).contiguous()


def amax(x: torch.Tensor, dim) -> torch.Tensor:
    """``max |x|`` over ``dim`` in fp32, NaN ignored."""
    a = x.float().abs()
    return torch.where(torch.isnan(a), torch.zeros_like(a), a).amax(dim=dim)


def pow2_code(scale: torch.Tensor) -> torch.Tensor:
    """UE8M0 code (int32) of the smallest power of two >= ``scale`` (positive normal fp32)."""
    bits = scale.contiguous().view(torch.int32)
    exponent = (bits >> 23) & 0xFF
    return torch.clamp(exponent + ((bits & 0x7FFFFF) != 0).to(torch.int32), max=254)


def code_to_scale(code: torch.Tensor) -> torch.Tensor:
    """fp32 ``2 ** (code - 127)`` for UE8M0 codes 1..254."""
    return (code.to(torch.int32) << 23).view(torch.float32)


def group_scale(a: torch.Tensor, fmt: str = "e4m3", pow2: bool = False) -> torch.Tensor:
    """Rules 2 and 3: the fp32 scale of groups with amax ``a``."""
    clamp, fmax = (E4M3_CLAMP, E4M3_MAX) if fmt == "e4m3" else (E2M1_CLAMP, E2M1_MAX)
    s = _div(torch.maximum(a, torch.full_like(a, clamp)), fmax)
    return code_to_scale(pow2_code(s)) if pow2 else s


def reciprocal(s: torch.Tensor) -> torch.Tensor:
    return _div(torch.ones_like(s), s)


def cast_e4m3(v: torch.Tensor) -> torch.Tensor:
    """fp32 -> float8_e4m3fn, RNE, saturating, NaN -> 0x7F, sign of zero kept."""
    q = torch.clamp(v, -E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    nan = torch.tensor(0x7F, dtype=torch.uint8, device=v.device).view(torch.float8_e4m3fn)
    return torch.where(torch.isnan(v), nan, q)


def e2m1_code(v: torch.Tensor) -> torch.Tensor:
    """fp32 -> 4-bit e2m1 code (uint8, low nibble): RNE with ties to the even code, saturating."""
    a = v.abs()
    mag = (
        (a > 0.25).int() + (a >= 0.75).int() + (a > 1.25).int() + (a >= 1.75).int()
        + (a > 2.5).int() + (a >= 3.5).int() + (a > 5.0).int()
    )
    code = mag | (torch.signbit(v).int() << 3)
    return torch.where(torch.isnan(v), torch.full_like(code, 7), code).to(torch.uint8)


E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


def e2m1_value(code: torch.Tensor) -> torch.Tensor:
    """4-bit e2m1 code -> its exact fp32 value."""
    table = torch.tensor(E2M1_VALUES + tuple(-v for v in E2M1_VALUES), dtype=torch.float32, device=code.device)
    table[8] = -0.0
    return table[code.long() & 0xF]


def pack_e2m1(codes: torch.Tensor) -> torch.Tensor:
    """Two codes per byte along the last dim: element 2i in the low nibble, 2i+1 in the high."""
    c = codes.to(torch.uint8)
    return c[..., 0::2] | (c[..., 1::2] << 4)


def unpack_e2m1(packed: torch.Tensor) -> torch.Tensor:
    lo, hi = packed & 0xF, packed >> 4
    return torch.stack((lo, hi), dim=-1).flatten(-2)


def tma_aligned(n: int) -> int:
    return (n + TMA_ALIGN - 1) // TMA_ALIGN * TMA_ALIGN


def layout_scales(s: torch.Tensor, scale_fmt: str, col_major: bool) -> torch.Tensor:
    """fp32 scales ``[T, NG]`` -> the kernel's output format and layout (rule 3, scale layouts)."""
    t, ng = s.shape
    if scale_fmt == "ue8m0_packed":
        ng4 = (ng + 3) // 4
        codes = torch.zeros((t, ng4 * 4), dtype=torch.uint8, device=s.device)
        codes[:, :ng] = pow2_code(s).to(torch.uint8)
        s = codes.view(torch.int32)
        ng = ng4
    if not col_major:
        return s.contiguous()
    storage = torch.zeros((ng, tma_aligned(t)), dtype=s.dtype, device=s.device)
    storage[:, :t] = s.t()
    return storage.t()[:t]


def per_token_group_cast(x: torch.Tensor, group: int = 128, scale_fmt: str = "fp32", col_major: bool = False):
    """``[T, H]`` bf16/fp32 -> (e4m3 ``[T, H]``, scales) with groups of ``1 x group``."""
    t, h = x.shape
    xf = x.float().reshape(t, h // group, group)
    s = group_scale(amax(xf, -1), "e4m3", pow2=scale_fmt != "fp32")
    q = cast_e4m3(xf * reciprocal(s)[..., None]).reshape(t, h)
    return q, layout_scales(s, scale_fmt, col_major)


def per_block_cast(w: torch.Tensor, block: int = 128, pow2: bool = False):
    """``[N, K]`` -> (e4m3 ``[N, K]``, fp32 scales ``[N / block, K / block]``)."""
    n, k = w.shape
    wf = w.float().reshape(n // block, block, k // block, block)
    s = group_scale(amax(wf, (1, 3)), "e4m3", pow2)
    q = cast_e4m3(wf * reciprocal(s)[:, None, :, None]).reshape(n, k)
    return q, s


def mxfp4_cast(x: torch.Tensor):
    """``[T, K]`` -> (e2m1 packed ``[T, K / 2]`` uint8, UE8M0 codes ``[T, K / 32]`` uint8)."""
    t, k = x.shape
    xf = x.float().reshape(t, k // 32, 32)
    s = group_scale(amax(xf, -1), "e2m1", pow2=True)
    codes = e2m1_code(xf * reciprocal(s)[..., None]).reshape(t, k)
    return pack_e2m1(codes), pow2_code(s).to(torch.uint8)


def dequant_e2m1(packed: torch.Tensor, codes: torch.Tensor, out_dtype=torch.bfloat16) -> torch.Tensor:
    """MXFP4 ``[T, K/2]`` + UE8M0 ``[T, K/32]`` -> ``out_dtype`` ``[T, K]`` (exact in fp32, then RNE)."""
    t = packed.shape[0]
    v = e2m1_value(unpack_e2m1(packed)).reshape(t, -1, 32)
    return (v * code_to_scale(codes)[..., None]).reshape(t, -1).to(out_dtype)


def dequant_e4m3(q: torch.Tensor, s: torch.Tensor, block: tuple[int, int] = (1, 128), out_dtype=torch.bfloat16):
    """e4m3 ``[M, N]`` times fp32 scales of ``block``-shaped tiles -> ``out_dtype`` (one fp32 multiply, RNE)."""
    s_full = s.float().repeat_interleave(block[0], 0).repeat_interleave(block[1], 1)[: q.shape[0], : q.shape[1]]
    return (q.float() * s_full).to(out_dtype)


def fp4_to_fp8(packed: torch.Tensor, codes: torch.Tensor, block: tuple[int, int] = (1, 128)):
    """Re-block MXFP4 into e4m3 with power-of-two scales of ``block`` (exact while, within a
    block, no 1x32 scale is more than 14 binades below the largest one)."""
    x = dequant_e2m1(packed, codes, torch.float32)
    if block[0] == 1:
        return per_token_group_cast(x, block[1], "ue8m0")
    return per_block_cast(x, block[0], pow2=True)


def swiglu(x: torch.Tensor, clamp: float = 10.0, weights: torch.Tensor | None = None) -> torch.Tensor:
    """``[T, 2I]`` -> fp32 ``silu(fmin(gate, c)) * fmax(fmin(up, c), -c) * w`` (gate = first half).

    ``silu(g) = g / (1 + exp(-g))`` with the platform's fp32 ``exp`` (CUDA ``expf`` on the GPU),
    so GPU results match the kernels bit for bit; fmin/fmax ignore NaN like CUDA's.
    """
    i = x.shape[1] // 2
    gate, up = x[:, :i].float(), x[:, i:].float()
    c = torch.full_like(gate, clamp)
    g = torch.fmin(gate, c)
    u = torch.fmax(torch.fmin(up, c), -c)
    y = g / (1.0 + torch.exp(-g)) * u
    if weights is not None:
        y = y * weights.float()[:, None]
    return y


def swiglu_cast(x: torch.Tensor, clamp: float = 10.0, weights: torch.Tensor | None = None, group: int = 128,
                scale_fmt: str = "fp32", col_major: bool = False):
    return per_token_group_cast(swiglu(x, clamp, weights), group, scale_fmt, col_major)


def per_channel_cast_transpose(x: torch.Tensor, group: int = 128, pow2: bool = False):
    """``[T, H]`` -> (e4m3 ``[H, T]``, fp32 scales ``[H, ceil(T / group)]``): one scale per
    ``group`` tokens of a channel; the last group may be partial."""
    t, h = x.shape
    tp = (t + group - 1) // group * group
    xt = torch.zeros((h, tp), dtype=torch.float32, device=x.device)
    xt[:, :t] = x.float().t()
    q, s = per_token_group_cast(xt, group, "ue8m0" if pow2 else "fp32")
    return q[:, :t].contiguous(), s
