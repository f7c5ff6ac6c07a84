"""DeepSeek-V4 sparse attention forward: the kernel (its three schedules) and its CUDA baseline
(sparse_fwd.cu) compile for sm_90a, the reference agrees with a dense formulation, bad arguments
are named (CPU); the kernel matches the reference at V4 shapes, with masked slots, all slots
masked, the window branch, and 100 identical runs, and each schedule is bit for bit equal to the
baseline (GPU)."""

import math

import pytest
import torch

from kernels.attention import reference as R
from kernels.attention.common import LOG2E
from kernels.attention.sparse_fwd import ONE_CHAIN, SCHEDULES, sparse_attention, sparse_fwd_kernel, sparse_fwd_producer_kernel


def test_kernel_compiles_for_sm90a(deterministic):
    kernel = sparse_fwd_kernel(128, 1024, 128, LOG2E / math.sqrt(512))
    assert deterministic(kernel) is True
    src = kernel.device_source
    assert "64, 32, 16, false, false" in src and "64, 256, 16, false, true" in src  # S: 2 x m64n32, O: 2 x m64n256
    assert "exp2f(__fmaf_rn(acc_s" in src
    # the gather's offsets from per-token views stay in 32 bits; the views are proven against
    # the tensors they point into, under the row limit the launcher checks
    gathers = [line for line in src.splitlines() if "*)KVb)" in line or "*)WKVb)" in line]
    assert "void* KVb = " in src and gathers and not any("int64_t" in line for line in gathers)
    report = kernel.metadata["reports"]["bounds"]
    assert (report["unknown"], report["violations"]) == ([], []) and report["proven"] == report["accesses"] > 0
    assert {p["text"] for p in kernel.metadata["preconditions"]} >= {"N <= 2097152", "NW <= 2097152"}
    assert "tma_store" in src  # the output leaves through one TMA store


def test_producer_schedule_compiles_with_the_same_consumer_arithmetic(deterministic):
    """The producer schedule's consumers run the same wgmma shapes and the same cross-warpgroup
    row reductions as the pipelined kernel (the bits' contract); a producer warpgroup gathers by
    cp.async, each warp one row at a time (the row index shuffled from the lane that read it);
    the consumers store the output staged in the query tile; every access is proven in bounds."""
    scale = LOG2E / math.sqrt(512)
    kernel = sparse_fwd_producer_kernel(128, 1024, 128, scale)
    assert deterministic(kernel) is True
    src, base = kernel.device_source, sparse_fwd_kernel(128, 1024, 128, scale).device_source
    for needle in ("64, 32, 16, false, false", "64, 256, 16, false, true", "exp2f(__fmaf_rn(acc_s",
                   "AllReduce<tl::MaxOp, 256, 128, 0, tl::NamedBarrier<256>>", "AllReduce<tl::SumOp, 256, 128, 0, tl::NamedBarrier<256>>"):
        assert needle in src and needle in base, needle
    assert "cp_async_gs" in src and "warpgroup_reg_dealloc<24>" in src and "__shfl_sync" in src
    # the queries in 16-byte pieces, as the pipelined kernel loads them (not 4-byte steps)
    assert "*(uint4*)(((bfloat16_t*)Q_s)" in src and "*(uint1*)(((bfloat16_t*)Q_s)" not in src
    # the output staged in Q_s between two barriers of the 256 consumers, then whole rows in
    # 16-byte stores: the one store to O
    assert src.count("tl::__sync_thread_partial(8, 256)") == 2
    assert src.count("(O + ") == src.count("*(uint4*)(O + ") == 1
    report = kernel.metadata["reports"]["bounds"]
    assert (report["unknown"], report["violations"]) == ([], []) and report["proven"] == report["accesses"] > 0
    with pytest.raises(ValueError, match=r"schedule: expected one of \('pipelined', 'producer', 'independent', 'alternate'\), got 'tma'"):
        sparse_attention(torch.zeros(1, 1, 64, 512, dtype=torch.bfloat16), torch.zeros(1, 8, 512, dtype=torch.bfloat16),
                         torch.zeros(1, 1, 512, dtype=torch.int32), torch.zeros(64), schedule="tma")


