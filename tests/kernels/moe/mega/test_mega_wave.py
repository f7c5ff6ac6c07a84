"""The fused wave kernel (kernels/moe/mega/wave.py) on its own: argument errors (CPU); bitwise
equal to the fused L1 + SwiGLU GEMM followed by the L2 grouped GEMM, and an L2 tile whose L1 count
never arrives ending in a WAIT_L1 status instead of a hang (GPU)."""

import time

import pytest
import torch

from kernels.moe.mega import protocol as K
from kernels.moe.mega.wave import wave_kernel
from tests.kernels.staged_release import assert_stages_released_after_last_read

CUDA = "cuda"
H, I = 4096, 2048  # V4-Flash


def test_wave_kernel_names_bad_shapes():
    with pytest.raises(ValueError, match="n: expected 2I with I a multiple of 128"):
        wave_kernel(4096 + 128, 4096)
    with pytest.raises(ValueError, match="k: expected a multiple of 128"):
        wave_kernel(4096, 4000)


def test_wave_kernel_releases_stages_after_last_read():
    """scale_s is written with plain stores behind the release of the TMA copies' stage: the
    consumer must have read it (into registers) before releasing that stage (CPU, sm_90a)."""
    src = wave_kernel(2 * I, H, 10.0, num_sms=132).device_source
    assert_stages_released_after_last_read(src, {"A_s", "B_s", "Bu_s", "scale_s"})


def _layer(e, rows, seed):
    """e4m3 activations and weights with block scales, and a row-block expert map with one block of
    another wave (-1)."""
    g = torch.Generator(device=CUDA).manual_seed(seed)

    def e4m3(*shape):
        return (torch.randn(*shape, device=CUDA, generator=g) * 2).clamp(-8, 8).to(torch.float8_e4m3fn)

    a, sa = e4m3(rows, H), torch.rand(rows, H // 128, device=CUDA, generator=g) + 0.5
    w1, s1 = e4m3(e, 2 * I, H), torch.rand(e, 2 * I // 128, H // 128, device=CUDA, generator=g) * 0.01 + 0.001
    w2, s2 = e4m3(e, H, I), torch.rand(e, H // 128, I // 128, device=CUDA, generator=g) * 0.01 + 0.001
    block_expert = torch.randint(0, e, (rows // 128,), device=CUDA, generator=g, dtype=torch.int32).sort().values
    block_expert[1] = -1
    return a, sa, w1, s1, w2, s2, block_expert


def _launch(kernel, a, sa, w1, s1, w2, s2, block_expert, counters, flags, timeout_ns):
    rows = a.shape[0]
    q = torch.full((rows, I), 0x7F, dtype=torch.uint8, device=CUDA).view(torch.float8_e4m3fn)
    s = torch.full((rows, I // 128), float("nan"), device=CUDA)
    y = torch.full((rows, H), float("nan"), dtype=torch.bfloat16, device=CUDA)
    kernel(a, sa, w1, s1, block_expert, q, s, q, w2, s2, y, counters, flags, 3, 1, timeout_ns)
    torch.cuda.synchronize()
    return q, s, y


@pytest.mark.gpu
@pytest.mark.parametrize("num_sms", [132, 14])  # one rank of the GPU; one of 8 virtual ranks (many tiles per CTA)
def test_wave_kernel_bitwise_equal_to_its_two_gemms(num_sms):
    from kernels.moe.grouped_gemm import grouped_gemm_contiguous, grouped_gemm_swiglu
    from tlx.numerics.parity import assert_bitwise

    e, rows = 8, 16 * 128
    a, sa, w1, s1, w2, s2, block_expert = _layer(e, rows, seed=num_sms)
    counters = torch.zeros(rows // 128, dtype=torch.int32, device=CUDA)
    flags = torch.zeros(K.FLAG_WORDS, dtype=torch.int32, device=CUDA)
    q, s, y = _launch(wave_kernel(2 * I, H, 10.0, num_sms=num_sms), a, sa, w1, s1, w2, s2, block_expert, counters,
                      flags, 5_000_000_000)
    assert flags[K.STATUS:K.STATUS + 4].tolist() == [0, 0, 0, 0]
    q_ref, s_ref = grouped_gemm_swiglu(a, sa, w1, s1, block_expert)
    y_ref = grouped_gemm_contiguous(q_ref, s_ref, w2, s2, block_expert)
    used = (block_expert >= 0).repeat_interleave(128).nonzero().reshape(-1)
    assert_bitwise(q[used].view(torch.uint8), q_ref[used].view(torch.uint8), name="wave kernel e4m3 hidden")
    assert_bitwise(s[used], s_ref[used], name="wave kernel hidden scales")
    assert_bitwise(y[used], y_ref[used], name="wave kernel L2 output")
    assert torch.isfinite(y[used].float()).all()
    # every computed row block counted its I / 128 L1 tiles once; the other wave's block was skipped
    assert counters.tolist() == [I // 128 if b >= 0 else 0 for b in block_expert.tolist()]
    assert torch.isnan(y[128:256].float()).all()


@pytest.mark.gpu
def test_wave_kernel_l1_count_that_never_arrives_times_out():
    """Counts far below zero never reach I / 128: the first L2 tile's wait gives up after the
    timeout and records WAIT_L1 (rank 3, wave 1 as launched); every later wait sees the status and
    gives up at once, so the kernel ends in about one timeout."""
    e, rows = 4, 8 * 128
    args = _layer(e, rows, seed=5)
    counters = torch.full((rows // 128,), -(1 << 30), dtype=torch.int32, device=CUDA)
    flags = torch.zeros(K.FLAG_WORDS, dtype=torch.int32, device=CUDA)
    kernel = wave_kernel(2 * I, H, 10.0, num_sms=132)
    _launch(kernel, *args, torch.zeros_like(counters), torch.zeros_like(flags), 5_000_000_000)  # warm: loads the module
    t0 = time.perf_counter()
    _launch(kernel, *args, counters, flags, 100_000_000)  # 0.1 s
    took = time.perf_counter() - t0
    assert flags[K.STATUS:K.STATUS + 4].tolist() == [K.WAIT_L1, 3, 1, 3]
    assert took < 2.0, f"the kernel took {took:.2f} s with a 0.1 s timeout"
