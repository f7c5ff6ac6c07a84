"""Dense attention backward without a GPU: its three kernels compile for sm_90a with no atomics
(the determinism contract) and no launch condition beyond their assume lists; bad arguments are
named."""

import math
import re

import pytest
import torch

from kernels.attention.dense_bwd import SPLIT_DIMS, backward_kernels, bwd_dkdv_kernel, dense_attention_backward


@pytest.mark.parametrize("dim,causal", [(128, True), (64, False), (256, True)])
def test_kernels_compile_without_atomics(dim, causal, derived_preconditions):
    delta, *dkdv, dq = backward_kernels(dim, causal, 1 / math.sqrt(dim))
    for kernel in (*dkdv, dq):
        assert derived_preconditions(kernel) == []
    for kernel in (delta, *dkdv, dq):
        assert "atomic" not in kernel.device_source.lower()
    # dV += P^T dO and dK += dS^T Q from registers, m64n{d}k16 (one kernel, or one each at d 256);
    # dQ += dS K likewise
    from_registers = f"tl::DataType::kFloat32, 64, {dim}, 16, false, true"
    assert [k.device_source.count(from_registers) for k in dkdv] == ([1, 1] if dim in SPLIT_DIMS else [2])
    assert from_registers in dq.device_source


def staged_release_and_last_read(cuda: str, buffer: str) -> tuple[list[int], int]:
    """Where the consumer arrives on the barrier that TileLang's producer waits for before it
    writes ``buffer`` with plain loads (not TMA), and where the consumer last reads ``buffer``
    (offsets into its branch of the warp-specialized CUDA)."""
    producer, _, consumer = cuda.rpartition("mbarrier_cp_async_arrive_noinc")
    consumer = consumer.split("} else {", 1)[1]

    def stage(index: str) -> str:  # the two branches name their loop variables apart
        return re.sub(r"\bstep(_\d+)?\b", "step", index)

    waited = stage(re.findall(r"mbarrier\[(.*?)\]\.wait\(", producer[:producer.index(f"*){buffer})")])[-1])
    arrives = [m.start() for m in re.finditer(r"mbarrier\[(.*?)\]\.arrive\(\)", consumer) if stage(m.group(1)) == waited]
    return arrives, consumer.rindex(f"*){buffer})")


@pytest.mark.parametrize("dim,causal", [(128, True), (64, False), (256, True)])
def test_staged_rows_released_after_last_read(dim, causal):
    """lse_s and delta_s live two pipeline stages: the producer overwrites a stage once the
    consumer releases it, so the release must follow the consumer's last read of the stage. The
    d 256 dV kernel once released it after its first GEMM, before computing P from lse_s (dV
    wrong and different on every run)."""
    _, *dkdv, _ = backward_kernels(dim, causal, 1 / math.sqrt(dim))
    for kernel in dkdv:
        staged = [b for b in ("lse_s", "delta_s") if f"*){b})" in kernel.device_source]
        assert "lse_s" in staged
        for buffer in staged:
            arrives, last_read = staged_release_and_last_read(kernel.device_source, buffer)
            assert arrives and min(arrives) > last_read, f"{buffer}: released at {arrives}, last read at {last_read}"


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