def test_independent_schedule_has_no_cross_warpgroup_step(deterministic):
    """The independent schedule: each consumer warpgroup computes a block's whole 64 x 64 score
    tile (m64n64) and its own softmax (reductions within a lane quad only, no 256-thread
    barrier), its P V from registers (m64n256, RS); the producer is the producer schedule's;
    every access is proven in bounds."""
    scale = LOG2E / math.sqrt(512)
    kernel = SCHEDULES["independent"](128, 1024, 128, scale)
    assert deterministic(kernel) is True
    src = kernel.device_source
    assert "64, 64, 16, false, false" in src and "wgmma_rs<tl::DataType::kBFloat16, tl::DataType::kBFloat16, tl::DataType::kFloat32, 64, 256, 16" in src
    assert "NamedBarrier<256>" not in src and "AllReduce<tl::SumOp, 4, 1" in src
    assert "__shfl_sync" in src and "warpgroup_reg_dealloc<24>" in src
    report = kernel.metadata["reports"]["bounds"]
    assert (report["unknown"], report["violations"]) == ([], []) and report["proven"] == report["accesses"] > 0


@pytest.mark.parametrize("window", [128, 64])  # 18 key blocks (warpgroup 0 adds the last, 1's) and 17 (the reverse)
def test_alternate_schedule_hands_the_softmax_state_over(deterministic, window):
    """The alternate schedule: each consumer warpgroup computes the whole 64 x 64 score tile of
    its own blocks only (m64n64, no 256-thread reduction), hands P and the softmax state over
    through shared memory (the ``ready`` / ``free`` mbarriers, 128 arrivals each) and adds every
    block into its 256 columns with P from shared memory (m64n256, SS); every access proven."""
    kernel = SCHEDULES["alternate"](128, 1024, window, LOG2E / math.sqrt(512))
    assert deterministic(kernel) is True
    src = kernel.device_source
    assert src.count("tl::DataType::kFloat32, 64, 64, 16, false, false") == 2  # one score product per warpgroup
    assert src.count("tl::DataType::kFloat32, 64, 256, 16, false, true") == 5  # per warpgroup the other's block and its own; one tail
    assert "wgmma_rs" not in src and "NamedBarrier<256>" not in src
    assert all(f"{name}[{i}].init(128);" in src for name in ("ready", "free") for i in (0, 1))
    report = kernel.metadata["reports"]["bounds"]
    assert (report["unknown"], report["violations"]) == ([], []) and report["proven"] == report["accesses"] > 0
    # the hand-over protocol (full/empty with the producer, ready/free between the consumers)
    # runs to the end for every thread under random schedules: no wait is left hanging
    from tlx.ir.tir import device_functions
    from tlx.lowering import lower
    from tlx.passes.progress import check_progress

    prim = sparse_fwd_producer_kernel.get_tir(128, 1024, window, LOG2E / math.sqrt(512), consumers="alternate")
    [(_, func)] = list(device_functions(lower(prim, {"kind": "cuda", "arch": "sm_90a"}, {}).device_mod))
    progress = check_progress(func, seeds=4)
    assert progress.verdict == "ok", progress


def test_baseline_compiles():
    from pathlib import Path

    import kernels.attention.sparse_fwd as mod
    from tlx.numerics.parity import build_baseline

    assert Path(build_baseline(Path(mod.__file__).with_suffix(".cu"), compile_only=True)).stat().st_size > 0


