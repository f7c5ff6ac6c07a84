"""MLA decode over a paged cache (kernels/attention/decode_mla.py).

CPU: the split and combine kernels compile for sm_90a (bf16 and e4m3 caches, 1..4 tokens) with
wgmma and without atomics, the CUDA baseline compiles; bad input raises a clear error. GPU: bit
for bit equal to the CUDA baseline (decode_mla.cu); within tolerance of the fp32
torch reference at sequence lengths 1, 63, 64, 65, 4001 and 131072, with empty sequences,
repeated pages and fully masked rows; an e4m3 cache gives exactly the bits of the bf16 cache
holding its dequantized values; a sequence's bits are the same alone, inside batches of 1, 7,
64 and 128 mixed-length sequences, with a wider block table (more splits in the grid) and while
another stream holds most SMs; 100 runs identical; a table entry past the cache
makes that sequence NaN and nothing else."""

import re

import pytest
import torch

from kernels.attention import common as C
from kernels.attention.decode_mla import (D_QK, D_V, GROUP, PAGE, SPLIT_PAGES, dequant_cache, key_major_default,
                                          mla_combine_kernel, mla_decode, mla_split_key_major_fp8_kernel,
                                          mla_split_key_major_kernel, mla_split_kernel, mla_split_overlap_kernel,
                                          reference_mla_decode, split_kernel)
from tests.kernels.staged_release import assert_stages_released_after_last_read

E4M3 = torch.float8_e4m3fn


@pytest.mark.parametrize("tokens, heads, kv", [(1, 128, "bfloat16"), (2, 128, "float8_e4m3"), (1, 16, "bfloat16"),
                                               (4, 16, "float8_e4m3")])
def test_kernels_compile(tokens, heads, kv):
    src = mla_split_kernel(tokens, heads, kv, D_QK ** -0.5).device_source
    assert "wgmma" in src and "atomic" not in src.lower()
    assert_stages_released_after_last_read(src, {"KP_s", "KV_s"} if kv == "bfloat16" else {"KQ_s", "KQP_s", "KS_s"})
    assert "atomic" not in mla_combine_kernel(tokens, heads).device_source.lower()
    # the queries: 64 heads of one token a block by TMA, else 16-byte pieces (TileLang's
    # elementwise loop issued 54 dependent 2- and 4-byte steps a thread: 1.07-1.12x, H200)
    assert ("tma_load(Q_desc" in src) == (heads % 64 == 0)
    assert ("*(uint4*)(Q + " in src) == (heads % 64 != 0)


@pytest.mark.parametrize("tokens, heads, kv", [(1, 16, "bfloat16"), (2, 128, "bfloat16"), (1, 16, "float8_e4m3")])
def test_two_pages_in_flight_fit_and_release_after_last_read(tokens, heads, kv):
    """Two pages in flight fit the sm_90 opt-in limit (231424 dynamic bytes beside the driver's
    reserved KiB; tlx once counted that KiB twice and refused bf16's exactly-full 231424); with
    an e4m3 cache only because P shares the dequantized rope keys' buffer."""
    kernel = mla_split_kernel(tokens, heads, kv, D_QK ** -0.5, 2)
    staged = {"KP_s", "KV_s"} if kv == "bfloat16" else {"KQ_s", "KQP_s", "KS_s"}
    assert_stages_released_after_last_read(kernel.device_source, staged)
    assert int(kernel.metadata["launches"][0]["dynamic_shared_memory"]) == (231424 if kv == "bfloat16" else 227840)


@pytest.mark.parametrize("tokens, heads, kv, stages, consumers", [(1, 16, "bfloat16", 2, 1), (2, 16, "bfloat16", 2, 2),
                                                                  (1, 16, "float8_e4m3", 1, 2), (1, 32, "float8_e4m3", 2, 2)])
def test_key_major_kernel_compiles(tokens, heads, kv, stages, consumers):
    """The key-major split kernel: S^T = K Q^T as m64nNk16 with both operands K-major, O^T += V^T P^T
    with V^T read transposed (wgmma's transpose bit) and P K-major, N the rows of a consumer
    warpgroup; the row sum's eight chains a row staged through shared memory; no atomics; the
    staged tiles released after their last read."""
    src = mla_split_key_major_kernel(tokens, heads, kv, D_QK ** -0.5, stages, SPLIT_PAGES, consumers).device_source
    n = tokens * heads // consumers
    assert f"kFloat32, 64, {n}, 16, false, false" in src  # K Q^T
    assert f"kFloat32, 64, {n}, 16, true, false" in src  # V^T P^T
    assert src.count("wgmma_ss<") == 3  # nope and rope scores, output: no other product
    assert "atomic" not in src.lower() and "part_s" in src
    # two consumers: 384 threads cap a thread at 168 registers unless the producer hands its own over
    assert ("warpgroup_reg_alloc<240>" in src) == (consumers == 2)
    assert_stages_released_after_last_read(src, {"KP_s", "KV_s"} if kv == "bfloat16" else {"KQ_s", "KQP_s", "KS_s"})


@pytest.mark.parametrize("tokens, heads", [(1, 16), (2, 16)])
def test_key_major_fp8_kernel_compiles(tokens, heads):
    """The e4m3 key-major kernel: the consumer's products as the key-major kernel's (no other);
    the page loaded by the two producer warpgroups into registers (no TMA, no staging tile) and
    dequantized there (the e4m3 conversions in their branches only); 128 arrivals a phase on
    each slot's two barriers; registers handed from the producers to the consumer; every
    synchronisation after the barriers' init is a named barrier of one warpgroup's 128 threads,
    the producers' with ids of their own (a barrier of 256 over both producers made producer 1
    wait for producer 0's last page: a hang tlx's progress check shows); no atomics."""
    src = mla_split_key_major_fp8_kernel(tokens, heads, D_QK ** -0.5).device_source
    n = tokens * heads
    assert f"kFloat32, 64, {n}, 16, false, false" in src and f"kFloat32, 64, {n}, 16, true, false" in src
    assert src.count("wgmma_ss<") == 3 and "tma_load" not in src and "KQ_s" not in src
    # 2 x 128 x 136 + 128 x 232 = 384 x 168, the registers at launch (240 made the consumer wait forever)
    assert src.count("init(128)") == 4 and "warpgroup_reg_alloc<232>" in src and "warpgroup_reg_dealloc<136>" in src
    assert src.count("__syncthreads()") == 1  # after the barriers' init
    def named_barriers(text):  # (id, threads) of each bar.sync
        return re.findall(r"__sync_thread_partial\((\d+), (\d+)\)", text)

    assert named_barriers(src) and {count for _, count in named_barriers(src)} == {"128"}
    consumer, producers = src.split("warpgroup_reg_alloc<232>", 1)[1].split("warpgroup_reg_dealloc", 1)
    assert "__NV_E4M3" not in consumer and "__NV_E4M3" in producers
    assert {i for i, _ in named_barriers(consumer)}.isdisjoint({i for i, _ in named_barriers(producers)})
    assert "atomic" not in src.lower()


