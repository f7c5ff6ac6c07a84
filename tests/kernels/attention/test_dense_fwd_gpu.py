"""Dense attention forward on the GPU: close to the torch fp32 reference, bit for bit equal to
the CUDA baseline (``kernels/attention/dense_fwd.cu``), batch invariant and deterministic.

Every kernel output is produced twice, into buffers poisoned with 0x00 and 0xFF bytes, and the
two results must agree bit for bit, so an element the kernel never writes cannot pass. Inputs
are fresh random normal values (never zeros).
"""

import math

import pytest
import torch

from kernels.attention import reference as R
from kernels.attention.common import LOG2E
from kernels.attention.dense_fwd import dense_attention, kernel_options
from tlx.numerics.parity import assert_bitwise

pytestmark = pytest.mark.gpu

TOL = {torch.bfloat16: 1e-2, torch.float16: 3e-3}  # ||o - ref|| / ||ref|| (rounded P and o)


def randn(shape, dtype, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return torch.randn(shape, generator=g, device="cuda", dtype=torch.float32).to(dtype)


def run(q, k, v, **kw):
    """The kernel's (o, lse), checked to write every element (two poisons, same bits)."""
    results = []
    for poison in (0x00, 0xFF):
        o = torch.empty_like(q)
        h = q.shape[-2]
        lse = torch.empty((h, q.numel() // (h * q.shape[-1])), dtype=torch.float32, device=q.device)
        o.view(torch.uint8).fill_(poison)
        lse.view(torch.uint8).fill_(poison)
        dense_attention(q, k, v, out=(o, lse), **kw)
        results.append((o, lse))
    assert_bitwise(results[0][0], results[1][0], name="o (poison 0x00 vs 0xFF)")
    assert_bitwise(results[0][1], results[1][1], name="lse (poison 0x00 vs 0xFF)")
    return results[0]


def run_baseline(base, q, k, v, causal, softmax_scale=None, cu_seqlens_q=None, cu_seqlens_k=None, fast_exp2=False,
                 block_n=0):
    """The CUDA baseline's (o [.., h, d] like q, lse [h, total_q]); ``fast_exp2``, ``block_n``: the
    kernel options' exp2 and keys a block (0: the default)."""
    d, h = q.shape[-1], q.shape[-2]
    scale = 1.0 / math.sqrt(d) if softmax_scale is None else softmax_scale
    if cu_seqlens_q is None:
        b, s_q, s_k = q.shape[0], q.shape[1], k.shape[1]
        cu_seqlens_q = torch.arange(b + 1, dtype=torch.int32, device="cuda") * s_q
        cu_seqlens_k = torch.arange(b + 1, dtype=torch.int32, device="cuda") * s_k
        max_q = s_q
    else:
        max_q = int((cu_seqlens_q[1:] - cu_seqlens_q[:-1]).max())
    qp, kp, vp = q.reshape(-1, h, d), k.reshape(-1, k.shape[-2], d), v.reshape(-1, k.shape[-2], d)
    o = torch.full_like(qp, float("nan"))
    lse = torch.full((h, qp.shape[0]), float("nan"), device="cuda")
    base("dense_fwd").attention_dense_fwd(qp, kp, vp, cu_seqlens_q, cu_seqlens_k, o, lse, scale * LOG2E,
                                          max(1, -(-max_q // 64)), causal, fast_exp2, block_n)
    return o.view(q.shape), lse


def check_reference(o, lse, q, k, v, causal, softmax_scale=None, cu_seqlens_q=None, cu_seqlens_k=None):
    ref_o, ref_lse = R.dense_attention_ref(q, k, v, causal, softmax_scale, cu_seqlens_q, cu_seqlens_k)
    if cu_seqlens_q is None:  # reference lse [b, h, s] -> the kernel's [h, b * s]
        ref_lse = ref_lse.permute(1, 0, 2).reshape(lse.shape)
    err = (o.float() - ref_o).norm() / ref_o.norm().clamp_min(1e-30)
    assert err < TOL[q.dtype], f"relative error {err:.3e}"
    assert not torch.isnan(o).any() and not torch.isnan(lse).any()
    assert torch.equal(torch.isneginf(lse), torch.isneginf(ref_lse)), "rows without keys differ"
    fin = torch.isfinite(ref_lse)
    torch.testing.assert_close(lse[fin], ref_lse[fin], rtol=0, atol=2e-3)


def check_all(base, q, k, v, causal, schedule="pipelined", options=None, **kw):
    o, lse = run(q, k, v, causal=causal, schedule=schedule, options=options, **kw)
    check_reference(o, lse, q, k, v, causal, **kw)
    chosen = kernel_options(schedule, q.shape[-1], options)
    bo, blse = run_baseline(base, q, k, v, causal, fast_exp2=chosen.get("fast_exp2", False), block_n=chosen.get("block_n", 0),
                            **kw)
    assert_bitwise(o, bo, name="o vs baseline")
    assert_bitwise(lse, blse, name="lse vs baseline")
    return o, lse


@pytest.mark.parametrize("dtype,d,causal", [
    (torch.bfloat16, 64, False), (torch.bfloat16, 64, True), (torch.bfloat16, 128, False),
    (torch.bfloat16, 128, True), (torch.bfloat16, 256, False), (torch.bfloat16, 256, True),
    (torch.float16, 128, False), (torch.float16, 128, True)])
@pytest.mark.parametrize("schedule", ["pipelined", "overlap"])
def test_matches_reference_and_baseline(attention_baseline, dtype, d, causal, schedule):
    b, s, h, hk = 2, 1000, 8, 2  # GQA, a partial last tile
    q, k, v = randn((b, s, h, d), dtype, 1), randn((b, s, hk, d), dtype, 2), randn((b, s, hk, d), dtype, 3)
    check_all(attention_baseline, q, k, v, causal, schedule=schedule)


# the candidates bench/attention_prefill.py --sweep times (same bits: the rows' arithmetic and
# its order do not depend on the consumer count, the stages, the warpgroups' turns, the tiles'
# order or where the instructions are scheduled (pinned_softmax); a fast exp2 candidate is held to
# the baseline built with fast_exp2: check_all)
@pytest.mark.parametrize("d,options", [(64, {"consumers": 3}), (64, {"consumers": 3, "pingpong": True}),
                                       (64, {"pingpong": True}), (128, {"pingpong": True}), (128, {"num_stages": 3}),
                                       (256, {"pingpong": True}), (64, {"consumers": 3, "fast_exp2": True}),
                                       (128, {"num_stages": 3, "fast_exp2": True}), (256, {"fast_exp2": True}),
                                       (64, {"consumers": 3, "heavy_first": True}),
                                       (128, {"num_stages": 3, "fast_exp2": True, "heavy_first": True}),
                                       (64, {"consumers": 3, "fast_exp2": True, "pinned_softmax": True}),
                                       (128, {"num_stages": 3, "fast_exp2": True, "pinned_softmax": True}),
                                       (128, {"num_stages": 3, "fast_exp2": True, "pinned_softmax": True, "pingpong": True}),
                                       (256, {"block_n": 80, "fast_exp2": True, "lazy_rescale": True,
                                              "pinned_softmax": True})], ids=str)
@pytest.mark.parametrize("causal", [False, True])
def test_overlap_candidates_match_baseline(attention_baseline, d, options, causal):
    b, s, h, hk = 2, 1000, 8, 2  # GQA, a partial last tile (of 128 and of 192 rows)
    q, k, v = (randn((b, s, n, d), torch.bfloat16, seed) for n, seed in ((h, 7), (hk, 8), (hk, 9)))
    check_all(attention_baseline, q, k, v, causal, schedule="overlap", options=options)


@pytest.mark.parametrize("schedule", ["pipelined", "overlap"])
def test_fast_exp2_flushes_as_the_baseline(attention_baseline, schedule):
    """Where the two exp2 differ, through CUDA-core arithmetic only: at scale_log2 = 1 the first key
    block's scores are 0 (p = 1, v = 2^100: O = 2^107), the second block's first key scores 130
    with v = 0 and its other keys score 0 with v = 0, so the rescale factor alpha = exp2(-130) is
    below 2^-126. exp2f keeps it (o = 2^107 * 2^-130 / l = 2^-23); ex2.approx.ftz flushes it (o =
    0). The subnormal never enters a tensor-core product (P V adds exact zeros), so the outcome
    does not hang on how wgmma treats subnormal inputs. With either choice the kernel and the
    baseline built with the same ``fast_exp2`` agree bit for bit."""
    b, s, h, d = 1, 256, 2, 128  # two key blocks of 128 (block_n_for(128))
    q = randn((b, s, h, d), torch.bfloat16, 31)
    q[..., 1] = 130.0
    k = torch.zeros((b, s, h, d), dtype=torch.bfloat16, device="cuda")
    k[:, 128, :, 1] = 1.0  # score 130 for key 128, 0 for every other key
    v = torch.zeros((b, s, h, d), dtype=torch.bfloat16, device="cuda")
    v[:, :128] = 2.0 ** 100
    scale = 1 / LOG2E  # scale_log2 = 1 (rounded to fp32)
    outs = {}
    for fast in (False, True):
        o, lse = run(q, k, v, causal=False, softmax_scale=scale, schedule=schedule, options={"fast_exp2": fast})
        bo, blse = run_baseline(attention_baseline, q, k, v, False, softmax_scale=scale, fast_exp2=fast)
        assert_bitwise(o, bo, name=f"o vs baseline (fast_exp2={fast})")
        assert_bitwise(lse, blse, name=f"lse vs baseline (fast_exp2={fast})")
        outs[fast] = o
    assert int(outs[True].count_nonzero()) == 0, "ex2.approx.ftz: alpha flushed, o = 0"
    assert torch.equal(outs[False].float(), torch.full_like(outs[False], 2.0 ** -23, dtype=torch.float32)), \
        "exp2f: alpha = 2^-130 kept, o = 2^-23"


PERSISTENT = [(64, {"consumers": 3, "fast_exp2": True, "persistent": True}),
              (128, {"fast_exp2": True, "persistent": True}),  # its own output tile: Q freed after the last Q K^T
              (128, {"num_stages": 3, "fast_exp2": True, "persistent": True}),  # the output through Q's tile
              (256, {"block_n": 80, "fast_exp2": True, "persistent": True})]


@pytest.mark.parametrize("dim, options", PERSISTENT, ids=str)
@pytest.mark.parametrize("causal", [False, True])
def test_persistent_grid_matches_baseline(attention_baseline, dim, options, causal):
    """A grid of one CTA a SM walking the tiles (several a CTA here: 4 x 8 x 16 = 512 tiles of 128
    rows at d 128) gives the baseline's bits, also over a varlen batch with empty sequences
    (tiles without keys or rows), where the K/V ring's phases run on across tiles of different
    block counts."""
    b, s, h, hk = 4, 1000, 16, 4
    q, k, v = (randn((b, s, n, dim), torch.bfloat16, seed) for n, seed in ((h, 27), (hk, 28), (hk, 29)))
    check_all(attention_baseline, q, k, v, causal, schedule="overlap", options=options)
    lens_q = [0, 5, 0, 300, 129, 0, 1000, 1] * 4
    lens_k = [3, 5, 0, 300, 200, 0, 900, 64] * 4
    q, k, v, cu_q, cu_k = varlen_inputs(lens_q, lens_k, 8, 2, dim, 40)
    check_all(attention_baseline, q, k, v, causal, "overlap", options=options, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k)


@pytest.mark.parametrize("dim, options", [(128, {"block_n": 176}), (128, {"block_n": 176, "fast_exp2": True}),
                                          (256, {"block_n": 80}), (256, {"block_n": 80, "fast_exp2": True})], ids=str)
@pytest.mark.parametrize("causal", [False, True])
def test_other_key_blocks_match_reference_and_baseline(attention_baseline, dim, options, causal):
    """176 keys a block at d 128, 80 at d 256 (sweep candidates; other blocks than the default's,
    so other bits): within tolerance of the reference, and bit for bit the baseline built with
    the same block, on GQA with a partial last tile and a partial last key block."""
    b, s, h, hk = 2, 1000, 8, 2
    q, k, v = (randn((b, s, n, dim), torch.bfloat16, seed) for n, seed in ((h, 17), (hk, 18), (hk, 19)))
    check_all(attention_baseline, q, k, v, causal, schedule="overlap", options=options)


@pytest.mark.parametrize("h,hk", [(4, 4), (8, 1), (16, 4)])  # MHA, MQA, GQA
def test_head_layouts(attention_baseline, h, hk):
    q, k, v = randn((1, 300, h, 128), torch.bfloat16, 4), randn((1, 300, hk, 128), torch.bfloat16, 5), randn((1, 300, hk, 128), torch.bfloat16, 6)
    check_all(attention_baseline, q, k, v, False)


@pytest.mark.parametrize("schedule", ["pipelined", "overlap"])
@pytest.mark.parametrize("s_q,s_k", [(1, 1), (127, 127), (4001, 4001), (127, 300), (300, 127), (1, 4001)])
def test_awkward_lengths_causal(attention_baseline, s_q, s_k, schedule):
    q, k, v = randn((1, s_q, 4, 128), torch.bfloat16, 7), randn((1, s_k, 2, 128), torch.bfloat16, 8), randn((1, s_k, 2, 128), torch.bfloat16, 9)
    check_all(attention_baseline, q, k, v, True, schedule=schedule)


def test_long_sequence(attention_baseline):
    q, k, v = (randn((1, 16384, hh, 128), torch.bfloat16, i) for i, hh in ((10, 2), (11, 1), (12, 1)))
    for causal in (False, True):
        check_all(attention_baseline, q, k, v, causal)


def test_model_shape_64k_tokens(attention_baseline):
    """b * s = 64k tokens (b 16, s 4096), h 8, kv heads 2, causal."""
    q, k, v = randn((16, 4096, 8, 128), torch.bfloat16, 13), randn((16, 4096, 2, 128), torch.bfloat16, 14), randn((16, 4096, 2, 128), torch.bfloat16, 15)
    check_all(attention_baseline, q, k, v, True)


def test_softmax_scale(attention_baseline):
    q, k, v = randn((2, 200, 4, 64), torch.bfloat16, 16), randn((2, 200, 4, 64), torch.bfloat16, 17), randn((2, 200, 4, 64), torch.bfloat16, 18)
    check_all(attention_baseline, q, k, v, False, softmax_scale=0.3)


def varlen_inputs(lens_q, lens_k, h, hk, d, seed):
    cu_q = torch.tensor([0, *torch.tensor(lens_q).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
    cu_k = torch.tensor([0, *torch.tensor(lens_k).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
    q = randn((int(cu_q[-1]), h, d), torch.bfloat16, seed)
    k, v = randn((int(cu_k[-1]), hk, d), torch.bfloat16, seed + 1), randn((int(cu_k[-1]), hk, d), torch.bfloat16, seed + 2)
    return q, k, v, cu_q, cu_k


@pytest.mark.parametrize("schedule", ["pipelined", "overlap"])
@pytest.mark.parametrize("causal", [False, True])
def test_varlen_with_empty_sequences(attention_baseline, causal, schedule):
    lens_q = [0, 5, 0, 300, 129, 0, 1000, 1]
    lens_k = [3, 5, 0, 300, 200, 0, 900, 64]
    q, k, v, cu_q, cu_k = varlen_inputs(lens_q, lens_k, 8, 2, 128, 20)
    check_all(attention_baseline, q, k, v, causal, schedule, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k)


@pytest.mark.parametrize("causal", [False, True])
def test_batch_invariance(causal):
    """A sequence's bits are the same alone and inside a varlen batch of 64 sequences."""
    g = torch.Generator().manual_seed(21)
    lens = torch.randint(1, 700, (64,), generator=g).tolist()
    q, k, v, cu_q, cu_k = varlen_inputs(lens, lens, 8, 2, 128, 22)
    o, lse = run(q, k, v, causal=causal, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k)
    for i in (0, 17, 63):
        a, e = int(cu_q[i]), int(cu_q[i + 1])
        one = torch.tensor([0, e - a], dtype=torch.int32, device="cuda")
        o1, lse1 = run(q[a:e].contiguous(), k[a:e].contiguous(), v[a:e].contiguous(), causal=causal, cu_seqlens_q=one, cu_seqlens_k=one)
        assert_bitwise(o1, o[a:e], name=f"sequence {i} alone vs in the batch")
        assert_bitwise(lse1, lse[:, a:e].contiguous(), name=f"lse of sequence {i}")


@pytest.mark.parametrize("schedule", ["pipelined", "overlap"])
def test_deterministic_100_runs(schedule):
    q, k, v = randn((2, 1024, 8, 128), torch.bfloat16, 30), randn((2, 1024, 2, 128), torch.bfloat16, 31), randn((2, 1024, 2, 128), torch.bfloat16, 32)
    o0, lse0 = dense_attention(q, k, v, causal=True, schedule=schedule)
    o0, lse0 = o0.clone(), lse0.clone()
    for _ in range(100):
        o, lse = dense_attention(q, k, v, causal=True, schedule=schedule)
        assert torch.equal(o.view(torch.int16), o0.view(torch.int16)) and torch.equal(lse.view(torch.int32), lse0.view(torch.int32))


@pytest.mark.parametrize("part,count", [("forward", 4), ("backward", 4), ("sparse", 2)])
def test_compute_sanitizer_memcheck(part, count):
    """The prefill kernels at tail shapes (empty sequences, partial tiles, s_q != s_k; the sparse
    forward with n not a multiple of its key block, masked and out-of-range slots, the window)
    under memcheck: ``sanitize_attention.py``'s part."""
    import os
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    tool = shutil.which("compute-sanitizer") or "/usr/local/cuda/bin/compute-sanitizer"
    if not os.path.exists(tool):
        pytest.skip("compute-sanitizer not installed")
    script = Path(__file__).with_name("sanitize_attention.py")
    root = Path(R.__file__).parents[2]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]))
    # the part's kernels are built (and run once) outside the sanitizer first: compiled at first use
    # under it, the forward and backward parts outlasted a device call (2026-12-02)
    warm = subprocess.run([sys.executable, str(script), part], capture_output=True, text=True, env=env, timeout=600)
    assert warm.returncode == 0, (warm.stdout + warm.stderr)[-8000:]
    proc = subprocess.run([tool, "--tool", "memcheck", "--error-exitcode", "3", sys.executable, str(script), part],
                          capture_output=True, text=True, env=env, timeout=600)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-8000:]
    assert "ERROR SUMMARY: 0 errors" in out
    assert f"ran {count} operations" in out
