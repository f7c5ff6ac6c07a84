"""DeepSeek-V4 sparse attention backward. CPU: its kernels compile for sm_90a without atomics, with
deterministic and batch-invariant verdicts and no launch condition beyond their assume lists; the
algorithm (per-slot rows G summed through the inverse index, in chunks of tokens) written in torch
equals autograd of the fp32 reference; bad arguments are named. GPU: the gradients match autograd
of the fp32 reference (masked slots, a token with every slot masked, keys named by many tokens,
keys named by none, the window branch), every output element is written (poisoned with NaN
first), 100 runs give the same bits, and neither the batch nor the token chunking changes them."""

import math

import pytest
import torch

from kernels.attention import reference as R
from kernels.attention import sparse_bwd as M
from kernels.attention.sparse_bwd import (backward_kernels, inverse_index, key_ranges, sparse_attention_backward,
                                          sparse_bwd_dkv_kernel, sparse_bwd_token_kernel)

SCALE = 1.0 / math.sqrt(512)


@pytest.mark.parametrize("h,k,window", [(64, 512, 0), (128, 512, 64)])
def test_kernels_compile_deterministic(h, k, window, derived_preconditions):
    kernels = backward_kernels(h, k, window, SCALE)
    for kernel in kernels:
        assert derived_preconditions(kernel) == []
        assert "atomic" not in kernel.device_source.lower()
        report = kernel.metadata["reports"]["determinism"]
        assert (report["deterministic"], report["batch_invariant"], report["findings"]) == (True, True, [])
    src = kernels[2].device_source
    # S and dP: 2 x m64n16 (one per warpgroup), dQ += dS' KV: 2 x m64n256, G: m16n8k16 from shared
    assert "kFloat32, 64, 16, 16, false, false" in src and "kFloat32, 64, 256, 16, false, true" in src
    assert "kFloat32, 16, 8, 16, false, true" in src
    assert "exp2f(__fmaf_rn(acc_s" in src


def _model_backward(q, kv, idx, sink, do, scale, chunk_tokens):
    """sparse_bwd.py's algorithm in fp32 torch: per-slot rows G, dkv summed key by key over the
    inverse index in chunks of ``chunk_tokens`` tokens, entries in ascending order."""
    b, s, h, d = q.shape
    n, k = kv.shape[1], idx.shape[2]
    o, lse = R.sparse_attention_ref(q, kv, idx, sink, softmax_scale=scale)
    ok = (idx >= 0) & (idx < n)
    rows = torch.stack([kv[i, idx[i].clamp(0, n - 1).long()] for i in range(b)])  # b, s, k, d
    logits = (torch.einsum("bshd,bskd->bshk", q, rows) * scale).masked_fill(~ok[:, :, None, :], float("-inf"))
    p = torch.exp(logits - lse[..., None])
    delta = (o * do).sum(-1)
    ds = p * (torch.einsum("bshd,bskd->bshk", do, rows) - delta[..., None]) * scale
    dq = torch.einsum("bshk,bskd->bshd", ds, rows)
    g = (torch.einsum("bshk,bshd->bskd", ds, q) + torch.einsum("bshk,bshd->bskd", p, do)).reshape(b, s * k, d)
    dsink = -(torch.exp(sink - lse) * delta).sum((0, 1))
    entries, sort_keys = inverse_index(idx, n, k, 0)
    dkv = torch.zeros_like(kv)
    for s0 in range(0, s, chunk_tokens):
        lo, hi = key_ranges(sort_keys, n, s * k, s0 * k, min(s, s0 + chunk_tokens) * k)
        for i in range(b):
            for key in range(n):
                for e in entries[i, lo[i, key]:hi[i, key]].tolist():
                    assert s0 * k <= e < (s0 + chunk_tokens) * k
                    dkv[i, key] += g[i, e]
    return dq, dkv, dsink


