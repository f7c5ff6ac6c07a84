"""MegaMoE (kernels/moe/mega): plans, wave schedule, argument checks and kernel builds (CPU);
bitwise equality with ``moe_layer(..., n_ranks=n)``, skewed routing, repeatability, batch
invariance, CUDA-graph capture and the timeout of a rank that never arrives (GPU)."""

import dataclasses
import inspect
import time

import pytest
import torch

from kernels.moe.mega import MegaMoETimeout, layer_for, make_plan, mega_moe
from kernels.moe.mega import protocol as K
from kernels.moe.mega.layer import (
    FUSIONS, SYNC, check_layer_args, compute_kernel_specs, failure_message, flags_awaited, flags_set, launch_order,
    protocol_segments, takes_rows,
)
from kernels.moe.grouped_gemm import grouped_gemm_swiglu_kernel
from kernels.moe.mega.wave import wave_kernel
from kernels.moe.metadata import max_rows
from kernels.moe.pipeline import V4_FLASH, V4_PRO, MoEConfig, moe_layer
from kernels.moe.reference import random_layer

pytestmark = pytest.mark.xdist_group("gpu_memory")  # full V4 layers (tens of GiB): one heavy module at a time

CUDA = "cuda"
FLASH = dict(hidden=4096, inter=2048, n_experts=256, topk=6)
PRO = dict(hidden=7168, inter=3072, n_experts=384, topk=6)


# ---- CPU: plans and the wave schedule ---------------------------------------------------

