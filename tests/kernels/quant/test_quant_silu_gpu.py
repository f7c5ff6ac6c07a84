"""SwiGLU's fast quotient (``tlx_quant_silu`` in ``kernels/quant/group_cast.py``) against the IEEE
quotient ``g / (1 + expf(-g))`` for every bf16 ``g``, on the GPU: bit-equal on the range the
kernel takes it for (``g >= SILU_FAST_MIN``, finite; a thread with a smaller ``g`` uses the IEEE
division), and the range check is the one that matters (the fast path is wrong for some ``g``
below it). Outputs are poisoned before the launch.
"""

import pytest
import torch
import tilelang.language as T

import tlx
from kernels.quant.common import QUANT_PRELUDE, TARGET
from kernels.quant.group_cast import SILU_FAST_MIN, SILU_PRELUDE
from tlx.numerics.sweep import assert_same_bits, poisoned

pytestmark = pytest.mark.gpu


@tlx.jit(target=TARGET)
def silu_kernel(N: int):
    """Per bf16 input: the fast quotient and the IEEE one, as the SwiGLU kernel spells both."""

    @T.prim_func
    def kernel(X: T.Tensor((N,), T.bfloat16), OUT: T.Tensor((2, N), T.float32)):
        with T.Kernel(N // 256, threads=256, prelude=QUANT_PRELUDE + SILU_PRELUDE) as bx:
            i = bx * 256 + T.get_thread_binding()
            g = T.Cast(T.float32, X[i])
            OUT[0, i] = T.call_extern("float32", "tlx_quant_silu", g)
            OUT[1, i] = g / T.ieee_add(T.float32(1.0), T.exp(-g), "rn")

    return kernel


def test_fast_silu_every_bf16():
    x = torch.arange(1 << 16, dtype=torch.int32, device="cuda").to(torch.int16).view(torch.bfloat16)
    out = poisoned((2, 1 << 16), torch.float32)
    silu_kernel(1 << 16)(x, out)
    g = x.float()
    fast = (g >= SILU_FAST_MIN) & torch.isfinite(g)
    assert int(fast.sum()) > 30000  # zeros, subnormals, all of [-87, 0) and everything finite above
    assert_same_bits(out[0][fast], out[1][fast], "tlx_quant_silu vs IEEE g / (1 + expf(-g))", (x[fast],))
    slow = ~fast & ~torch.isnan(g)
    assert not torch.equal(out[0][slow].view(torch.int32), out[1][slow].view(torch.int32))
