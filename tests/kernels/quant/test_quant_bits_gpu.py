"""The bit-level building blocks of ``kernels/quant/common.py`` against CUDA's own conversions,
on the GPU: ``e2m1_nibble`` (fp32 -> e2m1 without CUDA's fp64 path), ``cast_e4m3x4`` (paired
e4m3 cvt) and ``pow2_scale`` (UE8M0 code and reciprocal by integer ops) over all 2^32 fp32 bit
patterns, ``e2m1_pair_bf16`` (bf16 pairs -> e2m1) against ``e2m1_nibble`` of the fp32 product
for every bf16 value in both halves at every power-of-two reciprocal a group scale can have,
``e2m1_e4m3_table`` / ``e2m1_e4m3_word`` (MXFP4 -> e4m3 by byte permutes) against the fp32 rule for
every code at every nibble position, every UE8M0 code 0..255 and every block code 105..254 a block
holding the group can have.
Outputs are poisoned before each launch.
"""

import pytest
import torch
import tilelang.language as T

import tlx
from kernels.quant import reference as R
from kernels.quant.common import (
    QUANT_PRELUDE, TARGET, bf16_word_half, cast_e4m3x4, e2m1_byte, e2m1_e4m3_table, e2m1_e4m3_word, e2m1_nibble,
    e2m1_pair_bf16, group_scale, pow2_scale,
)
from tlx.numerics import ieee
from tlx.numerics.sweep import all_fp32_chunks, assert_same_bits, poisoned

pytestmark = pytest.mark.gpu

CHUNK = 1 << 28


