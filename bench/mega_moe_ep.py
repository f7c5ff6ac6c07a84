"""MegaMoE across the GPUs of one host (issue 24): one process a GPU, started by ``torchrun``.

    torchrun --nproc-per-node N bench/mega_moe_ep.py [--out FILE.json] [--models V4-Flash,V4-Pro]
        [--tokens 1,8,64,512,8192] [--reps R] [--timeout-s S]
    torchrun --nproc-per-node N bench/mega_moe_ep.py --absent-rank R   (the fault run)

For each model and T (tokens per rank), every rank builds the same global batch (same seeds) and
takes its slice, then:
* checks, bit for bit against ``moe_layer`` of the gathered batch (its rows of this rank):
  ``moe_layer_ep`` (the unfused distributed baseline: gating and the FP8 cast on the token's rank,
  NCCL all-to-all of the entries to their experts' ranks and back, the project's grouped GEMM
  pipeline, the combine in k order) and ``mega_moe(group=...)`` (torch symmetric memory);
* times both side by side (``interleaved`` rounds, every rank in step: a barrier, then one call
  of each on every rank, CUDA events; a call's time is the slowest rank's, the figure the median
  over rounds). ``mega_moe`` is also timed as a CUDA-graph replay; the baseline is not: its
  all-to-all split sizes depend on the routing and reach the host (``.tolist()``), which a graph
  cannot capture;
* counts the bytes that cross between GPUs on this rank (received: the dispatch's rows from other
  ranks, e4m3 values and fp32 scales; the combine's bf16 result rows from other ranks) and the
  achieved rate over ``mega_moe``'s time.

* times the same layer (the same kernels, the same launches) "with communication removed": on
  logits shifted so that every token's top-k experts are on its own rank (``local_logits``), every
  pull of the dispatch and the combine reads the rank's own memory, while each expert still gets
  the same expected number of rows (T * k / El); the bytes that cross are checked to be zero and
  the output bit for bit against ``moe_layer`` of the shifted batch. ``hidden`` is the real
  call's time over this one (issue 24: <= 1.2 at T <= 64).

``--absent-rank R``: rank R builds the layer and then never calls it; every other rank must end in
``MegaMoETimeout`` naming R within ``--timeout-s`` plus a margin. The run prints one line per rank.

Results: rank 0 prints a table and writes ``--out``. Nothing here has run yet (no machine with
several GPUs was lent when it was written, 2026-12-03); the exchange it relies on is tested on
CPU processes (tests/kernels/moe/test_moe_ep.py).
"""
# not a benchmark (scripts/gpu-check runs the bench/*.py files without this line): it needs torchrun

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.mega_moe import MODELS  # noqa: E402  (the models' dims, as the one-GPU bench has them)


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", help="rank 0 writes the rows as JSON here")
    ap.add_argument("--models", default="V4-Flash,V4-Pro")
    ap.add_argument("--tokens", default="1,8,64,512,8192", help="T, tokens per rank")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--timeout-s", type=float, default=5.0, help="mega_moe's wait limit")
    ap.add_argument("--absent-rank", type=int, help="the fault run: this rank never calls the layer")
    args = ap.parse_args(argv)
    models = args.models.split(",")
    if set(models) - set(MODELS):
        ap.error(f"--models: expected a subset of {','.join(MODELS)}, got {args.models}")
    args.models = models
    args.tokens = [int(t) for t in args.tokens.split(",") if t]
    if any(t < 1 for t in args.tokens):
        ap.error(f"--tokens: expected positive counts, got {args.tokens}")
    return args


