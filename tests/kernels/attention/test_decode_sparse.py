"""Sparse MLA decode (kernels/attention/decode_sparse.py).

CPU: the split kernel compiles for sm_90a (bf16 / e4m3, k 512..2048) with wgmma, no atomics,
a producer warpgroup and 8-value gathers (bf16: 16-byte cp.async); bad input raises a clear error. GPU: within tolerance of the fp32
reference with -1 slots, slots past the token's visible keys, repeated indices, an attention
sink, every slot masked (o = 0, lse = the sink); with every visible key selected it equals dense
decode's reference; e4m3 = bf16 of the dequantized cache bit for bit; batch invariant; a visible
slot whose table entry lies past the cache makes that token NaN. Each for both consumer schedules
(independent: each consumer its own score tile; shared: one tile split between them)."""

import pytest
import torch

from kernels.attention.decode_mla import D_QK, PAGE, dequant_cache, mla_combine_kernel, reference_mla_decode
from kernels.attention.decode_sparse import (CONSUMERS, reference_sparse_mla_decode, sparse_mla_decode, sparse_split_kernel,
                                             splits_of)

from tests.kernels.attention.test_decode_mla import check_close, make_case, poisoned_outputs
from tlx.numerics.sweep import same_bits


@pytest.mark.parametrize("tokens, heads, topk, kv, consumers", [
    (1, 128, 2048, "bfloat16", "independent"), (2, 64, 512, "float8_e4m3", "independent"),
    (1, 16, 1024, "bfloat16", "independent"), (1, 128, 2048, "bfloat16", "shared"), (2, 16, 512, "float8_e4m3", "shared")])
def test_kernels_compile(tokens, heads, topk, kv, consumers):
    src = sparse_split_kernel(tokens, heads, topk, kv, D_QK ** -0.5, consumers).device_source
    assert "wgmma" in src and "atomic" not in src.lower()
    # shared: the score tile split between the consumers (m64n32), P V over all 512 columns
    # (two m64n256 halves); independent: each consumer's whole tile (m64n64)
    assert ("64, 32, 16" in src) == (consumers == "shared") and ("64, 64, 16" in src) == (consumers == "independent")
    # the producer's gathers move 8 values a thread: 16-byte predicated cp.async (bf16), 8-byte
    # loads (e4m3; per element, each waited for the slot's index and table entry: sparse e4m3
    # decode once ran 7x slower than bf16 on the H200)
    assert ("cp_async_gs_conditional<16>" if kv == "bfloat16" else "*(fp8_e4_8_t*)(KV + ") in src
    assert "setmaxnreg" in src or "warpgroup_reg_alloc" in src  # warp-specialized: the producer's registers go to the consumers
    assert "atomic" not in mla_combine_kernel(tokens, heads, splits_of(topk), True).device_source.lower()


def test_consumers_dequantize_kernel():
    """``dequant_by="consumers"``: the producer copies raw e4m3 rows by 16-byte cp.async (no
    register holds them), the consumers dequantize into the one bf16 tile; every access proven,
    no wgmma serialized, no spill (the raw gather's addresses spilled at 56 producer registers),
    no thread waits forever; only with an e4m3 cache and shared consumers."""
    import warnings

    from tests.kernels.attention.test_decode_mla import device_function
    from tlx.passes.progress import check_progress

    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # ptxas's serialized wgmma
        kernel = sparse_split_kernel(1, 128, 2048, "float8_e4m3", D_QK ** -0.5, "shared", 2048, "consumers")
    src = kernel.device_source
    assert "cp_async_gs_conditional<16>((&(((fp8_e4_t*)RAW_s)" in src and "cp_async_gs_conditional<4>((&(((float*)SC_s)" in src
    assert "*(fp8_e4_8_t*)(KV + " not in src  # no register-staged gather
    bounds = kernel.metadata["reports"]["bounds"]
    assert (bounds["unknown"], bounds["violations"], bounds["preconditions"]) == ([], [], [])
    assert bounds["proven"] == bounds["accesses"] > 0
    assert int(kernel.metadata["launches"][0]["dynamic_shared_memory"]) <= 232448
    report = check_progress(device_function(sparse_split_kernel, 1, 128, 2048, "float8_e4m3", D_QK ** -0.5, "shared", 2048,
                                            "consumers"))
    assert report.verdict == "ok", report.detail
    for kv, consumers in (("bfloat16", "shared"), ("float8_e4m3", "independent")):
        with pytest.raises(ValueError, match="dequant_by: expected one of"):
            sparse_split_kernel(1, 128, 2048, kv, D_QK ** -0.5, consumers, 2048, "consumers")