def fp8_split_device_function(*args):
    """The lowered device function of ``mla_split_key_major_fp8_kernel(*args)`` (for the progress check)."""
    return device_function(mla_split_key_major_fp8_kernel, *args)


def lowered(factory, *args):
    """``factory(*args)`` as TileLang lowers it, under the pass configs its build takes (the
    decorator's and the program's own)."""
    from tlx.lowering import lower

    tir = factory.get_tir(*args)
    configs = factory.build_options(tir).pass_config_dict() or {}
    return lower(tir, {"kind": "cuda", "arch": "sm_90a"}, configs)


def device_function(factory, *args):
    """The lowered device function of ``factory(*args)`` (for the progress check)."""
    from tlx.ir.tir import device_functions

    [(_, func)] = list(device_functions(lowered(factory, *args).device_mod))
    return func


@pytest.mark.parametrize("factory, args", [
    (mla_split_key_major_kernel, (1, 16, "bfloat16", D_QK ** -0.5, 2, SPLIT_PAGES, 1)),
    (mla_split_key_major_fp8_kernel, (1, 16, D_QK ** -0.5, SPLIT_PAGES, 1, True)),
    (mla_split_key_major_kernel, (2, 16, "bfloat16", D_QK ** -0.5, 2, SPLIT_PAGES, 1))])
def test_key_major_row_sums_read_p_without_bank_conflicts(factory, args):
    """The ordered row sums' reads of p (8 a thread a page, on the consumer's chain) each hit
    32 banks (``p_index``); the plain [64, rows] tile put 8 lanes on one bank. Its stores (once
    per value, from the score fragment) stay within 4 ways."""
    from tlx.passes.banks import banks_report

    accesses = [a for a in banks_report(lowered(factory, *args))["accesses"] if a["buffer"] == "p_s"]
    loads = [a for a in accesses if a["op"] == "load"]
    assert len(loads) == 8 and all(a["degree"] == 1 and a["status"] == "proven" for a in loads), loads
    assert all(a["degree"] <= 4 for a in accesses if a["op"] == "store")


@pytest.mark.parametrize("tokens", [1, 2])
def test_overlap_kernel_proven_overlapped_and_never_hangs(tokens):
    """The hand-scheduled row-major kernel: every access proven in bounds, each page's nope keys
    as eight TMA panels on their own barriers, no wgmma serialized (a wait right after each would
    show as ``wgmma_wait<0>`` inside the page loop: the loop's only waits keep one product in
    flight or come before the slot is released), within the opt-in shared-memory limit; its
    producer / consumer hand-off simulated at every page count 0..9: no thread waits forever."""
    from tlx.passes.progress import check_progress

    kernel = mla_split_overlap_kernel(tokens, 128, D_QK ** -0.5)
    bounds = kernel.metadata["reports"]["bounds"]
    assert (bounds["unknown"], bounds["violations"], bounds["preconditions"]) == ([], [], [])
    assert bounds["proven"] == bounds["accesses"] > 0
    src = kernel.device_source
    assert "nope_full[(((t & 1) * 8) + c)].expect_transaction(8192);" in src  # a 64 x 64 bf16 panel each
    assert "tl::tma_load(KV_desc, nope_full[(((t & 1) * 8) + c)]" in src
    loop = src[src.index("for (int t_1 = 1; t_1 < count; ++t_1)"):]
    assert "tl::wait_wgmma<1>();" in loop and loop.index("tl::wait_wgmma<1>();") < loop.index("tl::wait_wgmma<0>();")
    assert int(kernel.metadata["launches"][0]["dynamic_shared_memory"]) <= 231424
    report = check_progress(device_function(mla_split_overlap_kernel, tokens, 128, D_QK ** -0.5))
    assert report.verdict == "unknown" and "no hang at count = 0..9 (8 schedules each)" in report.detail, report.detail


def test_overlap_kernel_checks_its_arguments():
    q = torch.zeros(1, 1, 16, D_QK, dtype=torch.bfloat16)
    kv = torch.zeros(4, PAGE, D_QK, dtype=torch.bfloat16)
    table, sl = torch.zeros(1, 4, dtype=torch.int32), torch.ones(1, dtype=torch.int32)
    with pytest.raises(ValueError, match="overlap: needs heads a multiple of 64"):
        mla_decode(q, kv, table, sl, overlap=True)
    with pytest.raises(TypeError, match="overlap: expected a bool"):
        mla_decode(q, kv, table, sl, overlap=1)
    with pytest.raises(ValueError, match="overlap: takes a bf16 cache"):
        split_kernel(1, 128, "float8_e4m3", D_QK ** -0.5, None, overlap=True)
    with pytest.raises(ValueError, match="heads: the overlap split kernel takes a multiple of 64"):
        mla_split_overlap_kernel(1, 96, D_QK ** -0.5)