@tlx.jit(target=TARGET)
def conversions_kernel(N: int):
    """Per 4 inputs: the e2m1 nibbles both ways and the e4m3 bytes both ways."""

    @T.prim_func
    def kernel(X: T.Tensor((N,), T.float32), FAST: T.Tensor((N,), T.uint8), CUDA: T.Tensor((N,), T.uint8),
               PAIRS: T.Tensor((N // 4,), T.uint32), SINGLE: T.Tensor((N,), T.uint8)):
        with T.Kernel(N // 1024, threads=256, prelude=QUANT_PRELUDE) as bx:
            i = (bx * 256 + T.get_thread_binding()) * 4
            for k in T.unroll(4):
                FAST[i + k] = T.Cast(T.uint8, e2m1_nibble(X[i + k]) & T.uint32(15))
                CUDA[i + k] = ieee.cast_fp4_e2m1(X[i + k])
                SINGLE[i + k] = T.reinterpret(ieee.cast_fp8_e4m3(X[i + k]), T.uint8)
            PAIRS[i // 4] = cast_e4m3x4(X[i], X[i + 1], X[i + 2], X[i + 3])

    return kernel


@tlx.jit(target=TARGET)
def scale_kernel(N: int, fmt: str):
    """``pow2_scale`` of each input taken as a group's amax, next to ``group_scale`` (CUDA's
    UE8M0 conversion) and the IEEE reciprocal of its scale."""

    @T.prim_func
    def kernel(X: T.Tensor((N,), T.float32), CODES: T.Tensor((N, 2), T.uint8), INVS: T.Tensor((N, 2), T.float32)):
        with T.Kernel(N // 256, threads=256) as bx:
            i = bx * 256 + T.get_thread_binding()
            _, code, inv = pow2_scale(X[i], fmt)
            scale, cuda_code = group_scale(X[i], fmt, True)
            CODES[i, 0] = T.Cast(T.uint8, code)
            CODES[i, 1] = cuda_code
            INVS[i, 0] = inv
            INVS[i, 1] = T.float32(1.0) / scale

    return kernel


@tlx.jit(target=TARGET)
def pair_kernel(N: int):
    """Per word of two bf16 and power of two ``inv`` (fp32 bits): the byte of two e2m1 codes from
    ``e2m1_pair_bf16`` and from ``e2m1_nibble`` of each fp32 product."""

    @T.prim_func
    def kernel(Xw: T.Tensor((N,), T.uint32), INV: T.Tensor((N,), T.uint32), OUT: T.Tensor((N, 2), T.uint8)):
        with T.Kernel(N // 256, threads=256, prelude=QUANT_PRELUDE) as bx:
            i = bx * 256 + T.get_thread_binding()
            inv = T.reinterpret(INV[i], T.float32)
            s = e2m1_pair_bf16(Xw[i], (INV[i] >> T.uint32(16)) * T.uint32(0x10001))
            OUT[i, 0] = T.Cast(T.uint8, (e2m1_byte(s) & T.uint32(0x7F)) | ((s >> T.uint32(24)) & T.uint32(0x80)))
            lo = e2m1_nibble(bf16_word_half(Xw[i], 0) * inv) & T.uint32(15)
            hi = e2m1_nibble(bf16_word_half(Xw[i], 1) * inv) & T.uint32(15)
            OUT[i, 1] = T.Cast(T.uint8, lo | (hi << T.uint32(4)))

    return kernel


@tlx.jit(target=TARGET)
def reblock_kernel(N: int):
    """Per two words, UE8M0 code and block code: their 16 codes as e4m3 bytes via the permute table."""

    @T.prim_func
    def kernel(Wd: T.Tensor((N, 2), T.uint32), CODE: T.Tensor((N, 2), T.uint8), D: T.Tensor((N, 4), T.uint32)):
        with T.Kernel(N // 256, threads=256, prelude=QUANT_PRELUDE) as bx:
            i = bx * 256 + T.get_thread_binding()
            xw = T.alloc_local((2,), T.uint32)
            tab = T.alloc_local((2,), T.uint32)
            for k in T.unroll(2):
                xw[k] = Wd[i, k]
            e2m1_e4m3_table(tab, xw, 0, T.Cast(T.uint32, CODE[i, 0]), T.Cast(T.uint32, CODE[i, 1]))
            for k in T.unroll(2):
                D[i, 2 * k] = e2m1_e4m3_word(xw[k], tab, 0)
                D[i, 2 * k + 1] = e2m1_e4m3_word(xw[k], tab, 1)

    return kernel


def test_e2m1_e4m3_table_every_code_and_scale():
    v = torch.arange(1 << 16, dtype=torch.int64, device="cuda")
    words = torch.stack([v | (v.flip(0) << 16), ((v * 40503 + 7) % (1 << 16)) | (v << 16)], dim=1)  # every code everywhere
    c, s = torch.meshgrid(torch.arange(256, device="cuda"), torch.arange(105, 255, device="cuda"), indexing="ij")
    pairs = torch.stack([c.reshape(-1), s.reshape(-1)], dim=1)  # every (UE8M0 code, block code)
    n = 1 << 21
    g = torch.Generator(device="cuda").manual_seed(3)
    ws = words[torch.randint(0, words.shape[0], (n,), device="cuda", generator=g)]
    cs = pairs[torch.arange(n, device="cuda") % pairs.shape[0]]
    ws[: pairs.shape[0]] = words[torch.arange(pairs.shape[0], device="cuda") % words.shape[0]]
    codes = torch.stack([(ws[:, k // 8] >> (4 * (k % 8))) & 15 for k in range(16)], dim=1)
    # a block code is at least what the block's own groups need: raise s to this group's bid
    cls = ((codes & 7).amax(dim=1) + 2) // 2 * ((codes & 7).amax(dim=1) > 0)
    key = torch.where(cs[:, 0] == 255, 512, cs[:, 0] + cls) * (cls > 0)
    cs[:, 1] = torch.where(key >= 257, 254, torch.maximum(cs[:, 1], key - 10))
    out = poisoned((n, 4), torch.int32)
    reblock_kernel(n)(ws.to(torch.uint32), cs.to(torch.uint8), out.view(torch.uint32))
    x = R.e2m1_value(codes) * R.code_to_scale(cs[:, :1])  # code 255: (255 << 23) is inf, as in the kernels
    want = R.cast_e4m3(x * R.code_to_scale(254 - cs[:, 1:]).where(cs[:, 1:] < 254, 2.0**-127))
    assert_same_bits(out.view(torch.uint8).view(n, 16), want.view(torch.uint8), "e2m1_e4m3_word vs the fp32 rule")


def test_e2m1_nibble_and_e4m3x4_exhaustive():
    kernel = conversions_kernel(CHUNK)
    for x in all_fp32_chunks(CHUNK):
        fast, cuda = poisoned(CHUNK, torch.uint8), poisoned(CHUNK, torch.uint8)
        pairs, single = poisoned(CHUNK // 4, torch.int32), poisoned(CHUNK, torch.uint8)
        kernel(x, fast, cuda, pairs.view(torch.uint32), single)
        assert_same_bits(fast, cuda, "e2m1_nibble vs CUDA's __nv_cvt_float_to_fp4", (x,))
        assert_same_bits(pairs.view(torch.uint8), single, "cast_e4m3x4 vs CUDA's per-element e4m3 cvt", (x,))


@pytest.mark.parametrize("fmt", ["e4m3", "e2m1"])
def test_pow2_scale_exhaustive(fmt):
    kernel = scale_kernel(CHUNK, fmt)
    for x in all_fp32_chunks(CHUNK):
        codes, invs = poisoned((CHUNK, 2), torch.uint8), poisoned((CHUNK, 2), torch.float32)
        kernel(x, codes, invs)
        assert_same_bits(codes[:, 0], codes[:, 1], f"pow2_scale code vs CUDA's UE8M0 conversion ({fmt})", (x,))
        assert_same_bits(invs[:, 0], invs[:, 1], f"pow2_scale reciprocal vs IEEE 1/scale ({fmt})", (x,))


def test_e2m1_pair_bf16_every_value_and_scale():
    v = torch.arange(1 << 16, dtype=torch.int64, device="cuda")
    words = (v | (((v * 40503 + 7) % (1 << 16)) << 16)).to(torch.uint32)  # every bf16 in both halves
    codes = torch.arange(1, 255, dtype=torch.int64, device="cuda")  # UE8M0 codes of group scales
    inv = torch.where(codes == 254, 0x00400000, (254 - codes) << 23).to(torch.uint32)  # 2^(127 - code)
    n = words.numel() * codes.numel()
    xs, invs = words.repeat(codes.numel()), inv.repeat_interleave(words.numel())
    out = poisoned((n, 2), torch.uint8)
    pair_kernel(n)(xs, invs, out)
    assert_same_bits(out[:, 0], out[:, 1], "e2m1_pair_bf16 vs e2m1_nibble of the fp32 products", (xs.view(torch.int32), invs.view(torch.int32)))
