"""Dense attention backward without a GPU: its three kernels compile for sm_90a with no atomics
(the determinism contract) and no launch condition beyond their assume lists; bad arguments are
named."""

import math
import re

import pytest
import torch

from kernels.attention.dense_bwd import SPLIT_DIMS, backward_kernels, bwd_dkdv_kernel, bwd_dq_kernel, dense_attention_backward
from tests.kernels.staged_release import assert_stages_released_after_last_read


@pytest.mark.parametrize("dim,causal", [(128, True), (64, False), (256, True)])
def test_kernels_compile_without_atomics(dim, causal, derived_preconditions, deterministic):
    delta, *dkdv, dq = backward_kernels(dim, causal, 1 / math.sqrt(dim))
    for kernel in (*dkdv, dq):
        assert derived_preconditions(kernel) == []
    for kernel in (delta, *dkdv, dq):
        assert "atomic" not in kernel.device_source.lower()
        assert deterministic(kernel) is True
    # dV += P^T dO and dK += dS^T Q from registers, m64n{d}k16 (one kernel, or one each at d 256);
    # dQ += dS K likewise
    from_registers = f"tl::DataType::kFloat32, 64, {dim}, 16, false, true"
    assert [k.device_source.count(from_registers) for k in dkdv] == ([1, 1] if dim in SPLIT_DIMS else [2])
    assert from_registers in dq.device_source


@pytest.mark.parametrize("dim,causal", [(128, True), (64, False), (256, True)])
def test_staged_rows_released_after_last_read(dim, causal):
    """lse_s and delta_s live two pipeline stages: the producer overwrites a stage once the
    consumer releases it, so the release must follow the consumer's last read of the stage (of
    every staged buffer, in the dK/dV kernels and the dQ kernel). The d 256 dV kernel once
    released it after its first GEMM, before computing P from lse_s (dV wrong and different on
    every run)."""
    _, *dkdv, dq = backward_kernels(dim, causal, 1 / math.sqrt(dim))
    for kernel in dkdv:
        assert_stages_released_after_last_read(kernel.device_source, {"Q_s", "dO_s", "lse_s"})
    assert_stages_released_after_last_read(dq.device_source, {"K_s", "V_s"})


def test_bad_arguments_are_named():
    q = torch.randn(1, 8, 4, 128, dtype=torch.bfloat16)
    k = torch.randn(1, 8, 2, 128, dtype=torch.bfloat16)
    lse = torch.zeros(1, 4, 8)
    with pytest.raises(ValueError, match="q: head dim expected one of \\(64, 128, 256\\), got 96"):
        q2, k2 = torch.randn(1, 8, 4, 96, dtype=torch.bfloat16), torch.randn(1, 8, 2, 96, dtype=torch.bfloat16)
        dense_attention_backward(q2, q2, k2, k2, q2, lse)
    with pytest.raises(ValueError, match="do: expected the shape of q"):
        dense_attention_backward(q[:, :4].contiguous(), q, k, k, q, lse)
    with pytest.raises(TypeError, match="o: expected dtype"):
        dense_attention_backward(q, q, k, k, q.half(), lse)
    with pytest.raises(ValueError, match="lse: expected fp32"):
        dense_attention_backward(q, q, k, k, q, lse[:, :2])
    with pytest.raises(ValueError, match="out: expected a tuple"):
        dense_attention_backward(q, q, k, k, q, lse, out=(q, k))
    with pytest.raises(ValueError, match=r"out\[1\]: expected shape \(1, 8, 2, 128\)"):
        dense_attention_backward(q, q, k, k, q, lse, out=(q, q, k))
    with pytest.raises(ValueError, match="q: expected a CUDA tensor"):
        dense_attention_backward(q, q, k, k, q, lse)
    with pytest.raises(ValueError, match="grads: expected 'dkdv', 'dk' or 'dv'"):
        bwd_dkdv_kernel(128, False, 1.0, 1.0, "bfloat16", "dq")
    with pytest.raises(ValueError, match=r"block_keys: expected a block size in \(64, 128\), got 96"):
        bwd_dkdv_kernel(128, False, 1.0, 1.0, "bfloat16", "dkdv", 96, 64)
    with pytest.raises(ValueError, match=r"block_queries: expected a block size in \(64, 128\), got 32"):
        bwd_dq_kernel(128, False, 1.0, 1.0, "bfloat16", 32, 64)
    with pytest.raises(TypeError, match="tiles: expected a BwdTiles or None, got tuple"):
        backward_kernels(128, False, 1.0, tiles=(128, 64, 128, 64))


