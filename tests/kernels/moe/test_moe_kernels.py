"""MoE kernels: compile for sm_90a and baselines build (CPU); bitwise vs baselines and
close to the float64 references (GPU)."""

from pathlib import Path

import pytest
import torch

from kernels.moe import reference as R
from kernels.moe.gating import gating, gating_kernel
from kernels.moe.grouped_gemm import (
    grouped_gemm_contiguous,
    grouped_gemm_contiguous_kernel,
    grouped_gemm_masked,
    grouped_gemm_masked_kernel,
    grouped_gemm_swiglu,
    grouped_gemm_swiglu_kernel,
    persistent_ctas,
    persistent_grouped_gemm,
)
from kernels.moe.metadata import max_rows, metadata_buffers, metadata_kernel, routing_metadata
from kernels.moe.permute import combine, combine_kernel, permute, permute_fp8_kernel, permute_kernel
from tests.kernels.staged_release import assert_stages_released_after_last_read

KDIR = Path(R.__file__).parent
BASELINES = ("gating", "metadata", "permute", "grouped_gemm")

# ---- CPU: compile-only ----------------------------------------------------------------

COMPILES = {
    "gating_grouped": lambda: gating_kernel(256, 6, "sqrtsoftplus", 8, 4, True, 1.5),
    "metadata": lambda: metadata_kernel(6, 256),
    "metadata_single": lambda: metadata_kernel(6, 256, single=True),  # one chunk: no grid barrier
    "permute": lambda: permute_kernel(4096, 6),
    "permute_fp8": lambda: permute_fp8_kernel(4096, 6),
    "permute_fp8_unpadded": lambda: permute_fp8_kernel(4096, 6, zero_padding=False),
    "combine": lambda: combine_kernel(4096, 6),
    "gemm_contiguous": lambda: grouped_gemm_contiguous_kernel(4096, 2048),  # 22 column tiles: 192-wide
    "gemm_contiguous_n128": lambda: grouped_gemm_contiguous_kernel(2048, 1024),  # 11 column tiles: 128-wide
    "gemm_contiguous_k1152": lambda: grouped_gemm_contiguous_kernel(2048, 1152),  # 9 K blocks: K loop not unrolled
    "gemm_contiguous_rows": lambda: grouped_gemm_contiguous_kernel(4096, 2048, block_n=128, row_mask=True),
    "gemm_contiguous_rows_192": lambda: grouped_gemm_contiguous_kernel(4096, 2048, row_mask=True),
    "gemm_masked": lambda: grouped_gemm_masked_kernel(4096, 2048),
    "gemm_swiglu": lambda: grouped_gemm_swiglu_kernel(4096, 4096),  # V4-Flash L1 with the SwiGLU cast
}


@pytest.mark.parametrize("name", sorted(COMPILES))
def test_kernel_compiles_for_sm90a(name):
    kernel = COMPILES[name]()
    src = kernel.device_source
    assert "__global__" in src
    if name.startswith("metadata"):
        # chunks meet at a grid barrier through chunk_counts (a cooperative launch); one chunk
        # takes its histogram as the totals: a plain launch that never writes chunk_counts
        single = name == "metadata_single"
        assert kernel.metadata["launches"][0]["cooperative"] is not single
        assert ("chunk_counts[" in src) is not single
    if name.startswith("gemm"):
        # wgmma m64n192k32 (persistent kernel, 128 x 192 tiles at N = 4096) or m64n128k32 e4m3 x
        # e4m3 -> f32 (the baseline's m64n64k32 steps compute the same per-element sums; the GPU
        # tests compare bits), and the promotion fma per K block
        width = 192 if name in ("gemm_contiguous", "gemm_masked", "gemm_contiguous_rows_192") else 128
        # the TMA store of C_s is waited on (.read) only before C_s is written again
        assert src.count("tl::tma_store_wait<0, true>()") == 2
        if name.startswith("gemm_contiguous_rows"):
            # no TMA store: 16-byte stores of the rows whose entry (staged in live_s) is >= 0
            assert "tl::tma_store(" not in src and "rows[" in src
            assert "(0 <= ((int*)live_s)[" in src and "*(uint4*)(C + " in src
            # a tile whose row 64 is padding (its entry < 0) loads 64 A rows a stage (8 KB of
            # e4m3), any other tile all 128 (16 KB); the other kernels always load 128
            assert "rows[(((int64_t)r0) + (int64_t)64)]" in src
            assert src.count("expect_transaction(8192)") == 1
        elif name.startswith("gemm"):
            assert "expect_transaction(8192)" not in src
        wgmma = f"kFloat8_e4m3, tl::DataType::kFloat8_e4m3, tl::DataType::kFloat32, 64, {width}, 32"
        assert wgmma in src
        assert "__fmaf_rn(part" in src
        # scale_s is written with plain stores behind the same release as the TMA copies
        assert_stages_released_after_last_read(src, {"A_s", "B_s", "scale_s"})
        if name == "gemm_swiglu":
            # a gate chain and an up chain per K block, each promoted into its own total; the
            # epilogue rounds both to bf16 as L1 stores them, takes the IEEE quotient of
            # swiglu_cast and casts with the e4m3 conversion of kernels.quant, no bf16 store
            assert src.count(wgmma) == 2 and "Bu_s" in src
            assert "total_up[i_4] = __fmaf_rn(part" in src
            assert "((bfloat16_t)total_up[" in src and "((bfloat16_t)total[" in src
            assert "__fadd_rn(0x1p+0f/*1.000000e+00*/, expf(" in src
            assert "tlx_ieee_fp8_e4m3_bits(" in src and "bfloat16_t*)C_s" not in src
    if name == "combine":
        assert "__fmaf_rn(w" in src


