"""Dense attention forward without a GPU: the kernel compiles for sm_90a with the instructions
its parity contract names, the CUDA baseline compiles, the torch reference agrees with torch's
SDPA, and bad arguments raise errors that name them."""

import math
import re
from pathlib import Path

import pytest
import torch

from kernels.attention import common as C
from kernels.attention import reference as R
from kernels.attention.dense_fwd import (REGISTER_SPLIT, dense_attention, dense_fwd_kernel, dense_fwd_overlap_kernel,
                                        dense_fwd_persistent_kernel, overlap_kernel)
from tests.kernels.staged_release import assert_stages_released_after_last_read

KDIR = Path(R.__file__).parent


@pytest.mark.parametrize("dim,causal", [(128, True), (256, False)])
def test_kernel_compiles_for_sm90a(dim, causal, derived_preconditions, deterministic):
    kernel = dense_fwd_kernel(dim, causal, C.LOG2E / math.sqrt(dim))
    assert derived_preconditions(kernel) == []
    assert deterministic(kernel) is True
    src = kernel.device_source
    block_n = 64 if dim == 256 else 128
    # S = Q K^T and O += P V: one wgmma chain per consumer warpgroup, P from registers
    assert f"kBFloat16, tl::DataType::kFloat32, 64, {block_n}, 16, false, false" in src
    assert f"tl::wgmma_rs<tl::DataType::kBFloat16, tl::DataType::kBFloat16, tl::DataType::kFloat32, 64, {dim}, 16, false, true" in src
    assert "tl::tma_load(K_desc" in src and "tl::tma_load(V_desc" in src  # TMA producer
    # the softmax arithmetic the baseline repeats: exp2 of an explicit fma, rounded max scaling
    assert "exp2f(__fmaf_rn(acc_s" in src and "__fmul_rn(m[" in src and "exp2f(__fsub_rn(m_scaled" in src
    assert "tl::AllReduce<tl::SumOp, 4, 1" in src
    assert_stages_released_after_last_read(src, {"K_s", "V_s"})


def test_overlap_kernel_compiles_for_sm90a(derived_preconditions, deterministic):
    """The hand-scheduled forward: S = Q K^T issued, then P V, and only S waited for before the
    softmax (wait_wgmma<1>), P V waited for after it."""
    kernel = dense_fwd_overlap_kernel(128, True, C.LOG2E / math.sqrt(128))
    assert derived_preconditions(kernel) == []
    assert deterministic(kernel) is True
    src = kernel.device_source
    assert src.index("tl::wait_wgmma<1>()") < src.index("tl::wait_wgmma<0>()")
    assert "tl::wgmma_rs<tl::DataType::kBFloat16, tl::DataType::kBFloat16, tl::DataType::kFloat32, 64, 128, 16, false, true" in src
    assert "exp2f(__fmaf_rn(acc_s" in src and "tl::AllReduce<tl::SumOp, 4, 1" in src
    assert_stages_released_after_last_read(src, {"K_s", "V_s"})


@pytest.mark.parametrize("dim,options", [(128, {"pingpong": True}), (64, {"consumers": 3, "pingpong": True})], ids=str)
def test_overlap_candidates_compile_for_sm90a(dim, options, derived_preconditions):
    """Candidates of the sweep: a producer and ``consumers`` warpgroups with the register split
    that fits them, and the turns: warpgroup 0 starts (the last one arrives on barrier 8 first),
    each waits on its barrier before issuing S and P V and then lets the next one go."""
    kernel = dense_fwd_overlap_kernel(dim, True, C.LOG2E / math.sqrt(dim), **options)
    assert derived_preconditions(kernel) == []
    src = kernel.device_source
    consumers = options.get("consumers", 2)
    assert f"__launch_bounds__({128 * (consumers + 1)}, 1)" in src
    assert f"tl::warpgroup_reg_alloc<{REGISTER_SPLIT[consumers][1]}>" in src
    assert "tl::__named_barrier_arrive(8, 256)" in src
    turn = src.index("tl::__sync_thread_partial(((((int)threadIdx.x) >> 7) + 8), 256)")
    s_gemm = src.index("tl::wgmma_ss", turn)
    pv_gemm = src.index("tl::wgmma_rs", s_gemm)
    next_turn = src.index("tl::__named_barrier_arrive(", pv_gemm)
    assert next_turn < src.index("tl::wait_wgmma<1>()", pv_gemm)