def test_algorithm_matches_autograd_of_reference():
    """Masked slots (-1 and past the cache), a token with every slot masked, an index repeated in
    a token and across tokens, a key named by none, two chunks of unequal size."""
    g = torch.Generator().manual_seed(1)
    b, s, h, n, k, d = 2, 7, 3, 9, 6, 16
    q, kv, do = (torch.randn(shape, generator=g) for shape in ((b, s, h, d), (b, n, d), (b, s, h, d)))
    sink = torch.randn(h, generator=g)
    idx = torch.randint(0, n - 1, (b, s, k), generator=g, dtype=torch.int32)  # key n - 1: named by none
    idx[0, 2] = -1
    idx[1, 3, :2] = torch.tensor([-1, n + 4])
    idx[1, 4, 1] = idx[1, 4, 0]
    leaves = [t.clone().requires_grad_() for t in (q, kv, sink)]
    o, _ = R.sparse_attention_ref(leaves[0], leaves[1], idx, leaves[2], softmax_scale=0.3)
    o.backward(do)
    got = _model_backward(q, kv, idx, sink, do, 0.3, chunk_tokens=4)
    for name, a, ref in zip(("dq", "dkv", "dsink"), got, (t.grad for t in leaves)):
        torch.testing.assert_close(a, ref, rtol=1e-4, atol=1e-5, msg=name)
    assert torch.equal(got[1][:, n - 1], torch.zeros_like(got[1][:, n - 1]))


def test_inverse_index_order():
    """Each key's entries are its (token, slot) positions ascending; masked slots are in no range."""
    idx = torch.tensor([[[3, -1, 3], [0, 3, 7], [2, 2, 0]]], dtype=torch.int32)  # 7 >= n: masked
    n, slots, offset = 5, 4, 1  # scratch rows of 4 slots a token, this branch from slot 1
    entries, sort_keys = inverse_index(idx, n, slots, offset)
    lo, hi = key_ranges(sort_keys, n, 3 * slots, 0, 3 * slots)
    expect = {0: [1 * 4 + 1, 2 * 4 + 3], 1: [], 2: [2 * 4 + 1, 2 * 4 + 2], 3: [1, 3, 1 * 4 + 2], 4: []}
    assert {key: entries[0, lo[0, key]:hi[0, key]].tolist() for key in range(n)} == expect
    lo, hi = key_ranges(sort_keys, n, 3 * slots, 1 * slots, 2 * slots)  # the second token only
    assert {key: entries[0, lo[0, key]:hi[0, key]].tolist() for key in range(n)} == {0: [5], 1: [], 2: [], 3: [6], 4: []}


def test_bad_arguments_are_named():
    q = torch.randn(1, 4, 64, 512, dtype=torch.bfloat16)
    kv = torch.randn(1, 100, 512, dtype=torch.bfloat16)
    idx = torch.zeros(1, 4, 512, dtype=torch.int32)
    sink, lse = torch.zeros(64), torch.zeros(1, 4, 64)
    with pytest.raises(TypeError, match="indices: expected an int32 tensor, got torch.int64"):
        sparse_attention_backward(q, kv, idx.long(), sink, q, lse, q)
    with pytest.raises(ValueError, match="q: head count expected one of \\(64, 128\\), got 32"):
        q32 = q[:, :, :32].contiguous()
        sparse_attention_backward(q32, kv, idx, sink[:32], q32, lse[..., :32].contiguous(), q32)
    with pytest.raises(ValueError, match="q: head dim expected 512, got 256"):
        q256 = q[..., :256].contiguous()
        sparse_attention_backward(q256, kv, idx, sink, q256, lse, q256)
    with pytest.raises(ValueError, match="indices: top-k expected one of"):
        sparse_attention_backward(q, kv, idx[..., :256].contiguous(), sink, q, lse, q)
    with pytest.raises(ValueError, match="kv: shape\\[0\\] expected 1"):
        sparse_attention_backward(q, torch.cat([kv, kv]), idx, sink, q, lse, q)
    with pytest.raises(ValueError, match="sink: shape\\[0\\] expected 64"):
        sparse_attention_backward(q, kv, idx, torch.zeros(32), q, lse, q)
    with pytest.raises(ValueError, match="o: expected the shape of q"):
        sparse_attention_backward(q, kv, idx, sink, q[:, :2].contiguous(), lse, q)
    with pytest.raises(TypeError, match="do: expected dtype"):
        sparse_attention_backward(q, kv, idx, sink, q, lse, q.half())
    with pytest.raises(ValueError, match="lse: expected shape \\(1, 4, 64\\)"):
        sparse_attention_backward(q, kv, idx, sink, q, lse[:, :2].contiguous(), q)
    with pytest.raises(TypeError, match="lse: expected dtype"):
        sparse_attention_backward(q, kv, idx, sink, q, lse.bfloat16(), q)
    with pytest.raises(ValueError, match="window_kv, window_indices: expected both or neither"):
        sparse_attention_backward(q, kv, idx, sink, q, lse, q, window_kv=kv)
    with pytest.raises(ValueError, match="window_indices: expected \\[1, 4, a multiple of 64\\]"):
        sparse_attention_backward(q, kv, idx, sink, q, lse, q, window_kv=kv, window_indices=idx[..., :48].contiguous())
    with pytest.raises(ValueError, match="out: expected a tuple of 3 tensors"):
        sparse_attention_backward(q, kv, idx, sink, q, lse, q, out=(q, kv))
    with pytest.raises(ValueError, match="out\\[1\\]: expected shape \\(1, 100, 512\\)"):
        sparse_attention_backward(q, kv, idx, sink, q, lse, q, out=(q, kv[:, :50].contiguous(), sink))
    with pytest.raises(ValueError, match="q: expected a CUDA tensor"):
        sparse_attention_backward(q, kv, idx, sink, q, lse, q)
    with pytest.raises(ValueError, match="heads: expected one of \\(64, 128\\), got 96"):
        sparse_bwd_token_kernel(96, 512, 0, 1.0, 1.0)
    with pytest.raises(ValueError, match="topk: expected a positive multiple of 32"):
        sparse_bwd_token_kernel(64, 100, 0, 1.0, 1.0)
    with pytest.raises(ValueError, match="groups: expected 1 or 2"):
        sparse_bwd_dkv_kernel(3)