def test_key_major_fp8_one_producer_kernel():
    """One producer warpgroup (``mla_decode(key_major=1, num_stages=1)`` over e4m3): 256 threads
    under ``__launch_bounds__(256, 2)`` in 100 KB of shared memory, so two CTAs share a SM; its
    scales by TMA into two slots, its values still straight into registers; 96 / 160 registers
    (2 x 128 at launch); the consumer's products the two-producer kernel's; every access proven;
    the hand-off, the scale slots and the register reallocation simulated at 0..9 pages: no
    thread waits forever."""
    from tlx.passes.progress import check_progress, ctas_per_sm

    scale, tokens, heads = D_QK ** -0.5, 1, 16
    kernel = mla_split_key_major_fp8_kernel(tokens, heads, scale, SPLIT_PAGES, 1)
    src, n = kernel.device_source, tokens * heads
    assert "__launch_bounds__(256, 2)" in src
    [launch] = kernel.metadata["launches"]
    assert launch["block"][0] == "256" and 2 * (int(launch["dynamic_shared_memory"]) + launch["static_shared_memory"]) <= 227 * 1024
    assert "warpgroup_reg_alloc<160>" in src and "warpgroup_reg_dealloc<96>" in src
    assert f"kFloat32, 64, {n}, 16, false, false" in src and f"kFloat32, 64, {n}, 16, true, false" in src
    assert src.count("wgmma_ss<") == 3 and src.count("tma_load(") == 1  # the scales' only
    assert src.count("init(128)") == 4  # full, empty, two scale slots
    bounds = kernel.metadata["reports"]["bounds"]
    assert (bounds["unknown"], bounds["violations"]) == ([], []) and bounds["proven"] == bounds["accesses"] > 0
    func = fp8_split_device_function(tokens, heads, scale, SPLIT_PAGES, 1)
    assert ctas_per_sm(func) == 2
    report = check_progress(func)
    assert report.verdict == "unknown" and "no hang at count = 0..9 (8 schedules each)" in report.detail, report.detail
    with pytest.raises(ValueError, match="producers: one producer .* takes 16 query rows"):
        mla_split_key_major_fp8_kernel(2, 16, scale, SPLIT_PAGES, 1)


def test_key_major_fp8_staged_kernel():
    """The staged split (``staged=True``): one producer warpgroup, 256 threads, one CTA a SM; each
    page's e4m3 values and scales by TMA into one staging tile (one expected-bytes barrier of 128
    arrivals), the next page's copy issued right after the producer's named barrier that follows
    its reads of the tile; the conversions read registers only, so no barrier sits inside a
    piece's conversion (TileLang put one in each of the 32 when the scales came from shared
    memory there); two bf16 slots on full / empty barriers; every access proven; the hand-off
    simulated at 0..9 pages: no thread waits forever."""
    from tlx.passes.progress import check_progress, ctas_per_sm

    scale, tokens, heads = D_QK ** -0.5, 1, 16
    kernel = mla_split_key_major_fp8_kernel(tokens, heads, scale, SPLIT_PAGES, 1, True)
    src, n = kernel.device_source, tokens * heads
    [launch] = kernel.metadata["launches"]
    assert launch["block"][0] == "256" and int(launch["dynamic_shared_memory"]) + launch["static_shared_memory"] <= 227 * 1024
    assert "warpgroup_reg" not in src  # 255 registers for both warpgroups at launch: nothing to hand over
    assert f"kFloat32, 64, {n}, 16, false, false" in src and f"kFloat32, 64, {n}, 16, true, false" in src
    assert src.count("wgmma_ss<") == 3
    assert src.count("staged_full[0].expect_transaction(32768)") == 2  # the nope values: prologue and loop
    assert src.count("init(128)") == 5  # full and empty of two slots, the staging tile's
    producer = src[src.index("staged_full[0].wait"):]
    staged_sync = f"__sync_thread_partial({C.NAMED_BARRIER}, 128)"
    assert producer.index(staged_sync) < producer.index("if ((n + 1) < steps)")
    conversions = re.findall(r"for \(int k_\d+ = 0; k_\d+ < 32; \+\+k_\d+\) \{(.*?)\n        \}", producer, re.S)
    assert len(conversions) == 2 and all("__NV_E4M3" in c and "__sync_thread_partial" not in c for c in conversions)
    bounds = kernel.metadata["reports"]["bounds"]
    assert (bounds["unknown"], bounds["violations"], bounds["preconditions"]) == ([], [], [])
    assert bounds["proven"] == bounds["accesses"] > 0
    func = fp8_split_device_function(tokens, heads, scale, SPLIT_PAGES, 1, True)
    assert ctas_per_sm(func) == 1
    report = check_progress(func)
    assert report.verdict == "unknown" and "no hang at steps = 0..9 (8 schedules each)" in report.detail, report.detail
    with pytest.raises(ValueError, match=r"producers: expected one of \(2, 1\), got 3"):
        mla_split_key_major_fp8_kernel(tokens, heads, scale, SPLIT_PAGES, 3, True)


def test_key_major_fp8_staged_two_producers_kernel():
    """The staged split with two producer warpgroups converting the halves of each page: 384
    threads, 16 nope and 2 rope pieces a producer thread, every barrier of the page counting 256
    producer arrivals; every access proven; the hand-off simulated: no hang."""
    from tlx.passes.progress import check_progress

    scale = D_QK ** -0.5
    kernel = mla_split_key_major_fp8_kernel(1, 16, scale, SPLIT_PAGES, 2, True)
    src = kernel.device_source
    assert kernel.metadata["launches"][0]["block"][0] == "384"
    assert "warpgroup_reg_alloc<232>" in src and "warpgroup_reg_dealloc<136>" in src
    assert src.count("init(256)") == 3  # full of two slots, the staging tile's
    assert f"__sync_thread_partial({C.NAMED_BARRIER}, 256)" in src
    bounds = kernel.metadata["reports"]["bounds"]
    assert (bounds["unknown"], bounds["violations"], bounds["preconditions"]) == ([], [], [])
    assert bounds["proven"] == bounds["accesses"] > 0
    func = fp8_split_device_function(1, 16, scale, SPLIT_PAGES, 2, True)
    for pages in (1, 2, 5):
        report = check_progress(func, swept={"steps": pages})
        assert report.verdict == "ok", (pages, report.detail)