@pytest.mark.parametrize("consumers", CONSUMERS)
def test_producer_dequant_never_diverges_at_a_barrier(consumers):
    """The e4m3 producer's gather branches per slot on its visibility (its row, or zeros): no
    barrier may stand in those arms. TileLang's storage sync put a bar.sync in both of them with
    independent consumers, and a warp whose slots differed in visibility (a short sequence) hung
    there (H100, 2026-12-06): that build now takes no storage sync of TileLang's."""
    from tests.kernels.attention.test_decode_mla import device_function
    from tlx.passes.progress import check_progress

    report = check_progress(device_function(sparse_split_kernel, 2, 16, 512, "float8_e4m3", D_QK ** -0.5, consumers, 2048,
                                            "producer"))
    assert report.verdict == "ok", report.detail


def test_finishing_kernel():
    """``finish=True`` (one split, shared consumers: every default case): the split kernel writes
    bf16 rows and the final lse itself, by the combine's arithmetic (its IEEE steps and exp2 of
    ``lse_weight``), every access proven; it refuses several splits, the independent consumers,
    and a sink without finishing."""
    kernel = sparse_split_kernel(1, 128, 2048, "float8_e4m3", D_QK ** -0.5, "shared", 2048, "consumers", True, True)
    src = kernel.device_source
    assert "atomic" not in src.lower() and "bfloat16_t* __restrict__ OP" in src and "__fmaf_rn(" in src
    assert "__fdiv_rn(exp2f(__fmul_rn(__fsub_rn(" in src and "logf(" in src  # the combine's weight and lse
    bounds = kernel.metadata["reports"]["bounds"]
    assert (bounds["unknown"], bounds["violations"], bounds["preconditions"]) == ([], [], [])
    assert bounds["proven"] == bounds["accesses"] > 0
    with pytest.raises(ValueError, match="finish: expected one split and shared consumers, got 2 splits"):
        sparse_split_kernel(1, 128, 2048, "bfloat16", D_QK ** -0.5, "shared", 1024, "producer", True)
    with pytest.raises(ValueError, match="finish: expected one split and shared consumers, got 1 splits, independent"):
        sparse_split_kernel(1, 128, 2048, "bfloat16", D_QK ** -0.5, "independent", 2048, "producer", True)
    with pytest.raises(ValueError, match="with_sink: the sink joins in the kernel only with finish=True"):
        sparse_split_kernel(1, 128, 2048, "bfloat16", D_QK ** -0.5, "shared", 2048, "producer", False, True)


@pytest.mark.parametrize("kv, consumers", [("float8_e4m3", "independent"), ("bfloat16", "independent"),
                                           ("bfloat16", "shared")])
def test_every_access_proven_in_bounds(kv, consumers):
    """An index near 2^31 once wrapped in the visibility test (TileLang rewrote ``i <= seq - 2``
    into ``i + 2 <= seq``): the bounds pass left that int32 overflow unknown. bf16: the block
    table's load ran out of budget in the walk's shared solver after the new query loads' queries
    (proven alone; an unknown is now retried in a solver of its own)."""
    report = sparse_split_kernel(2, 64, 512, kv, D_QK ** -0.5, consumers).metadata["reports"]["bounds"]
    assert (report["unknown"], report["violations"], report["preconditions"]) == ([], [], [])
    assert report["proven"] == report["accesses"] > 0


