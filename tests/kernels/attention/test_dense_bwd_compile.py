"""Dense attention backward without a GPU: its three kernels compile for sm_90a with no atomics
(the determinism contract) and no launch condition beyond their assume lists; bad arguments are
named."""

import math

import pytest
import torch

from kernels.attention.common import LOG2E
from kernels.attention.dense_bwd import bwd_delta_kernel, bwd_dkdv_kernel, bwd_dq_kernel, dense_attention_backward


@pytest.mark.parametrize("dim,causal", [(128, True), (64, False)])
def test_kernels_compile_without_atomics(dim, causal, derived_preconditions):
    s = 1 / math.sqrt(dim)
    dkdv, dq = bwd_dkdv_kernel(dim, causal, s * LOG2E, s), bwd_dq_kernel(dim, causal, s * LOG2E, s)
    for kernel in (dkdv, dq):
        assert derived_preconditions(kernel) == []
        assert "atomic" not in kernel.device_source.lower()
    # dV += P^T dO and dK += dS^T Q from registers, m64n{d}k16; dQ += dS K likewise
    assert dkdv.device_source.count(f"tl::DataType::kFloat32, 64, {dim}, 16, false, true") == 2
    assert f"tl::DataType::kFloat32, 64, {dim}, 16, false, true" in dq.device_source
    assert "atomic" not in bwd_delta_kernel(dim).device_source.lower()


def test_bad_arguments_are_named():
    q = torch.randn(1, 8, 4, 128, dtype=torch.bfloat16)
    k = torch.randn(1, 8, 2, 128, dtype=torch.bfloat16)
    lse = torch.zeros(1, 4, 8)
    with pytest.raises(ValueError, match="q: head dim expected one of \\(64, 128\\), got 256"):
        q2, k2 = torch.randn(1, 8, 4, 256, dtype=torch.bfloat16), torch.randn(1, 8, 2, 256, dtype=torch.bfloat16)
        dense_attention_backward(q2, q2, k2, k2, q2, lse)
    with pytest.raises(ValueError, match="do: expected the shape of q"):
        dense_attention_backward(q[:, :4].contiguous(), q, k, k, q, lse)
    with pytest.raises(TypeError, match="o: expected dtype"):
        dense_attention_backward(q, q, k, k, q.half(), lse)
    with pytest.raises(ValueError, match="lse: expected fp32"):
        dense_attention_backward(q, q, k, k, q, lse[:, :2])
    with pytest.raises(ValueError, match="q: expected a CUDA tensor"):
        dense_attention_backward(q, q, k, k, q, lse)
