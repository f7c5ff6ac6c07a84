"""Per-token-group casts ``[T, H] -> [T, H]`` with one scale per ``1 x group`` (rules in ``reference.py``).

One kernel body serves four public operations, differing only in how a thread gets its 16
fp32 values and what it stores:

- :func:`per_token_group_cast`: bf16/fp32 -> e4m3, groups of 32/64/128, scales fp32 or UE8M0
  (fp32 powers of two or packed four per int32), row-major or column-major TMA-aligned.
- :func:`swiglu_cast`: bf16 ``[T, 2I]`` -> ``silu(fmin(gate, c)) * clamp(up, -c, c) * w`` -> e4m3.
- :func:`mxfp4_cast`: bf16/fp32 -> e2m1 packed two per byte with UE8M0 codes per 1x32.
- :func:`fp4_to_fp8`: MXFP4 -> e4m3 with power-of-two 1x128 scales (lossless re-blocking).

Design for bandwidth: a thread owns 16 consecutive elements (16-byte vector loads, one
16-byte e4m3 store), ``group / 16`` adjacent lanes own a group and reduce amax with
``shfl_xor``; T is a dynamic dimension (one compile for every T; rows are independent, so
every row's output is identical whatever T is).
"""

import torch
import tilelang.language as T

import tlx
from kernels.quant.common import (
    EPT, TARGET, THREADS, TORCH_DTYPES, cast_e4m3, check_2d, check_cuda, e2m1_code, e2m1_value, group_scale, ue8m0_value,
)
from kernels.quant.reference import SCALE_FORMATS, tma_aligned

GROUPS = (32, 64, 128)


def _scale_buffer(Tn, TP, ng: int, out_fmt: str, scale_fmt: str, col_major: bool):
    """(shape, dtype) of the scale output as the kernel sees it (packed codes as bytes; the
    column-major packed layout as ``[words, TP, 4]`` so every shape variable appears bare)."""
    if out_fmt == "e2m1":
        return (Tn, ng), T.uint8
    if scale_fmt == "ue8m0_packed":
        ng4 = (ng + 3) // 4
        return ((ng4, TP, 4) if col_major else (Tn, ng4 * 4)), T.uint8
    return ((ng, TP) if col_major else (Tn, ng)), T.float32


