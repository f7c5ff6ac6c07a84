"""TIR building blocks shared by the quantization kernels (rules in ``reference.py``).

Each function returns a TIR expression for a ``@T.prim_func`` body. Conversions come from
``tlx.ieee`` (CUDA's own fp8/fp4/e8m0 conversions, injected by ``@tlx.jit``); the CUDA baselines
spell the same operations in the same order (``quant_common.cuh``), so results match bit for bit.
"""

from __future__ import annotations

import torch
import tilelang.language as T

from tlx.numerics import ieee

from kernels.quant.reference import E2M1_CLAMP, E2M1_MAX, E4M3_CLAMP, E4M3_MAX

TARGET = {"kind": "cuda", "arch": "sm_90a"}
THREADS = 256
EPT = 16  # elements per thread: 32 bytes of bf16 / 64 of fp32 in flight, one 16-byte e4m3 store
INT32_LIMIT = 2**31 - 1

TORCH_DTYPES = {torch.bfloat16: "bfloat16", torch.float32: "float32"}


def fp32(v: float):
    return T.float32(v)


def group_scale(amax, fmt: str, pow2: bool):
    """(fp32 scale, uint8 UE8M0 code or None) for a group with ``amax`` (rules 2 and 3)."""
    clamp, fmax = (E4M3_CLAMP, E4M3_MAX) if fmt == "e4m3" else (E2M1_CLAMP, E2M1_MAX)
    s = T.max(amax, fp32(clamp)) / fp32(fmax)
    if not pow2:
        return s, None
    code = ieee.ue8m0_code(s)  # rounded up; s is a positive normal number, so codes 1..254
    return ieee.ue8m0_decode(code), code


def cast_e4m3(v):
    """fp32 -> e4m3: RNE, saturating to ±448, NaN -> 0x7F (``tlx.ieee``)."""
    return ieee.cast_fp8_e4m3(v)


def e2m1_code(v):
    """fp32 -> e2m1 code in a uint8: RNE (ties to the even code), saturating, NaN -> 0x7 (``tlx.ieee``)."""
    return ieee.cast_fp4_e2m1(v)


def e2m1_value(code):
    """4-bit e2m1 code (uint32) -> exact fp32, built from bits: 0.5 for code 1, 2^(m/2-1)*(1+m%2/2) above."""
    m = code & T.uint32(7)
    mag = T.if_then_else(
        m >= T.uint32(2),
        ((m >> T.uint32(1)) + T.uint32(126)) << T.uint32(23) | ((m & T.uint32(1)) << T.uint32(22)),
        T.if_then_else(m == T.uint32(1), T.uint32(0x3F000000), T.uint32(0)),
    )
    return T.reinterpret(mag | ((code & T.uint32(8)) << T.uint32(28)), T.float32)


def ue8m0_value(code):
    """UE8M0 code (uint32, 1..254) -> fp32 2^(code-127)."""
    return T.reinterpret(code << T.uint32(23), T.float32)


def check_2d(name: str, t: torch.Tensor, dtypes, cols_multiple: int = 1) -> None:
    """Clear errors for a kernel wrapper's input: dtype, 2-D, contiguous, width, alignment, size."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in dtypes:
        raise TypeError(f"{name}: expected dtype in {[str(d) for d in dtypes]}, got {t.dtype}")
    if t.dim() != 2:
        raise ValueError(f"{name}: expected a 2-D tensor, got shape {tuple(t.shape)}")
    if not t.is_contiguous():
        raise ValueError(f"{name}: expected a contiguous tensor, got strides {t.stride()}")
    if t.shape[1] % cols_multiple:
        raise ValueError(f"{name}: width {t.shape[1]} is not a multiple of {cols_multiple}")
    if t.data_ptr() % 16:
        raise ValueError(f"{name}: data pointer 0x{t.data_ptr():x} is not 16-byte aligned (the kernels use 16-byte vector accesses)")
    if t.numel() > INT32_LIMIT:
        raise ValueError(f"{name}: {t.numel()} elements exceed the int32 index range of these kernels")


def check_cuda(**tensors: torch.Tensor) -> None:
    """All inputs on one CUDA device (checked last, so argument errors show first)."""
    devices = {t.device for t in tensors.values()}
    for name, t in tensors.items():
        if t.device.type != "cuda":
            raise ValueError(f"{name}: expected a CUDA tensor, got device {t.device}")
    if len(devices) > 1:
        raise ValueError(f"expected all inputs on one device, got {sorted(map(str, devices))}")