def test_key_major_fp8_staged_pair_kernel():
    """The staged split with two consumers (``consumers=2``): 384 threads, one CTA a SM for two
    splits; 184 registers a consumer thread, 136 the producer's (128 x 136 + 256 x 184 = 384 x 168);
    both consumers' cross-warp row maxima on named barriers of their own (TileLang put both on
    ids 1 and 2, where the progress check found a hang: tlx's ``reduce_barriers`` pass); every
    access proven; the hand-off simulated at page counts of both splits, equal or not (the
    producer's order holds for any two counts)."""
    from tlx.passes import PassContext
    from tlx.passes.progress import check_progress
    from tlx.passes.reduce_barriers import reduce_barriers_pass
    from tlx.ir.tir import device_functions

    scale, tokens, heads = D_QK ** -0.5, 1, 16
    kernel = mla_split_key_major_fp8_kernel(tokens, heads, scale, SPLIT_PAGES, 1, True, 2)
    src = kernel.device_source
    [launch] = kernel.metadata["launches"]
    assert launch["block"][0] == "384" and launch["grid"][0] == "((MP + 127) // 128)"
    assert int(launch["dynamic_shared_memory"]) + launch["static_shared_memory"] <= 227 * 1024
    assert "warpgroup_reg_alloc<184>" in src and "warpgroup_reg_dealloc<136>" in src
    assert src.count("wgmma_ss<") == 6  # each consumer's scores (nope, rope) and output product
    assert kernel.metadata["reports"]["reduce_barriers"] == {"kernel_kernel": {
        "groups": [[0, 128], [128, 128]], "renumbered": True, "ids": [[1, 2], [15, 14]]}}
    assert "tlx::NamedBarrierIds<128, 15, 14>" in src
    bounds = kernel.metadata["reports"]["bounds"]
    assert (bounds["unknown"], bounds["violations"], bounds["preconditions"]) == ([], [], [])
    assert bounds["proven"] == bounds["accesses"] > 0
    before = lowered(mla_split_key_major_fp8_kernel, tokens, heads, scale, SPLIT_PAGES, 1, True, 2)
    [(_, func)] = list(device_functions(before.device_mod))
    report = check_progress(func, swept={"count": 1, "count#2": 1})
    assert report.verdict == "deadlock" and "named barrier 1 of 128 threads" in report.detail, report.detail

    def assert_never_hangs(before):
        """The hand-off after tlx's passes, at page counts of both splits, equal or not."""
        [(_, func)] = list(device_functions(reduce_barriers_pass(before, PassContext()).device_mod))
        for pages in [(1, 0), (1, 1), (3, 2), (2, 3), (4, 4)]:
            report = check_progress(func, swept={"count": pages[0], "count#2": pages[1]})
            assert report.verdict == "ok", (pages, report.detail)

    assert_never_hangs(before)
    # two producers too (``mla_decode``'s paired split): 512 threads, the hand-off simulated as above
    both = mla_split_key_major_fp8_kernel(tokens, heads, scale, SPLIT_PAGES, 2, True, 2)
    assert both.metadata["launches"][0]["block"][0] == "512" and "warpgroup_reg_alloc<168>" in both.device_source
    assert "warpgroup_reg_dealloc<88>" in both.device_source
    bounds = both.metadata["reports"]["bounds"]
    assert (bounds["unknown"], bounds["violations"], bounds["preconditions"]) == ([], [], [])
    assert split_kernel(tokens, heads, "float8_e4m3", scale, None, paired=True) is both
    assert split_kernel(tokens, heads, "float8_e4m3", scale, None) is mla_split_key_major_fp8_kernel(
        tokens, heads, scale, SPLIT_PAGES, 1, True, 1)
    assert_never_hangs(lowered(mla_split_key_major_fp8_kernel, tokens, heads, scale, SPLIT_PAGES, 2, True, 2))
    with pytest.raises(ValueError, match=r"consumers: expected 1, or 2 with staged=True, got 2 \(staged=False\)"):
        mla_split_key_major_fp8_kernel(tokens, heads, scale, SPLIT_PAGES, 1, False, 2)


def test_key_major_fp8_kernel_proven_and_never_hangs():
    """Every access proven in bounds; deterministic, and batch invariance unknown for one reason
    only: the block table's width ``MP`` clamps ``seq_lens`` (a length past its table's pages),
    so it reaches the keys' count through data; and the three warpgroups' hand-off and register
    reallocation simulated (tlx/passes/progress.py) at every page count 0..9 (read from memory, so the verdict stays
    unknown; the producers' branch on the sequence's length synchronises alike in both arms): no
    thread waits forever."""
    from tlx.passes.progress import check_progress

    kernel = mla_split_key_major_fp8_kernel(1, 16, D_QK ** -0.5)
    bounds, det = kernel.metadata["reports"]["bounds"], kernel.metadata["reports"]["determinism"]
    assert (bounds["unknown"], bounds["violations"], bounds["preconditions"]) == ([], [], [])
    assert bounds["proven"] == bounds["accesses"] > 0
    assert det["deterministic"] is True and det["batch_invariant"] == "unknown" and det["findings"] == []
    assert det["unresolved"] and all("on ['MP']" in u for u in det["unresolved"]), det["unresolved"]
    func = fp8_split_device_function(1, 16, D_QK ** -0.5)
    report = check_progress(func)
    assert report.verdict == "unknown" and "no hang at count = 0..9 (8 schedules each)" in report.detail, report.detail