@tlx.jit(target=TARGET)
def group_cast_kernel(H: int, group: int, in_mode: str, in_dtype: str, out_fmt: str = "e4m3",
                      scale_fmt: str = "fp32", col_major: bool = False, clamp: float = 10.0, weighted: bool = False):
    """``in_mode``: "plain" (X ``[T, H]``), "swiglu" (X ``[T, 2H]`` and, if ``weighted``, W ``[T]``),
    "e2m1" (P ``[T, H/2]`` uint8 and C ``[T, H/32]`` UE8M0 codes). ``out_fmt``: "e4m3" or "e2m1"."""
    Tn = T.dynamic("T")
    TP = T.dynamic("TP")
    tpg = group // EPT
    cpr = H // EPT
    ng = H // group
    pow2 = scale_fmt != "fp32" or out_fmt == "e2m1"
    packed = scale_fmt == "ue8m0_packed" and out_fmt == "e4m3"
    s_shape, s_dtype = _scale_buffer(Tn, TP, ng, out_fmt, scale_fmt, col_major)
    q_shape, q_dtype = ((Tn, H // 2), T.uint8) if out_fmt == "e2m1" else ((Tn, H), T.float8_e4m3fn)
    fmt = "e2m1" if out_fmt == "e2m1" else "e4m3"
    x_cols = 2 * H if in_mode == "swiglu" else (H // 2 if in_mode == "e2m1" else H)
    x_dtype = T.uint8 if in_mode == "e2m1" else in_dtype
    shuffles = tpg.bit_length() - 1
    pad_bytes = -ng % 4

    @T.macro
    def finish(xf, Q, S, c, row, col):
        amax = T.alloc_var(T.float32)
        amax = T.float32(0)
        for v in T.unroll(EPT):
            amax = T.max(amax, T.abs(xf[v]))
        for k in T.unroll(shuffles):
            amax = T.max(amax, T.shfl_xor(amax, 1 << k))
        scale, code = group_scale(amax, fmt, pow2)
        inv = T.alloc_var(T.float32)
        inv = T.float32(1.0) / scale
        if c < Tn * cpr:
            if out_fmt == "e2m1":
                qb = T.alloc_local((EPT // 2,), T.uint8)
                for v in T.unroll(EPT // 2):
                    qb[v] = e2m1_code(xf[2 * v] * inv) | (e2m1_code(xf[2 * v + 1] * inv) << T.uint8(4))
                for v in T.vectorized(EPT // 2):
                    Q[row, col // 2 + v] = qb[v]
            else:
                qv = T.alloc_local((EPT,), T.float8_e4m3fn)
                for v in T.unroll(EPT):
                    qv[v] = cast_e4m3(xf[v] * inv)
                for v in T.vectorized(EPT):
                    Q[row, col + v] = qv[v]
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

    if in_mode == "plain":

        @T.prim_func
        def kernel(X: T.Tensor((Tn, x_cols), x_dtype), Q: T.Tensor(q_shape, q_dtype), S: T.Tensor(s_shape, s_dtype)):
            with T.Kernel(T.ceildiv(Tn * cpr, THREADS), threads=THREADS) as bx:
                tx = T.get_thread_binding()
                xv = T.alloc_local((EPT,), x_dtype)
                xf = T.alloc_local((EPT,), T.float32)
                c = bx * THREADS + tx
                row = c // cpr
                col = c % cpr * EPT
                if c < Tn * cpr:
                    for v in T.vectorized(EPT):
                        xv[v] = X[row, col + v]
                else:
                    for v in T.vectorized(EPT):
                        xv[v] = T.Cast(x_dtype, 0)
                for v in T.unroll(EPT):
                    xf[v] = T.Cast(T.float32, xv[v])
                finish(xf, Q, S, c, row, col)

        return kernel

    if in_mode == "e2m1":

        @T.prim_func
        def kernel(X: T.Tensor((Tn, x_cols), T.uint8), C: T.Tensor((Tn, H // 32), T.uint8),
                   Q: T.Tensor(q_shape, q_dtype), S: T.Tensor(s_shape, s_dtype)):
            with T.Kernel(T.ceildiv(Tn * cpr, THREADS), threads=THREADS) as bx:
                tx = T.get_thread_binding()
                xb = T.alloc_local((EPT // 2,), T.uint8)
                xf = T.alloc_local((EPT,), T.float32)
                c = bx * THREADS + tx
                row = c // cpr
                col = c % cpr * EPT
                sc = T.alloc_var(T.float32)
                if c < Tn * cpr:
                    for v in T.vectorized(EPT // 2):
                        xb[v] = X[row, col // 2 + v]
                    sc = ue8m0_value(T.Cast(T.uint32, C[row, col // 32]))
                else:
                    for v in T.vectorized(EPT // 2):
                        xb[v] = T.uint8(0)
                    sc = T.float32(1.0)
                for v in T.unroll(EPT // 2):
                    xf[2 * v] = e2m1_value(T.Cast(T.uint32, xb[v]) & T.uint32(15)) * sc
                    xf[2 * v + 1] = e2m1_value(T.Cast(T.uint32, xb[v]) >> T.uint32(4)) * sc
                finish(xf, Q, S, c, row, col)

        return kernel

    if in_mode != "swiglu":
        raise ValueError(f"in_mode: expected 'plain', 'swiglu' or 'e2m1', got {in_mode!r}")

    @T.prim_func
    def kernel(X: T.Tensor((Tn, x_cols), x_dtype), W: T.Tensor((Tn,), T.float32),
               Q: T.Tensor(q_shape, q_dtype), S: T.Tensor(s_shape, s_dtype)):
        with T.Kernel(T.ceildiv(Tn * cpr, THREADS), threads=THREADS) as bx:
            tx = T.get_thread_binding()
            gv = T.alloc_local((EPT,), x_dtype)
            uv = T.alloc_local((EPT,), x_dtype)
            xf = T.alloc_local((EPT,), T.float32)
            c = bx * THREADS + tx
            row = c // cpr
            col = c % cpr * EPT
            w = T.alloc_var(T.float32)
            if c < Tn * cpr:
                for v in T.vectorized(EPT):
                    gv[v] = X[row, col + v]
                for v in T.vectorized(EPT):
                    uv[v] = X[row, H + col + v]
                w = W[row]
            else:
                for v in T.vectorized(EPT):
                    gv[v] = T.Cast(x_dtype, 0)
                for v in T.vectorized(EPT):
                    uv[v] = T.Cast(x_dtype, 0)
                w = T.float32(1.0)
            for v in T.unroll(EPT):
                g = T.min(T.Cast(T.float32, gv[v]), T.float32(clamp))
                u = T.max(T.min(T.Cast(T.float32, uv[v]), T.float32(clamp)), T.float32(-clamp))
                xf[v] = g / T.ieee_add(T.float32(1.0), T.exp(-g), "rn") * u  # no FMA contraction into expf
                if weighted:
                    xf[v] = xf[v] * w
            finish(xf, Q, S, c, row, col)

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


def per_token_group_cast(x: torch.Tensor, group: int = 128, scale_fmt: str = "fp32", col_major: bool = False):
    """bf16/fp32 ``[T, H]`` -> (e4m3 ``[T, H]``, scales ``[T, H / group]``; int32 ``[T, ceil(H/group/4)]`` when packed)."""
    _check_group(group, scale_fmt)
    check_2d("x", x, TORCH_DTYPES, group)
    check_cuda(x=x)
    t, h = x.shape
    s_arg, s_out = _alloc_scales(t, h // group, scale_fmt, col_major, x.device)
    q = torch.empty((t, h), dtype=torch.float8_e4m3fn, device=x.device)
    if t:
        group_cast_kernel(h, group, "plain", TORCH_DTYPES[x.dtype], "e4m3", scale_fmt, col_major)(x, q, s_arg)
    return q, s_out


def swiglu_cast(x: torch.Tensor, weights: torch.Tensor | None = None, clamp: float = 10.0, group: int = 128,
                scale_fmt: str = "fp32", col_major: bool = False):
    """bf16 ``[T, 2I]`` -> e4m3 ``[T, I]`` of ``silu(fmin(gate, c)) * clamp(up, -c, c) * w`` plus scales."""
    _check_group(group, scale_fmt)
    check_2d("x", x, (torch.bfloat16,), 2 * group)
    t, i = x.shape[0], x.shape[1] // 2
    if weights is not None:
        if not isinstance(weights, torch.Tensor) or weights.dtype != torch.float32 or tuple(weights.shape) != (t,):
            raise ValueError(f"weights: expected an fp32 tensor of shape ({t},), got {getattr(weights, 'dtype', type(weights))} "
                             f"{tuple(getattr(weights, 'shape', ()))}")
        w = weights.contiguous()
        check_cuda(x=x, weights=w)
    else:
        check_cuda(x=x)
        w = torch.empty((t,), dtype=torch.float32, device=x.device)  # not read: the kernel is built unweighted
    s_arg, s_out = _alloc_scales(t, i // group, scale_fmt, col_major, x.device)
    q = torch.empty((t, i), dtype=torch.float8_e4m3fn, device=x.device)
    if t:
        kernel = group_cast_kernel(i, group, "swiglu", "bfloat16", "e4m3", scale_fmt, col_major, float(clamp), weights is not None)
        kernel(x, w, q, s_arg)
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
