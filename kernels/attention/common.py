"""Pieces shared by the attention kernels (prefill/training and decode): argument checks and the
online-softmax steps as TileLang macros.

The online softmax works in base 2 with the softmax scale folded into one multiply:
``scale_log2 = softmax_scale * log2(e)``. For a row with running max ``m`` (raw scores, not
scaled) and running sum ``l``, one key block with raw scores ``s`` does, per row, in this order:

1. ``m_new = max(m, max_j s_j)`` (row max: exact, so its reduction order does not matter);
2. ``m_scaled = m_new * scale_log2`` (one rounded multiply), or 0 when ``m_new`` is -inf (a row
   that has seen only masked keys: every ``p`` below is then exp2(-inf) = 0 instead of NaN);
3. ``alpha = exp2(m_scaled_old - m_scaled)`` (the rescale of the old sum and output: exactly 1
   while the max stands), 0 while the old max is -inf;
4. ``p_j = exp2(fma(s_j, scale_log2, -m_scaled))``;
5. ``l = l * alpha + rowsum(p)`` (``rowsum`` is TileLang's reduce_sum; its order is what the CUDA
   baselines repeat, see each kernel's docstring);
6. ``o = o * alpha`` and then ``o += P V`` with P rounded to the input dtype.

At the end ``o / l`` (one IEEE division; rows with ``l == 0`` give 0) and the log-sum-exp in
natural-log units, ``lse = (m_scaled + log2(l)) * ln 2`` (-inf for a row with no keys).
The explicit fma / rounded multiply calls fix the contraction, so the CUDA baselines can repeat it bit for bit.
"""

from __future__ import annotations

import math

import torch
import tilelang.language as T

from kernels.quant.common import check_cuda  # noqa: F401  (one device check for every kernel family)
from tlx.numerics import determinism

TARGET = {"kind": "cuda", "arch": "sm_90a"}
LOG2E = math.log2(math.e)
LN2 = math.log(2.0)
WARPGROUP = 128  # threads
# the first named-barrier id free for a kernel's own use (TileLang's generated code uses ids 0-7):
# the producer warpgroup's barrier of the warp-specialized kernels, the first turn of dense_fwd's
NAMED_BARRIER = 8
TORCH_DTYPES = {torch.bfloat16: "bfloat16", torch.float16: "float16"}
INT32_LIMIT = 2**31 - 1


# --- argument checks -----------------------------------------------------------------------------