def test_reference_matches_dense_softmax_with_sink():
    g = torch.Generator().manual_seed(0)
    b, s, h, n, k, d = 1, 3, 2, 10, 4, 512
    q, kv = torch.randn(b, s, h, d, generator=g, dtype=torch.float64), torch.randn(b, n, d, generator=g, dtype=torch.float64)
    idx = torch.tensor([[[0, 3, -1, 9], [5, 5, 2, 11], [-1, -1, -1, -1]]], dtype=torch.int32)  # 11 >= n: masked
    sink = torch.tensor([0.5, -1.0], dtype=torch.float64)
    o, lse = R.sparse_attention_ref(q, kv, idx, sink)
    for t in range(s):
        keys = [kv[0, i] for i in idx[0, t].tolist() if 0 <= i < n]
        for hh in range(h):
            logits = [float(q[0, t, hh].double() @ kk.double()) / math.sqrt(d) for kk in keys] + [float(sink[hh])]
            ref_lse = math.log(sum(math.exp(x) for x in logits))
            assert abs(float(lse[0, t, hh]) - ref_lse) < 1e-5
            exp_o = sum(math.exp(logits[i] - ref_lse) * keys[i].double() for i in range(len(keys))) if keys else torch.zeros(d, dtype=torch.float64)
            assert torch.allclose(o[0, t, hh].double(), exp_o, atol=1e-5)


def test_bad_arguments_are_named():
    q = torch.randn(1, 4, 64, 512, dtype=torch.bfloat16)
    kv = torch.randn(1, 100, 512, dtype=torch.bfloat16)
    idx = torch.zeros(1, 4, 512, dtype=torch.int32)
    sink = torch.zeros(64)
    with pytest.raises(TypeError, match="indices: expected an int32 tensor, got torch.int64"):
        sparse_attention(q, kv, idx.long(), sink)
    with pytest.raises(ValueError, match="q: head count expected one of \\(64, 128\\), got 32"):
        sparse_attention(q[:, :, :32].contiguous(), kv, idx, sink[:32])
    with pytest.raises(ValueError, match="q: head dim expected 512, got 256"):
        sparse_attention(q[..., :256].contiguous(), kv, idx, sink)
    with pytest.raises(ValueError, match="indices: top-k expected one of"):
        sparse_attention(q, kv, idx[..., :100].contiguous(), sink)
    with pytest.raises(ValueError, match="sink: shape\\[0\\] expected 64"):
        sparse_attention(q, kv, idx, torch.zeros(32))
    with pytest.raises(ValueError, match="window_kv, window_indices: expected both or neither"):
        sparse_attention(q, kv, idx, sink, window_kv=kv)
    with pytest.raises(ValueError, match="q: expected a CUDA tensor"):
        sparse_attention(q, kv, idx, sink)
    with pytest.raises(ValueError, match="topk: expected a positive multiple of 64"):
        sparse_fwd_kernel(64, 100, 0, 1.0)
    too_long = torch.empty(1, 2**21 + 1, 512, dtype=torch.bfloat16)  # 2 GiB of address space, never touched
    with pytest.raises(ValueError, match="kv: expected at most 2097152 rows per sequence, got 2097153"):
        sparse_attention(q, too_long, idx, sink)
    with pytest.raises(ValueError, match="window_kv: expected at most 2097152 rows per sequence, got 2097153"):
        sparse_attention(q, kv, idx, sink, window_kv=too_long, window_indices=idx[..., :64].contiguous())


def _inputs(b, s, h, n, k, seed, masked=0.1):
    g = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn((b, s, h, 512), generator=g, device="cuda").to(torch.bfloat16)
    kv = torch.randn((b, n, 512), generator=g, device="cuda").to(torch.bfloat16)
    idx = torch.randint(0, n, (b, s, k), generator=g, device="cuda", dtype=torch.int32)
    idx[torch.rand((b, s, k), generator=g, device="cuda") < masked] = -1
    sink = torch.randn((h,), generator=g, device="cuda")
    return q, kv, idx, sink


def _check(o, lse, ref_o, ref_lse):
    assert not torch.isnan(o).any() and not torch.isnan(lse).any()
    err = (o.float() - ref_o).norm() / ref_o.norm().clamp_min(1e-30)
    assert err < 1e-2, f"relative error {err:.3e}"
    torch.testing.assert_close(lse, ref_lse, rtol=0, atol=2e-3)