def test_rejects_bad_input():
    q = torch.zeros(2, 1, 64, D_QK, dtype=torch.bfloat16)
    kv = torch.zeros(4, PAGE, D_QK, dtype=torch.bfloat16)
    bt, sl = torch.zeros(2, 3, dtype=torch.int32), torch.ones(2, dtype=torch.int32)
    idx = torch.zeros(2, 1, 512, dtype=torch.int32)
    with pytest.raises(ValueError, match="indices: expected"):
        sparse_mla_decode(q, kv, bt, sl, idx[:, :, :100].contiguous())
    with pytest.raises(TypeError, match="indices: expected dtype"):
        sparse_mla_decode(q, kv, bt, sl, idx.long())
    with pytest.raises(ValueError, match="consumers: expected one of"):
        sparse_mla_decode(q, kv, bt, sl, idx, consumers="both")
    with pytest.raises(ValueError, match="split_slots: expected one of"):
        sparse_mla_decode(q, kv, bt, sl, idx, split_slots=768)
    with pytest.raises(ValueError, match="dequant_by: expected one of"):
        sparse_mla_decode(q, kv, bt, sl, idx, dequant_by="both")
    with pytest.raises(ValueError, match="sink: expected shape"):
        sparse_mla_decode(q, kv, bt, sl, idx, sink=torch.zeros(32))
    with pytest.raises(ValueError, match="expected a CUDA tensor"):
        sparse_mla_decode(q, kv, bt, sl, idx, sink=torch.zeros(64))


