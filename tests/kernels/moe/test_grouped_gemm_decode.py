"""The weights-on-M decode GEMM (``kernels/moe/grouped_gemm_decode.py``): compiles with the
instructions of its contract and proves its accesses (CPU); bit for bit equal to ``grouped_gemm.cu``
on the routed rows, padding rows untouched, and chosen by ``grouped_gemm_contiguous`` (GPU)."""

import pytest
import torch

from kernels.moe.grouped_gemm import grouped_gemm_contiguous
from kernels.moe.grouped_gemm_decode import TOKENS, decode_width, grouped_gemm_decode_kernel, one_chunk, width_for
from kernels.moe.metadata import routing_metadata
from tests.kernels.moe.test_moe_kernels import _ids, _weights
from tests.kernels.staged_release import assert_stages_released_after_last_read

CUDA = "cuda"


@pytest.mark.parametrize("n,k,tokens,block_n,group,bounded", [(4096, 2048, 8, 128, 2, True), (4096, 2048, 8, 128, 2, False),
                                                              (4096, 4096, 32, 64, 4, False)])
def test_compiles_with_its_contract(n, k, tokens, block_n, group, bounded):
    kernel = grouped_gemm_decode_kernel(n, k, tokens, block_n=block_n, group=group, bounded=bounded)
    check_contract(kernel, block_n, tokens, group, bounded=bounded)


def test_swiglu_form_compiles_with_its_contract():
    """The L1 with the SwiGLU cast: a gate and an up chain a K block, each promoted into its own total
    with its own scale group; the values' amax over the row through shared memory; e4m3 rows and
    their scales stored for routed rows only."""
    kernel = grouped_gemm_decode_kernel(4096, 4096, 8, swiglu_clamp=10.0, group=1)
    src = check_contract(kernel, 128, 8, 1, chains=2)
    assert "total_up[" in src and "__fadd_rn(0x1p+0f/*1.000000e+00*/, expf(" in src
    assert "tlx_ieee_fp8_e4m3_bits(" in src and "tl::MaxOp" in src and "Sq[" in src
    assert "bfloat16_t*)C_s" not in src
    with pytest.raises(ValueError, match="swiglu_clamp: expected block_n = 128"):
        grouped_gemm_decode_kernel(4096, 4096, 8, swiglu_clamp=10.0, block_n=64)


@pytest.mark.parametrize("swiglu", [False, True])
def test_pdl_form_streams_weights_before_waiting_on_the_grid_before_it(swiglu):
    """``pdl=True``: launched as a programmatic dependent; each CTA lets its own dependents start,
    issues its first ``num_stages`` stages of weight loads, then waits on the grid before it, and
    only then reads the activations (A by TMA, SA) that grid may still be writing; a CTA of an
    empty block waits on that grid before it leaves."""
    kw = {"swiglu_clamp": 10.0, "group": 1} if swiglu else {}
    kernel = grouped_gemm_decode_kernel(4096, 4096, 8, pdl=True, **kw)
    src = check_contract(kernel, 128, 8, kw.get("group", 2), chains=2 if swiglu else 1, pdl=True)
    assert [lc["programmatic_dependent"] for lc in kernel.metadata["launches"]] == [True]
    # one wait where the block has an expert (the producer's, after its early loads), one where it has none
    assert src.count("cudaGridDependencySynchronize()") == 2 and src.count("cudaTriggerProgrammaticLaunchCompletion()") == 1
    assert src.rstrip().endswith("} else {\n    cudaGridDependencySynchronize();\n  }\n}")
    before, after = src.split("cudaGridDependencySynchronize()", 1)
    assert "cudaTriggerProgrammaticLaunchCompletion()" in before
    # in a loop over the 3 stages: the gate and up loads (SwiGLU), or one in the loop over a stage's 2 K blocks
    assert before.count("tl::tma_load(B_desc") == (2 if swiglu else 1)
    assert "for (int kq = 0; kq < 3; ++kq)" in before
    assert "tma_load(A_desc" not in before and "SA[" not in before and "tma_load(A_desc" in after
    assert not grouped_gemm_decode_kernel(4096, 4096, 8, **kw).metadata["launches"][0]["programmatic_dependent"]


