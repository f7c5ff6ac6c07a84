"""Per-token-group casts ``[T, H] -> [T, H]`` with one scale per ``1 x group`` (rules in ``reference.py``).

One kernel body serves four public operations, differing only in how a thread gets its fp32
values and what it stores:

- :func:`per_token_group_cast`: bf16/fp32 -> e4m3, groups of 32/64/128, scales fp32 or UE8M0
  (fp32 powers of two or packed four per int32), row-major or column-major TMA-aligned.
- :func:`swiglu_cast`: bf16 ``[T, 2I]`` -> ``silu(fmin(gate, c)) * clamp(up, -c, c) * w`` -> e4m3.
- :func:`mxfp4_cast`: bf16/fp32 -> e2m1 packed two per byte with UE8M0 codes per 1x32.
- :func:`fp4_to_fp8`: MXFP4 -> e4m3 with power-of-two 1x128 scales (lossless re-blocking).

Design for bandwidth: a CTA covers (part of) one row (grid: rows x column blocks, so no index
divides); a thread owns ``ept`` consecutive elements (16-byte vector loads and stores; 32, a
whole 1x32 group, or 16 for fp32 -> e4m3), ``group / ept`` adjacent lanes own a group and
reduce amax with ``shfl_xor``. Conversions are the bit-level blocks of ``common.py`` (paired e4m3
cvt, e2m1 cast and decode in ALU instructions, bf16 pairs where exact, power-of-two scales by
integer ops), each checked bit for bit against CUDA's own on the GPU. T is a dynamic dimension
(one compile for every T; rows are independent, so every row's output is identical whatever T is).
MXFP4 re-blocking stays in the integers instead: a lane owns 16 codes (8 bytes in, 16 bytes out,
so each warp store covers 512 contiguous bytes), ``group / 16`` lanes reduce the group's UE8M0
code with ``shfl_xor``, and bytes come from a per-lane table (``common.e2m1_e4m3_table``).
"""

import struct

import torch
import tilelang.language as T

import tlx
from tlx.numerics import determinism
from kernels.quant.common import (
    EPT, QUANT_PRELUDE, TARGET, TORCH_DTYPES, bf16_word_half, bf16x2, cast_e4m3x4, check_2d, check_cuda,
    e2m1_block_code, e2m1_block_key, e2m1_byte, e2m1_class, e2m1_e4m3_table, e2m1_e4m3_word, e2m1_nibble,
    e2m1_pair_bf16, group_scale, pack_nibble, pow2_scale, sign_bytes, ue8m0_value,
)
from kernels.outputs import check_out
from kernels.quant.reference import SCALE_FORMATS, tma_aligned

GROUPS = (32, 64, 128)
SILU_FAST_MIN = -87.0  # 1 + expf(-g) < 2^126 above: the fast quotient's reciprocal stays normal
SILU_PRELUDE = r"""
#ifndef TLX_QUANT_SILU_
#define TLX_QUANT_SILU_
// silu(g) = g / (1 + expf(-g)), the IEEE quotient without div.rn's range check (FCHK) and slow
// path: approximate reciprocal, one Newton step, quotient, residual, correction -- the fast path
// div.rn takes itself, but with the residual negated so that a zero quotient keeps its sign.
// Bit-equal to the IEEE quotient for every bf16 g >= -87 (tests/kernels/quant/test_quant_silu_gpu.py
// checks them all); the kernel takes it only when all of a thread's g are.
__device__ __forceinline__ float tlx_quant_silu(float g) {
  float d = __fadd_rn(1.0f, expf(-g));
  float r;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(d));
  r = __fmaf_rn(r, __fmaf_rn(-d, r, 1.0f), r);
  float q = __fmul_rn(g, r);
  return __fmaf_rn(-r, __fmaf_rn(d, q, -g), q);
}
#endif
"""
determinism.declare_pure("tlx_quant_silu")


def _scale_buffer(Tn, TP, ng: int, out_fmt: str, scale_fmt: str, col_major: bool):
    """(shape, dtype) of the scale output as the kernel sees it (packed codes as bytes; the
    column-major packed layout as ``[words, TP, 4]`` so every shape variable appears bare)."""
    if out_fmt == "e2m1":
        return (Tn, ng), T.uint8
    if scale_fmt == "ue8m0_packed":
        ng4 = (ng + 3) // 4
        return ((ng4, TP, 4) if col_major else (Tn, ng4 * 4)), T.uint8
    return ((ng, TP) if col_major else (Tn, ng)), T.float32