def test_key_major_rows_checked():
    q = torch.zeros(1, 4, 16, D_QK, dtype=torch.bfloat16)
    kv = torch.zeros(4, PAGE, D_QK, dtype=torch.bfloat16)
    bt, sl = torch.zeros(1, 3, dtype=torch.int32), torch.ones(1, dtype=torch.int32)
    with pytest.raises(ValueError, match=r"key_major: needs tokens x heads in \(16, 32\), got q of shape \(1, 4, 16, 576\)"):
        mla_decode(q, kv, bt, sl, key_major=1)
    with pytest.raises(ValueError, match="the key-major split kernel takes"):
        mla_split_key_major_kernel(1, 128, "bfloat16", D_QK ** -0.5)
    with pytest.raises(ValueError, match="consumers: expected 1 or 2, got 3"):
        mla_split_key_major_kernel(1, 16, "bfloat16", D_QK ** -0.5, 1, SPLIT_PAGES, 3)
    with pytest.raises(ValueError, match="key_major: expected 0, 1 or 2"):
        mla_decode(q[:, :1], kv, bt, sl, key_major=True)
    with pytest.raises(ValueError, match="the key-major split kernel takes"):
        mla_split_key_major_fp8_kernel(1, 64, D_QK ** -0.5)
    with pytest.raises(ValueError, match="consumers: one consumer warpgroup over an e4m3 cache is mla_split_key_major_fp8_kernel"):
        mla_split_key_major_kernel(1, 16, "float8_e4m3", D_QK ** -0.5, 1, SPLIT_PAGES, 1)
    # one consumer over e4m3: pages in flight are its producers; by default the staged form at 16
    # rows (one producer, the next page staged by TMA), two producers at 32
    scale = D_QK ** -0.5
    assert split_kernel(1, 16, "float8_e4m3", scale, None, SPLIT_PAGES, 1) is mla_split_key_major_fp8_kernel(
        1, 16, scale, SPLIT_PAGES, 1, True)
    assert split_kernel(2, 16, "float8_e4m3", scale, None, SPLIT_PAGES, 1) is mla_split_key_major_fp8_kernel(2, 16, scale)
    assert split_kernel(1, 16, "float8_e4m3", scale, 2, SPLIT_PAGES, 1) is mla_split_key_major_fp8_kernel(1, 16, scale)
    with pytest.raises(ValueError, match=r"staged: takes 16 query rows .* got 2 x 16"):
        mla_split_key_major_fp8_kernel(2, 16, scale, SPLIT_PAGES, 1, True)
    assert split_kernel(1, 16, "float8_e4m3", scale, 1, SPLIT_PAGES, 1) is mla_split_key_major_fp8_kernel(1, 16, scale, SPLIT_PAGES, 1)
    with pytest.raises(ValueError, match="producers: expected one of"):
        mla_split_key_major_fp8_kernel(1, 16, scale, SPLIT_PAGES, 3)
    with pytest.raises(ValueError, match=r"num_stages: 1 with key_major=1 over an e4m3 cache .* takes 16 query rows, got 2 x 16"):
        split_kernel(2, 16, "float8_e4m3", scale, 1, SPLIT_PAGES, 1)  # what mla_decode(num_stages=1) asks for


def test_key_major_default_is_sixteen_rows():
    """The measured choice (``key_major_default``): key-major for H16 T1 (16 rows), either cache."""
    assert [key_major_default(rows) for rows in (16, 32, 64, 128)] == [1, 0, 0, 0]


