"""Dense attention backward without a GPU: its three kernels compile for sm_90a with no atomics
(the determinism contract) and no launch condition beyond their assume lists; bad arguments are
named."""

import math

import pytest
import torch

from kernels.attention.dense_bwd import SPLIT_DIMS, backward_kernels, bwd_dkdv_kernel, bwd_dq_kernel, dense_attention_backward
from tests.kernels.staged_release import assert_stages_released_after_last_read


@pytest.mark.parametrize("dim,causal", [(128, True), (64, False), (256, True)])
def test_kernels_compile_without_atomics(dim, causal, derived_preconditions, deterministic):
    delta, *dkdv, dq = backward_kernels(dim, causal, 1 / math.sqrt(dim))
    for kernel in (*dkdv, dq):
        assert derived_preconditions(kernel) == []
    for kernel in (delta, *dkdv, dq):
        assert "atomic" not in kernel.device_source.lower()
        assert deterministic(kernel) is True
    # dV += P^T dO and dK += dS^T Q from registers, m64n{d}k16 (one kernel, or one each at d 256);
    # dQ += dS K likewise
    from_registers = f"tl::DataType::kFloat32, 64, {dim}, 16, false, true"
    assert [k.device_source.count(from_registers) for k in dkdv] == ([1, 1] if dim in SPLIT_DIMS else [2])
    assert from_registers in dq.device_source


@pytest.mark.parametrize("dim,causal", [(128, True), (64, False), (256, True)])
def test_staged_rows_released_after_last_read(dim, causal):
    """lse_s and delta_s live two pipeline stages: the producer overwrites a stage once the
    consumer releases it, so the release must follow the consumer's last read of the stage (of
    every staged buffer, in the dK/dV kernels and the dQ kernel). The d 256 dV kernel once
    released it after its first GEMM, before computing P from lse_s (dV wrong and different on
    every run)."""
    _, *dkdv, dq = backward_kernels(dim, causal, 1 / math.sqrt(dim))
    for kernel in dkdv:
        assert_stages_released_after_last_read(kernel.device_source, {"Q_s", "dO_s", "lse_s"})
    assert_stages_released_after_last_read(dq.device_source, {"K_s", "V_s"})


def test_bad_arguments_are_named():
    q = torch.randn(1, 8, 4, 128, dtype=torch.bfloat16)
    k = torch.randn(1, 8, 2, 128, dtype=torch.bfloat16)
    lse = torch.zeros(1, 4, 8)
    with pytest.raises(ValueError, match="q: head dim expected one of \\(64, 128, 256\\), got 96"):
        q2, k2 = torch.randn(1, 8, 4, 96, dtype=torch.bfloat16), torch.randn(1, 8, 2, 96, dtype=torch.bfloat16)
        dense_attention_backward(q2, q2, k2, k2, q2, lse)
    with pytest.raises(ValueError, match="do: expected the shape of q"):
        dense_attention_backward(q[:, :4].contiguous(), q, k, k, q, lse)
    with pytest.raises(TypeError, match="o: expected dtype"):
        dense_attention_backward(q, q, k, k, q.half(), lse)
    with pytest.raises(ValueError, match="lse: expected fp32"):
        dense_attention_backward(q, q, k, k, q, lse[:, :2])
    with pytest.raises(ValueError, match="out: expected a tuple"):
        dense_attention_backward(q, q, k, k, q, lse, out=(q, k))
    with pytest.raises(ValueError, match=r"out\[1\]: expected shape \(1, 8, 2, 128\)"):
        dense_attention_backward(q, q, k, k, q, lse, out=(q, q, k))
    with pytest.raises(ValueError, match="q: expected a CUDA tensor"):
        dense_attention_backward(q, q, k, k, q, lse)
    with pytest.raises(ValueError, match="grads: expected 'dkdv', 'dk' or 'dv'"):
        bwd_dkdv_kernel(128, False, 1.0, 1.0, "bfloat16", "dq")
    with pytest.raises(ValueError, match=r"block_keys: expected a block size in \(64, 128\), got 96"):
        bwd_dkdv_kernel(128, False, 1.0, 1.0, "bfloat16", "dkdv", 96, 64)
    with pytest.raises(ValueError, match=r"block_queries: expected a block size in \(64, 128\), got 32"):
        bwd_dq_kernel(128, False, 1.0, 1.0, "bfloat16", 32, 64)
    with pytest.raises(TypeError, match="tiles: expected a BwdTiles or None, got tuple"):
        backward_kernels(128, False, 1.0, tiles=(128, 64, 128, 64))


def test_split_tiles_build_dv_and_dk_kernels_that_ptxas_does_not_serialize():
    """``SPLIT_WIDE_DQ_TILES`` at d 128: dV and dK in two kernels of two consumer warpgroups each,
    their wgmma not serialized by ptxas (the fused kernel of the same tiles runs out of registers)."""
    from kernels.attention.dense_bwd import SPLIT_WIDE_DQ_TILES, backward_builds

    builds = backward_builds(128, True, 1 / math.sqrt(128), tiles=SPLIT_WIDE_DQ_TILES)
    assert list(builds) == ["delta", "dv", "dk", "dq"]
    for name in ("dv", "dk"):
        kernel = builds[name]()
        assert kernel.metadata["reports"]["ptxas"] == {"performance_loss": []}, name
        assert_stages_released_after_last_read(kernel.device_source, {"Q_s", "dO_s", "lse_s"})
