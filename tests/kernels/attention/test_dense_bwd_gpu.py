"""Dense attention backward on the GPU: close to the gradients of the torch fp32 reference
(autograd), every gradient element written, and the same bits on 100 runs."""

import pytest
import torch

from kernels.attention import reference as R
from kernels.attention.dense_bwd import (FUSED_FAST_EXP2_TILES, FUSED_TILES, SINGLE_WARPGROUP_TILES, SPLIT_WIDE_DQ_TILES,
                                        TWO_WARPGROUP_TILES, WIDE_DQ_TILES, dense_attention_backward)
from kernels.attention.dense_fwd import dense_attention

pytestmark = pytest.mark.gpu

TOL = 2e-2  # ||g - ref|| / ||ref||: P and dS are rounded to bf16 before their GEMMs


def randn(shape, seed, dtype=torch.bfloat16):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return torch.randn(shape, generator=g, device="cuda", dtype=torch.float32).to(dtype)


def reference_grads(q, k, v, do, causal, cu_q=None, cu_k=None):
    qf, kf, vf = (t.float().requires_grad_() for t in (q, k, v))
    o, _ = R.dense_attention_ref(qf, kf, vf, causal, None, cu_q, cu_k)
    o.backward(do.float())
    return qf.grad, kf.grad, vf.grad


def varlen(lens_q, lens_k):
    """``cu_seqlens_q``, ``cu_seqlens_k`` of sequences of these lengths."""
    return (torch.tensor([0, *torch.tensor(lens_q).cumsum(0).tolist()], dtype=torch.int32, device="cuda"),
            torch.tensor([0, *torch.tensor(lens_k).cumsum(0).tolist()], dtype=torch.int32, device="cuda"))


def check(q, k, v, causal, cu_q=None, cu_k=None, seed=0, tiles=None):
    """Every gradient within TOL of the reference's; the outputs are poisoned with NaN first, so
    an element the kernels do not write fails."""
    kw = dict(causal=causal, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k)
    o, lse = dense_attention(q, k, v, **kw)
    do = randn(q.shape, seed + 100)
    grads = tuple(torch.full_like(t, float("nan")) for t in (q, k, v))
    dense_attention_backward(do, q, k, v, o, lse, out=grads, tiles=tiles, **kw)
    refs = reference_grads(q, k, v, do, causal, cu_q, cu_k)
    for name, g, r in zip(("dq", "dk", "dv"), grads, refs):
        assert not torch.isnan(g).any(), f"{name} has NaN"
        err = (g.float() - r).norm() / r.norm().clamp_min(1e-30)
        assert err < TOL, f"{name}: relative error {err:.3e}"
    return grads


@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("causal", [False, True])
def test_matches_reference_gqa(d, causal):
    """GQA, 4 query heads per kv head: dK and dV sum over the group (d 256: two dK/dV kernels)."""
    q, k, v = randn((2, 500, 8, d), 1), randn((2, 500, 2, d), 2), randn((2, 500, 2, d), 3)
    check(q, k, v, causal)


@pytest.mark.parametrize("h,hk", [(4, 4), (8, 1)])
def test_head_layouts(h, hk):
    q, k, v = randn((1, 300, h, 128), 4), randn((1, 300, hk, 128), 5), randn((1, 300, hk, 128), 6)
    check(q, k, v, True)


@pytest.mark.parametrize("causal", [False, True])
def test_varlen_empty_and_unequal(causal):
    """Empty sequences, s_q < s_k, keys no query sees (their dK, dV must be written as 0)."""
    cu_q, cu_k = varlen([0, 5, 300, 129, 1], [3, 5, 300, 200, 70])
    q = randn((int(cu_q[-1]), 8, 128), 7)
    k, v = randn((int(cu_k[-1]), 2, 128), 8), randn((int(cu_k[-1]), 2, 128), 9)
    _, dk, dv = check(q, k, v, causal, cu_q, cu_k)
    assert torch.equal(dk[:3], torch.zeros_like(dk[:3])) and torch.equal(dv[:3], torch.zeros_like(dv[:3]))