def test_fast_exp2_candidate_is_one_instruction_per_exp(deterministic):
    """``fast_exp2``: every exp2 of the softmax (p and alpha) is ``ex2.approx.ftz.f32``, declared
    pure for the determinism analysis; the kernel is otherwise the default's."""
    fast = dense_fwd_overlap_kernel(128, False, C.LOG2E / math.sqrt(128), num_stages=3, fast_exp2=True)
    default = dense_fwd_overlap_kernel(128, False, C.LOG2E / math.sqrt(128), num_stages=3)
    assert "exp2f(" not in fast.device_source and "ex2.approx.ftz.f32" in fast.device_source
    assert fast.device_source.count("tlx_exp2_ftz(") == default.device_source.count("exp2f(") + 1  # + its definition
    assert deterministic(fast) is True
    # approximate, and reported as such (allowed: the kernel runs in the default numerics mode)
    assert [(h["intrinsic"], h["cuda"]) for h in fast.metadata["reports"]["numerics"]["approximate"]] == [
        ("tlx_exp2_ftz", "ex2.approx.ftz.f32")]
    assert default.metadata["reports"]["numerics"]["approximate"] == []


def test_lazy_rescale_candidate_guards_only_the_rescale(deterministic):
    """``lazy_rescale``: each of O's rescales (in the key-block loop and after it) runs under one
    test of the thread's own rows' ``alpha != 1``, the multiplies themselves unchanged; every
    access proven, deterministic; the rest of the kernel is the default's."""
    scale = C.LOG2E / math.sqrt(64)
    lazy = dense_fwd_overlap_kernel(64, False, scale, lazy_rescale=True)
    default = dense_fwd_overlap_kernel(64, False, scale)
    src = lazy.device_source
    assert len(re.findall(r"if \(moved(_\d+)? != 0\) \{", src)) == 2 and "moved" not in default.device_source
    assert src.count("!= 0x1p+0f/*1.000000e+00*/") == 2  # a thread's rows, tested once a rescale
    multiplies = "acc_o + ("
    assert src.count(multiplies) == default.device_source.count(multiplies)
    bounds = lazy.metadata["reports"]["bounds"]
    assert bounds["proven"] == bounds["accesses"] and deterministic(lazy) is True


def test_pinned_softmax_runs_before_the_pv_wait(deterministic):
    """``pinned_softmax``: an order point on the row sums ``l`` (``tlx_order_point``) right before
    the wait for ``P V``, in the key-block loop only; in the SASS no exp2 or row-sum add of the
    block is left after that wait (``tlx.sass``; the default leaves most of them there: ptxas
    hoists the wait); still deterministic (the order point is declared as one), every access
    proven."""
    scale = C.LOG2E / math.sqrt(128)
    options = {"num_stages": 3, "fast_exp2": True}
    pinned = dense_fwd_overlap_kernel(128, False, scale, pinned_softmax=True, **options)
    default = dense_fwd_overlap_kernel(128, False, scale, **options)
    src = pinned.device_source
    loop = src[src.index("tl::wait_wgmma<1>()"):]
    l_update = re.search(r"\bl\[i_\d+\] = __fmaf_rn\(l\[", loop)  # l = fma(l, alpha, rowsum(p))
    assert l_update and l_update.start() < loop.index("tlx_order_point(") < loop.index("tl::wait_wgmma<0>()")
    assert src.count("tlx_order_point(") == 2  # its definition and the loop's one call
    assert "tlx_order_point" not in default.device_source
    assert deterministic(pinned) is True
    bounds = pinned.metadata["reports"]["bounds"]
    assert bounds["proven"] == bounds["accesses"]
    # tlx.sass: exp2s that wait for P V without depending on it, in the key-block loop
    in_loop = {name: [w for w in report["sass"]["waits"].get("main_kernel", []) if w["in_loop"]]
               for name, report in (("pinned", pinned.metadata["reports"]), ("default", default.metadata["reports"]))}
    assert in_loop["pinned"] == []
    (deferred,) = in_loop["default"]
    assert deferred["free"]["MUFU"] > 32 and deferred["wait"] == "WARPGROUP.DEPBAR.LE gsb0, 0x0"


@pytest.mark.parametrize("dim, block_n, smem", [(128, 176, None), (256, 80, 224 << 10)])
def test_other_key_block_candidates(dim, block_n, smem):
    """FlashAttention-3's keys a block: 176 at d 128 (S by m64n176 wgmma, P V over 11 k16 steps),
    80 at d 256 (two stages of 80-key K and V tiles beside Q: 224 KB of shared memory, within
    sm_90a's 227); every access proven; a block size wgmma cannot take is refused by name."""
    kernel = dense_fwd_overlap_kernel(dim, False, C.LOG2E / math.sqrt(dim), block_n=block_n)
    src = kernel.device_source
    assert f"kFloat32, 64, {block_n}, 16, false, false" in src and f"kFloat32, 64, {dim}, 16, false, true" in src
    bounds = kernel.metadata["reports"]["bounds"]
    assert bounds["proven"] == bounds["accesses"]
    if smem is not None:
        assert int(kernel.metadata["launches"][0]["dynamic_shared_memory"]) == smem
    with pytest.raises(ValueError, match="block_n: expected 0 or a multiple of 16 from 16 to 256, got 100"):
        dense_fwd_overlap_kernel(128, False, C.LOG2E / math.sqrt(128), block_n=100)