def check_contract(kernel, block_n, tokens, group, chains=1, pdl=False, bounded=False):
    """The instructions every form has (``pdl``: the weight loads twice, early and in the loop); returns the source."""
    src = kernel.device_source
    # the weights on M, the rows on N: m64n{tokens}k32 e4m3 x e4m3 -> f32, block_n / 64 chains a K block
    # (unless ``bounded``, each twice: the block's first chunk of rows, then the loop over its further chunks)
    copies = 1 if bounded else 2
    wgmma = f"kFloat8_e4m3, tl::DataType::kFloat8_e4m3, tl::DataType::kFloat32, 64, {tokens}, 32"
    assert src.count(wgmma) == copies * chains
    # a stage: `group` K blocks of block_n weight rows (128 bytes each; SwiGLU: gate and up) and of `tokens` A rows
    assert src.count(f"expect_transaction({block_n * 128})") == chains * (copies + pdl)
    assert src.count(f"expect_transaction({tokens * 128})") == copies
    # the further chunks only where chunk 1's first row, read once before the K loop, is routed
    more = f"more = rows[((((int64_t)((int)blockIdx.y)) * (int64_t)128) + (int64_t){tokens})];"
    assert (more in src, src.count("if (0 <= more) {")) == ((False, 0) if bounded else (True, 2))
    if group > 1:
        assert f"for (int u = 0; u < {group}; ++u)" in src
    # the promotion fma with the stage's sa * sb, C^T staged in C_s and the routed rows stored in 16-byte pieces
    assert "__fmaf_rn(part" in src and "((bfloat16_t)total[" in src
    assert "rows[" in src and "tma_store" not in src
    assert ("*(fp8_e4_16_t*)(Q + " if chains == 2 else "*(uint4*)(C + ") in src
    assert_stages_released_after_last_read(src, {"W_s", "X_s", "scale_s"})
    bounds = kernel.metadata["reports"]["bounds"]
    assert bounds["proven"] == bounds["accesses"] > 0 and not bounds["violations"]
    assert kernel.metadata["reports"]["determinism"]["deterministic"]
    return src


def test_width_and_bad_arguments():
    # the layers' rule: the width that holds up to 8 tokens, then 32 rows a chunk up to 512 tokens
    assert [decode_width(t) for t in (None, 1, 8, 9, 64, 512, 513)] == [None, 8, 8, 32, 32, 32, None]
    # one chunk a block exactly where the width holds the batch's tokens
    assert [one_chunk(t, decode_width(t)) for t in (1, 8, 9, 32, 33, 512)] == [True, True, True, True, False, False]
    assert TOKENS == (8, 16, 32, 64)
    assert [width_for(t) for t in (1, 9, 17, 33, 64, 65)] == [8, 16, 32, 64, 64, None]
    with pytest.raises(ValueError, match="tokens: expected one of \\(8, 16, 32, 64\\), got 12"):
        grouped_gemm_decode_kernel(4096, 2048, 12)
    with pytest.raises(ValueError, match="block_n: expected 64 or 128, got 192"):
        grouped_gemm_decode_kernel(4096, 2048, 8, block_n=192)
    with pytest.raises(ValueError, match="group: expected a divisor of the 16 K blocks, got 3"):
        grouped_gemm_decode_kernel(4096, 2048, 8, group=3)
    with pytest.raises(ValueError, match="tokens: expected a positive int \\(the batch's token count\\), got 0"):
        e4 = torch.float8_e4m3fn
        grouped_gemm_contiguous(torch.zeros(128, 128, dtype=e4), torch.ones(128, 1), torch.zeros(1, 128, 128, dtype=e4),
                                torch.ones(1, 1, 1), torch.zeros(1, dtype=torch.int32),
                                rows=torch.zeros(128, dtype=torch.int32), tokens=0)