@pytest.mark.parametrize("name", BASELINES)
def test_baseline_compiles(name, tmp_path):
    """Each CUDA baseline compiles with the flags the parity harness builds it with."""
    from tlx.numerics.parity import build_baseline

    obj = build_baseline(KDIR / f"{name}.cu", compile_only=True, build_directory=str(tmp_path))
    assert Path(obj).stat().st_size > 0


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="topk_groups"):
        gating_kernel(256, 6, "sigmoid", 8, 9)
    with pytest.raises(ValueError, match="score_func"):
        gating_kernel(256, 6, "relu")
    with pytest.raises(ValueError, match="out\\[0\\]: expected a contiguous torch.int32 tensor of shape \\(4, 6\\)"):
        gating(torch.zeros(4, 256), None, 6, "sigmoid", out=(torch.zeros(4, 8, dtype=torch.int32), torch.zeros(4, 6)))
    with pytest.raises(ValueError, match="k: expected a multiple of 128"):
        grouped_gemm_contiguous_kernel(256, 100)
    with pytest.raises(ValueError, match="block_n: expected 128 or 192"):
        grouped_gemm_contiguous_kernel(4096, 2048, block_n=256)
    with pytest.raises(ValueError, match="row_mask: the row-masked store serves the plain contiguous layout only"):
        persistent_grouped_gemm(4096, 2048, True, 4, 2, 132, None, True, row_mask=True)  # the masked layout
    with pytest.raises(ValueError, match="rows: expected torch.int32 of shape \\(256,\\), got torch.int64"):
        e4 = torch.float8_e4m3fn
        grouped_gemm_contiguous(torch.zeros(256, 128, dtype=e4), torch.ones(256, 1), torch.zeros(1, 128, 128, dtype=e4),
                                torch.ones(1, 1, 1), torch.zeros(2, dtype=torch.int32),
                                rows=torch.zeros(256, dtype=torch.int64))
    with pytest.raises(ValueError, match="n: expected 2I with I a multiple of 128"):
        grouped_gemm_swiglu_kernel(4096 + 128, 2048)
    with pytest.raises(ValueError, match="out\\[0\\]: expected torch.float8_e4m3fn of shape \\(128, 128\\)"):
        e4 = torch.float8_e4m3fn
        grouped_gemm_swiglu(torch.zeros(128, 128, dtype=e4), torch.ones(128, 1), torch.zeros(1, 256, 128, dtype=e4),
                            torch.ones(1, 2, 1), torch.zeros(1, dtype=torch.int32),
                            out=(torch.zeros(128, 256, dtype=e4), torch.ones(128, 1)))
    with pytest.raises(ValueError, match="out: expected a \\(Q, S\\) pair of tensors, got Tensor"):
        grouped_gemm_swiglu(torch.zeros(128, 128, dtype=e4), torch.ones(128, 1), torch.zeros(1, 256, 128, dtype=e4),
                            torch.ones(1, 2, 1), torch.zeros(1, dtype=torch.int32), out=torch.zeros(128, 128, dtype=e4))
    with pytest.raises(ValueError, match="ids"):
        routing_metadata(torch.zeros(4, 2, dtype=torch.int64), 8)
    with pytest.raises(ValueError, match="ids: expected a 2-D int32 tensor"):
        metadata_buffers(torch.zeros(4, 2, dtype=torch.int64), 8)
    with pytest.raises(ValueError, match="n_ranks: expected a divisor of n_experts = 8, got 3"):
        routing_metadata(torch.zeros(4, 2, dtype=torch.int32), 8, n_ranks=3)
    with pytest.raises(ValueError, match="rank: expected 0 <= rank < n_ranks = 2, got 2"):
        routing_metadata(torch.zeros(4, 2, dtype=torch.int32), 8, rank=2, n_ranks=2)
    with pytest.raises(ValueError, match="ids: expected a CUDA tensor"):
        routing_metadata(torch.zeros(4, 2, dtype=torch.int32), 8)