def test_heavy_first_candidate_reverses_only_the_tile_order(derived_preconditions, deterministic):
    """``heavy_first`` (causal): CTA ``bx`` takes query tile ``q_tiles - 1 - bx``; the kernel is
    the default's with that index (same TIR otherwise), every access proven with no derived
    precondition, still deterministic; without causal the option changes nothing."""
    scale = C.LOG2E / math.sqrt(128)
    options = {"num_stages": 3, "fast_exp2": True}
    heavy = dense_fwd_overlap_kernel(128, True, scale, heavy_first=True, **options)
    default = dense_fwd_overlap_kernel(128, True, scale, **options)
    assert derived_preconditions(heavy) == [] and deterministic(heavy) is True
    assert "(q_tiles * 128) - (((int)blockIdx.x) * 128)" in heavy.device_source
    assert "(q_tiles * 128)" not in default.device_source.split("tl::tma_load(Q_desc")[1].split(";")[0]
    bounds = heavy.metadata["reports"]["bounds"]
    assert bounds["proven"] == bounds["accesses"]
    non_causal = dense_fwd_overlap_kernel(128, False, scale, heavy_first=True, **options)
    assert non_causal.device_source == dense_fwd_overlap_kernel(128, False, scale, **options).device_source


def test_persistent_candidate_walks_the_tiles_with_its_own_output_tile(derived_preconditions, deterministic):
    """``persistent``: a grid of ``ctas`` CTAs (a scalar parameter) walking the tiles; at d 128 with
    two stages the output has its own tile beside Q (2 x 32 KB + two 64 KB K/V stages: 192 KB),
    so Q is released (``q_empty``) before the tile's last P V; every access proven under its
    ``assume`` list alone (``PERSISTENT_ASSUME``), deterministic, and no wgmma serialized by ptxas
    (one ``setmaxnreg`` per role, the tile loops inside them)."""
    kernel = dense_fwd_persistent_kernel(128, False, C.LOG2E / math.sqrt(128), fast_exp2=True)
    assert [p["name"] for p in kernel.metadata["params"]][-2:] == ["q_tiles", "ctas"]
    assert derived_preconditions(kernel) == [] and deterministic(kernel) is True
    bounds = kernel.metadata["reports"]["bounds"]
    assert bounds["proven"] == bounds["accesses"]
    assert kernel.metadata["reports"].get("ptxas", {}).get("performance_loss", []) == []  # no ptxas remark
    assert int(kernel.metadata["launches"][0]["dynamic_shared_memory"]) == 192 << 10
    src = kernel.device_source
    assert src.index("q_empty[0].arrive()") < src.rindex("tl::wgmma_rs")  # Q freed before the last P V
    assert src.count("tl::warpgroup_reg_alloc<240>") == 1 and src.count("tl::warpgroup_reg_dealloc<24>") == 1
    with pytest.raises(ValueError, match="pingpong: the turns start once per CTA"):
        overlap_kernel(128, False, C.LOG2E / math.sqrt(128), pingpong=True, persistent=True)


def test_persistent_candidate_never_hangs_across_tiles():
    """One CTA walking 8 tiles (q_tiles 2 x 2 heads x 2 sequences) through the two-stage K/V ring,
    its position carried from tile to tile: the barrier protocol simulated at every key-block
    count 0..9 a tile (odd counts start each tile at the other slot and parity) never hangs."""
    from tests.kernels.attention.test_decode_mla import device_function
    from tlx.passes.progress import check_progress

    func = device_function(dense_fwd_persistent_kernel, 128, False, C.LOG2E / math.sqrt(128), "bfloat16", 2, 2, True)
    report = check_progress(func, {"q_tiles": 2, "H": 2, "HK": 2, "NB": 3, "ctas": 1, "TQ": 512, "TK": 600})
    assert report.verdict == "unknown" and "no hang at n_blocks = 0..9 (8 schedules each)" in report.detail, report.detail


def test_baseline_compiles(tmp_path):
    from tlx.numerics.parity import build_baseline

    obj = build_baseline(KDIR / "dense_fwd.cu", with_cutlass=True, compile_only=True, build_directory=str(tmp_path))
    assert Path(obj).stat().st_size > 0