@pytest.mark.gpu
@pytest.mark.parametrize("e,n,k", [(8, 4096, 4096), (8, 4096, 2048), (4, 6144, 7168), (4, 7168, 3072)])
@pytest.mark.parametrize("t", [1, 8, 13, 33, 64])
@pytest.mark.parametrize("kind", ["uniform", "hot", "sparse"])
def test_bitwise_equal_to_baseline(baseline, e4m3, e, n, k, t, kind):
    """Every routed row bit for bit ``grouped_gemm.cu``'s, the kernel the layers take
    (``grouped_gemm_contiguous(tokens=t)``: width 8 and one chunk a block up to 8 tokens, 32 rows a
    chunk above); "hot": every token on one expert, whose block then holds t rows (two chunks at 33
    and 64); rows of other ranks' experts and padding rows keep their NaN poison."""
    from tlx.numerics.parity import assert_bitwise

    meta, a, sa, b, sb, written = _routed_operands(kind, t, e, n, k, e4m3, seed=e + n + t)
    rows = meta["entry_of_row"]
    out = torch.full((rows.shape[0], n), float("nan"), dtype=torch.bfloat16, device=CUDA)
    bout = out.clone()
    grouped_gemm_contiguous(a, sa, b, sb, meta["block_expert"], out=out, rows=rows, tokens=t)
    baseline("grouped_gemm").moe_grouped_gemm_contiguous(a, sa, b, sb, meta["block_expert"], bout)
    assert_bitwise(out[written], bout[written], name=f"decode GEMM T={t} {kind}")
    assert torch.isnan(out[~written].float()).all()