def test_pages_in_flight_checked():
    q = torch.zeros(1, 1, 16, D_QK, dtype=torch.bfloat16)
    kv = torch.zeros(4, PAGE, D_QK, dtype=torch.bfloat16)
    bt, sl = torch.zeros(1, 3, dtype=torch.int32), torch.ones(1, dtype=torch.int32)
    with pytest.raises(ValueError, match="num_stages: expected 1 or 2, got 3"):
        mla_decode(q, kv, bt, sl, num_stages=3)
    with pytest.raises(ValueError, match="num_stages: expected 1 or 2, got 0"):
        mla_decode(q, kv.to(E4M3), bt, sl, kv_scales=torch.ones(4, PAGE, D_QK // GROUP), num_stages=0)


def test_longer_splits_compile():
    """128 pages a split (longer than the default 64): the same loop body, the split size in the
    grid and the page range; its combine walks ceil(pages / 128) splits."""
    split = mla_split_kernel(1, 16, "bfloat16", D_QK ** -0.5, 2, 128).device_source
    assert "wgmma" in split and "* 128)" in split
    assert "atomic" not in mla_combine_kernel(1, 16, split_pages=128).device_source.lower()


def test_split_sizes_are_checked():
    q, kv = torch.zeros(1, 1, 16, D_QK, dtype=torch.bfloat16), torch.zeros(4, PAGE, D_QK, dtype=torch.bfloat16)
    bt, sl = torch.zeros(1, 3, dtype=torch.int32), torch.ones(1, dtype=torch.int32)
    with pytest.raises(ValueError, match=r"split_pages: expected one of \(16, 32, 64, 128\), got 8"):
        mla_decode(q, kv, bt, sl, split_pages=8)
    with pytest.raises(ValueError, match=r"split_pages: expected one of \(16, 32, 64, 128\), got 0"):
        mla_split_kernel(1, 16, "bfloat16", D_QK ** -0.5, 1, 0)


@pytest.mark.parametrize("kv", ["bfloat16", "float8_e4m3"])
def test_products_survive_nvcc(kv, tmp_path):
    """The split kernel's PTX (after nvcc's optimiser) still holds the TMA loads and the wgmma
    products. The first version's guard read a variable before the warp-specialized branches
    assigned it, so nvcc removed the whole body as dead code: the CUDA source had wgmma, the
    PTX had none, the kernel wrote nothing (every MLA GPU test failed, H200 2026-12-02)."""
    import subprocess

    kernel = mla_split_kernel(2, 16, kv, D_QK ** -0.5)
    src = tmp_path / "split.cu"
    src.write_text(kernel.device_source)
    # the recorded command without -o OUT SRC, its header directories this environment's (a kernel
    # loaded from the disk cache records those of the environment that built it)
    from tlx.lowering import device_include_dirs

    cmd = [a for a in kernel.metadata["nvcc_command"][:-3] if a != "--cubin" and not a.startswith("-I")]
    cmd += [f"-I{d}" for d in device_include_dirs()]
    subprocess.run([*cmd, "--ptx", "-o", str(tmp_path / "split.ptx"), str(src)], check=True, capture_output=True)
    ptx = (tmp_path / "split.ptx").read_text()
    assert "cp.async.bulk.tensor" in ptx
    assert "wgmma.mma_async" in ptx


def test_baseline_compiles():
    from pathlib import Path

    import kernels.attention.decode_mla as mod
    from tlx.numerics.parity import build_baseline

    assert Path(build_baseline(Path(mod.__file__).with_suffix(".cu"), compile_only=True)).stat().st_size > 0


def test_rejects_bad_input():
    q = torch.zeros(2, 1, 128, D_QK, dtype=torch.bfloat16)
    kv = torch.zeros(4, PAGE, D_QK, dtype=torch.bfloat16)
    bt, sl = torch.zeros(2, 3, dtype=torch.int32), torch.ones(2, dtype=torch.int32)
    with pytest.raises(ValueError, match="q: expected"):
        mla_decode(torch.zeros(2, 5, 128, D_QK, dtype=torch.bfloat16), kv, bt, sl)
    with pytest.raises(TypeError, match="q: expected dtype"):
        mla_decode(q.float(), kv, bt, sl)
    with pytest.raises(ValueError, match="kv_cache: expected"):
        mla_decode(q, torch.zeros(4, 32, D_QK, dtype=torch.bfloat16), bt, sl)
    with pytest.raises(ValueError, match="kv_scales: an e4m3 kv_cache needs"):
        mla_decode(q, kv.to(E4M3), bt, sl)
    with pytest.raises(ValueError, match="kv_scales: expected shape"):
        mla_decode(q, kv.to(E4M3), bt, sl, kv_scales=torch.ones(4, PAGE, 8))
    with pytest.raises(ValueError, match="block_table: expected"):
        mla_decode(q, kv, bt[:1], sl)
    with pytest.raises(ValueError, match="seq_lens: expected shape"):
        mla_decode(q, kv, bt, sl[:1])
    o, lse = torch.zeros(2, 1, 128, D_V, dtype=torch.bfloat16), torch.zeros(2, 1, 128)
    with pytest.raises(ValueError, match=r"out\[0\]: expected shape \(2, 1, 128, 512\)"):
        mla_decode(q, kv, bt, sl, out=(o[..., :-1].contiguous(), lse))
    with pytest.raises(TypeError, match=r"out\[1\]: expected dtype"):
        mla_decode(q, kv, bt, sl, out=(o, lse.double()))
    with pytest.raises(TypeError, match="out: expected a pair"):
        mla_decode(q, kv, bt, sl, out=o)
    with pytest.raises(ValueError, match="expected a CUDA tensor"):
        mla_decode(q, kv, bt, sl)


def make_case(seq_lens, tokens=1, heads=128, fp8=False, seed=0, pages=None, mp=None):
    g = torch.Generator(device="cuda").manual_seed(seed)
    b = len(seq_lens)
    need = [max(-(-s // PAGE), 1) for s in seq_lens]
    mp = mp or max(need)
    pages = pages or sum(need) + 3
    q = (torch.randn(b, tokens, heads, D_QK, device="cuda", generator=g)).to(torch.bfloat16)
    kv = torch.randn(pages, PAGE, D_QK, device="cuda", generator=g)
    scales = None
    if fp8:
        groups = kv.view(pages, PAGE, D_QK // GROUP, GROUP)
        scales = groups.abs().amax(-1).clamp_min(1e-4) / 448.0
        kv = (groups / scales[..., None]).view(pages, PAGE, D_QK).to(E4M3)
    else:
        kv = kv.to(torch.bfloat16)
    perm = torch.randperm(pages, device="cuda", generator=g).to(torch.int32)
    table = torch.zeros(b, mp, dtype=torch.int32, device="cuda")
    at = 0
    for i, n in enumerate(need):
        table[i, :n] = perm[at:at + n] if at + n <= pages else perm[:n]
        at += n
    sl = torch.tensor(seq_lens, dtype=torch.int32, device="cuda")
    return q, kv, table, sl, scales


def poisoned_outputs(q):
    """(o, lse) for ``q``'s decode, filled with NaN: an element the kernels do not write fails
    ``check_close``."""
    b, t, h, _ = q.shape
    return (torch.full((b, t, h, D_V), float("nan"), dtype=torch.bfloat16, device=q.device),
            torch.full((b, t, h), float("nan"), device=q.device))


def check_close(o, lse, ref_o, ref_lse):
    assert not torch.isnan(o).any() and not torch.isnan(lse).any()
    torch.testing.assert_close(o.float(), ref_o, rtol=2e-2, atol=2e-2)
    fin = torch.isfinite(ref_lse)
    assert torch.equal(torch.isfinite(lse), fin)
    torch.testing.assert_close(lse[fin], ref_lse[fin], rtol=1e-4, atol=1e-4)


# (tokens, heads) of the GPU tests: few kernel variants, so a fresh machine compiles few
SHAPES = [(1, 128), (2, 16)]


@pytest.mark.gpu
@pytest.mark.parametrize("fp8", [False, True])
@pytest.mark.parametrize("tokens, heads", SHAPES)
def test_reference_edge_lengths(fp8, tokens, heads):
    seq_lens = [1, 63, 64, 65, 4001, 0, 200]
    q, kv, table, sl, scales = make_case(seq_lens, tokens=tokens, heads=heads, fp8=fp8, seed=tokens)
    table[6, :] = table[6, 0]  # every page of the sequence is one page
    o, lse = mla_decode(q, kv, table, sl, kv_scales=scales, out=poisoned_outputs(q))
    ref_o, ref_lse = reference_mla_decode(q, kv, table, sl, kv_scales=scales)
    check_close(o, lse, ref_o, ref_lse)
    assert bool((o[5] == 0).all()) and bool(torch.isneginf(lse[5]).all())  # no keys at all
    if tokens == 2:  # seq 1 with 2 tokens: the first token sees no key
        assert bool(torch.isneginf(lse[0, 0]).all()) and bool((o[0, 0] == 0).all())


@pytest.mark.gpu
def test_reference_long_sequence():
    q, kv, table, sl, scales = make_case([131072], tokens=2, heads=16, seed=3)
    o, lse = mla_decode(q, kv, table, sl, out=poisoned_outputs(q))
    check_close(o, lse, *reference_mla_decode(q, kv, table, sl))


@pytest.mark.gpu
@pytest.mark.parametrize("tokens, heads", SHAPES)
def test_fp8_equals_bf16_of_dequantized_cache(tokens, heads):
    q, kv, table, sl, scales = make_case([70, 1500, 3000], tokens=tokens, heads=heads, fp8=True, seed=5)
    o8, l8 = mla_decode(q, kv, table, sl, kv_scales=scales)
    o16, l16 = mla_decode(q, dequant_cache(kv, scales), table, sl)
    assert torch.equal(o8.view(torch.int16), o16.view(torch.int16))
    assert torch.equal(l8.view(torch.int32), l16.view(torch.int32))


@pytest.mark.gpu
@pytest.mark.parametrize("fp8", [False, True])
@pytest.mark.parametrize("tokens", [1, 2])
def test_batch_invariance(fp8, tokens):
    """16 e4m3 rows (T1): batches of 64 and 128 take the paired staged split (two splits a CTA,
    ``B x splits`` above the SM count), the smaller ones one split a CTA."""
    g = torch.Generator().manual_seed(11)
    lens = [int(x) for x in torch.randint(1, 9000, (128,), generator=g)]
    lens[0] = 4001
    q, kv, table, sl, scales = make_case(lens, tokens=tokens, heads=16, fp8=fp8, seed=7)
    alone = mla_decode(q[:1].contiguous(), kv, table[:1].contiguous(), sl[:1].contiguous(), kv_scales=scales)
    for size in (1, 7, 64, 128):
        o, lse = mla_decode(q[:size].contiguous(), kv, table[:size].contiguous(), sl[:size].contiguous(), kv_scales=scales)
        assert torch.equal(o[:1].view(torch.int16), alone[0].view(torch.int16)), f"batch {size}"
        assert torch.equal(lse[:1].view(torch.int32), alone[1].view(torch.int32)), f"batch {size}"
    # the same sequence at another place in the batch, with a wider block table
    wide = torch.zeros(3, table.shape[1] + 40, dtype=torch.int32, device="cuda")
    wide[2, :table.shape[1]] = table[0]
    o, lse = mla_decode(q[[5, 6, 0]].contiguous(), kv, wide, sl[[5, 6, 0]].contiguous(), kv_scales=scales)
    assert torch.equal(o[2:].view(torch.int16), alone[0].view(torch.int16))
    # a restricted grid: another stream's matrix products hold most SMs while the sequence decodes
    side, big = torch.cuda.Stream(), torch.randn(8192, 8192, device="cuda")
    torch.cuda.synchronize()
    with torch.cuda.stream(side):
        for _ in range(8):
            big = big @ big.T / 8192
    crowded = mla_decode(q[:1].contiguous(), kv, table[:1].contiguous(), sl[:1].contiguous(), kv_scales=scales)
    torch.cuda.synchronize()
    assert torch.equal(crowded[0].view(torch.int16), alone[0].view(torch.int16))
    first = mla_decode(q, kv, table, sl, kv_scales=scales)
    for _ in range(100):
        again = mla_decode(q, kv, table, sl, kv_scales=scales)
        assert torch.equal(again[0].view(torch.int16), first[0].view(torch.int16))


@pytest.mark.gpu
def test_entry_past_cache_is_nan_not_read():
    q, kv, table, sl, _ = make_case([200, 200, 100], tokens=2, heads=16, seed=9)
    table[0, 2] = kv.shape[0]  # one past the cache
    table[2, 3] = 1 << 30  # past the sequence's 2 pages: not read
    o, lse = mla_decode(q, kv, table, sl)
    assert bool(torch.isnan(o[0]).all()) and bool(torch.isnan(lse[0]).all())
    assert not torch.isnan(o[1:]).any()
    ref = reference_mla_decode(q[1:], kv, table[1:].clamp(0, kv.shape[0] - 1), sl[1:])
    check_close(o[1:], lse[1:], *ref)


@pytest.mark.gpu
@pytest.mark.parametrize("fp8", [False, True])
def test_slots_past_sequence_may_hold_nan(fp8):
    """The last page's slots past the sequence hold NaN: the result is the clean cache's, bit for bit."""
    q, kv, table, sl, scales = make_case([100, 4001], tokens=2, heads=16, fp8=fp8, seed=12)
    clean = mla_decode(q, kv, table, sl, kv_scales=scales)
    dirty = kv.clone()
    nan = torch.tensor(float("nan"), device="cuda").to(kv.dtype)
    dirty[table[0, 1].long(), 100 - PAGE:] = nan
    dirty[table[1, 62].long(), 4001 - 62 * PAGE:] = nan
    got = mla_decode(q, dirty, table, sl, kv_scales=scales)
    assert torch.equal(got[0].view(torch.int16), clean[0].view(torch.int16))
    assert torch.equal(got[1].view(torch.int32), clean[1].view(torch.int32))


@pytest.mark.gpu
@pytest.mark.parametrize("tokens, heads, fp8", [(1, 16, False), (2, 128, False), (1, 16, True), (2, 128, True)])
def test_two_pages_in_flight_same_bits(tokens, heads, fp8):
    """One page in flight or two: the same bits (H16 T1 e4m3: the key-major kernel's one producer,
    two CTAs a SM, against its two producers, the default)."""
    q, kv, table, sl, scales = make_case([1, 63, 65, 4001, 0, 1500], tokens=tokens, heads=heads, fp8=fp8, seed=30 + tokens)
    o1, lse1 = mla_decode(q, kv, table, sl, kv_scales=scales, num_stages=1)
    o2, lse2 = mla_decode(q, kv, table, sl, kv_scales=scales, out=poisoned_outputs(q), num_stages=2)
    assert torch.equal(o2.view(torch.int16), o1.view(torch.int16))
    assert torch.equal(lse2.view(torch.int32), lse1.view(torch.int32))


@pytest.mark.gpu
@pytest.mark.parametrize("consumers", [1, 2])
@pytest.mark.parametrize("tokens, heads, fp8", [(1, 16, False), (1, 16, True), (2, 16, False), (1, 32, True)])
def test_key_major_same_bits_as_row_major(tokens, heads, fp8, consumers):
    """The key-major split kernel gives the row-major kernel's bits (and so the baseline's, which
    test_bitwise_equal_to_baseline checks for both: the default at H16 T1 bf16 is key-major):
    short, page-edge and long sequences, an empty one, a bad table entry (NaN rows in both), NaN
    slots past a sequence; every element written."""
    q, kv, table, sl, scales = make_case([1, 63, 64, 65, 4001, 0, 1500, 9000], tokens=tokens, heads=heads, fp8=fp8,
                                         seed=40 + tokens + heads)
    table[1, 0] = kv.shape[0] + 3
    kv[table[3, 1].long(), 1:] = torch.tensor(float("nan"), device="cuda").to(kv.dtype)
    o1, lse1 = mla_decode(q, kv, table, sl, kv_scales=scales, key_major=0)
    o2, lse2 = mla_decode(q, kv, table, sl, kv_scales=scales, out=poisoned_outputs(q), key_major=consumers)
    assert torch.equal(o2.view(torch.int16), o1.view(torch.int16))
    assert torch.equal(lse2.view(torch.int32), lse1.view(torch.int32))
    assert not torch.isnan(o2[0]).any() and torch.isnan(o2[1]).all()


@pytest.mark.gpu
@pytest.mark.parametrize("consumers, producers, split", [(1, 1, SPLIT_PAGES), (2, 1, SPLIT_PAGES), (1, 2, SPLIT_PAGES),
                                                     (2, 2, SPLIT_PAGES), (2, 2, 16)])
def test_staged_split_same_bits_as_row_major(consumers, producers, split, monkeypatch):
    """The staged e4m3 split, with one consumer or two (two splits a CTA) and one producer or two
    (the halves of each page), gives the row-major
    kernel's bits (H16 T1): sequences of 1 to 9000 keys, so CTAs whose second split is full,
    shorter (6000 keys: 64 + 30 pages), empty (4001, 8200) or past the table; a bad table entry
    (NaN rows in both), NaN slots past a sequence; every element written."""
    import kernels.attention.decode_mla as decode_mla

    q, kv, table, sl, scales = make_case([1, 63, 64, 65, 4001, 0, 1500, 9000, 6000, 8200], tokens=1, heads=16, fp8=True,
                                         seed=60 + consumers + 2 * producers + split)
    table[1, 0] = kv.shape[0] + 3
    kv[table[3, 1].long(), 1:] = torch.tensor(float("nan"), device="cuda").to(kv.dtype)
    o1, lse1 = mla_decode(q, kv, table, sl, kv_scales=scales, key_major=0, split_pages=split)
    staged = mla_split_key_major_fp8_kernel(1, 16, D_QK ** -0.5, split, producers, True, consumers)
    monkeypatch.setattr(decode_mla, "split_kernel", lambda *args, **kwargs: staged)
    o2, lse2 = mla_decode(q, kv, table, sl, kv_scales=scales, out=poisoned_outputs(q), split_pages=split)
    assert torch.equal(o2.view(torch.int16), o1.view(torch.int16))
    assert torch.equal(lse2.view(torch.int32), lse1.view(torch.int32))
    assert not torch.isnan(o2[0]).any() and torch.isnan(o2[1]).all()


@pytest.mark.gpu
@pytest.mark.parametrize("tokens, heads, split", [(1, 128, SPLIT_PAGES), (2, 128, SPLIT_PAGES), (1, 64, 16)])
def test_overlap_same_bits_as_row_major(tokens, heads, split):
    """The hand-scheduled kernel gives the row-major kernel's bits (and so the baseline's): short,
    page-edge and long sequences (one page, a partial last page, several splits), an empty one, a
    bad table entry (NaN rows in both), NaN slots past a sequence; every element written."""
    q, kv, table, sl, scales = make_case([1, 63, 64, 65, 4001, 0, 1500, 9000], tokens=tokens, heads=heads, fp8=False,
                                         seed=50 + tokens + heads)
    table[1, 0] = kv.shape[0] + 3
    kv[table[3, 1].long(), 1:] = torch.tensor(float("nan"), device="cuda").to(kv.dtype)
    o1, lse1 = mla_decode(q, kv, table, sl, split_pages=split)
    o2, lse2 = mla_decode(q, kv, table, sl, out=poisoned_outputs(q), split_pages=split, overlap=True)
    assert torch.equal(o2.view(torch.int16), o1.view(torch.int16))
    assert torch.equal(lse2.view(torch.int32), lse1.view(torch.int32))
    assert not torch.isnan(o2[0]).any() and torch.isnan(o2[1]).all()


# every dtype and shape at the default split; the other split sizes (each its own contract) once each
BASELINE_CASES = ([(fp8, tokens, heads, SPLIT_PAGES) for fp8 in (False, True) for tokens, heads in SHAPES]
                  + [(False, 1, 128, 16), (False, 1, 16, 128), (True, 2, 16, 32)])


@pytest.mark.gpu
@pytest.mark.parametrize("fp8, tokens, heads, split", BASELINE_CASES)
def test_bitwise_equal_to_baseline(attention_baseline, fp8, tokens, heads, split):
    from kernels.attention.common import LOG2E
    from kernels.attention.decode_mla import _zeros
    from tlx.numerics.parity import assert_bitwise

    seq_lens = [1, 63, 64, 65, 4001, 0, 1500, 9000]  # 9000: three splits at the default size
    q, kv, table, sl, scales = make_case(seq_lens, tokens=tokens, heads=heads, fp8=fp8, seed=20 + tokens)
    table[1, 0] = kv.shape[0] + 3  # a bad entry: sequence 1 is NaN in both
    nan = torch.tensor(float("nan"), device="cuda").to(kv.dtype)
    kv[table[3, 1].long(), 1:] = nan  # slots past sequence 3
    scale = D_QK ** -0.5
    o, lse = mla_decode(q, kv, table, sl, kv_scales=scales, split_pages=split)
    bo = torch.full_like(o, float("nan"))
    blse = torch.full_like(lse, float("nan"))
    attention_baseline("decode_mla").mla_decode(q, kv, scales if fp8 else _zeros(q.device, (1, PAGE, D_QK // GROUP)),
                                                table, sl, bo, blse, scale * LOG2E, split)
    assert_bitwise(o, bo, name="MLA decode o")
    assert_bitwise(lse, blse, name="MLA decode lse")