def test_reference_matches_sdpa():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, n, h, 64, generator=g) for n, h in ((37, 8), (53, 2), (53, 2)))
    for causal in (False, True):
        o, lse = R.dense_attention_ref(q, k, v, causal, 0.2, dtype=torch.float64)
        mask = torch.ones(37, 53, dtype=torch.bool).tril(53 - 37) if causal else None
        kr, vr = (t.repeat_interleave(4, dim=2).transpose(1, 2).double() for t in (k, v))
        exp = torch.nn.functional.scaled_dot_product_attention(q.transpose(1, 2).double(), kr, vr, attn_mask=mask, scale=0.2)
        torch.testing.assert_close(o.transpose(1, 2), exp, rtol=1e-12, atol=1e-12)
        s = torch.matmul(q.transpose(1, 2).double(), kr.transpose(2, 3)) * 0.2
        if causal:
            s = s.masked_fill(~mask, float("-inf"))
        torch.testing.assert_close(lse, torch.logsumexp(s, -1), rtol=1e-12, atol=1e-12)


def test_reference_rows_without_keys():
    """Causal with more queries than keys: the first queries see no key (o 0, lse -inf)."""
    q, k, v = torch.randn(1, 5, 2, 64), torch.randn(1, 3, 2, 64), torch.randn(1, 3, 2, 64)
    o, lse = R.dense_attention_ref(q, k, v, True)
    assert torch.equal(o[0, :2], torch.zeros(2, 2, 64)) and bool(torch.isneginf(lse[0, :, :2]).all())
    assert bool(torch.isfinite(lse[0, :, 2:]).all())


def _qkv(dtype=torch.bfloat16, d=128, h=8, hk=2, b=2, s=16):
    return (torch.randn(b, s, h, d, dtype=dtype), torch.randn(b, s, hk, d, dtype=dtype), torch.randn(b, s, hk, d, dtype=dtype))


def test_bad_arguments_are_named():
    q, k, v = _qkv()
    with pytest.raises(ValueError, match="k: head count expected a divisor of the 8 query heads, got 3"):
        dense_attention(q, *_qkv(h=8, hk=3)[1:])
    with pytest.raises(ValueError, match="q: head dim expected one of \\(64, 128, 256\\), got 96"):
        dense_attention(*_qkv(d=96))
    with pytest.raises(TypeError, match="q: expected dtype in"):
        dense_attention(q.float(), k, v)
    with pytest.raises(TypeError, match="k: expected dtype torch.bfloat16 \\(the dtype of q\\), got torch.float16"):
        dense_attention(q, k.half(), v)
    with pytest.raises(ValueError, match="v: expected the shape of k"):
        dense_attention(q, k, v[:, :8].contiguous())
    with pytest.raises(ValueError, match="softmax_scale"):
        dense_attention(q, k, v, softmax_scale=-1.0)
    with pytest.raises(ValueError, match="dim: head dim expected one of"):
        dense_fwd_kernel(80, False, 1.0)
    with pytest.raises(ValueError, match="schedule: expected one of"):
        dense_attention(q, k, v, schedule="fast")
    with pytest.raises(ValueError, match=r"consumers: expected one of \(2, 3\), got 4"):
        dense_fwd_overlap_kernel(128, False, 1.0, consumers=4)
    with pytest.raises(ValueError, match="num_stages: expected >= 1, got 0"):
        dense_fwd_overlap_kernel(128, False, 1.0, num_stages=0)
    qp, kp, vp = q.view(32, 8, 128), k.view(32, 2, 128), v.view(32, 2, 128)
    ok = torch.tensor([0, 16, 32], dtype=torch.int32)
    with pytest.raises(ValueError, match=r"cu_seqlens_q: expected non-decreasing offsets, got cu_seqlens_q\[1\] = 20 > cu_seqlens_q\[2\] = 12"):
        dense_attention(qp, kp, vp, cu_seqlens_q=torch.tensor([0, 20, 12, 32], dtype=torch.int32), cu_seqlens_k=torch.tensor([0, 10, 20, 32], dtype=torch.int32))
    with pytest.raises(TypeError, match="cu_seqlens_k: expected a 1-D int32 tensor"):
        dense_attention(qp, kp, vp, cu_seqlens_q=ok, cu_seqlens_k=ok.long())
    with pytest.raises(ValueError, match="cu_seqlens_k: expected the last offset to equal the 32 packed rows, got 30"):
        dense_attention(qp, kp, vp, cu_seqlens_q=ok, cu_seqlens_k=torch.tensor([0, 16, 30], dtype=torch.int32))
    with pytest.raises(ValueError, match="cu_seqlens_q, cu_seqlens_k: expected both or neither"):
        dense_attention(qp, kp, vp, cu_seqlens_q=ok)
    with pytest.raises(ValueError, match="q: expected a CUDA tensor"):
        dense_attention(q, k, v)