@pytest.mark.parametrize("d", [128, 256])
def test_deterministic_100_runs(d):
    q, k, v = randn((2, 1024, 8, d), 10), randn((2, 1024, 2, d), 11), randn((2, 1024, 2, d), 12)
    o, lse = dense_attention(q, k, v, causal=True)
    do = randn(q.shape, 13)
    first = [g.clone() for g in dense_attention_backward(do, q, k, v, o, lse, causal=True)]
    for _ in range(100):
        for g, g0 in zip(dense_attention_backward(do, q, k, v, o, lse, causal=True), first):
            assert torch.equal(g.view(torch.int16), g0.view(torch.int16))


@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
def test_tiles_change_no_bits(d, causal):
    """Each gradient element is one k16 chain in ascending order whatever the block sizes: the
    candidates bench/attention_prefill.py --sweep times give the single-warpgroup tiles' bits (varlen
    with a partial last tile of 128, GQA)."""
    cu = torch.tensor([0, 300, 1000], dtype=torch.int32, device="cuda")
    q, k, v = randn((1000, 8, d), 20), randn((1000, 2, d), 21), randn((1000, 2, d), 22)
    kw = dict(causal=causal, cu_seqlens_q=cu, cu_seqlens_k=cu)
    o, lse = dense_attention(q, k, v, **kw)
    do = randn(q.shape, 23)
    first = dense_attention_backward(do, q, k, v, o, lse, tiles=SINGLE_WARPGROUP_TILES, **kw)
    for tiles in (TWO_WARPGROUP_TILES, WIDE_DQ_TILES, SPLIT_WIDE_DQ_TILES):
        for name, g, g0 in zip(("dq", "dk", "dv"), dense_attention_backward(do, q, k, v, o, lse, tiles=tiles, **kw), first):
            assert torch.equal(g.view(torch.int16), g0.view(torch.int16)), f"{name} differs with {tiles}"


@pytest.mark.parametrize("tiles", [FUSED_TILES, FUSED_FAST_EXP2_TILES], ids=["exp2f", "fast_exp2"])
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
def test_fused_matches_reference_and_repeats(d, causal, tiles):
    """The fused backward (dQ's shares added across key tiles in a fixed order) on a varlen GQA
    batch with an empty sequence, s_q != s_k both ways and partial tiles: within TOL of the
    reference; causal, dK and dV bit for bit the default's (the same walk; the fast exp2 differs
    from exp2f only below 2^-126, which random scores do not reach); 100 runs, one set of bits."""
    cu_q, cu_k = varlen([0, 5, 300, 129, 700, 1000], [3, 5, 300, 200, 900, 130])
    q = randn((int(cu_q[-1]), 8, d), 30)
    k, v = randn((int(cu_k[-1]), 2, d), 31), randn((int(cu_k[-1]), 2, d), 32)
    grads = check(q, k, v, causal, cu_q, cu_k, tiles=tiles)
    kw = dict(causal=causal, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k)
    o, lse = dense_attention(q, k, v, **kw)
    do = randn(q.shape, 100)  # check()'s seed + 100
    if causal:
        default = dense_attention_backward(do, q, k, v, o, lse, **kw)
        for name, g, g0 in zip(("dk", "dv"), grads[1:], default[1:]):
            assert torch.equal(g.view(torch.int16), g0.view(torch.int16)), f"{name} differs from the default's"
    for _ in range(100):
        for g, g0 in zip(dense_attention_backward(do, q, k, v, o, lse, tiles=tiles, **kw), grads):
            assert torch.equal(g.view(torch.int16), g0.view(torch.int16))


@pytest.mark.parametrize("causal", [False, True])
def test_fused_more_key_tiles_than_sms(causal):
    """A sequence of 20000 keys has 157 key tiles of 128, more CTAs than the GPU holds at once:
    a tile waits only on the tile above it, which starts first, so the call finishes (a wait that
    did not would trap after 10 s) with the reference's gradients."""
    q, k, v = randn((1, 20000, 2, 64), 40), randn((1, 20000, 1, 64), 41), randn((1, 20000, 1, 64), 42)
    check(q, k, v, causal, tiles=FUSED_TILES)