@pytest.mark.parametrize("dims", [FLASH, PRO], ids=["flash", "pro"])
@pytest.mark.parametrize("n", [1, 2, 4, 8])
@pytest.mark.parametrize("waves", [None, 1, 3, 16])
def test_wave_schedule_covers_each_local_expert_once_in_order(dims, n, waves):
    plan = make_plan(n, 64, sms=132, waves=waves, **dims)
    experts = [e for w in plan.waves() for e in w]
    assert experts == list(range(dims["n_experts"] // n))
    assert all(len(w) > 0 for w in plan.waves()) and len(plan.waves()) == plan.n_waves <= K.MAX_WAVES
    assert plan.n_waves == (waves or (1 if n == 1 else 2))
    assert plan.rows == max_rows(n * 64, 6, dims["n_experts"] // n)


@pytest.mark.parametrize("n", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("waves", [1, 2, 5, 16])
def test_every_awaited_flag_is_set_by_an_earlier_launch(n, waves):
    """The no-deadlock rule on one GPU: streams share hardware queues, so a kernel may wait behind
    any kernel enqueued before it; a wait for a flag that only a later launch sets could then never
    end. Every awaited flag has exactly one setter, enqueued strictly earlier."""
    plan = make_plan(n, 8, sms=132, waves=waves, hidden=4096, inter=2048, n_experts=384, topk=6)
    waves = plan.n_waves  # the plan's count (ceil(El / waves) experts a wave)
    order = launch_order(plan, range(n))
    setter = {}
    for i, (step, r, w) in enumerate(order):
        for flag in flags_set(plan, step, r, w):
            assert flag not in setter, f"{flag} set twice"
            setter[flag] = i
    waits = 0
    for i, (step, r, w) in enumerate(order):
        for flag in flags_awaited(plan, step, r, w):
            assert flag in setter and setter[flag] < i, f"{step} of rank {r}, wave {w} waits for {flag}"
            waits += 1
    if n == 1:  # one rank: no flags at all (stream order, ``MegaPlan.solo``)
        assert waits == 0 and not setter
        return
    # every rank waits for every READY and every DONE, and for its own dispatch once per wave
    assert waits == n * n + n * waves + n * n * waves
    assert sorted(setter) == sorted([("READY", r) for r in range(n)] + [("COUNT", r, w) for r in range(n) for w in range(waves)]
                                    + [("DONE", r, w) for r in range(n) for w in range(waves)])


@pytest.mark.parametrize("fusion", FUSIONS)
@pytest.mark.parametrize("n,waves", [(1, 1), (1, 3), (2, 1), (2, 2), (4, 2), (8, 1), (8, 4)])
def test_the_protocol_orders_every_global_access(n, waves, fusion):
    """tlx/passes/protocol.py over two calls of the layer: every two kernels that touch one
    region of a rank's buffer (a send buffer, the dispatched rows of a wave, ``y``, ``row_of``,
    the metadata), one writing, are ordered by stream order, stream joins or the flags."""
    from tlx.passes.protocol import find_races

    plan = make_plan(n, 64, sms=132, waves=waves, hidden=4096, inter=2048, n_experts=256, topk=6)
    segments = protocol_segments(plan, calls=2, fusion=fusion)
    assert [str(race) for race in find_races(segments)] == []


def test_one_rank_pushes():
    """One rank: the dispatch is the unfused permute, one launch for every wave's rows (reading a
    token once), after the metadata's row map; several ranks pull wave by wave."""
    def plan(n, t, waves):
        return make_plan(n, t, sms=132, waves=waves, hidden=4096, inter=2048, n_experts=256, topk=6)

    for t in (1, 512):
        push = [seg for seg in protocol_segments(plan(1, t, 2), calls=1) if seg.name.startswith("dispatch")]
        assert [seg.name for seg in push] == ["dispatch (push) (rank 0, call 0)"]
        # every wave's rows of xp and sp
        assert sorted((a.buffer, a.part) for a in push[0].accesses if a.write) == [
            (("sp", 0), 0), (("sp", 0), 1), (("xp", 0), 0), (("xp", 0), 1)]
    pulled = [seg.name for seg in protocol_segments(plan(2, 8, 2), calls=1) if seg.name.startswith("dispatch")]
    assert pulled == [f"dispatch wave {v} (rank {r}, call 0)" for r in (0, 1) for v in (0, 1)]


def test_one_rank_is_ordered_by_its_compute_stream():
    """EP1: no flag kernels; the dispatch on the compute stream after the metadata and before L1;
    leaving the stream order out (the dispatch on the communication stream without a join) is a race."""
    from tlx.passes.protocol import find_races

    plan = make_plan(1, 64, sms=132, waves=2, hidden=4096, inter=2048, n_experts=256, topk=6)
    segments = protocol_segments(plan, calls=2)
    names = [seg.name for seg in segments]
    assert not any(name.startswith(("exchange", "gather_ids", "step", "gate")) for name in names)
    assert all(not seg.sets and not seg.awaits for seg in segments)
    dispatch = [seg for seg in segments if seg.name.startswith("dispatch")]
    assert dispatch and all(seg.stream == (0, "compute") for seg in dispatch)
    assert [str(race) for race in find_races(segments)] == []
    moved = [dataclasses.replace(seg, stream=(0, "comm")) if seg.name.startswith("dispatch") else seg for seg in segments]
    assert find_races(moved)


@pytest.mark.parametrize("n, t, fusion", [(1, 8, "l1_swiglu"), (1, 8, "none"), (8, 1, "l1_swiglu"), (2, 4, "none")])
def test_decode_gemms_as_dependent_launches_are_ordered(n, t, fusion):
    """At decode sizes each wave GEMM is a programmatic dependent: before its wait it reads the
    metadata (block experts, rows), which the stream's last ordinary launch (the dispatch, the
    wave's step or the SwiGLU cast) followed; an early read of the wave's activations would race
    with the kernel that writes them."""
    from tlx.passes.protocol import Access, find_races

    plan = make_plan(n, t, sms=132, waves=1, hidden=4096, inter=2048, n_experts=256, topk=6)
    segments = protocol_segments(plan, calls=2, fusion=fusion)
    early = [seg for seg in segments if seg.programmatic]
    assert len(early) == 2 * n * 2 and all(seg.name.startswith(("l1", "l2")) for seg in early)
    assert [str(race) for race in find_races(segments)] == []
    l2 = next(i for i, seg in enumerate(segments) if seg.programmatic and seg.name.startswith("l2"))
    r = segments[l2].stream[0]
    segments[l2] = dataclasses.replace(segments[l2], accesses=(Access(("hq", r), 0),))
    assert [race.second.name for race in find_races(segments)][:1] == [segments[l2].name]


# per synchronisation left out: a race it prevents (buffer, first and second segment of the race)
_PREVENTS = {"exchange": (("xq", 0), "publish (rank 0, call 0)", "dispatch wave 0 (rank 1, call 0)"),
             "dispatch_after_route": (("meta", 1), "routing_metadata (rank 1, call 0)", "dispatch wave 0 (rank 1, call 0)"),
             "step_count": (("xp", 1), "dispatch wave 1 (rank 1, call 0)", "l1_swiglu 1 (rank 1, call 0)"),
             "gate": (("y", 0), "l2 1 (rank 0, call 0)", "combine (rank 1, call 0)")}


@pytest.mark.parametrize("sync", SYNC)
def test_each_synchronisation_prevents_a_race(sync):
    """Without the exchange's acquire of READY, a peer's dispatch reads a send buffer being
    written; without the dispatch's wait for the route, it reads metadata being written;
    without the step's acquire of COUNT, L1 reads rows being dispatched; without the gate's
    acquire of DONE, the combine reads a peer's L2 rows being written."""
    from tlx.passes.protocol import find_races

    plan = make_plan(2, 64, sms=132, waves=2, hidden=4096, inter=2048, n_experts=256, topk=6)
    races = {(r.buffer, r.first.name, r.second.name) for r in find_races(protocol_segments(plan, leave_out=[sync]))}
    assert _PREVENTS[sync] in races
    with pytest.raises(ValueError, match="leave_out: expected names from"):
        protocol_segments(plan, leave_out=["barrier"])


def test_the_protocol_table_flags_are_the_launch_orders():
    """The segments release and acquire per call what ``flags_set`` / ``flags_awaited`` say each
    step does (the no-deadlock test's table), the dispatch's COUNT wave by wave."""
    plan = make_plan(4, 64, sms=132, waves=2, hidden=4096, inter=2048, n_experts=256, topk=6)
    segments = protocol_segments(plan, calls=1)
    sets = {f[:-1] for seg in segments for f in seg.sets}
    awaits = {f[:-1] for seg in segments for f in seg.awaits}
    order = launch_order(plan, range(4))
    assert sets == {f for step, r, w in order for f in flags_set(plan, step, r, w)}
    assert awaits == {f for step, r, w in order for f in flags_awaited(plan, step, r, w)}


def test_the_protocol_table_reads_and_writes_what_the_kernels_do():
    """The buffers the table says the data-moving kernels read and write (rank 1 of 2) are the
    pointer parameters their lowered device code reads and writes (``read_only_params``): peer
    slots ``name<s>`` are rank s's buffer; ``mine`` (the flags), and the combine's per-call
    gating outputs ``ids`` / ``weights`` are outside the table."""
    from tlx.ir.facts import read_only_params, user_name
    from tlx.ir.tir import device_functions
    from tlx.lowering import lower

    plan = make_plan(2, 64, sms=132, waves=2, hidden=4096, inter=2048, n_experts=256, topk=6)
    segments = {seg.name: seg for seg in protocol_segments(plan, calls=1)}
    table_name = {"xq": "xq", "xs": "xs", "ids": "ids", "y": "y", "r": "row_of", "entry_of_row": "meta", "offsets": "meta",
                  "gids": "gids", "xp": "xp", "sp": "sp", "out": "out"}
    outside = {"mine", "ids", "weights"}
    kernels = {"gather_ids (rank 1, call 0)": K.gather_ids_kernel.get_tir(2, 6),
               "dispatch wave 0 (rank 1, call 0)": K.dispatch_kernel.get_tir(2, 4096, 6, plan.n_waves, plan.wave_experts,
                                                                              plan.n_local, plan.dispatch_ctas),
               "combine (rank 1, call 0)": K.combine_kernel.get_tir(2, 4096, 6, plan.n_local)}
    for name, prim_func in kernels.items():
        [(_, device)] = list(device_functions(lower(prim_func, {"kind": "cuda", "arch": "sm_90a"}, {}).device_mod))
        handles = {user_name(p.name) for p in device.params if str(p.dtype) == "handle"}
        reads = {user_name(p.name) for p in read_only_params(device)}

        def buffers(params):
            return {(table_name[q.rstrip("0123456789")], int(q[-1]) if q[-1].isdigit() else 1) for q in params if q not in outside}

        seg = segments[name]
        assert buffers(handles - reads) == {a.buffer for a in seg.accesses if a.write}, name
        assert buffers(reads) == {a.buffer for a in seg.accesses if not a.write}, name


def test_a_missing_rank_leaves_the_first_wait_of_the_others_unset():
    """launch_only={0} of 2 ranks: rank 0's first unset wait is rank 1's READY (the exchange of
    wave 0), which the timeout test on the GPU expects in the message."""
    plan = make_plan(2, 8, sms=132, hidden=4096, inter=2048, n_experts=16, topk=6)
    order = launch_order(plan, [0])
    done = set()
    for step, r, w in order:
        missing = [f for f in flags_awaited(plan, step, r, w) if f not in done]
        if missing:
            assert (step, missing) == ("route", [("READY", 1)])
            break
        done.update(flags_set(plan, step, r, w))
    else:
        raise AssertionError("no wait of rank 0 depends on rank 1")


@pytest.mark.parametrize("n", [1, 2, 4, 8])
def test_virtual_ranks_share_the_sms_and_group_ranks_take_all(n):
    virtual = make_plan(n, 8, sms=132, **FLASH)
    assert virtual.gemm_sms % 2 == 0 and n * virtual.gemm_sms <= 132 and virtual.gemm_sms >= 132 // n - 1
    assert make_plan(n, 8, sms=132, virtual=False, **FLASH).gemm_sms == 132


def test_symmetric_bytes_count_every_peer_visible_buffer():
    p = make_plan(2, 8, sms=132, **FLASH)
    expect = 4 * K.FLAG_WORDS + 8 * 4096 + 8 * 32 * 4 + 8 * 6 * 4 + p.rows * 4096 * 2 + 16 * 6 * 4
    assert p.symmetric_bytes() == expect


@pytest.mark.parametrize("kwargs, match", [
    (dict(n_ranks=0), "n_ranks: expected 1 to 8"),
    (dict(n_ranks=9), "n_ranks: expected 1 to 8"),
    (dict(n_ranks=3), "n_ranks: expected a divisor of the 256 experts"),
    (dict(tokens_per_rank=0), "tokens_per_rank"),
    (dict(hidden=4096 + 512), "hidden: expected a multiple of 1024"),
    (dict(inter=2048 + 64), "inter: expected a multiple of 128"),
    (dict(waves=0), "waves: expected 1 to 16"),
    (dict(n_ranks=8, waves=33), "waves: expected 1 to 16"),
    (dict(n_ranks=8, sms=8), "leave 1 SMs each"),
])
def test_plan_rejects_bad_arguments(kwargs, match):
    args = dict(n_ranks=2, tokens_per_rank=8, sms=132, **FLASH)
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        make_plan(**args)


@pytest.mark.parametrize("n,tokens", [(1, 8), (8, 1), (8, 8), (1, 512), (8, 512)])
def test_compute_kernels_of_each_fusion(n, tokens):
    """Fused: L1 is the SwiGLU-epilogue GEMM (clamp from the config); unfused: the bf16 L1. Up to
    512 tokens in all the GEMMs are the weights-on-M decode kernel (the fused L1 its SwiGLU form),
    which stores the wave's rows only: width 8 and one chunk a block up to 8 tokens, 32 rows a
    chunk above; above 512 they run on the rank's SM share as ``streaming_block_n`` says: the
    default tiles storing every row at 512 tokens a rank on 8 ranks (28672 rows for 32 experts: a
    block an expert or more; ``test_narrow_tiles_plan_takes_routed_row_gemms_at_every_size`` has
    the other rule)."""
    p = make_plan(n, tokens, sms=132, **FLASH)
    fused, unfused = (compute_kernel_specs(p, 10.0, f) for f in ("l1_swiglu", "none"))
    share = {"num_sms": p.gemm_sms}
    if tokens * n <= 512:
        decode = ("kernels.moe.grouped_gemm_decode", "grouped_gemm_decode_kernel")
        width, pdl = (8, {"pdl": True, "bounded": True}) if tokens * n <= 8 else (32, {"pdl": True, "bounded": False})
        assert fused["l1"] == (*decode, (4096, 4096, width), {"swiglu_clamp": 10.0, "group": 1} | pdl)
        assert unfused["l1"] == (*decode, (4096, 4096, width), pdl)
        assert fused["l2"] == unfused["l2"] == (*decode, (4096, 2048, width), pdl)
    else:
        plain = share | {"block_n": None, "row_mask": False}
        assert fused["l1"][1:] == ("grouped_gemm_swiglu_kernel", (4096, 4096, 10.0), share)
        assert unfused["l1"][1:] == ("grouped_gemm_contiguous_kernel", (4096, 4096), plain)
        assert fused["l2"] == unfused["l2"] == ("kernels.moe.grouped_gemm", "grouped_gemm_contiguous_kernel",
                                                (4096, 2048), plain)
    assert takes_rows(unfused["l2"]) is (tokens * n <= 512)
    wave = compute_kernel_specs(p, 10.0, "wave")
    assert wave == {"wave": ("kernels.moe.mega.wave", "wave_kernel", (4096, 4096, 10.0), {"num_sms": p.wave_sms})}
    with pytest.raises(ValueError, match="fusion: expected one of"):
        compute_kernel_specs(p, 10.0, "all")


def test_narrow_tiles_plan_takes_routed_row_gemms_at_every_size():
    """A device of ``grouped_gemm.NARROW_EVERYWHERE`` (the plan's ``narrow_tiles``): the plain
    GEMMs take 128-wide tiles storing routed rows at 8192 tokens too, where another device's plan
    takes the default tiles; the fused L1 is unchanged."""
    wide, narrow = (make_plan(1, 8192, sms=132, narrow_tiles=t, **FLASH) for t in (False, True))
    share = {"num_sms": 132}
    for plan, plain in ((wide, {"block_n": None, "row_mask": False}), (narrow, {"block_n": 128, "row_mask": True})):
        specs = compute_kernel_specs(plan, 10.0, "none")
        assert specs["l1"][3] == specs["l2"][3] == share | plain
        assert compute_kernel_specs(plan, 10.0, "l1_swiglu")["l1"][3] == share


def test_narrow_everywhere_by_device_name(monkeypatch):
    """The tile rule's device check reads the device's name: an H100 takes the narrow tiles, an H200 not."""
    from kernels.moe import grouped_gemm as G

    for name, expected in (("NVIDIA H100 80GB HBM3", True), ("NVIDIA H200", False), ("NVIDIA H100 NVL", True)):
        G.narrow_everywhere.cache_clear()
        monkeypatch.setattr(torch.cuda, "get_device_name", lambda index, name=name: name)
        assert G.narrow_everywhere(0) is expected
    G.narrow_everywhere.cache_clear()
    assert G.streaming_block_n(1 << 20, 256, True) == 128 and G.streaming_block_n(1 << 20, 256) is None
    assert G.streaming_block_n(6144, 256) == 128


@pytest.mark.parametrize("n", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("sms", [132, 114, 78])
def test_wave_kernels_of_all_ranks_fit_with_the_waiting_warps(n, sms):
    """The fused wave kernel's CTAs wait for each other: the n ranks' 2-CTA clusters plus the n - 1
    one-warp CTAs that other ranks may have waiting (spoiling an SM pair each at worst) fit on the
    device's SM pairs together."""
    p = make_plan(n, 8, sms=sms, **FLASH) if FLASH["n_experts"] % n == 0 else None
    if p is None:
        p = make_plan(n, 8, sms=sms, hidden=4096, inter=2048, n_experts=384, topk=6)
    assert p.wave_sms % 2 == 0 and 2 <= p.wave_sms <= p.gemm_sms
    assert n * p.wave_sms // 2 + n - 1 <= sms // 2
    assert {1: 132, 2: 64, 4: 30, 8: 14}.get(n, p.wave_sms) == p.wave_sms or sms != 132
    assert make_plan(n, 8, sms=sms, virtual=False, hidden=4096, inter=2048, n_experts=384, topk=6).wave_sms == sms // 2 * 2


def test_flag_words_do_not_overlap():
    words = [K.EPOCH, K.READY, *range(K.STATUS, K.STATUS + 4), *range(K.COUNT, K.COUNT + K.MAX_WAVES),
             *range(K.DONE, K.DONE + K.MAX_WAVES)]
    assert len(set(words)) == len(words) and max(words) < K.FLAG_WORDS


def test_failure_message_names_rank_peer_and_wave():
    msg = failure_message(K.WAIT_RESULTS, 3, 1, 5, 0.5)
    assert "rank 3" in msg and "rank 5" in msg and "wave 1" in msg and "0.5 s" in msg
    msg = failure_message(K.WAIT_TOKENS, 0, 0, 1, 2.0)
    assert msg.startswith("MegaMoE: rank 0 timed out") and "rank 1" in msg and "wave 0" in msg
    msg = failure_message(K.WAIT_L1, 2, 1, 2, 5.0)
    assert msg == "MegaMoE: rank 2 timed out after 5 s waiting for its own L1 tiles of wave 1 (an L2 tile of the fused wave kernel)"


# ---- CPU: argument checks ---------------------------------------------------------------

def _small(t=3, e=4, h=1024, i=128, device="cpu"):
    cfg = MoEConfig(e, 2)
    w1 = torch.zeros(e, 2 * i, h, dtype=torch.float8_e4m3fn, device=device)
    s1 = torch.ones(e, 2 * i // 128, h // 128, device=device)
    w2 = torch.zeros(e, h, i, dtype=torch.float8_e4m3fn, device=device)
    s2 = torch.ones(e, h // 128, i // 128, device=device)
    x = torch.zeros(t, h, dtype=torch.bfloat16, device=device)
    return x, torch.zeros(t, e, device=device), w1, s1, w2, s2, cfg


@pytest.mark.parametrize("change, match", [
    (lambda a: a.update(x=a["x"].float()), "x: expected bf16"),
    (lambda a: a.update(x=a["x"][:, :512]), "x: expected bf16"),
    (lambda a: a.update(logits=a["logits"][:, :3]), "logits: expected float32 \\[3, 4\\]"),
    (lambda a: a.update(logits=a["logits"].double()), "logits: expected float32"),
    (lambda a: a.update(w1=a["w1"].float()), "w1: expected e4m3"),
    (lambda a: a.update(s1=a["s1"][:, :1]), "s1: expected"),
    (lambda a: a.update(w2=a["w2"][:, :512]), "w2: expected"),
    (lambda a: a.update(s2=a["s2"].double()), "s2: expected"),
    (lambda a: a.update(cfg=MoEConfig(8, 2)), "w1: expected 8 experts"),
    (lambda a: a.update(x=a["x"][:0], logits=a["logits"][:0]), "x: expected at least one token"),
    (lambda a: a.update(x="x"), "x: expected a torch.Tensor"),
    (lambda a: None, "x: expected a tensor on w1's CUDA device"),  # all on the CPU
])
def test_mega_moe_names_the_bad_argument(change, match):
    x, logits, w1, s1, w2, s2, cfg = _small()
    args = dict(x=x, logits=logits, w1=w1, s1=s1, w2=w2, s2=s2, cfg=cfg)
    change(args)
    with pytest.raises((ValueError, TypeError), match=match):
        mega_moe(args["x"], args["logits"], args["w1"], args["s1"], args["w2"], args["s2"], args["cfg"], n_virtual_ranks=2)


def test_mega_moe_wants_exactly_one_of_group_and_virtual_ranks():
    args = _small()
    with pytest.raises(ValueError, match="expected exactly one of them, got neither"):
        mega_moe(*args)
    with pytest.raises(ValueError, match="got both"):
        mega_moe(*args, group=object(), n_virtual_ranks=2)
    with pytest.raises(ValueError, match="n_ranks: expected 1 to 8 ranks dividing 4 experts, got 3"):
        mega_moe(*args, n_virtual_ranks=3)
    with pytest.raises(ValueError, match="n_virtual_ranks: expected an int"):
        mega_moe(*args, n_virtual_ranks=2.0)
    with pytest.raises(ValueError, match=r"fusion: expected one of \('l1_swiglu', 'none', 'wave'\), got 'all'"):
        mega_moe(*args, n_virtual_ranks=2, fusion="all")


def test_group_mode_checks_the_group_size_and_local_tokens(fake_group):
    x, logits, w1, s1, w2, s2, cfg = _small()
    with pytest.raises(ValueError, match="n_ranks: expected 1 to 8 ranks dividing 4 experts, got 16"):
        mega_moe(x, logits, w1, s1, w2, s2, cfg, group=fake_group(16))
    with pytest.raises(ValueError, match="n_ranks: expected 1 to 8 ranks dividing 4 experts, got 3"):
        mega_moe(x, logits, w1, s1, w2, s2, cfg, group=fake_group(3))
    # a rank with no tokens of its own is legal in group mode (it still serves its experts): the
    # checks get past the token count to the device (these tensors are on the CPU)
    with pytest.raises(ValueError, match="x: expected a tensor on w1's CUDA device"):
        check_layer_args(x[:0], logits[:0], w1, s1, w2, s2, cfg, 2, local=True)
    with pytest.raises(ValueError, match="x: expected at least one token"):
        check_layer_args(x[:0], logits[:0], w1, s1, w2, s2, cfg, 2, local=False)


# ---- CPU: every kernel builds for sm_90a --------------------------------------------------

BUILDS = {
    "announce": lambda: K.announce_kernel(),
    "exchange_n1": lambda: K.exchange_kernel(1),
    "exchange_n8": lambda: K.exchange_kernel(8),
    "step": lambda: K.step_kernel(),
    "gate_n8_w2": lambda: K.gate_kernel(8, 2),
    "gather_n8": lambda: K.gather_ids_kernel(8, 6),
    "dispatch_flash_n1": lambda: K.dispatch_kernel(1, 4096, 6, 1, 256, 256, 132),
    "dispatch_flash_n8": lambda: K.dispatch_kernel(8, 4096, 6, 2, 16, 32, 16),
    "dispatch_pro_n8": lambda: K.dispatch_kernel(8, 7168, 6, 2, 24, 48, 16),
    "combine_flash_n8": lambda: K.combine_kernel(8, 4096, 6, 32),
    "combine_pro_n8": lambda: K.combine_kernel(8, 7168, 6, 48),
    "l1_swiglu_flash_n8": lambda: grouped_gemm_swiglu_kernel(4096, 4096, 10.0, num_sms=16),  # a rank's SM share
    "wave_flash_n8": lambda: wave_kernel(4096, 4096, 10.0, num_sms=14),  # make_plan's wave_sms at 8 ranks
}


def shape_preconditions(kernel) -> set:
    """The shape preconditions (derived by the bounds verifier) that the launcher checks."""
    marker = 'tlx::fail_precondition(kKernel, "'
    lines = [ln for ln in kernel.host_source.splitlines() if marker in ln]
    return {ln.split(marker, 1)[1].split('"', 1)[0] for ln in lines}


def refuses_no_real_size(preconditions) -> bool:
    """Each precondition is an upper bound of 2^27 or more on a size (rows, tokens) or "Tr >= 1"
    (send buffers have a row at least): none refuses a real layer (a bound like "T <= 1", from an
    int32 overflow of an index sum, would)."""
    bounds = [p.split(" <= ") for p in preconditions - {"Tr >= 1"}]
    return all(len(b) == 2 and b[1].isdigit() and int(b[1]) >= 1 << 27 for b in bounds)


@pytest.mark.parametrize("name", sorted(BUILDS))
def test_mega_kernel_builds_for_sm90a(name):
    kernel = BUILDS[name]()
    if name.startswith("l1_swiglu"):  # the grouped GEMM's int32 row bounds: 2^31 rows, in row blocks too
        assert shape_preconditions(kernel) == {"NB <= 16777214", "R <= 2147483391"}
    elif name.startswith("wave"):  # 2^27 rows (wave.py says why)
        assert shape_preconditions(kernel) == {"NB <= 1048576", "R <= 2147483391"}
    else:
        assert refuses_no_real_size(shape_preconditions(kernel)), shape_preconditions(kernel)
    src = kernel.device_source
    body = src.split("__global__", 1)[1]
    assert "__global__" in src
    if name.startswith(("exchange", "gate")):
        assert "tlx_wait_flag_sys(" in body and "tlx_mega_record_failure(" in body
    if name.startswith("announce"):
        assert "tlx_release_store_sys(" in body and "tlx_wait_flag_sys(" not in body  # publishes, never waits
    if name.startswith("exchange"):
        assert "tlx_release_store_sys(" not in body
    if name.startswith("dispatch"):
        assert "tlx_release_add_sys(" in body and "fp8_e4_16_t" in body  # 16-byte row words
        n = int(name.rsplit("n", 1)[1])
        assert body.count("if (src == ") >= n  # a branch per source rank
    if name.startswith("combine"):
        assert "__fmaf_rn(ws[" in body  # the fma chain of permute.combine
    if name.startswith(("announce", "exchange", "gate", "step")):
        assert kernel.metadata["launches"][0]["block"] == ["32", "1", "1"]  # one warp waits, no more
    if name.startswith("l1_swiglu"):
        assert kernel.metadata["launches"][0]["grid"] == ["16", "1", "1"]  # persistent on the rank's share
        assert "tlx_ieee_fp8_e4m3_bits(" in body and "tl::tma_store(Q_desc" in body  # e4m3 out, no bf16 hidden
    if name.startswith("wave"):
        assert kernel.metadata["launches"][0]["grid"] == ["14", "1", "1"]
        # L1 tiles: e4m3 out, then the row block's count released once the store has completed;
        # L2 tiles: a bounded acquire of that count (16 = I / 128 L1 tiles), the async-proxy fence,
        # the e4m3 rows loaded back by TMA, bf16 out
        assert "tl::tma_store(Q_desc" in body and "tl::tma_store_wait<0, false>()" in body
        assert "tlx_count_release_sys((&(counters[0])), (r0 >> 7))" in body
        assert "tlx_wait_count_sys((&(counters[0])), (r0 >> 7), 16, (&(flags[2])), timeout_ns) == 0" in body
        assert "tlx_mega_record_failure((&(flags[2])), 4, rank, wave_id, rank)" in body
        assert body.count("tlx_fence_proxy_async_global()") == 2 and "fence.proxy.async.global;" in src
        assert "tl::tma_load_multicast(QA_desc" in body and "tl::tma_store(Y_desc" in body


# ---- GPU --------------------------------------------------------------------------------

def make_inputs(model, t, seed):
    g = torch.Generator(device=CUDA).manual_seed(seed)
    x = torch.randn(t, model["hidden"], device=CUDA, generator=g).to(torch.bfloat16)
    logits = torch.randn(t, model["n_experts"], device=CUDA, generator=g)
    return x, logits


@pytest.fixture(scope="module")
def flash():
    return random_layer(V4_FLASH)


@pytest.fixture(scope="module")
def pro():
    return random_layer(V4_PRO, seed=1)


def poisoned(x):
    return torch.full_like(x, float("nan"))


def assert_bits(a, b, what):
    assert a.shape == b.shape, what
    diff = (a.view(torch.int16) != b.view(torch.int16)).any(dim=1)
    assert not diff.any(), f"{what}: {int(diff.sum())} of {a.shape[0]} tokens differ, first {int(diff.nonzero()[0])}"


def run_both(model, layer, t_total, n, seed, logits=None, waves=None, fusion="l1_swiglu"):
    x, lg = make_inputs(model, t_total, seed)
    if logits is not None:
        lg = logits
    ref = moe_layer(x, lg, *layer, model["cfg"], n_ranks=n)
    out = mega_moe(x, lg, *layer, model["cfg"], n_virtual_ranks=n, waves=waves, out=poisoned(x), fusion=fusion)
    torch.cuda.synchronize()
    return out, ref


# T is tokens per rank: the batch is n * T tokens.
@pytest.mark.gpu
@pytest.mark.parametrize("n", [1, 2, 4, 8])
@pytest.mark.parametrize("t", [1, 8, 64, 512])
def test_flash_bitwise_equal_to_unfused(flash, n, t):
    out, ref = run_both(V4_FLASH, flash, n * t, n, seed=t + n)
    assert torch.isfinite(out.float()).all()
    assert_bits(out, ref, f"V4-Flash n={n} T={t}")


@pytest.mark.gpu
@pytest.mark.parametrize("waves", [1, 4, 16])
def test_wave_count_does_not_change_bits(flash, waves):
    out, ref = run_both(V4_FLASH, flash, 4 * 64, 4, seed=5, waves=waves)
    assert_bits(out, ref, f"waves={waves}")


@pytest.mark.gpu
@pytest.mark.parametrize("n, t, waves", [(1, 512, None), (4, 64, 4)])
def test_unfused_waves_bitwise_equal_too(flash, n, t, waves):
    """fusion="none" (L1, SwiGLU cast, L2 as three launches a wave), kept for comparison: the same bits."""
    out, ref = run_both(V4_FLASH, flash, n * t, n, seed=7 + n, waves=waves, fusion="none")
    assert_bits(out, ref, f"unfused waves n={n} T={t}")


@pytest.mark.gpu
@pytest.mark.parametrize("n, t, waves", [(1, 8, None), (1, 512, None), (1, 4001, None), (2, 64, None), (4, 64, 4),
                                         (8, 64, None)])
def test_fused_wave_kernel_bitwise_equal(flash, n, t, waves):
    """fusion="wave" (L1 + SwiGLU and L2 in one kernel a wave, L2 tiles waiting in the kernel):
    the same bits, no timeout (``mega_moe`` raises MegaMoETimeout if an L2 tile gave up)."""
    out, ref = run_both(V4_FLASH, flash, n * t, n, seed=9 + t + n, waves=waves, fusion="wave")
    assert_bits(out, ref, f"fused wave n={n} T={t}")


@pytest.mark.gpu
@pytest.mark.parametrize("n, t", [(1, 512), (8, 8)])
def test_fused_wave_kernel_bitwise_equal_pro(pro, n, t):
    out, ref = run_both(V4_PRO, pro, n * t, n, seed=13 + t + n, fusion="wave")
    assert_bits(out, ref, f"fused wave V4-Pro n={n} T={t}")


@pytest.mark.gpu
@pytest.mark.parametrize("n", [2, 8])
def test_all_tokens_to_the_same_experts(flash, n):
    """Every token picks experts 0..5: one rank gets all rows, the others (and most experts) none."""
    t_total = 8 * 64
    _, lg = make_inputs(V4_FLASH, t_total, 11)
    lg[:, :6] += 100.0
    out, ref = run_both(V4_FLASH, flash, t_total, n, seed=11, logits=lg)
    assert_bits(out, ref, f"skewed n={n}")


@pytest.mark.gpu
def test_ranks_without_tokens(flash):
    """3 tokens over 8 ranks: ranks 3..7 send nothing (and Tr = 1)."""
    out, ref = run_both(V4_FLASH, flash, 3, 8, seed=3)
    assert_bits(out, ref, "3 tokens, 8 ranks")


@pytest.mark.gpu
def test_same_bits_in_100_runs_and_batch_invariance(flash):
    cfg = V4_FLASH["cfg"]
    x, lg = make_inputs(V4_FLASH, 4 * 64, 21)
    first = mega_moe(x, lg, *flash, cfg, n_virtual_ranks=4)
    for i in range(100):
        again = mega_moe(x, lg, *flash, cfg, n_virtual_ranks=4, out=poisoned(x), check=(i % 10 == 9))
        assert_bits(again, first, f"run {i}")
    # a token's result does not depend on the other tokens of the batch (nor on its rank)
    few = mega_moe(x[:5].contiguous(), lg[:5].contiguous(), *flash, cfg, n_virtual_ranks=4)
    assert_bits(few, first[:5], "first 5 tokens alone")


@pytest.mark.gpu
def test_cuda_graph_replay_matches_eager(flash):
    cfg = V4_FLASH["cfg"]
    x, lg = make_inputs(V4_FLASH, 4 * 64, 31)
    eager = mega_moe(x, lg, *flash, cfg, n_virtual_ranks=4)
    out = poisoned(x)
    graph, stream = torch.cuda.CUDAGraph(), torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
        mega_moe(x, lg, *flash, cfg, n_virtual_ranks=4, out=out)
    torch.cuda.current_stream().wait_stream(stream)
    graph.replay()
    torch.cuda.synchronize()
    assert_bits(out, eager, "graph replay")
    layer_for(x, *flash, cfg, n_virtual_ranks=4).check()
    # new inputs in place: the replay follows them
    x2, lg2 = make_inputs(V4_FLASH, 4 * 64, 32)
    x.copy_(x2)
    lg.copy_(lg2)
    out.fill_(float("nan"))
    for _ in range(3):
        graph.replay()
    torch.cuda.synchronize()
    assert_bits(out, moe_layer(x2, lg2, *flash, cfg, n_ranks=4), "graph replay, new inputs")
    layer_for(x, *flash, cfg, n_virtual_ranks=4).check()


@pytest.mark.gpu
def test_rank_that_never_arrives_times_out_naming_rank_and_wave(flash):
    cfg = V4_FLASH["cfg"]
    x, lg = make_inputs(V4_FLASH, 16, 41)
    layer = layer_for(x, *flash, cfg, n_virtual_ranks=2, timeout_s=0.25)
    layer(x, lg)  # a healthy call first (compiles, and the epochs advance together)
    t0 = time.perf_counter()
    with pytest.raises(MegaMoETimeout, match=r"rank 0 timed out after 0.25 s waiting for the tokens and routing "
                                             r"of rank 1 \(wave 0, exchange\)"):
        layer(x, lg, launch_only={0})
    assert time.perf_counter() - t0 < 5.0
    with pytest.raises(RuntimeError, match="failed earlier"):
        layer(x, lg)


@pytest.mark.gpu
@pytest.mark.parametrize("n, t", [(1, 4001), (1, 8192), (2, 4001), (2, 8192)])
def test_flash_bitwise_equal_to_unfused_large(flash, n, t):
    out, ref = run_both(V4_FLASH, flash, n * t, n, seed=t + n)
    assert_bits(out, ref, f"V4-Flash n={n} T={t}")


@pytest.mark.gpu
@pytest.mark.parametrize("n, t", [(1, 8), (8, 8), (1, 512), (8, 64), (2, 4001)])
def test_pro_bitwise_equal_to_unfused(pro, n, t):
    out, ref = run_both(V4_PRO, pro, n * t, n, seed=t + n)
    assert_bits(out, ref, f"V4-Pro n={n} T={t}")


def test_default_fusion_follows_the_rank_and_token_counts():
    """Without ``fusion``: the L1 + SwiGLU kernel where bench/mega_moe.py measured it faster (one rank
    at decode sizes, up to 8 tokens; 9-512 tokens over all ranks: the decode kernel's SwiGLU form in
    32-row chunks; 8 ranks from 512 tokens a rank), else the three launches a wave; ``layer_for``
    resolves it as ``mega_moe`` does, so ``check()`` after a graph replay reads the layer that ran."""
    from kernels.moe.mega.layer import default_fusion, rank_tokens

    fused, none = "l1_swiglu", "none"
    assert [default_fusion(1, t) for t in (1, 8, 9, 64, 512, 513, 4001, 8192)] == [fused] * 5 + [none] * 3
    assert [default_fusion(n, 1) for n in (2, 4, 8, 16)] == [none, none, none, fused]
    assert [default_fusion(n, 4) for n in (2, 4, 8)] == [none, fused, fused]
    assert [default_fusion(n, 64) for n in (2, 4, 8, 16)] == [fused, fused, fused, none]
    assert [default_fusion(n, 512) for n in (2, 4, 8)] == [none, none, fused]
    # by the tokens of one rank: x's shared out over virtual ranks, or x's own in group mode
    assert [rank_tokens(512, 8, True), rank_tokens(513, 8, True), rank_tokens(512, 8, False), rank_tokens(0, 2, True)] == [64, 65, 512, 1]
    assert inspect.signature(layer_for).parameters["fusion"].default is None
    assert inspect.signature(mega_moe).parameters["fusion"].default is None