def crossing_bytes(ids, rank: int, t: int, n: int, experts_per_rank: int, hidden: int) -> int:
    """Bytes this rank receives from other GPUs for one call: the rows of its experts that come
    from other ranks' tokens (e4m3 values + fp32 scales of 128-groups), and the result rows of its
    own tokens' entries computed on other ranks (bf16). ``ids`` is the gathered batch's routing
    [n * T, k] (token s * T + i is token i of rank s)."""
    owner = ids.long() // experts_per_rank
    source = (ids.new_tensor(range(n * t)).long() // t)[:, None].expand_as(owner)
    dispatched = int(((owner == rank) & (source != rank)).sum())
    returned = int(((source == rank) & (owner != rank)).sum())
    return dispatched * (hidden + hidden // 128 * 4) + returned * hidden * 2


def local_logits(logits, t: int, experts_per_rank: int, topk: int):
    """The logits of the gathered batch [n * T, E] with each token's own rank's experts raised above
    all others (token s * T + i is rank s's): its top-k then lie on its own rank, whatever the score
    function (each is increasing in the logit) and with no selection bias. The shift is the batch's
    logit range plus one, so every raised logit exceeds every other one of its row."""
    if topk > experts_per_rank:
        raise ValueError(f"topk: local routing needs at most {experts_per_rank} experts a rank, got {topk}")
    import torch

    owner = torch.arange(logits.shape[0], device=logits.device) // t  # the rank of each token
    expert_rank = torch.arange(logits.shape[1], device=logits.device) // experts_per_rank
    shift = float(logits.max() - logits.min()) + 1.0
    return logits + shift * (expert_rank[None, :] == owner[:, None]).to(logits.dtype)


def timed_rounds(fns: dict, reps: int, group) -> dict:
    """Median over rounds of each callable's time in ms, the slowest rank's: every round starts
    with a barrier, then each callable once, in turn, between CUDA events."""
    import torch
    import torch.distributed as dist

    times = {name: [] for name in fns}
    for i in range(reps + 3):
        for name, fn in fns.items():
            dist.barrier(group)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            ms = torch.tensor([start.elapsed_time(end)], device="cuda")
            dist.all_reduce(ms, op=dist.ReduceOp.MAX, group=group)
            if i >= 3:  # warm-up rounds left out
                times[name].append(float(ms))
    return {name: sorted(v)[len(v) // 2] for name, v in times.items()}


def run_config(name, m, layer_w, cfg, t, args, group, emit):
    import torch
    import torch.distributed as dist

    from bench.mega_moe import captured
    from kernels.moe.mega import MegaMoE
    from kernels.moe.pipeline import moe_layer, moe_layer_ep

    n, r = group.size(), group.rank()
    g = torch.Generator(device="cuda").manual_seed(1000 + n * t)
    x_all = torch.randn(n * t, m["hidden"], device="cuda", generator=g).to(torch.bfloat16)
    logits_all = torch.randn(n * t, m["n_experts"], device="cuda", generator=g)
    x, logits = x_all[r * t:(r + 1) * t].contiguous(), logits_all[r * t:(r + 1) * t].contiguous()
    ref_all, ids, _ = moe_layer(x_all, logits_all, *layer_w, cfg, return_routing=True)
    ref = ref_all[r * t:(r + 1) * t]
    layer = MegaMoE(*layer_w, cfg, t, group=group, timeout_s=args.timeout_s)
    checks = {"baseline": moe_layer_ep(x, logits, *layer_w, cfg, group), "mega": layer(x, logits)}
    layer.check()

    def replayed_graph(logits_r):
        """The layer on these logits captured as a CUDA graph and replayed once, every rank together."""
        graph, out = captured(lambda: layer(x, logits_r, check=False))
        dist.barrier(group)
        graph.replay()
        torch.cuda.synchronize()
        layer.check()
        return graph, out

    graph, checks["mega graph"] = replayed_graph(logits)
    # communication removed: the same layer on logits that keep every token on its own rank
    el = m["n_experts"] // n
    local_all = local_logits(logits_all, t, el, cfg.topk)
    local_ref_all, local_ids, _ = moe_layer(x_all, local_all, *layer_w, cfg, return_routing=True)
    if crossing_bytes(local_ids, r, t, n, el, m["hidden"]):
        raise AssertionError(f"rank {r}: the local routing still moves rows between ranks")
    refs = dict.fromkeys(checks, ref)
    local_graph, checks["mega local graph"] = replayed_graph(local_all[r * t:(r + 1) * t].contiguous())
    refs["mega local graph"] = local_ref_all[r * t:(r + 1) * t]
    equal = {what: torch.equal(out.view(torch.int16), refs[what].view(torch.int16)) for what, out in checks.items()}
    ok = torch.tensor([all(equal.values())], device="cuda", dtype=torch.int32)
    dist.all_reduce(ok, op=dist.ReduceOp.MIN, group=group)
    ms = timed_rounds({"baseline": lambda: moe_layer_ep(x, logits, *layer_w, cfg, group),
                       "mega": lambda: layer(x, logits, check=False), "mega graph": graph.replay,
                       "mega local graph": local_graph.replay}, args.reps, group)
    layer.check()
    moved = crossing_bytes(ids, r, t, n, el, m["hidden"])
    most = torch.tensor([moved], device="cuda", dtype=torch.int64)
    dist.all_reduce(most, op=dist.ReduceOp.MAX, group=group)
    emit(model=name, n=n, T=t, bitwise="all ranks equal" if int(ok) else f"rank {r}: {equal}",
         baseline_us=round(ms["baseline"] * 1e3, 1), mega_us=round(ms["mega"] * 1e3, 1),
         mega_graph_us=round(ms["mega graph"] * 1e3, 1), speedup=round(ms["baseline"] / ms["mega graph"], 2),
         local_graph_us=round(ms["mega local graph"] * 1e3, 1),
         hidden=round(ms["mega graph"] / ms["mega local graph"], 2),
         crossing_MB_max_rank=round(int(most) / 1e6, 2), crossing_GBps=round(int(most) / (ms["mega graph"] * 1e6), 1))
    del graph, local_graph, layer


def absent_rank_run(m, layer_w, cfg, args, group, emit):
    """Rank ``args.absent_rank`` never calls the layer; every other one must time out naming it."""
    import torch
    import torch.distributed as dist

    from kernels.moe.mega import MegaMoE, MegaMoETimeout

    n, r = group.size(), group.rank()
    if not 0 <= args.absent_rank < n:
        raise SystemExit(f"--absent-rank: expected 0 <= R < {n}, got {args.absent_rank}")
    t = 64
    g = torch.Generator(device="cuda").manual_seed(7)
    x = torch.randn(t, m["hidden"], device="cuda", generator=g).to(torch.bfloat16)
    logits = torch.randn(t, m["n_experts"], device="cuda", generator=g)
    layer = MegaMoE(*layer_w, cfg, t, group=group, timeout_s=args.timeout_s)
    dist.barrier(group)
    if r == args.absent_rank:
        emit(every_rank=True, rank=r, result="absent: never called the layer")
        return
    t0 = time.time()
    try:
        layer(x, logits)
        torch.cuda.synchronize()
        layer.check()
        result = "FAILED: no timeout"
    except MegaMoETimeout as exc:
        named = f"rank {args.absent_rank}" in str(exc)
        result = f"{'ok' if named else 'FAILED: does not name the absent rank'}: {exc}"
    emit(every_rank=True, rank=r, result=result[:300], seconds=round(time.time() - t0, 2))


def main():
    args = parse_args()
    import torch
    import torch.distributed as dist

    from kernels.moe.pipeline import V4_FLASH, V4_PRO
    from kernels.moe.reference import random_layer

    local = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local))
    group = dist.group.WORLD
    rows = []

    def emit(every_rank: bool = False, **row):
        """Record a row (rank 0's are written to --out); print it on rank 0, or on every rank."""
        rows.append(row)
        if every_rank or group.rank() == 0:
            print("| " + " | ".join(f"{k}={v}" for k, v in row.items()) + " |", flush=True)

    try:
        for name in args.models:
            m = MODELS[name]
            cfg = (V4_FLASH if name == "V4-Flash" else V4_PRO)["cfg"]
            layer_w = random_layer(m, seed=1)  # the same weights on every rank (same seed, same device kind)
            if args.absent_rank is not None:
                absent_rank_run(m, layer_w, cfg, args, group, emit)
                break
            for t in args.tokens:
                run_config(name, m, layer_w, cfg, t, args, group, emit)
            del layer_w
            torch.cuda.empty_cache()
    finally:
        if args.out and group.rank() == 0:
            Path(args.out).write_text(json.dumps({"gpu": torch.cuda.get_device_name(), "ranks": group.size(), "rows": rows},
                                                 indent=1))
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