@pytest.mark.gpu
@pytest.mark.parametrize("h,k", [(64, 512), (128, 1024), (128, 2048)])
def test_matches_reference(h, k):
    q, kv, idx, sink = _inputs(1, 64, h, 8192, k, h + k)
    idx[0, 0] = -1  # a token whose slots are all masked: o = 0, lse = sink
    o, lse = sparse_attention(q, kv, idx, sink)
    _check(o, lse, *R.sparse_attention_ref(q, kv, idx, sink))
    assert torch.equal(o[0, 0], torch.zeros_like(o[0, 0]))
    torch.testing.assert_close(lse[0, 0], sink, rtol=0, atol=1e-5)


@pytest.mark.gpu
def test_window_branch():
    q, kv, idx, sink = _inputs(2, 48, 64, 4096, 512, 7)
    wkv = torch.randn((2, 300, 512), device="cuda").to(torch.bfloat16)
    pos = torch.arange(48, device="cuda")[:, None] + 300 - 48 - torch.arange(128, device="cuda")[None, :]  # the last 128 rows
    widx = torch.where(pos >= 0, pos, -1).to(torch.int32)[None].expand(2, -1, -1).contiguous()
    o, lse = sparse_attention(q, kv, idx, sink, window_kv=wkv, window_indices=widx)
    _check(o, lse, *R.sparse_attention_ref(q, kv, idx, sink, window_kv=wkv, window_indices=widx))


@pytest.mark.gpu
def test_deterministic_100_runs():
    q, kv, idx, sink = _inputs(1, 32, 128, 2048, 1024, 11)
    o0, lse0 = (t.clone() for t in sparse_attention(q, kv, idx, sink))
    for _ in range(100):
        o, lse = sparse_attention(q, kv, idx, sink)
        assert torch.equal(o.view(torch.int16), o0.view(torch.int16)) and torch.equal(lse, lse0)


@pytest.mark.gpu
@pytest.mark.parametrize("schedule", sorted(SCHEDULES))
@pytest.mark.parametrize("h,k,window", [(64, 512, 0), (128, 1024, 0), (128, 512, 128), (64, 512, 64)])
def test_bitwise_equal_to_baseline(attention_baseline, h, k, window, schedule):
    """Outputs poisoned with NaN first; masked slots (-1 and past the cache), a token with every
    slot masked, a slot index repeated, and with a window its branch with masked slots too."""
    from tlx.numerics.parity import assert_bitwise

    q, kv, idx, sink = _inputs(2, 40, h, 3000, k, 100 + h + k + window, masked=0.2)
    idx[0, 0] = -1
    idx[1, 3, :5] = kv.shape[1] + 7  # past the cache: masked, the clamped row loaded
    idx[1, 4, 1] = idx[1, 4, 0]
    more = {}
    wkv, widx = kv, idx[:, :, :1].contiguous()  # read by neither kernel without a window
    if window:
        wkv = torch.randn((2, 200, 512), device="cuda").to(torch.bfloat16)
        pos = torch.arange(40, device="cuda")[:, None] + 200 - 40 - torch.arange(window, device="cuda")[None, :]
        widx = torch.where(pos >= 0, pos, -1).to(torch.int32)[None].expand(2, -1, -1).contiguous()
        more = dict(window_kv=wkv, window_indices=widx)
    o, lse = sparse_attention(q, kv, idx, sink, schedule=schedule, **more)
    bo, blse = torch.full_like(o, float("nan")), torch.full_like(lse, float("nan"))
    attention_baseline("sparse_fwd").sparse_attention_fwd(q, kv, idx, sink, wkv, widx, bo, blse,
                                                          1.0 / math.sqrt(512) * LOG2E, window,  # the wrapper's constant
                                                          schedule in ONE_CHAIN)
    assert_bitwise(o, bo, name="sparse forward o")
    assert_bitwise(lse, blse, name="sparse forward lse")