def random_indices(seq_lens, tokens, topk, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    idx = torch.full((len(seq_lens), tokens, topk), -1, dtype=torch.int32, device="cuda")
    for i, s in enumerate(seq_lens):
        for t in range(tokens):
            n = min(topk, max(s - tokens + t + 1, 0))
            if n:
                idx[i, t, :n] = torch.randperm(s - tokens + t + 1, device="cuda", generator=g)[:n].to(torch.int32)
        idx[i] = idx[i][:, torch.randperm(topk, device="cuda", generator=g)]  # -1 slots anywhere
    return idx


@pytest.mark.gpu
@pytest.mark.parametrize("consumers", CONSUMERS)
@pytest.mark.parametrize("fp8", [False, True])
@pytest.mark.parametrize("tokens, heads, topk, split_slots", [(1, 128, 2048, 1024), (1, 128, 2048, 2048), (2, 16, 512, 1024)])
def test_reference(fp8, tokens, heads, topk, split_slots, consumers):
    seq_lens = [1, 63, 65, 4001, 0, 3000]
    q, kv, table, sl, scales = make_case(seq_lens, tokens=tokens, heads=heads, fp8=fp8, seed=topk)
    idx = random_indices(seq_lens, tokens, topk, seed=1)
    idx[3, 0, :5] = idx[3, 0, 5]  # a repeated index counts once per slot
    idx[5, 0, 7] = 5000  # past the sequence: masked
    sink = torch.randn(heads, device="cuda")
    o, lse = sparse_mla_decode(q, kv, table, sl, idx, sink=sink, kv_scales=scales, out=poisoned_outputs(q),
                               consumers=consumers, split_slots=split_slots)
    check_close(o, lse, *reference_sparse_mla_decode(q, kv, table, sl, idx, sink=sink, kv_scales=scales))
    assert torch.equal(lse[4], sink.expand_as(lse[4]))  # no keys: the sink alone
    assert bool((o[4] == 0).all())


@pytest.mark.gpu
def test_all_keys_selected_equals_dense_reference():
    seq_lens = [300, 2048]
    q, kv, table, sl, _ = make_case(seq_lens, tokens=1, heads=128, seed=2)
    idx = torch.full((2, 1, 2048), -1, dtype=torch.int32, device="cuda")
    idx[0, 0, :300] = torch.arange(300, dtype=torch.int32, device="cuda")
    idx[1, 0] = torch.arange(2048, dtype=torch.int32, device="cuda").flip(0)
    o, lse = sparse_mla_decode(q, kv, table, sl, idx)
    check_close(o, lse, *reference_mla_decode(q, kv, table, sl))


@pytest.mark.gpu
@pytest.mark.parametrize("consumers", CONSUMERS)
def test_fp8_equals_bf16_and_batch_invariance(consumers):
    g = torch.Generator().manual_seed(4)
    lens = [int(x) for x in torch.randint(1, 6000, (64,), generator=g)]
    q, kv, table, sl, scales = make_case(lens, tokens=2, heads=16, fp8=True, seed=6)
    idx = random_indices(lens, 2, 512, seed=3)
    sink = torch.randn(16, device="cuda")
    o8, l8 = sparse_mla_decode(q, kv, table, sl, idx, sink=sink, kv_scales=scales, consumers=consumers)
    o16, l16 = sparse_mla_decode(q, dequant_cache(kv, scales), table, sl, idx, sink=sink, consumers=consumers)
    assert torch.equal(o8.view(torch.int16), o16.view(torch.int16))
    assert torch.equal(l8.view(torch.int32), l16.view(torch.int32))
    for size in (1, 7, 64):
        o, lse = sparse_mla_decode(q[:size].contiguous(), kv, table[:size].contiguous(), sl[:size].contiguous(),
                                   idx[:size].contiguous(), sink=sink, kv_scales=scales, consumers=consumers)
        assert torch.equal(o[:1].view(torch.int16), o8[:1].view(torch.int16)), f"batch {size}"
        assert torch.equal(lse[:1].view(torch.int32), l8[:1].view(torch.int32)), f"batch {size}"


def guarded_case(tokens, heads, topk, fp8, seed, idx_seed):
    """A batch of six sequences (lengths 1 .. 4001 and an empty one) with the inputs the guards
    are for: masked slots whose would-be rows hold NaN (sequence 2) and a visible key on a page
    past the cache (sequence 5, whose token turns NaN). Returns (q, cache, table, seq_lens, scales,
    indices)."""
    seq_lens = [1, 63, 65, 4001, 0, 3000]
    q, cache, table, sl, scales = make_case(seq_lens, tokens=tokens, heads=heads, fp8=fp8, seed=seed)
    idx = random_indices(seq_lens, tokens, topk, seed=idx_seed)
    cache[table[2, 1].long(), 1:] = float("nan")  # past sequence 2's 65 keys: the rows of masked slots
    idx[2, 0, 0] = 100  # past sequence 2: masked, its row NaN
    table[5, 2] = cache.shape[0]  # a page of sequence 5 past the cache
    return q, cache, table, sl, scales, idx


@pytest.mark.gpu
@pytest.mark.parametrize("tokens, heads, topk", [(1, 128, 2048), (2, 16, 512)])
def test_consumers_dequantize_same_bits(tokens, heads, topk):
    """The consumers' dequant (raw rows by cp.async) gives the producer's dequantized values, so
    the same bits, with masked slots whose would-be rows hold NaN, a sink, and a table entry past
    the cache (that token NaN); and it is within tolerance of the reference."""
    q, kv, table, sl, scales, idx = guarded_case(tokens, heads, topk, True, seed=topk + 1, idx_seed=2)
    sink = torch.randn(heads, device="cuda")
    got = {by: sparse_mla_decode(q, kv, table, sl, idx, sink=sink, kv_scales=scales, out=poisoned_outputs(q), dequant_by=by)
           for by in ("producer", "consumers")}
    assert all(same_bits(a, b) for a, b in zip(got["producer"], got["consumers"]))
    o, lse = got["consumers"]
    assert bool(torch.isnan(o[5]).any())  # the token that selected a key of the bad page
    ok = [i for i in range(q.shape[0]) if i != 5]
    check_close(o[ok], lse[ok], *reference_sparse_mla_decode(q[ok], kv, table[ok], sl[ok], idx[ok], sink=sink, kv_scales=scales))


@pytest.mark.gpu
@pytest.mark.parametrize("kv", ["bfloat16", "float8_e4m3"])
@pytest.mark.parametrize("with_sink", [False, True])
def test_finishing_split_same_bits_as_combine(kv, with_sink):
    """One split (every default case) finishes in the split kernel: the same bits as the split's
    partials combined by ``mla_combine_kernel``, with rows of no visible key (o 0, lse the sink
    or -inf), masked slots over NaN rows and a table entry past the cache (that token NaN)."""
    tokens, heads = 2, 128
    q, cache, table, sl, scales, idx = guarded_case(tokens, heads, 512, kv == "float8_e4m3", seed=17, idx_seed=3)
    sink = torch.randn(heads, device="cuda") if with_sink else None
    combined = sparse_mla_decode(q, cache, table, sl, idx, sink=sink, kv_scales=scales, out=poisoned_outputs(q), finish=False)
    o, lse = sparse_mla_decode(q, cache, table, sl, idx, sink=sink, kv_scales=scales, out=poisoned_outputs(q))
    assert same_bits(o, combined[0]) and same_bits(lse, combined[1])
    assert bool(torch.isnan(o[5]).any()) and not bool(torch.isnan(o[:5]).any())
    assert bool((o[4] == 0).all()) and bool((lse[4] == (sink.expand(tokens, heads) if with_sink else float("-inf"))).all())
    check_close(o[:5], lse[:5], *reference_sparse_mla_decode(q[:5], cache, table[:5], sl[:5], idx[:5], sink=sink,
                                                             kv_scales=scales))


@pytest.mark.gpu
@pytest.mark.parametrize("consumers", CONSUMERS)
def test_entry_past_cache_is_nan(consumers):
    q, kv, table, sl, _ = make_case([200, 200], tokens=2, heads=16, seed=8)
    idx = random_indices([200, 200], 2, 512, seed=5)
    table[0, 1] = kv.shape[0]  # page of keys 64..127 of sequence 0
    idx[0, 0, 0] = 70
    o, lse = sparse_mla_decode(q, kv, table, sl, idx, consumers=consumers)
    # both tokens of sequence 0 select keys of the bad page (each selects all its visible keys)
    assert bool(torch.isnan(o[0]).all()) and bool(torch.isnan(lse[0]).all())
    assert not torch.isnan(o[1]).any()
    check_close(o[1:], lse[1:], *reference_sparse_mla_decode(q[1:], kv, table[1:], sl[1:], idx[1:]))


@pytest.mark.gpu
@pytest.mark.parametrize("consumers", CONSUMERS)
def test_masked_slots_may_point_at_nan(consumers):
    """Masked slots (-1, past the sequence) whose would-be rows hold NaN change nothing."""
    q, kv, table, sl, _ = make_case([100], tokens=2, heads=16, seed=13)
    idx = random_indices([100], 2, 512, seed=6)
    idx[0, 0, 0] = 120  # past the sequence, in its last page
    clean = sparse_mla_decode(q, kv, table, sl, idx, consumers=consumers)
    dirty = kv.clone()
    dirty[table[0, 1].long(), 100 - PAGE:] = float("nan")
    got = sparse_mla_decode(q, dirty, table, sl, idx, consumers=consumers)
    assert torch.equal(got[0].view(torch.int16), clean[0].view(torch.int16))


@pytest.mark.gpu
def test_index_near_int32_max_is_masked():
    """A slot index past the sequence stays masked at 2^31 - 2 (it wrapped to visible and turned
    the token's output NaN when the visibility test ran in int32)."""
    q, kv, table, sl, _ = make_case([300, 300], tokens=2, heads=64, seed=17)
    idx = random_indices([300, 300], 2, 512, seed=8)
    far = idx.clone()
    far[0, 0, 3] = 2**31 - 2
    far[1, 1, 9] = 2**31 - 1
    idx[0, 0, 3] = -1
    idx[1, 1, 9] = -1
    want = sparse_mla_decode(q, kv, table, sl, idx)
    got = sparse_mla_decode(q, kv, table, sl, far, out=poisoned_outputs(q))
    for g, w in zip(got, want):
        assert torch.equal(g.view(torch.int16 if g.dtype == torch.bfloat16 else torch.int32),
                           w.view(torch.int16 if w.dtype == torch.bfloat16 else torch.int32))