def test_split_tiles_build_dv_and_dk_kernels_that_ptxas_does_not_serialize():
    """``SPLIT_WIDE_DQ_TILES`` at d 128: dV and dK in two kernels of two consumer warpgroups each,
    their wgmma not serialized by ptxas (the fused kernel of the same tiles runs out of registers)."""
    from kernels.attention.dense_bwd import SPLIT_WIDE_DQ_TILES, backward_builds

    builds = backward_builds(128, True, 1 / math.sqrt(128), tiles=SPLIT_WIDE_DQ_TILES)
    assert list(builds) == ["delta", "dv", "dk", "dq"]
    for name in ("dv", "dk"):
        kernel = builds[name]()
        assert kernel.metadata["reports"]["ptxas"] == {"performance_loss": []}, name
        assert_stages_released_after_last_read(kernel.device_source, {"Q_s", "dO_s", "lse_s"})


def _walks(causal: bool, len_q: int, len_k: int):
    """The fused backward's walks, evaluated: {(chain, block): [(tile, rank, step), ...]}."""
    from tilelang import tvm

    from kernels.attention.dense_bwd import fused_rank, fused_schedule, fused_step

    simplify = tvm.arith.Analyzer().simplify

    def value(x):
        return int(x) if isinstance(x, (int, bool)) else int(simplify(x).value)

    adds = {}
    nk = -(-len_k // 128)
    for tile in range(nk + 1):  # one tile past the keys: it must walk nothing
        per_head, first, _ = (value(x) for x in fused_schedule(causal, tile, len_q, len_k, 64, 128))
        assert tile < nk or per_head == 0
        for t in range(per_head):
            _, qb, chain = (value(x) for x in fused_step(causal, t, per_head, first, len_q, 0, 1, 64))
            rank = value(fused_rank(causal, tile, qb, chain, len_q, len_k, nk, 64, 128))
            adds.setdefault((chain, qb), []).append((tile, rank, t))
    return adds


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("len_q,len_k", [(1, 1), (64, 128), (300, 500), (500, 300), (4096, 4096), (1000, 130),
                                         (129, 4001), (4001, 129), (700, 700)])
def test_fused_walks_give_every_block_one_order(causal, len_q, len_k):
    """The fused backward's dQ protocol, evaluated on the CPU for sequences of every shape: each
    (key tile, query block) pair that has a key the block's rows see is walked exactly once;
    the tiles adding to one block in one chain hold ranks 0..n-1 in descending tile order (each
    waits for exactly the one ranked before it, tile + 1: no CTA waits on a later block index)
    and that tile reaches the block no later in its own walk (the waits cannot form a cycle, and
    a tile seldom waits at all)."""
    adds = _walks(causal, len_q, len_k)
    nq, nk = -(-len_q // 64), -(-len_k // 128)
    walked = sorted((qb, tile) for (_, qb), tiles in adds.items() for tile, _, _ in tiles)
    # causal (bottom-right): the block's last row sees the tile's first key
    expected = sorted((qb, tile) for qb in range(nq) for tile in range(nk)
                      if not causal or 64 * qb + 63 + len_k - len_q >= 128 * tile)
    assert walked == expected
    for (chain, qb), tiles in adds.items():
        assert causal is False or chain == 0
        by_rank = sorted(tiles, key=lambda a: a[1])
        assert [rank for _, rank, _ in by_rank] == list(range(len(tiles))), (chain, qb, tiles)
        for (prev, _, prev_step), (tile, _, step) in zip(by_rank, by_rank[1:]):
            assert prev == tile + 1 and prev_step <= step, (chain, qb, tiles)


@pytest.mark.parametrize("dim,causal", [(128, False), (64, True)])
def test_fused_kernel_structure(dim, causal, derived_preconditions, deterministic):
    """The fused backward: every access proven with no derived precondition; five wgmma per step
    (S and dP m64n64, dV and dK from registers m64n{d}, dQ's share m64n{d/2} with dS^T from shared
    memory); the consumers' registers raised to 240 without a spill or a serialized wgmma; dQ's
    shares leave through the ordered hand-off (bulk reductions, GPU-scope acquire / release), with
    no atomic instruction. Determinism stays "unknown": the analysis does not read the hand-off."""
    from kernels.attention.dense_bwd import FUSED_TILES

    delta, fused, dq_sum = backward_kernels(dim, causal, 1 / math.sqrt(dim), tiles=FUSED_TILES)
    bounds = fused.metadata["reports"]["bounds"]
    assert derived_preconditions(fused) == [] and bounds["proven"] == bounds["accesses"]
    src = fused.device_source
    gemms = re.findall(r"tl::wgmma_(ss|rs)<tl::DataType::kBFloat16, tl::DataType::kBFloat16, tl::DataType::kFloat32, "
                       r"64, (\d+), 16, (true|false), (true|false)", src)
    assert sorted(gemms) == sorted([("ss", "64", "false", "false")] * 2 + [("rs", str(dim), "false", "true")] * 2
                                   + [("ss", str(dim // 2), "true", "true")])
    assert "warpgroup_reg_alloc<240>" in src and "warpgroup_reg_dealloc<24>" in src
    assert fused.metadata["reports"]["ptxas"]["performance_loss"] == []
    hand_off = src[src.index("dq_full[(t_1 & 1)].wait"):]
    # the slot is freed once read, the counter released once the sums have landed
    assert hand_off.index("tlx_dq_add_in_order(") < hand_off.index("dq_empty[(t_1 & 1)].arrive()") < hand_off.index("tlx_dq_release(")
    assert "cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32" in src
    assert "ld.acquire.gpu" in src and "red.release.gpu" in src and ".sys" not in src.split("TLX_ORDERED_DQ_PRELUDE_")[1]
    assert "atomic" not in src.lower()
    assert deterministic(fused) == "unknown"
    assert any("tlx_dq_add_in_order" in u for u in fused.metadata["reports"]["determinism"]["unresolved"])
    # the launcher checks the row count as for the delta kernel
    assert deterministic(dq_sum) is True and derived_preconditions(dq_sum) == ["TQ <= 2147483584"]


def test_fused_fast_exp2_candidate():
    """``FUSED_FAST_EXP2_TILES``: P's exp2 as ``ex2.approx.ftz.f32`` (reported as approximate),
    every access still proven."""
    from kernels.attention.dense_bwd import FUSED_FAST_EXP2_TILES

    _, fused, _ = backward_kernels(128, False, 1 / math.sqrt(128), tiles=FUSED_FAST_EXP2_TILES)
    assert "exp2f(" not in fused.device_source and fused.device_source.count("tlx_exp2_ftz(") == 2  # definition + call
    assert [h["intrinsic"] for h in fused.metadata["reports"]["numerics"]["approximate"]] == ["tlx_exp2_ftz"]
    bounds = fused.metadata["reports"]["bounds"]
    assert bounds["proven"] == bounds["accesses"]


def test_fused_tiles_are_checked():
    from kernels.attention.dense_bwd import FUSED_TILES, backward_tiles

    with pytest.raises(ValueError, match=r"tiles: the fused backward takes head dims \(64, 128\)"):
        backward_tiles(256, FUSED_TILES)
    with pytest.raises(ValueError, match=r"\(128, 64\) \(keys, queries\), got d 128 and \(64, 64\)"):
        backward_tiles(128, FUSED_TILES._replace(dkdv_keys=64))
    with pytest.raises(ValueError, match="tiles: fast_exp2 is an option of the fused backward"):
        backward_tiles(128, FUSED_TILES._replace(fused=False, fast_exp2=True))


@pytest.mark.parametrize("causal", [False, True])
def test_fused_kernel_barriers_make_progress(causal):
    """The fused backward's four roles (TMA warp, dQ warp, two consumer warpgroups) and their
    mbarriers and named barriers, simulated by tlx's progress check with the sequence lengths (read
    from memory) of an empty and of a one-block sequence, 8 query heads a kv head (8 steps: both
    stages and both dQ slots reused): no thread waits forever. The dQ warp's wait on the tile
    above it is another CTA's and is not simulated (``test_fused_walks_give_every_block_one_order``)."""
    from kernels.attention.dense_bwd import bwd_fused_kernel
    from tlx.ir.tir import device_functions
    from tlx.lowering import lower
    from tlx.passes.progress import check_progress

    tir = bwd_fused_kernel.get_tir(64, causal, 0.125 * 1.4426950408889634, 0.125)
    [(_, func)] = list(device_functions(lower(tir, {"kind": "cuda", "arch": "sm_90a"}, {}).device_mod))
    for len_q, len_k in ((0, 0), (0, 9), (9, 0), (9, 9)):
        report = check_progress(func, {"H": 8, "HK": 1, "TQ": 9, "TK": 9, "NB": 2, "QB": 1, "k_tiles": 1},
                                swept={"len_q": len_q, "len_k": len_k})
        assert report.verdict == "ok", (len_q, len_k, report.detail)