def check_tensor(name: str, t, dtypes, ndim: int) -> None:
    """``t`` is a contiguous torch tensor of one of ``dtypes`` with ``ndim`` dimensions."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in dtypes:
        raise TypeError(f"{name}: expected dtype in {[str(d) for d in dtypes]}, got {t.dtype}")
    if t.dim() != ndim:
        raise ValueError(f"{name}: expected a {ndim}-D tensor, got shape {tuple(t.shape)}")
    if not t.is_contiguous():
        raise ValueError(f"{name}: expected a contiguous tensor, got strides {t.stride()}")
    if t.numel() > INT32_LIMIT:
        raise ValueError(f"{name}: {t.numel()} elements exceed the int32 index range of these kernels")


def check_same_dtype(**tensors) -> None:
    """All named tensors share one dtype (the first one's)."""
    (first, t0), *rest = tensors.items()
    for name, t in rest:
        if t.dtype != t0.dtype:
            raise TypeError(f"{name}: expected dtype {t0.dtype} (the dtype of {first}), got {t.dtype}")


def check_head_dim(name: str, d: int, supported) -> None:
    if d not in supported:
        raise ValueError(f"{name}: head dim expected one of {tuple(supported)}, got {d}")


def check_heads(q_heads: int, kv_heads: int, kv_name: str = "k") -> int:
    """The query heads per kv head (GQA group size); MHA is 1, MQA is ``q_heads``."""
    if kv_heads < 1 or q_heads % kv_heads:
        raise ValueError(f"{kv_name}: head count expected a divisor of the {q_heads} query heads, got {kv_heads}")
    return q_heads // kv_heads


def check_dim(name: str, t: torch.Tensor, dim: int, expected: int, what: str) -> None:
    if t.shape[dim] != expected:
        raise ValueError(f"{name}: shape[{dim}] expected {expected} ({what}), got {t.shape[dim]}")


def check_cu_seqlens(name: str, cu: torch.Tensor, total: int) -> torch.Tensor:
    """``cu`` is int32 [batch + 1], starts at 0, never decreases and ends at ``total`` (the rows of
    the packed tensor). Reads it on the host (one device sync): a bad offset must raise here, not
    read out of bounds on the GPU. Returns the host copy."""
    if not isinstance(cu, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(cu).__name__}")
    if cu.dtype != torch.int32 or cu.dim() != 1 or cu.numel() < 2:
        raise TypeError(f"{name}: expected a 1-D int32 tensor of batch + 1 >= 2 offsets, got {cu.dtype} {tuple(cu.shape)}")
    host = cu.cpu()
    if int(host[0]) != 0:
        raise ValueError(f"{name}: expected {name}[0] == 0, got {int(host[0])}")
    steps = host[1:] - host[:-1]
    if bool((steps < 0).any()):
        i = int(torch.nonzero(steps < 0)[0])
        raise ValueError(f"{name}: expected non-decreasing offsets, got {name}[{i}] = {int(host[i])} > {name}[{i + 1}] = {int(host[i + 1])}")
    if int(host[-1]) != total:
        raise ValueError(f"{name}: expected the last offset to equal the {total} packed rows, got {int(host[-1])}")
    return host


# --- online softmax (TileLang macros) ------------------------------------------------------------


def neg_inf():
    return -T.infinity("float32")


def row_state(rows: int):
    """The fp32 per-row fragments of the online softmax, allocated where this is called inside a
    kernel: ``(m, m_prev, m_scaled, alpha, l, row_sum, lse_rows)`` (the names ``softmax_step`` and
    ``finish_rows`` take)."""
    return tuple(T.alloc_fragment((rows,), "float32") for _ in range(7))


@T.macro
def init_softmax(m, m_scaled, l, acc_o):
    """Running max -inf (scaled: 0), running sum 0, output accumulator 0."""
    T.fill(m, neg_inf())
    T.fill(m_scaled, 0)
    T.fill(l, 0)
    T.fill(acc_o, 0)


# exp2 as one MUFU instruction (``ex2.approx.ftz.f32``). ``T.exp2`` becomes CUDA's exp2f, which
# wraps the same instruction in three more (a compare and two predicated multiplies) so that results
# below 2^-126 come out subnormal; here they are 0. In the online softmax that is a p (or alpha)
# below 2^-126: the bits differ from exp2f's only where a score lies more than 126 / scale_log2
# below its row's running max.
EXP2_FTZ_PRELUDE = r"""
#ifndef TLX_EXP2_FTZ_PRELUDE_
#define TLX_EXP2_FTZ_PRELUDE_
__device__ __forceinline__ float tlx_exp2_ftz(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
#endif
"""
determinism.declare_pure("tlx_exp2_ftz")


def exp2_ftz(x):
    """``ex2.approx.ftz.f32`` of ``x`` (``EXP2_FTZ_PRELUDE`` in the kernel's prelude)."""
    return T.call_extern("float32", "tlx_exp2_ftz", x)


# ptxas schedules a wgmma wait (``WARPGROUP.DEPBAR``) as early as its operands allow, and a wait has
# none: in the overlap schedule it hoisted ``wait_wgmma(0)`` (P V done) above 54 of a block's 66
# exp2s and its row sums (sm_90a, nvcc 13.0), so most of the softmax ran after the P V it was
# written to overlap. A shared-memory store is kept in program order with the wait, so storing a
# value that depends on the whole softmax (the row sum ``l``) just before the wait pins the softmax
# above it. The slot is never read: the store orders instructions and moves no data.
ORDER_POINT_PRELUDE = r"""
#ifndef TLX_ORDER_POINT_PRELUDE_
#define TLX_ORDER_POINT_PRELUDE_
__device__ __forceinline__ void tlx_order_point(int bits) {
  __shared__ int tlx_order_slot[128];
  asm volatile("st.shared.b32 [%0], %1;" :: "r"((unsigned)__cvta_generic_to_shared(&tlx_order_slot[threadIdx.x & 127])),
               "r"(bits) : "memory");
}
#endif
"""
determinism.declare_sync(tlx_order_point="fence")  # its store moves no data any code reads


@T.macro
def order_point(values, rows: int):
    """Everything that computes the fp32 fragment ``values`` [rows] is issued before what follows
    (``ORDER_POINT_PRELUDE`` in the kernel's prelude)."""
    for i in T.Parallel(rows):
        T.evaluate(T.call_extern("void", "tlx_order_point", T.reinterpret(values[i], "int32")))


@T.macro
def rescale_state(m, m_prev, m_scaled, alpha, scale_log2: float, rows: int, exp2=T.exp2):
    """Steps 2-3 of the module docstring, the new row max in ``m`` and the old one in ``m_prev``:
    ``alpha`` from the old ``m_scaled`` (same rounding: exactly 1 while the max stands), 0 while
    the row had no keys (l and o are 0 then; exp2 of a huge difference would be inf); then the
    new ``m_scaled``."""
    for i in T.Parallel(rows):
        alpha[i] = T.if_then_else(m_prev[i] == neg_inf(), T.float32(0), exp2(T.ieee_sub(m_scaled[i], T.if_then_else(m[i] == neg_inf(), T.float32(0), T.ieee_mul(m[i], T.float32(scale_log2))))))
        m_scaled[i] = T.if_then_else(m[i] == neg_inf(), T.float32(0), T.ieee_mul(m[i], T.float32(scale_log2)))


@T.macro
def softmax_step(acc_s, m, m_prev, m_scaled, alpha, l, row_sum, scale_log2: float, rows: int, cols: int, exp2=T.exp2):
    """Steps 1-5 of the module docstring on the raw scores ``acc_s`` [rows, cols]: ``acc_s``
    becomes ``p``, ``m``/``m_scaled``/``l`` are updated, ``alpha`` holds the output's rescale
    (``m_prev`` is scratch: the old max). ``exp2``: ``T.exp2`` or ``exp2_ftz``."""
    T.copy(m, m_prev)
    T.reduce_max(acc_s, m, dim=1, clear=False)
    rescale_state(m, m_prev, m_scaled, alpha, scale_log2, rows, exp2)
    for i, j in T.Parallel(rows, cols):
        acc_s[i, j] = exp2(T.ieee_fmaf(acc_s[i, j], T.float32(scale_log2), -m_scaled[i]))
    T.reduce_sum(acc_s, row_sum, dim=1)
    for i in T.Parallel(rows):
        l[i] = T.ieee_fmaf(l[i], alpha[i], row_sum[i])


@T.macro
def rescale_rows(acc_o, alpha, rows: int, cols: int, lazy: bool = False):
    """Step 6's ``o = o * alpha``. ``lazy``: a thread skips its multiplies where every row it holds
    has ``alpha`` 1 (the row's max did not move), since ``o * 1`` is ``o`` bit for bit (denormals are
    kept: no fast math; a NaN stays a NaN): the same bits, fewer instructions once the maxima settle."""
    if lazy:
        moved = T.alloc_var("int32")
        moved = 0
        for i in T.Parallel(rows):
            if alpha[i] != T.float32(1):
                moved = 1
        if moved != 0:
            for i, j in T.Parallel(rows, cols):
                acc_o[i, j] = acc_o[i, j] * alpha[i]
    else:
        for i, j in T.Parallel(rows, cols):
            acc_o[i, j] = acc_o[i, j] * alpha[i]


@T.macro
def finish_rows(acc_o, l, m_scaled, lse_rows, rows: int, cols: int, reciprocal: bool = False, transposed: bool = False):
    """``acc_o /= l`` (0 for rows with no keys) and ``lse_rows`` in natural-log units.
    ``reciprocal``: ``acc_o *= 1 / l`` instead (one IEEE division per row, then a rounded multiply
    per value: other bits than the division's, which costs a division per value; ``lse_rows``
    holds the reciprocal meanwhile). ``transposed``: ``acc_o`` is [cols, rows] (a key-major
    kernel's O^T), divided as the rows' values are."""
    if transposed:
        for j, i in T.Parallel(cols, rows):
            acc_o[j, i] = T.if_then_else(l[i] == T.float32(0), T.float32(0), acc_o[j, i] / l[i])
    elif reciprocal:
        for i in T.Parallel(rows):
            lse_rows[i] = T.if_then_else(l[i] == T.float32(0), T.float32(0), T.float32(1) / l[i])
        for i, j in T.Parallel(rows, cols):
            acc_o[i, j] = T.if_then_else(l[i] == T.float32(0), T.float32(0), acc_o[i, j] * lse_rows[i])
    else:
        for i, j in T.Parallel(rows, cols):
            acc_o[i, j] = T.if_then_else(l[i] == T.float32(0), T.float32(0), acc_o[i, j] / l[i])
    for i in T.Parallel(rows):
        lse_rows[i] = T.if_then_else(l[i] == T.float32(0), neg_inf(), (m_scaled[i] + T.log2(l[i])) * T.float32(LN2))