# ---- GPU -----------------------------------------------------------------------------------------
TOL = 2e-2  # ||g - ref|| / ||ref||: P and dS are rounded to bf16 before their GEMMs, dq and dkv to bf16


def _inputs(b, s, h, n, k, seed, masked=0.1, named=None):
    """Random bf16 inputs; indices drawn from the first ``named`` keys (default all ``n``): with
    ``named`` << s k / 2, every drawn key is named by many (token, slot) pairs, the rest by none."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn((b, s, h, 512), generator=g, device="cuda").to(torch.bfloat16)
    kv = torch.randn((b, n, 512), generator=g, device="cuda").to(torch.bfloat16)
    idx = torch.randint(0, named or n, (b, s, k), generator=g, device="cuda", dtype=torch.int32)
    idx[torch.rand((b, s, k), generator=g, device="cuda") < masked] = -1
    sink = torch.randn((h,), generator=g, device="cuda")
    do = torch.randn((b, s, h, 512), generator=g, device="cuda").to(torch.bfloat16)
    return q, kv, idx, sink, do


def _window(b, s, n_w, w):
    """The last ``w`` rows of a window cache of ``n_w`` before each token (-1 before its start)."""
    pos = torch.arange(s, device="cuda")[:, None] + n_w - s - torch.arange(w, device="cuda")[None, :]
    widx = torch.where(pos >= 0, pos, -1).to(torch.int32)[None].expand(b, -1, -1).contiguous()
    return torch.randn((b, n_w, 512), device="cuda").to(torch.bfloat16), widx


def _backward(q, kv, idx, sink, do, **window):
    """The forward, then the backward into outputs poisoned with NaN."""
    from kernels.attention.sparse_fwd import sparse_attention

    o, lse = sparse_attention(q, kv, idx, sink, **window)
    likes = [q, kv, sink] + ([window["window_kv"]] if window else [])
    out = tuple(torch.full_like(t, float("nan")) for t in likes)
    returned = sparse_attention_backward(q, kv, idx, sink, o, lse, do, out=out, **window)
    assert len(returned) == len(out) and all(r is t for r, t in zip(returned, out))
    return out


def _reference(q, kv, idx, sink, do, window_kv=None, window_indices=None):
    leaves = [t.detach().float().requires_grad_() for t in ((q, kv, sink) + ((window_kv,) if window_kv is not None else ()))]
    o, _ = R.sparse_attention_ref(leaves[0], leaves[1], idx, leaves[2], window_kv=leaves[3] if window_kv is not None else None,
                                  window_indices=window_indices)
    o.backward(do.float())
    return [t.grad for t in leaves]


def _check(grads, refs):
    for name, g, r in zip(("dq", "dkv", "dsink", "dwindow_kv"), grads, refs):
        assert not torch.isnan(g).any(), f"{name} has NaN (an element not written)"
        err = (g.float() - r).norm() / r.norm().clamp_min(1e-30)
        assert err < TOL, f"{name}: relative error {err:.3e}"


@pytest.mark.gpu
@pytest.mark.parametrize("h,k", [(64, 512), (128, 512), (64, 1024), (128, 1024)])
def test_matches_reference(h, k):
    """Keys 0..599 named about 2 x 48 x k / 600 times each, keys 600..699 by none (dkv 0); token 0
    of batch 0 has every slot masked (dq 0); slots past the cache and a repeated index."""
    q, kv, idx, sink, do = _inputs(2, 48, h, 700, k, 3 * h + k, named=600)
    idx[0, 0] = -1
    idx[1, 3, :5] = kv.shape[1] + 7
    idx[1, 4, 1] = idx[1, 4, 0]
    grads = _backward(q, kv, idx, sink, do)
    _check(grads, _reference(q, kv, idx, sink, do))
    dq, dkv = grads[0], grads[1]
    assert torch.equal(dq[0, 0], torch.zeros_like(dq[0, 0]))
    assert torch.equal(dkv[:, 600:], torch.zeros_like(dkv[:, 600:]))


@pytest.mark.gpu
def test_window_branch():
    q, kv, idx, sink, do = _inputs(2, 40, 64, 500, 512, 21, named=400)
    wkv, widx = _window(2, 40, 200, 128)
    grads = _backward(q, kv, idx, sink, do, window_kv=wkv, window_indices=widx)
    assert len(grads) == 4
    _check(grads, _reference(q, kv, idx, sink, do, window_kv=wkv, window_indices=widx))
    # window rows before the first token's window are named by none
    assert torch.equal(grads[3][:, :200 - 40 - 127], torch.zeros_like(grads[3][:, :200 - 40 - 127]))


@pytest.mark.gpu
def test_deterministic_100_runs():
    """The same bits on 100 runs, the outputs poisoned with NaN before each."""
    q, kv, idx, sink, do = _inputs(1, 32, 128, 2048, 1024, 11, named=512)
    first = _backward(q, kv, idx, sink, do)
    for _ in range(100):
        for g, g0 in zip(_backward(q, kv, idx, sink, do), first):
            assert torch.equal(g.view(torch.int32 if g.dtype == torch.float32 else torch.int16),
                               g0.view(torch.int32 if g0.dtype == torch.float32 else torch.int16))


@pytest.mark.gpu
def test_batch_and_chunking_do_not_change_bits(monkeypatch):
    """A batch element's dq and dkv are those of that element alone; the scratch split into chunks
    of 5 tokens (8 chunks, the last of 3) gives the bits of one chunk, dsink included."""
    q, kv, idx, sink, do = _inputs(2, 38, 64, 600, 512, 5, named=300)
    whole = _backward(q, kv, idx, sink, do)
    alone = _backward(q[1:].contiguous(), kv[1:].contiguous(), idx[1:].contiguous(), sink, do[1:].contiguous())
    assert torch.equal(whole[0][1:].view(torch.int16), alone[0].view(torch.int16))
    assert torch.equal(whole[1][1:].view(torch.int16), alone[1].view(torch.int16))
    monkeypatch.setattr(M, "SCRATCH_ELEMENTS", 2 * 512 * 1 * 512 * 5)  # b x slots x groups x 512 x 5 tokens
    chunked = _backward(q, kv, idx, sink, do)
    for g, g0 in zip(chunked, whole):
        assert torch.equal(g.view(torch.int32 if g.dtype == torch.float32 else torch.int16),
                           g0.view(torch.int32 if g0.dtype == torch.float32 else torch.int16))