def _routed_operands(kind, t, e, n, k, e4m3, seed):
    """(metadata, A, SA, B, SB, written) of a routing of t tokens over 8 * e experts of which this
    "rank" owns the first e (one of them at least routed), random e4m3 rows and weights; ``written``:
    the routed rows of the rank's experts."""
    ids = _ids(kind, t, 8 * e, seed=seed)
    if not (ids < e).any():  # one token may pick none of the rank's e experts: give it the last one
        ids[0, 0] = e - 1
    meta = routing_metadata(ids, 8 * e, 0, 8)
    r = meta["entry_of_row"].shape[0]
    a = e4m3.small((r, k), CUDA)
    sa = torch.rand(r, k // 128, device=CUDA) + 0.5
    b, sb = _weights(e, n, k, e4m3)
    written = (torch.arange(r, device=CUDA) < int(meta["offsets"][-1])) & (meta["entry_of_row"] >= 0)
    return meta, a, sa, b, sb, written


@pytest.mark.gpu
@pytest.mark.parametrize("swiglu", [False, True])
@pytest.mark.parametrize("t,width", [(13, 8), (64, 8), (200, 32)])
@pytest.mark.parametrize("kind", ["uniform", "hot"])
def test_rows_past_the_width_take_further_chunks(baseline, e4m3, swiglu, t, width, kind):
    """An expert's block holding more routed rows than the kernel's width (``hot``: expert 3 holds
    all t tokens, 128 rows a block then a further block) is computed chunk by chunk, every routed row bit for
    bit ``grouped_gemm.cu``'s (with ``swiglu_clamp``: the persistent L1 then ``swiglu_cast``);
    padding rows keep their poison."""
    from kernels.quant.group_cast import swiglu_cast
    from tlx.numerics.parity import assert_bitwise

    e, n, k = 8, 4096, 2048
    meta, a, sa, b, sb, written = _routed_operands(kind, t, e, n, k, e4m3, seed=7 * t + width)
    rows = meta["entry_of_row"]
    r = rows.shape[0]
    if kind == "hot":
        assert int(meta["counts"][3]) == t > width  # expert 3 holds every token: past the width
    if swiglu:
        q = torch.full((r, n // 2), 0x7F, dtype=torch.uint8, device=CUDA).view(torch.float8_e4m3fn)
        s = torch.full((r, n // 256), float("nan"), device=CUDA)
        grouped_gemm_decode_kernel(n, k, width, swiglu_clamp=10.0, group=1)(a, sa, b, sb, meta["block_expert"], rows, q, s)
        q_ref, s_ref = swiglu_cast(grouped_gemm_contiguous(a, sa, b, sb, meta["block_expert"]), clamp=10.0, group=128)
        assert_bitwise(q[written].view(torch.uint8), q_ref[written].view(torch.uint8), name=f"decode SwiGLU chunks T={t}")
        assert_bitwise(s[written], s_ref[written], name=f"decode SwiGLU chunk scales T={t}")
        assert (q[~written].view(torch.uint8) == 0x7F).all()
        return
    out = torch.full((r, n), float("nan"), dtype=torch.bfloat16, device=CUDA)
    bout = out.clone()
    grouped_gemm_decode_kernel(n, k, width)(a, sa, b, sb, meta["block_expert"], rows, out)
    baseline("grouped_gemm").moe_grouped_gemm_contiguous(a, sa, b, sb, meta["block_expert"], bout)
    assert_bitwise(out[written], bout[written], name=f"decode GEMM chunks T={t} {kind}")
    assert torch.isnan(out[~written].float()).all()


@pytest.mark.gpu
@pytest.mark.parametrize("e,n,k", [(8, 4096, 4096), (4, 6144, 7168)])
@pytest.mark.parametrize("t", [1, 8])
@pytest.mark.parametrize("kind", ["uniform", "hot", "wide"])
def test_swiglu_bitwise_equal_to_gemm_then_swiglu_cast(e4m3, e, n, k, t, kind):
    """The decode L1 with the SwiGLU cast fused against L1 (the persistent kernel) followed by
    ``swiglu_cast``: the same e4m3 bytes and fp32 scales on every routed row; padding rows and (where
    two blocks are routed) a block set to expert -1 keep their poison. "wide": activation scales up to 200, so the hidden values
    pass the clamp (10) on both sides."""
    from kernels.quant.group_cast import swiglu_cast
    from tlx.numerics.parity import assert_bitwise

    ids = _ids("hot" if kind == "hot" else "uniform", t, 8 * e, seed=e + n + t)
    if not (ids < e).any():  # one token may pick none of this rank's e experts: give it the last one
        ids[0, 0] = e - 1
    meta = routing_metadata(ids, 8 * e, 0, 8)
    rows = meta["entry_of_row"]
    r = rows.shape[0]
    block_expert = meta["block_expert"].clone()
    routed_blocks = torch.nonzero(block_expert >= 0).flatten()
    if routed_blocks.numel() > 1:  # a block of another wave: not computed (one routed block stays)
        block_expert[routed_blocks[0]] = -1
    a = e4m3.small((r, k), CUDA)
    sa = torch.rand(r, k // 128, device=CUDA) * (200 if kind == "wide" else 1) + 0.5
    b, sb = _weights(e, n, k, e4m3)
    q = torch.full((r, n // 2), 0x7F, dtype=torch.uint8, device=CUDA).view(torch.float8_e4m3fn)
    s = torch.full((r, n // 256), float("nan"), device=CUDA)
    grouped_gemm_decode_kernel(n, k, 8, swiglu_clamp=10.0, group=1)(a, sa, b, sb, block_expert, rows, q, s)
    hidden = grouped_gemm_contiguous(a, sa, b, sb, block_expert)
    q_ref, s_ref = swiglu_cast(hidden, clamp=10.0, group=128)
    live = (block_expert >= 0).repeat_interleave(128) & (rows >= 0)
    live &= torch.arange(r, device=CUDA) < int(meta["offsets"][-1])
    assert live.any()
    assert_bitwise(q[live].view(torch.uint8), q_ref[live].view(torch.uint8), name="decode SwiGLU e4m3")
    assert_bitwise(s[live], s_ref[live], name="decode SwiGLU scales")
    assert (q[~live].view(torch.uint8) == 0x7F).all() and torch.isnan(s[~live]).all()