@pytest.mark.parametrize("e", [12, 64])
@pytest.mark.parametrize("seed", range(20))
def test_max_rows_bounds_the_padded_rows(seed, e):
    g = torch.Generator().manual_seed(seed)
    t = int(torch.randint(1, 40, (1,), generator=g))
    ids = torch.argsort(torch.rand(t, e, generator=g), dim=1)[:, :3].int()
    used = int(R.metadata_ref(ids, e, align=8)["offsets"][-1])
    assert used <= max_rows(t, 3, e, align=8)
    assert max_rows(t, 3, e, align=8) % 8 == 0


def test_max_rows_is_tight_when_every_entry_has_its_own_expert():
    ids = torch.arange(12, dtype=torch.int32).view(4, 3)  # 4 tokens, 12 distinct experts out of 64
    assert int(R.metadata_ref(ids, 64, align=8)["offsets"][-1]) == max_rows(4, 3, 64, align=8) == 12 * 8


# ---- GPU ------------------------------------------------------------------------------

CUDA = "cuda"
SCORE_CODES = {"softmax": 0, "sigmoid": 1, "sqrtsoftplus": 2}


def _logits(t, e, ties, seed):
    g = torch.Generator(device=CUDA).manual_seed(seed)
    x = torch.randn(t, e, device=CUDA, generator=g) * 2
    return (x * 4).round() / 4 if ties else x  # ties: many equal logits


GATING_CASES = [
    # (E, n_groups, topk_groups, score, renormalize, scaling)
    (256, 1, 1, "sqrtsoftplus", True, 1.5),  # V4-Flash
    (384, 1, 1, "sqrtsoftplus", True, 2.5),  # V4-Pro
    (256, 8, 4, "sigmoid", True, 2.5),
    (384, 8, 3, "softmax", False, 1.0),
    (72, 1, 1, "softmax", True, 1.0),  # E not a multiple of 32: lanes with fewer experts
    (40, 8, 4, "sigmoid", True, 1.5),  # groups of 5 across lanes
]


@pytest.mark.gpu
@pytest.mark.parametrize("case", GATING_CASES, ids=lambda c: f"E{c[0]}-g{c[1]}-{c[3]}")
@pytest.mark.parametrize("t", [1, 4097])
@pytest.mark.parametrize("ties", [False, True])
def test_gating_bitwise_and_reference(baseline, case, t, ties):
    from tlx.numerics.parity import assert_bitwise

    e, g, tg, score, renorm, scale = case
    logits = _logits(t, e, ties, seed=t + e)
    bias = torch.randn(e, device=CUDA) * 0.1
    ids, w = gating(logits, bias, 6, score, g, tg, renorm, scale)
    b_ids = torch.full_like(ids, -7)
    b_w = torch.full_like(w, float("nan"))
    baseline("gating").moe_gating(logits, bias, b_ids, b_w, SCORE_CODES[score], g, tg, renorm, scale)
    assert_bitwise(ids, b_ids, name="ids")
    assert_bitwise(w, b_w, name="weights")
    r_ids, r_w = R.gating_ref(logits.cpu(), bias.cpu(), 6, score, g, tg, renorm, scale)
    same = (ids.cpu() == r_ids).all(dim=1)
    # float32 vs float64 scores may order near-equal experts differently; exact ties may not.
    assert same.float().mean().item() >= (0.999 if ties else 0.99)
    err = R.rel_error(w.cpu()[same], r_w[same])
    print(f"gating {case} T={t} ties={ties}: ids equal {same.float().mean().item():.4f}, weights rel err {err:.2e}")
    assert err < 1e-5


