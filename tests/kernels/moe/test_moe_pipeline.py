"""The unfused MoE layer: argument checks, also of its expert-parallel form (CPU); against the float64 reference, determinism,
batch invariance and the simulated multi-rank mode (GPU), on the V4 model shapes."""

import pytest
import torch

from kernels.moe import reference as R
from kernels.moe.pipeline import V4_FLASH, V4_PRO, MoEConfig, moe_layer, moe_layer_ep
from kernels.quant.group_cast import swiglu_cast

pytestmark = pytest.mark.xdist_group("gpu_memory")  # full V4 layers (tens of GiB): one heavy module at a time

CUDA = "cuda"


def test_pipeline_rejects_mismatched_shapes(fake_group):
    cfg = MoEConfig(4, 2)
    w1 = torch.zeros(4, 256, 128, dtype=torch.float8_e4m3fn)
    w2 = torch.zeros(4, 128, 128, dtype=torch.float8_e4m3fn)
    s1, s2 = torch.ones(4, 2, 1), torch.ones(4, 1, 1)
    x = torch.zeros(3, 128, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="logits"):
        moe_layer(x, torch.zeros(3, 5), w1, s1, w2, s2, cfg)
    with pytest.raises(ValueError, match="x: expected bf16"):
        moe_layer(x.float(), torch.zeros(3, 4), w1, s1, w2, s2, cfg)
    with pytest.raises(ValueError, match="n_ranks"):
        moe_layer(x, torch.zeros(3, 4), w1, s1, w2, s2, cfg, n_ranks=3)
    # the expert-parallel baseline takes the same arguments, checked the same way, and a group
    with pytest.raises(ValueError, match=r"group: expected a divisor of 4 experts, got 3"):
        moe_layer_ep(x, torch.zeros(3, 4), w1, s1, w2, s2, cfg, fake_group(3))
    with pytest.raises(ValueError, match="logits"):
        moe_layer_ep(x, torch.zeros(3, 5), w1, s1, w2, s2, cfg, fake_group(2))
    with pytest.raises(ValueError, match="x: expected bf16"):
        moe_layer_ep(x.float(), torch.zeros(3, 4), w1, s1, w2, s2, cfg, fake_group(2))


def make_inputs(model, t, seed):
    g = torch.Generator(device=CUDA).manual_seed(seed)
    x = torch.randn(t, model["hidden"], device=CUDA, generator=g).to(torch.bfloat16)
    logits = torch.randn(t, model["n_experts"], device=CUDA, generator=g)
    return x, logits


@pytest.fixture(scope="module")
def flash():
    return R.random_layer(V4_FLASH)


@pytest.mark.gpu
@pytest.mark.parametrize("t", [1, 64])
def test_flash_layer_close_to_float64_reference(flash, t):
    cfg = V4_FLASH["cfg"]
    x, logits = make_inputs(V4_FLASH, t, seed=t)
    out = moe_layer(x, logits, *flash, cfg)
    ref = R.moe_ref(x, logits, None, *flash, topk=cfg.topk, score_func=cfg.score_func,
                    routed_scaling=cfg.routed_scaling, clamp=cfg.clamp)
    err = R.rel_error(out, ref)
    print(f"V4-Flash T={t}: pipeline vs float64 reference rel err {err:.3e}")
    assert err < 0.08  # e4m3 activations (x and the SwiGLU output) dominate


@pytest.mark.gpu
def test_flash_layer_is_deterministic_and_batch_invariant(flash):
    cfg = V4_FLASH["cfg"]
    x, logits = make_inputs(V4_FLASH, 4096, seed=1)
    full = moe_layer(x, logits, *flash, cfg)
    assert torch.equal(full, moe_layer(x, logits, *flash, cfg)), "two runs differ"
    for lo, hi in [(0, 1), (100, 613), (4000, 4096)]:
        part = moe_layer(x[lo:hi].contiguous(), logits[lo:hi].contiguous(), *flash, cfg)
        assert torch.equal(part, full[lo:hi]), f"tokens {lo}:{hi} differ when batched alone"


@pytest.mark.gpu
def test_flash_layer_hot_expert_and_empty_experts(flash):
    cfg = V4_FLASH["cfg"]
    x, logits = make_inputs(V4_FLASH, 2048, seed=2)
    logits[:, 5] += 100.0  # every token routes to expert 5
    logits[:, 128:] -= 100.0  # experts 128.. stay empty
    out, ids, _ = moe_layer(x, logits, *flash, cfg, return_routing=True)
    assert (ids == 5).any(dim=1).all() and (ids < 128).all()
    sub = slice(0, 48)
    ref = R.moe_ref(x[sub], logits[sub], None, *flash, topk=cfg.topk, score_func=cfg.score_func,
                    routed_scaling=cfg.routed_scaling, clamp=cfg.clamp)
    assert R.rel_error(out[sub], ref) < 0.08


@pytest.mark.gpu
@pytest.mark.parametrize("t", [8, 512])
def test_swiglu_cast_reads_routed_rows_only(flash, t):
    """The layer leaves its padding rows unspecified (permute does not zero them; at T = 8 the
    128-wide L1 GEMM does not store them): its SwiGLU cast reads routed rows only and gives, on
    every routed row, the bits of the cast of the whole L1 output."""
    cfg = V4_FLASH["cfg"]
    x, logits = make_inputs(V4_FLASH, t, seed=5)
    seen = {}

    def capture(h, clamp, rows):  # the layer's own SwiGLU step, recorded
        seen.update(h=h, rows=rows)
        return swiglu_cast(h, clamp=clamp, group=128, rows=rows)

    _, ids, _ = moe_layer(x, logits, *flash, cfg, swiglu_quant=capture, return_routing=True)
    hid, rows = seen["h"], seen["rows"]
    counts = torch.bincount(ids.flatten().long(), minlength=cfg.n_experts)
    used = int(((counts + 127) // 128 * 128).sum())  # rows of the computed blocks
    routed = rows[:used] >= 0
    assert (~routed).sum() > used // 2
    q, s = swiglu_cast(hid, clamp=cfg.clamp)
    mq, ms = swiglu_cast(hid, clamp=cfg.clamp, rows=rows)
    assert torch.equal(mq[:used][routed].view(torch.uint8), q[:used][routed].view(torch.uint8))
    assert torch.equal(ms[:used][routed].view(torch.int32), s[:used][routed].view(torch.int32))


@pytest.mark.gpu
@pytest.mark.parametrize("n_ranks", [8])
def test_simulated_ranks_match_one_rank(flash, n_ranks):
    cfg = V4_FLASH["cfg"]
    x, logits = make_inputs(V4_FLASH, 777, seed=3)
    assert torch.equal(moe_layer(x, logits, *flash, cfg, n_ranks=n_ranks), moe_layer(x, logits, *flash, cfg))


@pytest.mark.gpu
def test_pro_layer_runs_and_matches_reference():
    layer = R.random_layer(V4_PRO, seed=4)
    cfg = V4_PRO["cfg"]
    x, logits = make_inputs(V4_PRO, 32, seed=4)
    out = moe_layer(x, logits, *layer, cfg)
    again = moe_layer(x, logits, *layer, cfg, n_ranks=4)
    assert torch.equal(out, again)
    ref = R.moe_ref(x, logits, None, *layer, topk=cfg.topk, score_func=cfg.score_func,
                    routed_scaling=cfg.routed_scaling, clamp=cfg.clamp)
    err = R.rel_error(out, ref)
    print(f"V4-Pro T=32: pipeline vs float64 reference rel err {err:.3e}")
    assert err < 0.08