def cta_threads(chunks: int) -> int:
    """Threads of a CTA covering (part of) one row of ``chunks`` thread chunks: the largest
    multiple of 32 up to 256 that divides ``chunks`` (no idle lanes), else ``chunks`` rounded up
    to 32 (at most 256)."""
    for t in range(256, 31, -32):
        if chunks % t == 0:
            return t
    return min(256, -(-chunks // 32) * 32)


def default_ept(in_dtype: str, out_fmt: str) -> int:
    """Elements per thread: 32 (a whole 1x32 group; 64 bytes of bf16 or 16 of e2m1 codes in
    flight per thread, measured fastest on H200), 16 for fp32 -> e4m3 (64 bytes already)."""
    return EPT if in_dtype == "float32" and out_fmt == "e4m3" else 32


@tlx.jit(target=TARGET)
def group_cast_kernel(H: int, group: int, in_mode: str, in_dtype: str, out_fmt: str = "e4m3",
                      scale_fmt: str = "fp32", col_major: bool = False, clamp: float = 10.0, weighted: bool = False,
                      masked: bool = False):
    """``in_mode``: "plain" (X ``[T, H]``), "swiglu" (X ``[T, 2H]`` and, if ``weighted``, W ``[T]``;
    if ``masked``, R ``[T]`` int32 after W: a row with R < 0 is neither read nor written), "e2m1" (P ``[T, H/2]`` uint8 and C ``[T, H/32]`` UE8M0 codes). ``out_fmt``: "e4m3" or "e2m1".
    A thread owns :func:`default_ept` elements; it works on packed bf16 pairs where that is exact
    (bf16 -> e2m1 by :func:`e2m1_pair_bf16`; the SwiGLU clamps when the clamp is a bf16 value), else
    per fp32 value. "e2m1" input has its own integer path (:func:`e2m1_e4m3_table`; power-of-two
    scales only)."""
    ept = default_ept(in_dtype, out_fmt)
    if masked and in_mode != "swiglu":
        raise ValueError(f"masked: expected in_mode 'swiglu' (the only masked form), got {in_mode!r}")
    if group % ept:
        raise ValueError(f"group: expected a multiple of {ept} (the elements a thread owns), got {group}")
    Tn = T.dynamic("T")
    TP = T.dynamic("TP")
    u32 = T.uint32
    tpg = group // ept
    cpr = H // ept
    ng = H // group
    pow2 = scale_fmt != "fp32" or out_fmt == "e2m1"
    packed = scale_fmt == "ue8m0_packed" and out_fmt == "e4m3"
    s_shape, s_dtype = _scale_buffer(Tn, TP, ng, out_fmt, scale_fmt, col_major)
    q_shape, q_dtype = ((Tn, H // 2), T.uint8) if out_fmt == "e2m1" else ((Tn, H), T.float8_e4m3fn)
    q_words = ept // 8 if out_fmt == "e2m1" else ept // 4  # uint32 words of output per thread
    fmt = "e2m1" if out_fmt == "e2m1" else "e4m3"
    x_cols = 2 * H if in_mode == "swiglu" else (H // 2 if in_mode == "e2m1" else H)
    x_dtype = T.uint8 if in_mode == "e2m1" else in_dtype
    shuffles = tpg.bit_length() - 1
    pad_bytes = -ng % 4
    tpc = cta_threads(cpr)
    nby = -(-cpr // tpc)

    @T.macro
    def store_scale(S, scale, code, c, row, col):
        """The first lane of a group writes its scale (``c`` < ``cpr`` checked by the caller)."""
        if c % tpg == 0:
            g = col // group
            if out_fmt == "e2m1":
                S[row, g] = T.Cast(T.uint8, code)
            elif packed and col_major:
                S[g // 4, row, g % 4] = T.Cast(T.uint8, code)
                if g == ng - 1:
                    for b in T.unroll(pad_bytes):  # unused bytes of the last word are zero
                        S[g // 4, row, ng % 4 + b] = T.uint8(0)
            elif packed:
                S[row, g] = T.Cast(T.uint8, code)
                if g == ng - 1:
                    for b in T.unroll(pad_bytes):
                        S[row, ng + b] = T.uint8(0)
            elif col_major:
                S[g, row] = scale
            else:
                S[row, g] = scale

    @T.macro
    def finish(xf, Q, S, c, row, col):
        """amax, scale, cast and store of the ``ept`` values ``xf`` of chunk ``c`` (``c < cpr``: in the row)."""
        amax = T.alloc_var(T.float32)
        amax = T.float32(0)
        for v in T.unroll(ept):
            amax = T.max(amax, T.abs(xf[v]))
        for k in T.unroll(shuffles):
            amax = T.max(amax, T.shfl_xor(amax, 1 << k))
        inv = T.alloc_var(T.float32)
        if pow2:
            scale, code, inv_pow2 = pow2_scale(amax, fmt)
            inv = inv_pow2
        else:
            scale, code = group_scale(amax, fmt, pow2)
            inv = T.float32(1.0) / scale
        if c < cpr:
            qw = T.alloc_local((q_words,), u32)
            Qw = T.view(Q, (Tn, H // (8 if out_fmt == "e2m1" else 4)), u32)
            if out_fmt == "e2m1":
                for j in T.unroll(q_words):
                    acc = T.alloc_var(u32)
                    acc = u32(0)
                    for k in T.unroll(8):
                        acc = pack_nibble(acc, e2m1_nibble(xf[8 * j + k] * inv))
                    qw[j] = acc
            else:
                for j in T.unroll(q_words):
                    qw[j] = cast_e4m3x4(xf[4 * j] * inv, xf[4 * j + 1] * inv, xf[4 * j + 2] * inv, xf[4 * j + 3] * inv)
            for v in T.vectorized(q_words):
                Qw[row, col // (ept // q_words) + v] = qw[v]
            store_scale(S, scale, code, c, row, col)

    @T.macro
    def load_bf16(X, xw, xf, row, col, valid, base, lo, hi):
        """``ept`` bf16 of row ``row`` from column ``base + col`` (zeros when not ``valid``) as fp32,
        clamped to [``lo``, ``hi``] (bf16 pairs, ``None``: not clamped) on the way; the (clamped)
        pairs stay in the caller's ``xw`` (``ept / 2`` uint32)."""
        Xw = T.view(X, (Tn, x_cols // 2), u32)
        if valid:
            for v in T.vectorized(ept // 2):
                xw[v] = Xw[row, (base + col) // 2 + v]
        else:
            for v in T.vectorized(ept // 2):
                xw[v] = u32(0)
        if hi is not None:
            for v in T.unroll(ept // 2):
                xw[v] = bf16x2("min", xw[v], hi)
        if lo is not None:
            for v in T.unroll(ept // 2):
                xw[v] = bf16x2("max", xw[v], lo)
        for v in T.unroll(ept):
            xf[v] = bf16_word_half(xw[v // 2], v % 2)

    if in_mode == "plain" and in_dtype == "bfloat16" and out_fmt == "e2m1":  # one 1x32 group per thread

        @T.prim_func
        def kernel(X: T.Tensor((Tn, x_cols), x_dtype), Q: T.Tensor(q_shape, q_dtype), S: T.Tensor(s_shape, s_dtype)):
            with T.Kernel(Tn, nby, threads=tpc, prelude=QUANT_PRELUDE) as (row, by):
                tx = T.get_thread_binding()
                xw = T.alloc_local((16,), u32)
                qw = T.alloc_local((4,), u32)
                sw = T.alloc_local((4,), u32)
                Xw = T.view(X, (Tn, H // 2), u32)
                Qw = T.view(Q, (Tn, H // 8), u32)
                c = by * tpc + tx
                if c < cpr:
                    for v in T.vectorized(16):
                        xw[v] = Xw[row, c * 16 + v]
                else:
                    for v in T.vectorized(16):
                        xw[v] = u32(0)
                amax2 = T.alloc_var(u32)
                amax2 = u32(0)
                for v in T.unroll(16):
                    amax2 = bf16x2("absmax", amax2, xw[v])
                amax2 = amax2 & u32(0x7FFF7FFF)
                scale, code, inv = pow2_scale(T.max(bf16_word_half(amax2, 0), bf16_word_half(amax2, 1)), "e2m1")
                inv2 = (T.reinterpret(inv, u32) >> u32(16)) * u32(0x10001)  # a power of two: exact in bf16
                if c < cpr:
                    for j in T.unroll(4):
                        acc = T.alloc_var(u32)
                        acc = u32(0)
                        for k in T.unroll(4):
                            sw[k] = e2m1_pair_bf16(xw[4 * j + k], inv2)
                            acc = T.call_extern("uint32", "__funnelshift_r", acc, e2m1_byte(sw[k]), 8)
                        qw[j] = acc | (sign_bytes(sw[0], sw[1], sw[2], sw[3]) & u32(0x80808080))
                    for v in T.vectorized(4):
                        Qw[row, c * 4 + v] = qw[v]
                    S[row, c] = T.Cast(T.uint8, code)

        return kernel

    if in_mode == "plain":

        @T.prim_func
        def kernel(X: T.Tensor((Tn, x_cols), x_dtype), Q: T.Tensor(q_shape, q_dtype), S: T.Tensor(s_shape, s_dtype)):
            with T.Kernel(Tn, nby, threads=tpc, prelude=QUANT_PRELUDE) as (row, by):
                tx = T.get_thread_binding()
                xf = T.alloc_local((ept,), T.float32)
                c = by * tpc + tx
                col = c * ept
                if in_dtype == "bfloat16":
                    xw = T.alloc_local((ept // 2,), u32)
                    load_bf16(X, xw, xf, row, col, c < cpr, 0, None, None)
                else:
                    if c < cpr:
                        for v in T.vectorized(ept):
                            xf[v] = X[row, col + v]
                    else:
                        for v in T.vectorized(ept):
                            xf[v] = T.float32(0)
                finish(xf, Q, S, c, row, col)

        return kernel

    if in_mode == "e2m1":
        if not pow2:
            raise ValueError("scale_fmt: re-blocking e2m1 is lossless only with power-of-two scales; expected 'ue8m0' or 'ue8m0_packed'")
        hpr = H // 16  # half groups per row: 16 codes, 8 bytes in, 16 bytes out
        lanes = group // 16  # lanes of one output group
        halves = 2  # per thread (H200: 1 is 12% slower; 4, or 2 rows per CTA, no faster)
        htc = cta_threads(-(-hpr // halves))
        nbh = -(-hpr // (halves * htc))

        @T.prim_func
        def kernel(X: T.Tensor((Tn, x_cols), T.uint8), C: T.Tensor((Tn, H // 32), T.uint8),
                   Q: T.Tensor(q_shape, q_dtype), S: T.Tensor(s_shape, s_dtype)):
            with T.Kernel(Tn, nbh, threads=htc, prelude=QUANT_PRELUDE) as (row, by):
                tx = T.get_thread_binding()
                xw = T.alloc_local((2 * halves,), u32)
                cv = T.alloc_local((halves,), T.uint8)
                tab = T.alloc_local((2,), u32)
                qw = T.alloc_local((4,), u32)
                Xw = T.view(X, (Tn, H // 8), u32)
                Qw = T.view(Q, (Tn, H // 4), u32)
                for j in T.unroll(halves):  # every load first
                    h = (by * halves + j) * htc + tx
                    if h < hpr:
                        for v in T.vectorized(2):
                            xw[2 * j + v] = Xw[row, h * 2 + v]
                        cv[j] = C[row, h // 2]
                    else:
                        for v in T.vectorized(2):
                            xw[2 * j + v] = u32(0)
                        cv[j] = T.uint8(0)
                for j in T.unroll(halves):
                    h = (by * halves + j) * htc + tx
                    cls = T.alloc_var(u32)
                    cls = e2m1_class(xw[2 * j], xw[2 * j + 1])
                    key = T.alloc_var(u32)
                    key = e2m1_block_key(T.Cast(u32, cv[j]), cls)
                    for k in T.unroll(lanes.bit_length() - 1):
                        key = T.max(key, T.shfl_xor(key, 1 << k))
                    code = T.alloc_var(u32)
                    code = e2m1_block_code(key)
                    e2m1_e4m3_table(tab, xw, 2 * j, T.Cast(u32, cv[j]), code)
                    for k in T.unroll(2):
                        qw[2 * k] = e2m1_e4m3_word(xw[2 * j + k], tab, 0)
                        qw[2 * k + 1] = e2m1_e4m3_word(xw[2 * j + k], tab, 1)
                    if h < hpr:
                        for v in T.vectorized(4):
                            Qw[row, h * 4 + v] = qw[v]
                        if h % lanes == 0:  # the group's first lane: store_scale's own test holds for chunk 0
                            store_scale(S, ue8m0_value(code), code, 0, row, h // lanes * group)

        return kernel

    if in_mode != "swiglu":
        raise ValueError(f"in_mode: expected 'plain', 'swiglu' or 'e2m1', got {in_mode!r}")
    clamp_bits = struct.unpack("<I", struct.pack("<f", clamp))[0]
    # the clamp's bf16 bits when it is a positive bf16 value (then the clamps run on bf16 pairs)
    bf16_clamp = clamp_bits >> 16 if clamp_bits & 0xFFFF == 0 and 0 < clamp < float("inf") else 0

    @T.macro
    def swiglu_ieee(gf, uf, xf):
        """``xf = silu(g) * u`` with the IEEE division (its range check and slow path per value)."""
        for v in T.unroll(ept):
            g = T.min(gf[v], T.float32(clamp))
            u = T.max(T.min(uf[v], T.float32(clamp)), T.float32(-clamp))
            if bf16_clamp:
                g = gf[v]
                u = uf[v]
            xf[v] = g / T.ieee_add(T.float32(1.0), T.exp(-g), "rn") * u  # no FMA contraction into expf

    @T.macro
    def swiglu_row(X, W, Q, S, row, by, tx, threads):
        """Row ``row``'s column block ``by``, ``tx`` the thread's place in the row's ``tpc`` (a
        thread past the row reads zeros, and w = 1); ``threads`` a CTA."""
        # at most 72 registers (4 CTAs of 224 threads per SM at H = 7168: 99.8% of copy on H200;
        # unbounded, nvcc takes 128 and 2 CTAs: 77.5%)
        T.annotate_min_blocks_per_sm(max(1, 65536 // (72 * threads)))
        gw = T.alloc_local((ept // 2,), u32)
        uw = T.alloc_local((ept // 2,), u32)
        gf = T.alloc_local((ept,), T.float32)
        uf = T.alloc_local((ept,), T.float32)
        xf = T.alloc_local((ept,), T.float32)
        c = by * tpc + tx
        col = c * ept
        w = T.alloc_var(T.float32)
        if bf16_clamp:  # fminf/fmaxf against a bf16 value: exact on the bf16 pairs
            load_bf16(X, gw, gf, row, col, c < cpr, 0, None, u32(bf16_clamp * 0x10001))
            load_bf16(X, uw, uf, row, col, c < cpr, H, u32((bf16_clamp | 0x8000) * 0x10001),
                      u32(bf16_clamp * 0x10001))
        else:
            load_bf16(X, gw, gf, row, col, c < cpr, 0, None, None)
            load_bf16(X, uw, uf, row, col, c < cpr, H, None, None)
        if c < cpr:
            w = W[row]
        else:
            w = T.float32(1.0)
        if bf16_clamp:
            # every g is a bf16 value <= the clamp: the fast quotient is exact when all are >= -87
            gmin2 = T.alloc_var(u32)
            gmin2 = gw[0]
            for v in T.unroll(ept // 2 - 1):
                gmin2 = bf16x2("min", gmin2, gw[v + 1])
            if T.min(bf16_word_half(gmin2, 0), bf16_word_half(gmin2, 1)) >= T.float32(SILU_FAST_MIN):
                for v in T.unroll(ept):
                    xf[v] = T.call_extern("float32", "tlx_quant_silu", gf[v]) * uf[v]
            else:
                swiglu_ieee(gf, uf, xf)
        else:
            swiglu_ieee(gf, uf, xf)
        if weighted:
            for v in T.unroll(ept):
                xf[v] = xf[v] * w
        finish(xf, Q, S, c, row, col)

    if masked:
        # ``rpc`` rows a CTA (whole warps each: a row's shuffles stay in its warps): most rows of
        # a MoE layer's padded layout are padding (T = 512, V4-Flash: 32512 of 35584), and a CTA
        # a row spent a launch on each of them
        rpc = max(1, 256 // tpc) if tpc % 32 == 0 else 1

        @T.prim_func
        def kernel(X: T.Tensor((Tn, x_cols), x_dtype), W: T.Tensor((Tn,), T.float32), R: T.Tensor((Tn,), T.int32),
                   Q: T.Tensor(q_shape, q_dtype), S: T.Tensor(s_shape, s_dtype)):
            # (T - 1) // rpc + 1 CTAs: ceil(T / rpc) without the int32 overflow of T + rpc - 1
            with T.Kernel((Tn - 1) // rpc + 1, nby, threads=tpc * rpc, prelude=QUANT_PRELUDE + SILU_PRELUDE) as (bx, by):
                tx = T.get_thread_binding()
                row = bx * rpc + tx // tpc
                if row < Tn:
                    if R[row] >= 0:
                        swiglu_row(X, W, Q, S, row, by, tx % tpc, tpc * rpc)

        return kernel

    @T.prim_func
    def kernel(X: T.Tensor((Tn, x_cols), x_dtype), W: T.Tensor((Tn,), T.float32),
               Q: T.Tensor(q_shape, q_dtype), S: T.Tensor(s_shape, s_dtype)):
        with T.Kernel(Tn, nby, threads=tpc, prelude=QUANT_PRELUDE + SILU_PRELUDE) as (row, by):
            swiglu_row(X, W, Q, S, row, by, T.get_thread_binding(), tpc)

    return kernel


def _check_group(group: int, scale_fmt: str = "fp32") -> None:
    if group not in GROUPS:
        raise ValueError(f"group: expected one of {GROUPS}, got {group!r}")
    if scale_fmt not in SCALE_FORMATS:
        raise ValueError(f"scale_fmt: expected one of {SCALE_FORMATS}, got {scale_fmt!r}")


def _alloc_scales(t: int, ng: int, scale_fmt: str, col_major: bool, device):
    """(tensor passed to the kernel, tensor returned to the caller) for the scale output."""
    if scale_fmt == "ue8m0_packed":
        ng4 = (ng + 3) // 4
        storage = torch.empty((ng4, tma_aligned(t)) if col_major else (t, ng4), dtype=torch.int32, device=device)
        out = storage.t()[:t] if col_major else storage
        codes = storage.view(torch.uint8)  # one byte per group, as the kernel writes them
        return (codes.view(ng4, tma_aligned(t), 4) if col_major else codes), out
    storage = torch.empty((ng, tma_aligned(t)) if col_major else (t, ng), dtype=torch.float32, device=device)
    return storage, (storage.t()[:t] if col_major else storage)


def per_token_group_cast(x: torch.Tensor, group: int = 128, scale_fmt: str = "fp32", col_major: bool = False,
                         out: tuple | None = None):
    """bf16/fp32 ``[T, H]`` -> (e4m3 ``[T, H]``, scales ``[T, H / group]``; int32 ``[T, ceil(H/group/4)]`` when packed).
    ``out``: a (q, scales) pair to write instead (fp32 row-major scales only), e.g. a send buffer's rows."""
    _check_group(group, scale_fmt)
    check_2d("x", x, TORCH_DTYPES, group)
    check_cuda(x=x)
    t, h = x.shape
    if out is None:
        s_arg, s_out = _alloc_scales(t, h // group, scale_fmt, col_major, x.device)
        q = torch.empty((t, h), dtype=torch.float8_e4m3fn, device=x.device)
    else:
        if scale_fmt != "fp32" or col_major:
            raise ValueError(f"out: expected only with row-major fp32 scales, got scale_fmt={scale_fmt!r}, col_major={col_major}")
        q, s_arg = check_out(out, "a (q, scales) pair", [(torch.float8_e4m3fn, (t, h)), (torch.float32, (t, h // group))],
                             x.device)
        s_out = s_arg
    if t:
        group_cast_kernel(h, group, "plain", TORCH_DTYPES[x.dtype], "e4m3", scale_fmt, col_major)(x, q, s_arg)
    return q, s_out


def swiglu_cast(x: torch.Tensor, weights: torch.Tensor | None = None, clamp: float = 10.0, group: int = 128,
                scale_fmt: str = "fp32", col_major: bool = False, rows: torch.Tensor | None = None):
    """bf16 ``[T, 2I]`` -> e4m3 ``[T, I]`` of ``silu(fmin(gate, c)) * clamp(up, -c, c) * w`` plus scales.

    ``rows``: int32 ``[T]``; a row whose entry is negative is neither read nor written (its
    output is unspecified): MoE padding rows (metadata's ``entry_of_row``, -1 there), which no
    later step reads, so only the routed rows cost memory traffic."""
    _check_group(group, scale_fmt)
    check_2d("x", x, (torch.bfloat16,), 2 * group)
    t, i = x.shape[0], x.shape[1] // 2
    for name, v, dtype in (("weights", weights, torch.float32), ("rows", rows, torch.int32)):
        if v is not None and (not isinstance(v, torch.Tensor) or v.dtype != dtype or tuple(v.shape) != (t,)):
            raise ValueError(f"{name}: expected a {dtype} tensor of shape ({t},), got {getattr(v, 'dtype', type(v))} "
                             f"{tuple(getattr(v, 'shape', ()))}")
    # W is not read by a kernel built unweighted; R (rows) is an input of the masked kernel only
    inputs = {"x": x, "weights": torch.empty((t,), dtype=torch.float32, device=x.device) if weights is None else weights.contiguous()}
    if rows is not None:
        inputs["rows"] = rows.contiguous()
    check_cuda(**inputs)
    s_arg, s_out = _alloc_scales(t, i // group, scale_fmt, col_major, x.device)
    q = torch.empty((t, i), dtype=torch.float8_e4m3fn, device=x.device)
    if t:
        kernel = group_cast_kernel(i, group, "swiglu", "bfloat16", "e4m3", scale_fmt, col_major, float(clamp), weights is not None,
                                   rows is not None)
        kernel(*inputs.values(), q, s_arg)
    return q, s_out


def mxfp4_cast(x: torch.Tensor):
    """bf16/fp32 ``[T, K]`` -> (e2m1 packed uint8 ``[T, K/2]``, UE8M0 codes uint8 ``[T, K/32]``)."""
    check_2d("x", x, TORCH_DTYPES, 32)
    check_cuda(x=x)
    t, k = x.shape
    q = torch.empty((t, k // 2), dtype=torch.uint8, device=x.device)
    s = torch.empty((t, k // 32), dtype=torch.uint8, device=x.device)
    if t:
        group_cast_kernel(k, 32, "plain", TORCH_DTYPES[x.dtype], "e2m1")(x, q, s)
    return q, s


def fp4_to_fp8(packed: torch.Tensor, codes: torch.Tensor, group: int = 128, scale_fmt: str = "ue8m0",
               col_major: bool = False):
    """MXFP4 (``[T, K/2]`` uint8, ``[T, K/32]`` UE8M0) -> e4m3 ``[T, K]`` with power-of-two 1 x ``group`` scales."""
    _check_group(group, scale_fmt)
    if scale_fmt == "fp32":
        raise ValueError("scale_fmt: re-blocking is lossless only with power-of-two scales; expected 'ue8m0' or 'ue8m0_packed'")
    check_2d("packed", packed, (torch.uint8,), group // 2)
    t, k = packed.shape[0], packed.shape[1] * 2
    check_2d("codes", codes, (torch.uint8,))
    if tuple(codes.shape) != (t, k // 32):
        raise ValueError(f"codes: expected shape {(t, k // 32)}, got {tuple(codes.shape)}")
    check_cuda(packed=packed, codes=codes)
    s_arg, s_out = _alloc_scales(t, k // group, scale_fmt, col_major, packed.device)
    q = torch.empty((t, k), dtype=torch.float8_e4m3fn, device=packed.device)
    if t:
        group_cast_kernel(k, group, "e2m1", "uint8", "e4m3", scale_fmt, col_major)(packed, codes, q, s_arg)
    return q, s_out