def _ids(kind, t, e, seed):
    g = torch.Generator(device=CUDA).manual_seed(seed)
    if kind == "uniform":
        return torch.argsort(torch.rand(t, e, device=CUDA, generator=g), dim=1)[:, :6].int()
    if kind == "hot":  # every token picks expert 3, the rest spread
        ids = torch.argsort(torch.rand(t, e, device=CUDA, generator=g), dim=1)[:, :6].int()
        ids[:, 0] = torch.where((ids[:, 1:] == 3).any(dim=1), ids[:, 0], 3)
        return ids
    # "sparse": only experts 0, 4, 8, ... get tokens, the others are empty
    return (torch.argsort(torch.rand(t, e // 4, device=CUDA, generator=g), dim=1)[:, :6] * 4).int()


def _baseline_metadata(baseline, ids, e, rank, n_ranks):
    el = e // n_ranks
    t, k = ids.shape
    nchunk = max(1, (t + 127) // 128)
    rows = max_rows(t, k, el)
    out = {
        "counts": torch.full((el,), -7, dtype=torch.int32, device=CUDA),
        "offsets": torch.full((el + 1,), -7, dtype=torch.int32, device=CUDA),
        "row_of": torch.full((t, k), -7, dtype=torch.int32, device=CUDA),
        "entry_of_row": torch.full((rows,), -7, dtype=torch.int32, device=CUDA),
        "block_expert": torch.full((rows // 128,), -7, dtype=torch.int32, device=CUDA),
    }
    cc = torch.full((nchunk, el), -7, dtype=torch.int32, device=CUDA)
    baseline("metadata").moe_metadata(ids, rank * el, 128, cc, out["counts"], out["offsets"], out["row_of"],
                                      out["entry_of_row"], out["block_expert"])
    return out


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["uniform", "hot", "sparse"])
@pytest.mark.parametrize("t", [1, 128, 129, 300, 16384, 20000])  # <= 128: one chunk (no grid barrier); 20000: 256-token chunks
@pytest.mark.parametrize("e,rank,n_ranks", [(256, 0, 1), (384, 2, 4)])
def test_metadata_bitwise_and_reference(baseline, kind, t, e, rank, n_ranks):
    from tlx.numerics.parity import assert_bitwise

    ids = _ids(kind, t, e, seed=t)
    got = routing_metadata(ids, e, rank, n_ranks)
    base = _baseline_metadata(baseline, ids, e, rank, n_ranks)
    ref = R.metadata_ref(ids, e, rank, n_ranks)
    used = int(ref["offsets"][-1])
    for key in ("counts", "offsets", "row_of", "block_expert"):
        assert_bitwise(got[key], base[key], name=key)
    poisoned = metadata_buffers(ids, e, n_ranks)
    poisoned["entry_of_row"].fill_(7)
    routing_metadata(ids, e, rank, n_ranks, out=poisoned)
    assert (poisoned["entry_of_row"][used:] == -1).all()  # rows past the last expert's: -1, not left as they were
    assert_bitwise(got["entry_of_row"][:used], base["entry_of_row"][:used], name="entry_of_row")
    for key in ("counts", "offsets", "row_of"):
        assert torch.equal(got[key].cpu(), ref[key]), key
    assert torch.equal(got["entry_of_row"][:used].cpu(), ref["entry_of_row"])
    nb = used // 128
    assert torch.equal(got["block_expert"][:nb].cpu(), ref["block_expert"])
    assert (got["block_expert"][nb:] == -1).all()


@pytest.mark.gpu
def test_metadata_into_reused_buffers():
    """``out=`` buffers (poisoned, reused across routings) end bitwise equal to a fresh call's, and
    buffers sized for other ids are refused, untouched."""
    t, e = 5000, 256
    bufs = metadata_buffers(_ids("uniform", t, e, seed=1), e)
    for p in bufs.values():
        p.fill_(-7)
    for kind in ("hot", "sparse"):
        ids = _ids(kind, t, e, seed=2)
        got = routing_metadata(ids, e, out=bufs)
        assert got is bufs
        fresh = routing_metadata(ids, e)
        used = int(fresh["offsets"][-1])
        for key in ("counts", "offsets", "row_of", "block_expert"):
            assert torch.equal(got[key], fresh[key]), key
        assert torch.equal(got["entry_of_row"][:used], fresh["entry_of_row"][:used])
    before = {key: p.clone() for key, p in bufs.items()}
    with pytest.raises(ValueError, match="out: expected buffers of"):
        routing_metadata(_ids("uniform", t + 1000, e, seed=3), e, out=bufs)
    assert all(torch.equal(bufs[key], p) for key, p in before.items())


def _routing(t, e, kind="uniform"):
    ids = _ids(kind, t, e, seed=7 + t)
    return ids, routing_metadata(ids, e)


@pytest.mark.gpu
@pytest.mark.parametrize("t,e,h", [(1, 256, 4096), (2000, 256, 4096), (513, 384, 7168)])
def test_permute_and_combine_bitwise_and_reference(baseline, e4m3, t, e, h):
    from tlx.numerics.parity import assert_bitwise

    ids, meta = _routing(t, e, "hot")
    used = int(meta["offsets"][-1])
    mod = baseline("permute")
    x = torch.randn(t, h, device=CUDA).to(torch.bfloat16)
    xp = permute(x, meta, 6)
    bxp = torch.full_like(xp, float("nan"))
    mod.moe_permute(x, meta["entry_of_row"], meta["offsets"], 6, bxp)
    assert_bitwise(xp[:used], bxp[:used], name="permute bf16")
    assert torch.equal(xp[:used].cpu(), R.permute_ref(x.cpu(), meta["entry_of_row"][:used].cpu(), 6))

    xq = e4m3.small((t, h), CUDA)
    xs = torch.rand(t, h // 128, device=CUDA)
    qp, sp = permute(xq, meta, 6, xs)
    bqp = torch.zeros_like(qp)
    bsp = torch.full_like(sp, float("nan"))
    mod.moe_permute_fp8(xq, xs, meta["entry_of_row"], meta["offsets"], 6, bqp, bsp)
    assert_bitwise(qp[:used], bqp[:used], name="permute e4m3")
    assert_bitwise(sp[:used], bsp[:used], name="permute scales")
    assert torch.equal(sp[:used].cpu(), R.permute_ref(xs.cpu(), meta["entry_of_row"][:used].cpu(), 6))
    # without zero_padding (moe_layer's): the routed rows' bits, the padding rows left as they were
    unpadded = permute_fp8_kernel(h, 6, zero_padding=False)
    uqp, usp = torch.empty_like(qp), torch.full_like(sp, float("nan"))
    uqp.view(torch.uint8).fill_(0x7F)  # an e4m3 NaN
    unpadded(xq, xs, meta["row_of"], meta["entry_of_row"], meta["offsets"], uqp, usp)
    routed = meta["entry_of_row"][:used] >= 0
    assert_bitwise(uqp[:used][routed], qp[:used][routed], name="permute e4m3, padding rows unwritten")
    assert_bitwise(usp[:used][routed], sp[:used][routed], name="permute scales, padding rows unwritten")
    assert (uqp[:used][~routed].view(torch.uint8) == 0x7F).all() and usp[:used][~routed].isnan().all()
    with pytest.raises(ValueError, match="zero_padding: only the e4m3 permute"):
        permute(x, meta, 6, zero_padding=False)

    y = torch.randn(xp.shape[0], h, device=CUDA).to(torch.bfloat16)
    w = torch.rand(t, 6, device=CUDA)
    out = combine(y, meta["row_of"], w)
    bout = torch.full_like(out, float("nan"))
    mod.moe_combine(y, meta["row_of"], w, bout)
    assert_bitwise(out, bout, name="combine")
    err = R.rel_error(out.cpu(), R.combine_ref(y.cpu(), meta["row_of"].cpu(), w.cpu()))
    print(f"combine T={t} H={h}: rel err {err:.2e}")
    assert err < 4e-3


def _weights(e, n, k, e4m3):
    b = e4m3.small((e, n, k), CUDA)
    sb = torch.rand(e, n // 128, k // 128, device=CUDA) * 0.01 + 0.001
    return b, sb


# The four shapes of the models (each (N, K) is one compile, shared with the pipeline; all take
# 128 x 192 tiles, the last one past N at N 4096 and 7168), one N whose 192-wide tiles do not pair
# up in clusters (128 x 128 tiles) and one K whose blocks do not fill whole rounds of the stages.
GEMM_SHAPES = [
    # (local experts, N, K)
    (8, 4096, 4096),  # V4-Flash L1: N = 2I, K = H
    (8, 4096, 2048),  # V4-Flash L2: N = H, K = I
    (4, 6144, 7168),  # V4-Pro L1
    (4, 7168, 3072),  # V4-Pro L2
    (4, 2048, 1024),  # ceil(2048 / 192) = 11 column tiles: 128-wide
    (4, 2048, 1152),  # 9 K blocks, not whole rounds of the 4 stages: the K loop is not unrolled
    (2, 4096, 1152),  # the same with 192-wide tiles (two scale groups per tile)
]


@pytest.mark.gpu
@pytest.mark.parametrize("e,n,k", GEMM_SHAPES)
@pytest.mark.parametrize("kind", ["uniform", "hot", "sparse"])
@pytest.mark.parametrize("store", ["all rows", "routed rows"])
def test_grouped_gemm_contiguous_bitwise_and_reference(baseline, e4m3, e, n, k, kind, store):
    """"all rows": the kernel with its default tiles (192-wide where the column tiles pair up),
    every row of the computed blocks stored; "routed rows": the 128-wide kernel that
    ``grouped_gemm_contiguous(rows=...)`` takes where the GEMM streams weights
    (``streaming_block_n``), the padding rows (entry -1) left as they were."""
    from tlx.numerics.parity import assert_bitwise

    t = 97 if kind != "hot" else 300
    ids = _ids(kind, t, 8 * e, seed=e + n)  # 8 * e experts in all; this "rank" owns the first e
    meta = routing_metadata(ids, 8 * e, 0, 8)
    rows = meta["entry_of_row"].shape[0]
    a = e4m3.small((rows, k), CUDA)
    sa = torch.rand(rows, k // 128, device=CUDA) + 0.5
    b, sb = _weights(e, n, k, e4m3)
    poison = torch.full((rows, n), float("nan"), dtype=torch.bfloat16, device=CUDA)
    out = poison.clone()
    written = torch.arange(rows, device=CUDA) < int(meta["offsets"][-1])  # rows past the offsets: not computed
    if store == "all rows":
        grouped_gemm_contiguous_kernel(n, k, num_sms=persistent_ctas(0))(a, sa, b, sb, meta["block_expert"], out)
    else:
        kernel = grouped_gemm_contiguous_kernel(n, k, num_sms=persistent_ctas(0), block_n=128, row_mask=True)
        kernel(a, sa, b, sb, meta["block_expert"], meta["entry_of_row"], out)
        written &= meta["entry_of_row"] >= 0  # (the metadata leaves entry_of_row past the offsets unset)
    bout = poison.clone()
    baseline("grouped_gemm").moe_grouped_gemm_contiguous(a, sa, b, sb, meta["block_expert"], bout)
    assert_bitwise(out[written], bout[written], name="grouped GEMM contiguous")
    ref = R.grouped_gemm_contiguous_ref(a, sa, b, sb, meta["block_expert"].cpu())
    err = R.rel_error(out[written], ref[written])
    print(f"gemm contiguous E={e} N={n} K={k} {kind} {store}: rows {int(written.sum())}, rel err {err:.2e}")
    assert err < 5e-3
    assert torch.isnan(out[~written].float()).all()  # padding rows (routed rows) and blocks past the end


def _masked_counts(pattern, e, m):
    """mixed: empty, 1, 129 and M rows in turn; clamped: counts past M (all rows) and below 0
    (none); sparse: two experts with rows among empty ones (the persistent kernel walks past runs
    of empty experts)."""
    if pattern == "mixed":
        counts = ([0, 1, 129, m] * e)[:e]
    elif pattern == "clamped":
        counts = ([m + 100, -3, 0, 129] * e)[:e]
    else:
        counts = [0] * e
        counts[e // 3], counts[-1] = m - 5, 1
    return torch.tensor(counts, dtype=torch.int32, device=CUDA)


@pytest.mark.gpu
@pytest.mark.parametrize("e,m,n,k,pattern", [
    (4, 384, 4096, 2048, "mixed"), (8, 384, 4096, 2048, "mixed"), (3, 200, 4096, 1024, "mixed"),
    (4, 512, 2048, 1152, "mixed"), (4, 640, 4096, 1024, "mixed"), (3, 600, 4096, 1024, "mixed"),
    (4, 512, 4096, 2048, "clamped"), (16, 1024, 4096, 1024, "sparse")])
def test_grouped_gemm_masked_bitwise_and_reference(baseline, e4m3, e, m, n, k, pattern):
    """128- and 192-wide tiles, rolled and unrolled K loop, the expert walk over empty, clamped and
    sparse counts. Bitwise against the baseline where M is a multiple of 128 (the baseline's
    contract); M = 200 / 600 (the last row block past M) against the reference."""
    from tlx.numerics.parity import assert_bitwise

    counts = _masked_counts(pattern, e, m)
    a = e4m3.small((e, m, k), CUDA)
    sa = torch.rand(e, m, k // 128, device=CUDA) + 0.5
    b, sb = _weights(e, n, k, e4m3)
    poison = torch.full((e, m, n), float("nan"), dtype=torch.bfloat16, device=CUDA)
    out = grouped_gemm_masked(a, sa, b, sb, counts, out=poison.clone())
    if m % 128 == 0:
        bout = poison.clone()
        baseline("grouped_gemm").moe_grouped_gemm_masked(a, sa, b, sb, counts, bout)
        assert_bitwise(out, bout, name="grouped GEMM masked")
    ref = R.grouped_gemm_masked_ref(a, sa, b, sb, counts.cpu())
    for i, c in enumerate(counts.clamp(0, m).tolist()):
        if c:
            err = R.rel_error(out[i, :c], ref[i, :c])
            assert err < 5e-3, (i, c, err)
        assert torch.isnan(out[i, (c + 127) // 128 * 128:].float()).all()


@pytest.mark.gpu
def test_grouped_gemm_is_deterministic_and_row_independent(e4m3):
    """The same row gives the same bits whatever else is in the batch and on every run."""
    e, n, k = 4, 4096, 2048
    ids = _ids("uniform", 200, 32, seed=1)
    meta = routing_metadata(ids, 32, 0, 8)
    rows = meta["entry_of_row"].shape[0]
    a = e4m3.small((rows, k), CUDA)
    sa = torch.rand(rows, k // 128, device=CUDA) + 0.5
    b, sb = _weights(e, n, k, e4m3)
    used = int(meta["offsets"][-1])  # rows of blocks owned by another rank (expert -1) are never written
    first = grouped_gemm_contiguous(a, sa, b, sb, meta["block_expert"])
    assert torch.equal(first[:used], grouped_gemm_contiguous(a, sa, b, sb, meta["block_expert"])[:used])
    a2 = a.clone()
    a2[1::2] = e4m3.small(a2[1::2].shape, CUDA)  # change every other row
    second = grouped_gemm_contiguous(a2, sa, b, sb, meta["block_expert"])
    assert torch.equal(first[:used:2], second[:used:2])


@pytest.mark.gpu
@pytest.mark.parametrize("e,n,k", [(3, 4096, 7168), (2, 2048, 1024)])
def test_grouped_gemm_equals_cublas_blockwise_scaled_mm(e4m3, e, n, k):
    """An implementation that is not ours: torch._scaled_mm with 1 x 128 / 128 x 128 block scales
    (cuBLAS on sm_90) gives each expert's rows the same bits, where the torch build has it."""
    from tlx.numerics.parity import assert_bitwise

    counts = [384, 128, 256][:e]
    block_expert = torch.repeat_interleave(torch.arange(e, dtype=torch.int32, device=CUDA),
                                           torch.tensor(counts, device=CUDA) // 128)
    rows = sum(counts)
    a = e4m3.small((rows, k), CUDA)
    sa = torch.rand(rows, k // 128, device=CUDA) + 0.5
    b, sb = _weights(e, n, k, e4m3)
    out = grouped_gemm_contiguous(a, sa, b, sb, block_expert,
                                  out=torch.full((rows, n), float("nan"), dtype=torch.bfloat16, device=CUDA))
    start = 0
    for i, c in enumerate(counts):
        rows_i = slice(start, start + c)
        scale_a = sa[rows_i].t().contiguous().t()  # cuBLAS takes the 1 x 128 scales M-major
        try:
            ref = torch._scaled_mm(a[rows_i], b[i].t(), scale_a=scale_a, scale_b=sb[i].t(), out_dtype=torch.bfloat16)
        except RuntimeError as exc:
            pytest.skip(f"this torch has no blockwise _scaled_mm: {exc}"[:200])
        assert_bitwise(out[rows_i], ref, name=f"grouped GEMM expert {i} vs cuBLAS blockwise")
        start += c


# L1 shapes (local experts, N = 2I, K = H): V4-Flash, V4-Pro, and one of 9 K blocks (the K loop
# not unrolled) whose I = 384 gives 3 column tiles (odd: no 2-CTA cluster pairs them, cluster 1)
SWIGLU_SHAPES = [(8, 4096, 4096), (4, 6144, 7168), (4, 768, 1152)]


@pytest.mark.gpu
@pytest.mark.parametrize("e,n,k", SWIGLU_SHAPES)
@pytest.mark.parametrize("kind", ["uniform", "wide"])
def test_grouped_gemm_swiglu_bitwise_equal_to_gemm_then_swiglu_cast(e4m3, e, n, k, kind):
    """The fused L1 + SwiGLU cast against its two unfused kernels: the same e4m3 bytes and fp32
    scales on every computed row; a row block of expert -1 (another wave's) is not written.
    "wide": activation scales up to 200, so the hidden values pass the clamp (10) on both sides
    and reach g < -87 (swiglu_cast's IEEE quotient instead of its fast one)."""
    from kernels.quant.group_cast import swiglu_cast
    from tlx.numerics.parity import assert_bitwise

    ids = _ids("hot" if kind == "wide" else "uniform", 300, 8 * e, seed=e + n)
    meta = routing_metadata(ids, 8 * e, 0, 8)
    rows = meta["entry_of_row"].shape[0]
    block_expert = meta["block_expert"].clone()
    block_expert[1] = -1  # a block of another wave: neither path computes it
    a = e4m3.small((rows, k), CUDA)
    sa = torch.rand(rows, k // 128, device=CUDA) * (200 if kind == "wide" else 1) + 0.5
    b, sb = _weights(e, n, k, e4m3)
    q_poison = torch.full((rows, n // 2), 0x7F, dtype=torch.uint8, device=CUDA).view(torch.float8_e4m3fn)
    s_poison = torch.full((rows, n // 256), float("nan"), device=CUDA)
    q, s = grouped_gemm_swiglu(a, sa, b, sb, block_expert, clamp=10.0, out=(q_poison.clone(), s_poison.clone()))
    hidden = grouped_gemm_contiguous(a, sa, b, sb, block_expert)
    q_ref, s_ref = swiglu_cast(hidden, clamp=10.0, group=128)
    computed = (block_expert >= 0).repeat_interleave(128)
    used = computed.nonzero().reshape(-1)
    assert_bitwise(q[used].view(torch.uint8), q_ref[used].view(torch.uint8), name="fused SwiGLU e4m3")
    assert_bitwise(s[used], s_ref[used], name="fused SwiGLU scales")
    skipped = ~computed
    assert (q[skipped].view(torch.uint8) == 0x7F).all() and torch.isnan(s[skipped]).all()
    h = hidden[used].float()
    g, u = h[:, : n // 2], h[:, n // 2:]
    if kind == "wide":  # the inputs exercise what they are meant to
        assert (g > 10).any() and (u.abs() > 10).any() and (g < -87).any()
    # and close to the float64 reference of the unfused steps' meaning
    ref = R.swiglu_ref(R.grouped_gemm_contiguous_ref(a, sa, b, sb, block_expert.cpu())[used], clamp=10.0)
    err = R.rel_error(R.dequant_rows_ref(q[used], s[used]), ref)
    print(f"gemm+swiglu E={e} N={n} K={k} {kind}: rows {len(used)}, rel err {err:.2e}")
    assert err < 0.07  # the e4m3 rounding: at most 2^-4 of each normal value
